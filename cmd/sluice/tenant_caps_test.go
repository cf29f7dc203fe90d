package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// TestTenantCapHoldsAgainstABlackHole: tenant acme's concurrency cap (3)
// bounds its three subscriptions together (each with a cap of 4 of its
// own, two from the file and one from the API) at a black hole: the hole
// never holds more than 3 of acme's requests at once, and does hold 3.
// Meanwhile another tenant's subscription gets every event, while acme's
// still wait; once the hole answers, acme's get every event too, none
// dead-lettered.
//
// The hole hangs up after MaxHold, well before the subscriptions'
// timeout: the hole then stops counting a request before sluice learns it
// ended and frees its slot, so the hole's count never exceeds sluice's.
// Were sluice's timeout to end each request, sluice would close the
// connection, reuse the slot and send the next request while the hole
// may not yet have read the close, and it would count one too many for a
// moment.
func TestTenantCapHoldsAgainstABlackHole(t *testing.T) {
	const events, tenantCap = 8, 3
	var hole *testbed.Server
	var maxAtArrival atomic.Int64
	hole = testbed.New(testbed.Options{Mode: testbed.ModeBlackhole, MaxHold: 200 * time.Millisecond,
		Hook: func(r testbed.Request, status int) int {
			if status == 0 {
				// Those held now, and this one, about to be.
				n := hole.Totals().Holding + 1
				for m := maxAtArrival.Load(); n > m && !maxAtArrival.CompareAndSwap(m, n); m = maxAtArrival.Load() {
				}
			}
			return status
		}})
	if err := hole.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hole.Close() })
	healthy := testbed.New(testbed.Options{})
	if err := healthy.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { healthy.Close() })

	k, _ := signing.ParseSecret(e2eSecret)
	retry := policy.RetryPolicy{MaxAttempts: 100, MaxAge: time.Hour, Backoff: policy.Backoff{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond}}
	fileSub := func(id, tenant, url string) *delivery.Subscription {
		return &delivery.Subscription{ID: id, Tenant: tenant, URL: url, Secrets: []signing.Secret{k}, MaxConcurrency: 4, Timeout: 2 * time.Second, Retry: retry}
	}
	s := openAPISidecar(t, proxy.Options{AdminToken: isoOpToken,
		TenantTokens: []admin.TenantToken{{Token: isoAcmeToken, Tenant: "acme"}},
		// The events are platform events both tenants receive: the operator
		// shares every type with them (the tenant rule, docs/security.md).
		Tenants: []delivery.Tenant{{ID: "acme", MaxConcurrency: tenantCap, SharedTypes: []string{"*"}}, {ID: "other", SharedTypes: []string{"*"}}},
		// Retries are not what this test is about: let them all through.
		RetryBudget: policy.BudgetConfig{Ratio: 1, MinPerSecond: 10_000},
		Subscriptions: []*delivery.Subscription{
			fileSub("acme-1", "acme", hole.URL()+"/acme-1"), fileSub("acme-2", "acme", hole.URL()+"/acme-2"),
			fileSub("other-ok", "other", healthy.URL()+"/other-ok"),
		}})
	s.mustCall(t, isoAcmeToken, "POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "acme-3", "url": hole.URL() + "/acme-3",
		"concurrency": map[string]any{"max": 4}, "timeout": "2s",
		"retry": map[string]any{"max_attempts": 100, "max_age": "1h", "base": "5ms", "cap": "50ms"}}), 201, nil)
	acme := []string{"acme-1", "acme-2", "acme-3"}

	// Sample what the hole holds, and the in_flight of acme's lanes as the
	// API shows them, until the hole heals.
	var maxHeld, maxLanes atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if n := hole.Totals().Holding; n > maxHeld.Load() {
				maxHeld.Store(n)
			}
			req, _ := http.NewRequest("GET", s.srv.AdminURL()+"/v1/subscriptions?tenant=acme", nil)
			req.Header.Set("Authorization", "Bearer "+isoOpToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				continue
			}
			var list api.SubscriptionList
			json.NewDecoder(resp.Body).Decode(&list)
			resp.Body.Close()
			sum := 0
			for _, l := range list.Subscriptions {
				sum += l.InFlight
			}
			if int64(sum) > maxLanes.Load() {
				maxLanes.Store(int64(sum))
			}
		}
	}()

	for i := range events {
		s.publish(t, "t.e", fmt.Sprintf("ev-%d", i))
	}
	// The other tenant is not held up: every event arrives while acme's
	// wait at the hole.
	waitFor(t, healthy, "the other tenant's deliveries", func(m map[string]testbed.PathStats) bool { return m["/other-ok"].Unique == events })
	delivered := 0
	for _, id := range acme {
		delivered += int(s.laneOf(t, id).Delivered)
	}
	if delivered != 0 {
		t.Fatalf("acme's lanes delivered %d to a black hole", delivered)
	}
	// Let the hole turn a few slots over: three rounds of its hold.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hole.Wait(ctx, func(map[string]testbed.PathStats) bool { return hole.Totals().Held >= 3*tenantCap }); err != nil {
		t.Fatalf("the hole held %d requests: %v", hole.Totals().Held, err)
	}
	hole.SetMode("", testbed.ModeOK)
	close(stop)
	wg.Wait()
	if held, at := maxHeld.Load(), maxAtArrival.Load(); held > tenantCap || at > tenantCap || max(held, at) < tenantCap {
		t.Errorf("the black hole held at most %d of acme's requests at once (sampled), %d (at arrivals); want the tenant's cap, %d",
			held, at, tenantCap)
	}
	// The lanes' in_flight is shown, not asserted: a lane gives its
	// tenant's slot back (outcome.go, releaseSlot) before it takes the
	// finished request off its own count, and another lane may start one
	// in between, so a list read in that moment can sum to one more than
	// the cap while the endpoint holds no more than the cap.
	t.Logf("acme's lanes showed at most %d in flight together; the hole held at most %d (%d at arrivals) of %d held in all",
		maxLanes.Load(), maxHeld.Load(), maxAtArrival.Load(), hole.Totals().Held)

	// Healed: nothing was lost.
	waitFor(t, hole, "acme's deliveries once the hole answers", func(m map[string]testbed.PathStats) bool {
		for _, id := range acme {
			if m["/"+id].Unique != events {
				return false
			}
		}
		return true
	})
	for _, id := range append(acme, "other-ok") {
		if l := s.laneOf(t, id); l.DeadLettered != 0 {
			t.Errorf("%s dead-lettered %d", id, l.DeadLettered)
		}
	}
}

// TestTenantMaxSubscriptions: a tenant's max_subscriptions refuses one
// more (409 naming the tenant), whoever asks and however (a create with
// the tenant's token or the operator's, a patch moving one in), and the
// refusal changes nothing; deleting one makes room.
func TestTenantMaxSubscriptions(t *testing.T) {
	tb := startReceiver(t)
	k, _ := signing.ParseSecret(e2eSecret)
	s := openAPISidecar(t, proxy.Options{AdminToken: isoOpToken,
		TenantTokens:  []admin.TenantToken{{Token: isoAcmeToken, Tenant: "acme"}},
		Tenants:       []delivery.Tenant{{ID: "acme", MaxSubscriptions: 2}},
		Subscriptions: []*delivery.Subscription{{ID: "acme-file", Tenant: "acme", URL: tb.URL() + "/acme-file", Secrets: []signing.Secret{k}}}})
	doc := func(id string, kv ...any) string {
		m := map[string]any{"id": id, "url": tb.URL() + "/" + id, "secret": e2eSecret}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return jsonOf(m)
	}
	s.mustCall(t, isoAcmeToken, "POST", "/v1/subscriptions", doc("acme-2"), 201, nil)
	s.mustCall(t, "", "POST", "/v1/subscriptions", doc("free"), 201, nil)
	s.refuses(t, []apiError{
		{name: "with the tenant's token", token: isoAcmeToken, method: "POST", path: "/v1/subscriptions", body: doc("acme-3"), status: 409,
			want: []string{"tenant acme", "max_subscriptions"}},
		{name: "with the operator's token", method: "POST", path: "/v1/subscriptions", body: doc("acme-3", "tenant", "acme"), status: 409,
			want: []string{"tenant acme", "max_subscriptions"}},
		{name: "a patch moving one in", method: "PATCH", path: "/v1/subscriptions/free", body: `{"tenant": "acme"}`, status: 409,
			want: []string{"tenant acme", "max_subscriptions"}},
	})
	// Another tenant is not bound by acme's limit, and a patch within
	// acme counts once.
	s.mustCall(t, "", "POST", "/v1/subscriptions", doc("other-1", "tenant", "other"), 201, nil)
	s.mustCall(t, isoAcmeToken, "PATCH", "/v1/subscriptions/acme-2", `{"timeout": "3s"}`, 200, nil)
	// A deleted one makes room at once: it takes no new events.
	s.mustCall(t, isoAcmeToken, "DELETE", "/v1/subscriptions/acme-2", "", 202, nil)
	s.mustCall(t, isoAcmeToken, "POST", "/v1/subscriptions", doc("acme-3"), 201, nil)
	if code, body := s.call(t, isoAcmeToken, "POST", "/v1/subscriptions", doc("acme-4")); code != 409 || !strings.Contains(body, "max_subscriptions") {
		t.Fatalf("a third of acme's: %d %s", code, body)
	}
}

// TestTenantCapPassesOnWhenAWaitingLaneIsPaused: lanes of a tenant that
// wait for its cap (1) are paused while they wait; when the slot frees,
// the one lane still active gets it. (A freed slot went to one waiting
// lane; one paused since took nothing, and the slot stayed free while
// the active lane waited for a release that never came.)
func TestTenantCapPassesOnWhenAWaitingLaneIsPaused(t *testing.T) {
	slow := testbed.New(testbed.Options{Mode: testbed.ModeSlow, Delay: 300 * time.Millisecond})
	if err := slow.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	tb := startReceiver(t)
	k, _ := signing.ParseSecret(e2eSecret)
	mk := func(id, url, typ string) *delivery.Subscription {
		return &delivery.Subscription{ID: id, Tenant: "acme", URL: url, Secrets: []signing.Secret{k}, Types: []string{typ}, Timeout: 5 * time.Second}
	}
	subs := []*delivery.Subscription{mk("holder", slow.URL()+"/holder", "hold.e"), mk("active", tb.URL()+"/active", "x.e")}
	var paused []string
	for i := range 8 {
		id := fmt.Sprintf("paused-%d", i)
		paused = append(paused, id)
		subs = append(subs, mk(id, tb.URL()+"/"+id, "x.e"))
	}
	s := openAPISidecar(t, proxy.Options{AdminToken: isoOpToken, Subscriptions: subs,
		Tenants: []delivery.Tenant{{ID: "acme", MaxConcurrency: 1, SharedTypes: []string{"*"}}}}) // platform events shared with acme
	s.publish(t, "hold.e", "hold-1") // holder takes acme's one slot for 300ms
	eventually(t, "the holder in flight", func() bool { return s.laneOf(t, "holder").InFlight == 1 })
	s.publish(t, "x.e", "x-1") // every other lane waits for the slot
	for _, id := range paused {
		s.mustCall(t, "", "POST", "/v1/subscriptions/"+id+"/pause", "", 200, nil)
	}
	waitFor(t, tb, "the active lane's delivery once the holder's ends", func(m map[string]testbed.PathStats) bool { return m["/active"].Unique == 1 })
	for _, id := range paused {
		if n := len(tb.IDs("/" + id)); n != 0 {
			t.Errorf("paused %s delivered %d", id, n)
		}
	}
}

// TestTenantDefaultsBoundUnlistedTenants: a tenant the config does not
// list (a token may be issued for any tenant id) is bound by
// tenant_defaults: its max_subscriptions, and the cap its token may give
// one subscription (refused 400 naming concurrency.max and the bound;
// a document that sets no cap gets the bound, not a default above it). A
// listed tenant's own bound replaces the default's; the operator is not
// bounded by it.
func TestTenantDefaultsBoundUnlistedTenants(t *testing.T) {
	tb := startReceiver(t)
	s := openAPISidecar(t, proxy.Options{AdminToken: isoOpToken,
		Tenants:        []delivery.Tenant{{ID: "acme", MaxSubscriptionConcurrency: 20}},
		TenantDefaults: delivery.Tenant{MaxSubscriptions: 3, MaxSubscriptionConcurrency: 8}})
	var tok api.TokenAnswer
	s.mustCall(t, "", "POST", "/v1/tenants/initech/tokens", "", 201, &tok)
	doc := func(id string, kv ...any) string {
		m := map[string]any{"id": id, "url": tb.URL() + "/" + id, "secret": e2eSecret}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return jsonOf(m)
	}
	s.refuses(t, []apiError{
		{name: "a cap of 10000", token: tok.Token, method: "POST", path: "/v1/subscriptions", body: doc("big", "concurrency", map[string]any{"max": 10000}),
			status: 400, want: []string{"concurrency.max", "10000", "initech", "8", "max_subscription_concurrency"}},
		{name: "an auto cap up to 64", token: tok.Token, method: "POST", path: "/v1/subscriptions", body: doc("big", "concurrency", map[string]any{"auto": true, "max": 64}),
			status: 400, want: []string{"concurrency.max", "64", "8"}},
	})
	s.mustCall(t, tok.Token, "POST", "/v1/subscriptions", doc("plain"), 201, nil)
	s.mustCall(t, tok.Token, "POST", "/v1/subscriptions", doc("auto", "concurrency", map[string]any{"auto": true}), 201, nil)
	s.mustCall(t, tok.Token, "POST", "/v1/subscriptions", doc("small", "concurrency", map[string]any{"max": 4}), 201, nil)
	if c := s.laneOf(t, "plain").Cap; c != 8 {
		t.Errorf("a subscription that sets no cap: cap %d, want the bound 8 (not the default 16)", c)
	}
	var info api.SubscriptionInfo
	s.mustCall(t, tok.Token, "GET", "/v1/subscriptions/auto", "", 200, &info)
	if c, _ := info.Config["concurrency"].(map[string]any); c["max"] != float64(8) || c["auto"] != true {
		t.Errorf("an auto cap with no max: %v, want max 8", info.Config["concurrency"])
	}
	s.refuses(t, []apiError{
		{name: "a patch past the bound", token: tok.Token, method: "PATCH", path: "/v1/subscriptions/small", body: `{"concurrency": {"max": 9}}`,
			status: 400, want: []string{"concurrency.max", "9", "8"}},
		{name: "past the default max_subscriptions", token: tok.Token, method: "POST", path: "/v1/subscriptions", body: doc("fourth"),
			status: 409, want: []string{"tenant initech", "max_subscriptions"}},
	})
	// acme's own bound (20) replaces the default's; its max_subscriptions
	// is the default's (3).
	s.mustCall(t, "", "POST", "/v1/tenants/acme/tokens", "", 201, &tok)
	s.mustCall(t, tok.Token, "POST", "/v1/subscriptions", doc("acme-20", "concurrency", map[string]any{"max": 20}), 201, nil)
	if code, body := s.call(t, tok.Token, "POST", "/v1/subscriptions", doc("acme-21", "concurrency", map[string]any{"max": 21})); code != 400 || !strings.Contains(body, "20") {
		t.Errorf("acme past its own bound: %d %s", code, body)
	}
	// The operator sets what it likes for a tenant.
	s.mustCall(t, "", "POST", "/v1/subscriptions", doc("op-made", "tenant", "acme", "concurrency", map[string]any{"max": 500}), 201, nil)
}
