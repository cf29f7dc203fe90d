package main

import (
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// Events belong to tenants (the tenant rule, docs/security.md): a producer posts
// events of acme, of globex and of the platform; each tenant's
// subscriptions, whatever their types say ("*"), receive exactly their
// tenant's events plus the platform types the operator shares with them;
// the operator's receive everything; dead letters, the ledger and replay
// follow the same rule; and an id a tenant used stays its own.

const (
	teOpToken     = "te-operator-token-0123456789"
	teAcmeToken   = "te-acme-token-0123456789"
	teGlobexToken = "te-globex-token-0123456789"
)

func TestTenantEventsReachOnlyTheirTenant(t *testing.T) {
	tb := testbed.New(testbed.Options{})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	tb.SetMode("/acme-dead", testbed.ModeFail)
	k, _ := signing.ParseSecret(e2eSecret)
	ops := &delivery.Subscription{ID: "ops-all", URL: tb.URL() + "/ops", Secrets: []signing.Secret{k}, Types: []string{"*"},
		Timeout: 2 * time.Second, Retry: policy.RetryPolicy{MaxAttempts: 1}}
	// initech is shared every platform type; the operational webhook's
	// events (acme-dead's dead letters make some) still reach only the
	// operator's webhook.
	opsHook := &delivery.Subscription{URL: tb.URL() + "/operational", Secrets: []signing.Secret{k}, Timeout: 2 * time.Second}
	all := &delivery.Subscription{ID: "initech-all", Tenant: "initech", URL: tb.URL() + "/initech", Secrets: []signing.Secret{k}, Types: []string{"*"},
		Timeout: 2 * time.Second}
	s := openAPISidecar(t, proxy.Options{AdminToken: teOpToken, Subscriptions: []*delivery.Subscription{ops, all}, OperationalWebhook: opsHook,
		Tenants:      []delivery.Tenant{{ID: "acme", SharedTypes: []string{"status.*"}}, {ID: "globex"}, {ID: "initech", SharedTypes: []string{"*"}}},
		TenantTokens: []admin.TenantToken{{Token: teAcmeToken, Tenant: "acme"}, {Token: teGlobexToken, Tenant: "globex"}}})

	// The attack of the finding: a tenant subscribes to everything.
	create := func(token, id, path string, extra map[string]any) {
		doc := map[string]any{"id": id, "url": tb.URL() + path, "types": []string{"*"}}
		for k, v := range extra {
			doc[k] = v
		}
		s.mustCall(t, token, "POST", "/v1/subscriptions", jsonOf(doc), 201, nil)
	}
	create(teAcmeToken, "acme-spy", "/acme-spy", nil)
	create(teAcmeToken, "acme-dead", "/acme-dead", map[string]any{"retry": map[string]any{"max_attempts": 1}})
	create(teGlobexToken, "globex-spy", "/globex-spy", nil)

	want := map[string][]string{} // path -> event ids it must receive, in order
	post := func(tenant, typ, id string) {
		s.postAs(t, tenant, typ, id, `{"email":"customer-of-`+tenant+`@example.com"}`)
		want["/ops"] = append(want["/ops"], id)
		if tenant == "" {
			want["/initech"] = append(want["/initech"], id)
		}
		switch {
		case tenant == "acme" || tenant == "" && strings.HasPrefix(typ, "status."):
			want["/acme-spy"] = append(want["/acme-spy"], id)
		case tenant == "globex":
			want["/globex-spy"] = append(want["/globex-spy"], id)
		}
	}
	for i := range 4 {
		n := strconv.Itoa(i)
		post("globex", "globex.invoice.paid", "globex-ev-"+n)
		post("acme", "acme.order.created", "acme-ev-"+n)
		post("", "status.up", "status-ev-"+n)        // shared with acme only
		post("", "platform.audit", "platform-ev-"+n) // shared with no tenant
	}
	eventually(t, "every subscription's deliveries", func() bool {
		return len(tb.IDs("/ops")) == len(want["/ops"]) && len(tb.IDs("/acme-spy")) == len(want["/acme-spy"]) &&
			len(tb.IDs("/globex-spy")) == len(want["/globex-spy"]) && s.laneOf(t, "acme-dead").DeadLettered == uint64(len(want["/acme-spy"])) &&
			len(tb.IDs("/initech")) == len(want["/initech"]) && len(tb.IDs("/operational")) > 0
	})
	// Every event has been resolved by every lane by now; a lane that took
	// another tenant's event would show it here.
	for _, path := range []string{"/ops", "/acme-spy", "/globex-spy", "/initech"} {
		got := tb.IDs(path)
		slices.Sort(got)
		w := slices.Clone(want[path])
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Errorf("%s received %v\nwant %v", path, got, w)
		}
	}

	// acme's dead letters hold only what acme may receive, each recording
	// its tenant and its owner.
	var page api.DeadLetterPage
	s.mustCall(t, teAcmeToken, "GET", "/v1/dead-letters?subscription=acme-dead", "", 200, &page)
	if len(page.DeadLetters) != len(want["/acme-spy"]) {
		t.Fatalf("acme-dead has %d dead letters, want %d", len(page.DeadLetters), len(want["/acme-spy"]))
	}
	var seq uint64
	for _, d := range page.DeadLetters {
		if strings.HasPrefix(d.EventID, "globex-") || strings.HasPrefix(d.EventID, "platform-") {
			t.Fatalf("acme's dead letters hold %s", d.EventID)
		}
		seq = d.Seq
	}
	letter := "/v1/dead-letters/acme-dead/" + strconv.FormatUint(seq, 10)

	// The ledger: a tenant sees another tenant's event as if it did not
	// exist, and its own.
	s.mustCall(t, teAcmeToken, "GET", "/v1/events/globex-ev-1", "", 404, nil)
	s.mustCall(t, teAcmeToken, "GET", "/v1/events/platform-ev-1", "", 404, nil)
	var st api.EventStatus
	s.mustCall(t, teGlobexToken, "GET", "/v1/events/globex-ev-1", "", 200, &st)
	for _, d := range st.Deliveries {
		if d.Subscription != "globex-spy" {
			t.Errorf("globex's ledger of its event shows %s", d.Subscription)
		}
	}

	// An id acme used stays acme's once its subscription is gone: globex
	// cannot take it and so cannot read or replay acme's dead letters.
	s.mustCall(t, teAcmeToken, "DELETE", "/v1/subscriptions/acme-dead", "", 202, nil)
	eventually(t, "acme-dead retires", func() bool { _, ok := s.lane("acme-dead"); return !ok })
	code, body := s.call(t, teGlobexToken, "POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "acme-dead", "url": tb.URL() + "/globex-steal", "types": []string{"*"}}))
	if code != http.StatusConflict {
		t.Fatalf("globex takes acme's retired id: %d %s, want 409", code, body)
	}
	s.mustCall(t, teGlobexToken, "GET", letter, "", 404, nil)
	s.mustCall(t, teAcmeToken, "GET", letter, "", 200, nil)
	// acme may take its own id again.
	create(teAcmeToken, "acme-dead", "/acme-dead-2", nil)
}

// TestIngestTenantHeader: a bad Sluice-Tenant is a 400 naming the header,
// and nothing is appended.
func TestIngestTenantHeader(t *testing.T) {
	s := openAPISidecar(t, proxy.Options{AdminToken: teOpToken})
	for _, bad := range []string{"Acme", "-acme", "acme corp", strings.Repeat("a", 65), "acme/../globex"} {
		req, _ := http.NewRequest(http.MethodPost, s.srv.URL()+"/v1/events/t.a", strings.NewReader(`{}`))
		req.Header.Set(ingest.HeaderTenant, bad)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), ingest.HeaderTenant) {
			t.Errorf("Sluice-Tenant %q: %d %s, want 400 naming the header", bad, resp.StatusCode, b)
		}
	}
	var list api.SubscriptionList
	s.mustCall(t, "", "GET", "/v1/subscriptions", "", 200, &list)
	if list.Head != 0 {
		t.Fatalf("bad tenants appended: head %d", list.Head)
	}
}

// TestTenantLimitAnswersAlike: at its max_subscriptions, a tenant asking
// for another tenant's id and for a free one hears the same answer, so
// it cannot tell which ids exist.
func TestTenantLimitAnswersAlike(t *testing.T) {
	tb := testbed.New(testbed.Options{})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	s := openAPISidecar(t, proxy.Options{AdminToken: teOpToken,
		Tenants:      []delivery.Tenant{{ID: "acme", MaxSubscriptions: 1}, {ID: "globex"}},
		TenantTokens: []admin.TenantToken{{Token: teAcmeToken, Tenant: "acme"}, {Token: teGlobexToken, Tenant: "globex"}}})
	doc := func(id string) string {
		return jsonOf(map[string]any{"id": id, "url": tb.URL() + "/x", "types": []string{"*"}})
	}
	s.mustCall(t, teGlobexToken, "POST", "/v1/subscriptions", doc("globex-x"), 201, nil)
	s.mustCall(t, teAcmeToken, "POST", "/v1/subscriptions", doc("acme-1"), 201, nil)
	takenCode, taken := s.call(t, teAcmeToken, "POST", "/v1/subscriptions", doc("globex-x"))
	freeCode, free := s.call(t, teAcmeToken, "POST", "/v1/subscriptions", doc("free-id-"))
	taken, free = strings.ReplaceAll(taken, "globex-x", "ID"), strings.ReplaceAll(free, "free-id-", "ID")
	if takenCode != freeCode || taken != free {
		t.Fatalf("at the limit, another tenant's id answers %d %s\nand a free one %d %s", takenCode, taken, freeCode, free)
	}
}

// TestTenantMoveStopsOldTenantsRetries: a subscription the operator moves
// to another tenant never sends that tenant a retry of an event it took
// before the move (another tenant's); the retry becomes a dead letter
// with reason not_entitled that only the operator reads.
func TestTenantMoveStopsOldTenantsRetries(t *testing.T) {
	tb := testbed.New(testbed.Options{})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	tb.SetMode("/mover", testbed.ModeFail)
	s := openAPISidecar(t, proxy.Options{AdminToken: teOpToken,
		Tenants:      []delivery.Tenant{{ID: "acme"}, {ID: "globex"}},
		TenantTokens: []admin.TenantToken{{Token: teAcmeToken, Tenant: "acme"}}})
	s.mustCall(t, "", "POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "mover", "url": tb.URL() + "/mover", "types": []string{"*"},
		"retry": map[string]any{"max_attempts": 50, "base": "20ms", "cap": "50ms"}}), 201, nil)
	s.postAs(t, "globex", "invoice.paid", "globex-ev", `{"email":"someone@globex.example"}`)
	eventually(t, "a retry of globex's event", func() bool { return s.laneOf(t, "mover").Retried >= 1 })
	s.mustCall(t, "", "POST", "/v1/subscriptions/mover/pause", "", 200, nil)
	s.mustCall(t, "", "PATCH", "/v1/subscriptions/mover", `{"tenant": "acme"}`, 200, nil)
	tb.SetMode("/mover", testbed.ModeOK) // were the retry sent, it would be accepted
	s.mustCall(t, "", "POST", "/v1/subscriptions/mover/resume", "", 200, nil)
	eventually(t, "the retry dead-lettered", func() bool { return s.laneOf(t, "mover").DeadLettered == 1 })
	if ids := tb.IDs("/mover"); len(ids) != 0 {
		t.Fatalf("acme's endpoint accepted %v after the move", ids)
	}
	var page api.DeadLetterPage
	s.mustCall(t, "", "GET", "/v1/dead-letters?subscription=mover", "", 200, &page)
	if len(page.DeadLetters) != 1 || page.DeadLetters[0].Reason != policy.ReasonNotEntitled {
		t.Fatalf("dead letters of mover: %+v; want one, not_entitled", page.DeadLetters)
	}
	letter := "/v1/dead-letters/mover/" + strconv.FormatUint(page.DeadLetters[0].Seq, 10)
	s.mustCall(t, teAcmeToken, "GET", letter, "", 404, nil)
	if got := s.mustCall(t, teAcmeToken, "GET", "/v1/subscriptions/mover/attempts", "", 200, nil); strings.Contains(got, "globex-ev") {
		t.Fatalf("acme's attempt log of mover names globex's event:\n%s", got)
	}
	s.mustCall(t, teAcmeToken, "GET", "/v1/dead-letters?subscription=mover", "", 200, &page)
	if len(page.DeadLetters) != 0 {
		t.Fatalf("acme lists %d of mover's dead letters, want none", len(page.DeadLetters))
	}
}
