package delivery

import (
	"io"
	"log/slog"
	"testing"

	"github.com/sluicehq/sluice/signing"
)

// TestUnlistedTenantGetsTheDefaultBulkhead: a subscription of a tenant
// Options.Tenants does not list is bounded by the default bulkhead (it
// had none, so a tenant nobody listed could take every slot); a listed
// tenant keeps its own, takes the default's where it sets none, and has
// none only when it says so (negative). The operator's subscriptions
// have none.
func TestUnlistedTenantGetsTheDefaultBulkhead(t *testing.T) {
	k, _ := signing.GenerateSecret()
	mk := func(id, tenant string) *Subscription {
		return &Subscription{ID: id, Tenant: tenant, URL: "http://127.0.0.1:1/" + id, Secrets: []signing.Secret{k}}
	}
	s := newTestServer(Options{Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(), AllowPrivateTargets: true,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		TenantDefaults: Tenant{MaxConcurrency: 5},
		Tenants:        []Tenant{{ID: "globex", MaxConcurrency: 7}, {ID: "unbound", MaxConcurrency: -1}, {ID: "plain"}},
		Subscriptions:  []*Subscription{mk("initech-1", "initech"), mk("initech-2", "initech"), mk("globex-1", "globex"), mk("op", "")}})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(t.Context()) })
	bulkheadOf := func(id string) *bulkhead {
		l := s.d.lane(id)
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.sub.bulkhead
	}
	if a, b := bulkheadOf("initech-1"), bulkheadOf("initech-2"); a == nil || a != b || a.max != 5 {
		t.Errorf("unlisted initech's lanes: bulkheads %p and %p, want one with the default 5", a, b)
	}
	if b := bulkheadOf("globex-1"); b == nil || b.max != 7 {
		t.Errorf("globex: %+v, want its own 7", b)
	}
	if b := bulkheadOf("op"); b != nil {
		t.Errorf("the operator's subscription has a bulkhead: %+v", b)
	}
	if b := s.d.bulkheadOf("unbound"); b != nil {
		t.Errorf("a tenant listed with no limit (negative) got a bulkhead of %d", b.max)
	}
	if b := s.d.bulkheadOf("plain"); b == nil || b.max != 5 {
		t.Errorf("a listed tenant that sets none: %+v, want the default 5", b)
	}
}
