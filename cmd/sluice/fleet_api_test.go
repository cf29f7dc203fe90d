package main

// End-to-end test of the subscription API in fleet mode: subscriptions created, changed and deleted through one
// node's admin API are served by the whole fleet. Real `sluice serve`
// processes on an embedded 3-node JetStream cluster; helpers in
// fleettest_test.go and fleet_e2e_test.go.
//
//	go test -race -run TestFleetAPI ./cmd/sluice

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	sluicejs "github.com/sluicehq/sluice/queue/jetstream"
	"github.com/sluicehq/sluice/testbed"
)

// fleetAPIToken is the operator token of TestFleetAPISubscriptions' nodes.
const fleetAPIToken = "operator-token-fleet-0123456789"

// call makes one admin request to n with token ("" for none) and returns
// the status and the body.
func (n *fleetNode) call(t *testing.T, token, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://sluice"+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := n.admin.Do(req)
	if err != nil {
		t.Fatalf("%s %s on %s: %v", method, path, n.id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// fleetAPISubID picks the id of the test's subscription so that its lane
// falls where the test needs it (policy.Owner is the fleet's rendezvous
// hashing, fixed by protocol): among a, b and c its owner is c, neither
// the node that creates it (a) nor the one that patches it (b), so both
// reach the owner through the shared KV only; once c is replaced by d,
// the owner is not d, so d's DELETE reaches the owner the same way.
func fleetAPISubID(a, b, c, d string) string {
	for k := 0; ; k++ {
		id := fmt.Sprintf("hooks-%d", k)
		if policy.Owner(id, []string{a, b, c}) == c && policy.Owner(id, []string{a, b, d}) != d {
			return id
		}
	}
}

// TestFleetAPISubscriptions: three nodes with an operator token; one API
// subscription (a body filter, a header, a cap of 1, its secret given
// inline so the receiver verifies every signature) goes through its life
// on different nodes. Its headers are one document for the whole fleet, so
// the receiver cannot tell the nodes apart as the other fleet tests do
// (X-Node): who delivered comes from each node's metrics.
//
//  1. created through a: every node's GET answers 200 soon after (the
//     member watch) and names the same owner, c; the events posted to
//     every node after the 201 reach it (those its filter passes), none
//     accepted before does; only the owner's metrics count attempts, and
//     the receiver never has two of its requests in flight (cap 1, each
//     held 10 ms), so no two nodes deliver it at once;
//  2. patched through b (a header added): the owner c, which hears of it
//     through the shared KV only, shows it within a second of the 200 (in
//     milliseconds; a dispatch in between may still have the old settings,
//     docs/admin-api.md), and every delivery of an event posted after that carries
//     it, from c and, later, from c's successor;
//  3. c is SIGKILLed mid-load: the lane moves to a survivor, still filtered
//     and patched; nothing owed is lost; both survivors still serve it;
//  4. a new node d replaces c and serves everything made before it
//     started; deleted through d, which does not own the lane (202,
//     draining), with a backlog: what was owed is delivered, nothing
//     posted after the 202 is, and once drained and retired it is gone
//     from every node's GET;
//  5. a tenant token issued through a works on b, c and d: it lists acme's
//     subscriptions only, made through a, or through b with the token, and
//     another subscription answers it 404; acme's cap of 1 request in
//     flight holds on whichever node owns its black-hole lanes;
//  6. a create of an id that exists answers 409 on every node, right
//     after the 201 too, and creates of one id racing on three nodes make
//     one subscription (one 201, the others 409) that every node shows
//     alike.
func TestFleetAPISubscriptions(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet API: real sidecars and a JetStream cluster")
	}
	began := time.Now()
	const (
		na, nb, nc, nd = "node-a", "node-b", "node-c", "node-d"
		hold           = 10 * time.Millisecond
	)
	id := fleetAPISubID(na, nb, nc, nd)
	w := newFleetWorld(t, nil, map[string]time.Duration{id: hold})
	w.cfg.AdminToken = fleetAPIToken
	// acme's subscriptions are black holes; the tenant's cap holds them to
	// one request in flight (each owner's: a tenant's lanes may have
	// several owners).
	// The producers post platform events, which the operator shares with
	// acme (the tenant rule, docs/security.md).
	w.cfg.Top = `tenants: [{id: acme, concurrency: {max: 1}, shared_types: ["*"]}]`
	w.recv.tb.SetMode("/acme-1", testbed.ModeBlackhole)
	w.recv.tb.SetMode("/acme-2", testbed.ModeBlackhole)
	a, b, c := w.addNode(na, w.cfg), w.addNode(nb, w.cfg), w.addNode(nc, w.cfg)
	w.startAll()
	t.Logf("fleet up in %v; the subscription is %s", time.Since(began).Round(time.Millisecond), id)
	op := fleetAPIToken
	w.load = newFleetLoad(t, w.current)
	// burst posts n more events spread over every node, and stops.
	burst := func(what string, n int, every time.Duration) {
		t.Helper()
		w.load.run(3, every)
		w.awaitAccepted(what, w.load.accepted()+n)
		w.load.halt()
		w.load.checkProblems(t)
	}

	// Before the subscription exists: not owed to it.
	burst("events before the create", 30, 5*time.Millisecond)

	// 1. Created through a.
	doc := fmt.Sprintf(`{"id": %q, "url": %q, "secret": %q, "types": ["*"],
		"filter": {"type": {"$in": ["t.a", "t.b"]}}, "headers": {"X-Node": "api"},
		"concurrency": {"max": 1}, "retry": {"base": "20ms", "cap": "200ms", "max_attempts": 100, "max_age": "1h"}}`,
		id, w.recv.tb.URL()+"/"+id, e2eSecret)
	createdAt := time.Now()
	if code, body := a.call(t, op, "POST", "/v1/subscriptions", doc); code != http.StatusCreated {
		t.Fatalf("create through %s: %d %s", a.id, code, body)
	}
	created := time.Now()
	t.Logf("created through %s in %v", a.id, created.Sub(createdAt).Round(time.Millisecond))
	// 6. At once, before the other nodes may have heard of it, and after.
	for _, n := range []*fleetNode{b, c, a} {
		if code, body := n.call(t, op, "POST", "/v1/subscriptions", doc); code != http.StatusConflict {
			t.Errorf("create of existing %s through %s: %d %s, want 409", id, n.id, code, body)
		}
	}
	for _, n := range []*fleetNode{b, c} {
		at := fleetAwait(t, "GET "+id+" on "+n.id, 5*time.Second, func() (bool, string) {
			code, body := n.call(t, op, "GET", "/v1/subscriptions/"+id, "")
			return code == http.StatusOK, fmt.Sprintf("%d %s", code, body)
		})
		t.Logf("%s serves %s %v after the 201", n.id, id, at.Sub(created).Round(time.Millisecond))
	}
	w.awaitAPIOwner(id, []*fleetNode{a, b, c}, nc, 15*time.Second)
	for _, n := range []*fleetNode{a, b, c} {
		info := fleetAPIInfo(t, n, op, id)
		if info.ManagedBy != api.ManagedByAPI || info.Config["filter"] == nil || info.Config["secrets_count"] != 1.0 {
			t.Errorf("%s shows %s as %+v", n.id, id, info)
		}
	}

	// 5. Tenant subscriptions and a token issued through a. other's takes
	// a type nothing is posted as; acme's take t.c (which the first one's
	// filter leaves out) and never answer.
	tenantDoc := func(id, tenant, types string) string {
		doc := fmt.Sprintf(`{"id": %q, "url": %q, "secret": %q, "types": %s, "headers": {"X-Node": "api"},
			"timeout": "300ms", "retry": {"base": "50ms", "cap": "200ms", "max_attempts": 100, "max_age": "1h"}`,
			id, w.recv.tb.URL()+"/"+id, e2eSecret, types)
		if tenant != "" {
			doc += fmt.Sprintf(`, "tenant": %q`, tenant)
		}
		return doc + "}"
	}
	for _, s := range [][3]string{{"acme-1", "acme", `["t.c"]`}, {"other-1", "other", `["t.none"]`}} {
		if code, body := a.call(t, op, "POST", "/v1/subscriptions", tenantDoc(s[0], s[1], s[2])); code != http.StatusCreated {
			t.Fatalf("create %s: %d %s", s[0], code, body)
		}
	}
	code, body := a.call(t, op, "POST", "/v1/tenants/acme/tokens", "")
	var tok api.TokenAnswer
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &tok) != nil || tok.Token == "" {
		t.Fatalf("issue acme's token through %s: %d %s", a.id, code, body)
	}
	w.awaitTenantView(b, tok.Token, []string{"acme-1"}, id)
	// The token creates through b; c lists it (its tenant from the KV).
	if code, body := b.call(t, tok.Token, "POST", "/v1/subscriptions", tenantDoc("acme-2", "", `["t.c"]`)); code != http.StatusCreated || !strings.Contains(body, `"tenant": "acme"`) {
		t.Fatalf("create acme-2 with acme's token through %s: %d %s", b.id, code, body)
	}
	w.awaitTenantView(c, tok.Token, []string{"acme-1", "acme-2"}, id)

	// Owed: every event posted after the 201 that the filter passes.
	owedSince := func(at time.Time) func(sub string, ev *fleetEvent) bool {
		return func(sub string, ev *fleetEvent) bool { return ev.firstSent.After(at) && ev.typ != "t.c" }
	}
	burst("events after the create", 60, 30*time.Millisecond)
	w.awaitOwed("events after the create delivered", id, owedSince(created), 30*time.Second)
	w.checkAttemptsOnly(id, nc, []*fleetNode{a, b, c})

	// 2. Patched through b, which does not own the lane.
	code, body = b.call(t, op, "PATCH", "/v1/subscriptions/"+id, `{"headers": {"X-Version": "2"}}`)
	if code != http.StatusOK {
		t.Fatalf("patch through %s: %d %s", b.id, code, body)
	}
	patched := time.Now()
	// The owner hears of it through the member watch, apart from the
	// events (another stream): a dispatch in between still has the old
	// settings, as one in flight at the patch has (docs/admin-api.md). Events posted
	// once the owner shows it must carry it.
	w.load.run(3, 30*time.Millisecond)
	applied := fleetAwait(t, "the owner applies the patch", time.Second, func() (bool, string) {
		h, _ := fleetAPIInfo(t, c, op, id).Config["headers"].(map[string]any)
		return h["X-Version"] == "2", fmt.Sprintf("headers on %s: %v", c.id, h)
	})
	w.awaitAccepted("events after the patch", w.load.accepted()+60)
	w.load.halt()
	w.load.checkProblems(t)
	w.awaitOwed("events after the patch delivered", id, owedSince(created), 30*time.Second)
	t.Logf("the owner %s showed the patch %v after its 200; %d requests of events posted in between went without it",
		c.id, applied.Sub(patched).Round(time.Millisecond), w.countVersion(id, patched, applied, "2"))
	w.checkVersion(id, applied, "2")
	for _, n := range []*fleetNode{a, b} {
		if h, _ := fleetAPIInfo(t, n, op, id).Config["headers"].(map[string]any); h["X-Version"] != "2" {
			t.Errorf("%s shows the headers of %s as %v after the patch", n.id, id, h)
		}
	}

	// 3. The owner is SIGKILLed mid-load.
	w.load.run(3, 30*time.Millisecond)
	w.awaitAccepted("load before the kill", w.load.accepted()+30)
	killed := c.kill()
	survivors := []*fleetNode{a, b}
	movedTo := w.awaitAPIOwner(id, survivors, "", fleetMoveBound+10*time.Second)
	t.Logf("%s SIGKILLed; %s owns %s %v later", c.id, movedTo, id, time.Since(killed).Round(time.Millisecond))
	w.awaitAccepted("load after the kill", w.load.accepted()+60)
	w.load.halt()
	w.load.checkProblems(t)
	w.awaitOwed("every owed event delivered after the kill", id, owedSince(created), 60*time.Second)
	w.checkVersion(id, applied, "2")
	for _, n := range survivors {
		if code, body := n.call(t, op, "GET", "/v1/subscriptions/"+id, ""); code != http.StatusOK {
			t.Errorf("GET %s on %s after the kill: %d %s", id, n.id, code, body)
		}
	}
	w.checkAttemptsOnly(id, movedTo, survivors)

	// 4. d replaces c: it learns every API subscription at start-up.
	d := newFleetNode(t, w.dir, nd, w.recv.tb.URL(), w.cfg)
	w.replace(2, d)
	d.start()
	d.awaitReady(60 * time.Second)
	nodes := []*fleetNode{a, b, d}
	w.awaitAPIOwner(id, nodes, movedTo, 15*time.Second)
	w.awaitTenantView(d, tok.Token, []string{"acme-1", "acme-2"}, id)
	if h, _ := fleetAPIInfo(t, d, op, id).Config["headers"].(map[string]any); h["X-Version"] != "2" {
		t.Errorf("%s shows the headers of %s as %v", d.id, id, h)
	}

	// A backlog owed at the delete (posted faster than the cap of 1 with
	// 10 ms per request drains), then the delete through d.
	burst("backlog before the delete", 120, 2*time.Millisecond)
	code, body = d.call(t, op, "DELETE", "/v1/subscriptions/"+id, "")
	if code != http.StatusAccepted || !strings.Contains(body, `"draining"`) {
		t.Fatalf("delete through %s: %d %s", d.id, code, body)
	}
	deleted := time.Now()
	owedAtDelete, _ := w.recv.missing(w.load.list(), owedSince(created), []string{id})
	t.Logf("deleted through %s with %d owed events not yet delivered", d.id, owedAtDelete)
	if code, body := d.call(t, op, "PATCH", "/v1/subscriptions/"+id, `{"headers": {"X-Version": "3"}}`); code != http.StatusNotFound {
		t.Errorf("patch of the deleted %s through %s: %d %s, want 404", id, d.id, code, body)
	}
	burst("events after the delete", 40, 10*time.Millisecond)
	for _, n := range nodes {
		fleetAwait(t, id+" gone from "+n.id, 30*time.Second, func() (bool, string) {
			code, body := n.call(t, op, "GET", "/v1/subscriptions/"+id, "")
			return code == http.StatusNotFound, fmt.Sprintf("%d %s", code, body)
		})
	}
	t.Logf("%s retired everywhere %v after the delete", id, time.Since(deleted).Round(time.Millisecond))
	owedBefore := func(sub string, ev *fleetEvent) bool {
		return owedSince(created)(sub, ev) && ev.accepted.Before(deleted)
	}
	if n, state := w.recv.missing(w.load.list(), owedBefore, []string{id}); n > 0 {
		t.Errorf("retired with owed events undelivered: %s", state)
	}

	// 6. Creates of one id racing on three nodes.
	var wg sync.WaitGroup
	codes := make([]int, len(nodes))
	answers := make([]string, len(nodes))
	for i, n := range nodes {
		wg.Go(func() {
			doc := fmt.Sprintf(`{"id": "race", "url": %q, "types": ["t.none"]}`, w.recv.tb.URL()+"/race-from-"+n.id)
			codes[i], answers[i] = n.call(t, op, "POST", "/v1/subscriptions", doc)
		})
	}
	wg.Wait()
	winners := 0
	for i, code := range codes {
		switch code {
		case http.StatusCreated:
			winners++
		case http.StatusConflict:
		default:
			t.Errorf("racing create through %s: %d %s", nodes[i].id, code, answers[i])
		}
	}
	if winners != 1 {
		t.Errorf("racing creates of one id on three nodes: %d answered 201, want 1: %v", winners, codes)
	}
	fleetAwait(t, "every node shows the one race subscription alike", 10*time.Second, func() (bool, string) {
		var urls []string
		for _, n := range nodes {
			code, body := n.call(t, op, "GET", "/v1/subscriptions/race", "")
			var info api.SubscriptionInfo
			if code != http.StatusOK || json.Unmarshal([]byte(body), &info) != nil {
				return false, fmt.Sprintf("%s: %d %s", n.id, code, body)
			}
			urls = append(urls, fmt.Sprint(info.Config["url"]))
		}
		return urls[0] == urls[1] && urls[1] == urls[2], fmt.Sprintf("urls %v", urls)
	})

	// The black holes answer again, so that nothing is held at shutdown.
	w.recv.tb.SetMode("/acme-1", testbed.ModeOK)
	w.recv.tb.SetMode("/acme-2", testbed.ModeOK)
	w.recv.tb.Release()
	for _, n := range nodes {
		n.term(20 * time.Second)
	}
	w.recv.checkProblems(t)

	// What the receiver saw of the subscription.
	got := w.recv.snapshot()[id]
	evs := w.load.list()
	late := 0
	for _, ev := range evs {
		rs := got[ev.key]
		switch {
		case len(rs) == 0:
		case ev.accepted.Before(createdAt):
			t.Errorf("%s (seq %d) was accepted before the create began, delivered to %s", ev.key, ev.seq, id)
		case ev.typ == "t.c":
			t.Errorf("%s of type t.c delivered to %s, whose filter takes t.a and t.b", ev.key, id)
		case ev.firstSent.After(deleted):
			if late++; late <= 3 {
				t.Errorf("%s (seq %d) was posted after the delete's 202, delivered to %s", ev.key, ev.seq, id)
			}
		}
	}
	if st := w.recv.tb.Stats()["/"+id]; st.MaxInFlight > 1 {
		t.Errorf("the receiver saw %d requests of %s in flight at once, cap 1: two owners delivering", st.MaxInFlight, id)
	}
	for _, other := range []string{"other-1", "race"} {
		if len(w.recv.snapshot()[other]) > 0 {
			t.Errorf("deliveries to %s, whose type nothing was posted as", other)
		}
	}
	for _, sub := range []string{"acme-1", "acme-2"} {
		st := w.recv.tb.Stats()["/"+sub]
		t.Logf("%s (a black hole): %d requests, at most %d in flight", sub, st.Requests, st.MaxInFlight)
		switch {
		case st.Requests == 0:
			t.Errorf("%s got no request: the tenant cap was not exercised", sub)
		case st.MaxInFlight > 1:
			t.Errorf("%s had %d requests in flight at once; its tenant's concurrency cap is 1", sub, st.MaxInFlight)
		}
	}
	t.Logf("fleet API: %d events accepted, %d deliveries of %s; %v in all", len(evs), len(got), id, time.Since(began).Round(time.Millisecond))
}

// fleetAPIInfo reads GET /v1/subscriptions/{id} on n.
func fleetAPIInfo(t *testing.T, n *fleetNode, token, id string) api.SubscriptionInfo {
	t.Helper()
	code, body := n.call(t, token, "GET", "/v1/subscriptions/"+id, "")
	var info api.SubscriptionInfo
	if code != http.StatusOK {
		t.Fatalf("GET %s on %s: %d %s", id, n.id, code, body)
	}
	if err := json.Unmarshal([]byte(body), &info); err != nil {
		t.Fatalf("GET %s on %s: %v: %s", id, n.id, err, body)
	}
	return info
}

// awaitAPIOwner waits until every node's admin API names the same live
// owner of sub, want if given, one of nodes otherwise; it returns it.
func (w *fleetWorld) awaitAPIOwner(sub string, nodes []*fleetNode, want string, timeout time.Duration) string {
	w.t.Helper()
	var ids []string
	for _, n := range nodes {
		ids = append(ids, n.id)
	}
	var owner string
	fleetAwait(w.t, "one owner of "+sub+" named by "+strings.Join(ids, ", "), timeout, func() (bool, string) {
		var seen []string
		for _, n := range nodes {
			o, err := n.owners()
			if err != nil {
				return false, err.Error()
			}
			seen = append(seen, o[sub])
		}
		owner = seen[0]
		ok := slices.Contains(ids, owner) && (want == "" || owner == want)
		for _, o := range seen {
			ok = ok && o == owner
		}
		return ok, fmt.Sprintf("owners named %v, want one of %v (%q)", seen, ids, want)
	})
	return owner
}

// awaitTenantView waits until tok's GET /v1/subscriptions on n lists
// exactly want, and checks that notMine answers it 404.
func (w *fleetWorld) awaitTenantView(n *fleetNode, tok string, want []string, notMine string) {
	t := w.t
	t.Helper()
	// A node applies a membership another wrote when its watch brings the
	// write, in milliseconds, unless the read of it fails: that read waits
	// up to request_timeout, and the one the node retries with (soon after)
	// as long again. A node that never learns it fails here all the same.
	within := 2 * sluicejs.DefaultRequestTimeout
	fleetAwait(t, "the tenant token's view on "+n.id, within, func() (bool, string) {
		code, body := n.call(t, tok, "GET", "/v1/subscriptions", "")
		var list api.SubscriptionList
		if code != http.StatusOK || json.Unmarshal([]byte(body), &list) != nil {
			return false, fmt.Sprintf("%d %s", code, body)
		}
		var got []string
		for _, l := range list.Subscriptions {
			got = append(got, l.Subscription+"/"+l.Tenant)
		}
		var exp []string
		for _, s := range want {
			exp = append(exp, s+"/acme")
		}
		return slices.Equal(got, exp), fmt.Sprintf("lists %v, want %v", got, exp)
	})
	if code, body := n.call(t, tok, "GET", "/v1/subscriptions/"+notMine, ""); code != http.StatusNotFound {
		t.Errorf("GET %s with acme's token on %s: %d %s, want 404", notMine, n.id, code, body)
	}
}

// awaitOwed waits until every accepted event owed to sub was acknowledged.
func (w *fleetWorld) awaitOwed(what, sub string, owed func(sub string, ev *fleetEvent) bool, timeout time.Duration) {
	w.t.Helper()
	evs := w.load.list()
	fleetAwait(w.t, what, timeout, func() (bool, string) {
		n, state := w.recv.missing(evs, owed, []string{sub})
		return n == 0, state
	})
}

// checkAttemptsOnly checks that of nodes only owner counts delivery
// attempts of sub (a process's counters start at its start).
func (w *fleetWorld) checkAttemptsOnly(sub, owner string, nodes []*fleetNode) {
	w.t.Helper()
	for _, n := range nodes {
		m, err := n.metrics()
		if err != nil {
			w.t.Fatalf("metrics of %s: %v", n.id, err)
		}
		got, _ := metricSum(m, "sluice_delivery_attempts_total", `subscription="`+sub+`"`)
		switch {
		case n.id == owner && got == 0:
			w.t.Errorf("%s owns %s and counts no delivery attempts", n.id, sub)
		case n.id != owner && got > 0:
			w.t.Errorf("%s does not own %s and counts %v delivery attempts of it", n.id, sub, got)
		}
	}
}

// countVersion counts the requests of sub for events posted between from
// and to that did not carry X-Version want.
func (w *fleetWorld) countVersion(sub string, from, to time.Time, want string) int {
	got := w.recv.snapshot()[sub]
	n := 0
	for _, ev := range w.load.list() {
		if ev.firstSent.After(from) && ev.firstSent.Before(to) {
			for _, r := range got[ev.key] {
				if r.version != want {
					n++
				}
			}
		}
	}
	return n
}

// checkVersion checks that every request of sub for an event posted
// after since carried X-Version want.
func (w *fleetWorld) checkVersion(sub string, since time.Time, want string) {
	w.t.Helper()
	got := w.recv.snapshot()[sub]
	bad := 0
	for _, ev := range w.load.list() {
		if !ev.firstSent.After(since) {
			continue
		}
		for _, r := range got[ev.key] {
			if r.version != want {
				if bad++; bad <= 3 {
					w.t.Errorf("%s (seq %d, posted %v after the owner showed the patch) reached %s with X-Version %q, want %q",
						ev.key, ev.seq, ev.firstSent.Sub(since).Round(time.Millisecond), sub, r.version, want)
				}
			}
		}
	}
	if bad > 3 {
		w.t.Errorf("%d requests of %s in all without X-Version %q", bad, sub, want)
	}
}
