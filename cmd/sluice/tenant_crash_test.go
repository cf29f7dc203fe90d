package main

// Tenant isolation (the tenant rule, docs/security.md) end to end across crashes: a
// producer posts events of acme, of globex and of the platform to real
// `sluice serve` processes, on the Badger log across a SIGKILL and on
// JetStream across a fleet takeover; every event acknowledged 202 reaches
// exactly the endpoints entitled to it. The in-process test of the same
// rule, with the ledger and dead letters, is tenant_events_test.go.
//
//	go test -race -run 'TestTenantEventsSurviveSIGKILL|TestFleetTenantEventsAcrossTakeover' ./cmd/sluice
//
// Both reuse the fleet tests' receiver (fleetRecorder: signatures
// verified, every request recorded whatever its answer, an endpoint held
// to make it slow) and their event bodies (fleetBody).

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tenantKind is who owns an event and its type.
type tenantKind struct {
	tenant string // Sluice-Tenant; "" for a platform event
	typ    string
}

// tenantKinds are the tenant tests' events in turn: key tk-<n> is
// tenantKinds[n%4], so the receiver knows each event's owner from its
// webhook-id alone, whether or not its POST was answered.
var tenantKinds = [...]tenantKind{
	{"acme", "acme.order.created"},
	{"globex", "globex.invoice.paid"},
	{"", "status.up"},      // platform, shared with acme (status.*)
	{"", "platform.audit"}, // platform, shared with no tenant
}

// tenantTestTenants is the tenants section of both tests' config.
const tenantTestTenants = `tenants: [{id: acme, shared_types: ["status.*"]}, {id: globex}]`

// tenantTestSubs: each tenant subscribes to everything (types ["*"], the
// way a tenant would try to read other tenants' events) and so does the
// operator.
var tenantTestSubs = []string{"ops-all", "acme-all", "globex-all"}

func tenantKey(n int) string { return "tk-" + strconv.Itoa(n) }

// tenantKeyKind is the kind of a tenant test's key; zero for any other.
func tenantKeyKind(key string) tenantKind {
	s, ok := strings.CutPrefix(key, "tk-")
	if !ok {
		return tenantKind{}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return tenantKind{}
	}
	return tenantKinds[n%len(tenantKinds)]
}

// tenantEntitled is the tenant rule (a tenant's subscription receives only
// its tenant's events and the types shared with it; platform events reach
// the operator's only) for tenantTestTenants and tenantTestSubs,
// spelt out rather than computed by sluice's own matcher.
func tenantEntitled(sub string, ev *fleetEvent) bool {
	k := tenantKeyKind(ev.key)
	switch sub {
	case "ops-all":
		return k.typ != ""
	case "acme-all":
		return k.tenant == "acme" || k.tenant == "" && strings.HasPrefix(k.typ, "status.")
	case "globex-all":
		return k.tenant == "globex"
	}
	return false
}

// checkTenantEntitlement fails for every request, whatever it was
// answered, that an endpoint got of an event it is not entitled to.
func checkTenantEntitlement(t *testing.T, r *fleetRecorder) {
	t.Helper()
	got := r.snapshot()
	bad := 0
	for sub, byID := range got {
		if !slices.Contains(tenantTestSubs, sub) {
			t.Errorf("requests at /%s, which no subscription names", sub)
			continue
		}
		for id, reqs := range byID {
			if !tenantEntitled(sub, &fleetEvent{key: id}) {
				if bad++; bad <= 10 {
					k := tenantKeyKind(id)
					t.Errorf("%s received %s (tenant %q, type %s) %d times, from %s: not entitled to it",
						sub, id, k.tenant, k.typ, len(reqs), reqs[0].node)
				}
			}
		}
	}
	if bad > 10 {
		t.Errorf("%d more events delivered where they are not entitled", bad-10)
	}
}

// tenantSubsYAML are the subscriptions of tenantTestSubs for the
// single-node test, in the form of fleetSub's, so fleetRecorder takes
// their requests.
func tenantSubsYAML(recvURL string, slots int) string {
	var b strings.Builder
	for _, s := range []struct{ id, extra string }{
		{"ops-all", ""},
		{"acme-all", fmt.Sprintf("    tenant: acme\n    concurrency: {max: %d}\n", slots)},
		{"globex-all", "    tenant: globex\n"},
	} {
		fmt.Fprintf(&b, "  - id: %s\n    url: %s/%s\n    secret: %s\n    types: [\"*\"]\n    headers: {X-Node: solo}\n"+
			"    retry: {base: 10ms, cap: 100ms, max_attempts: 100, max_age: 1h}\n%s", s.id, recvURL, s.id, e2eSecret, s.extra)
	}
	return b.String()
}

// TestTenantEventsSurviveSIGKILL: one `sluice serve` on the Badger log,
// tenants acme (shared_types status.*) and globex, a subscription of
// each to everything and the operator's. Producers post acme's, globex's,
// status.up and platform.audit events without pause; acme's endpoint is
// slow (each request held, 2 in flight), so it has deliveries in flight
// and owed when the sidecar is SIGKILLed mid-stream. Restarted on the
// same data dir, the producers go on. At the end every event answered
// 202 reached every endpoint entitled to it (at least once), and no
// endpoint got one request of an event it is not entitled to.
func TestTenantEventsSurviveSIGKILL(t *testing.T) {
	began := time.Now()
	const (
		hold     = 25 * time.Millisecond // acme's endpoint's latency
		slots    = 2
		perPhase = 150 // events accepted before the kill, and after it
	)
	recv := newFleetRecorder(t, map[string]time.Duration{"acme-all": hold})
	// The list is the file's last key, subscriptions; tenants follows it.
	sc := newSidecar(t, t.TempDir(), tenantSubsYAML(recv.tb.URL(), slots)+tenantTestTenants+"\n")
	sc.start()

	var (
		mu       sync.Mutex
		accepted []*fleetEvent
		next     atomic.Int64
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(accepted) }
	list := func() []*fleetEvent { mu.Lock(); defer mu.Unlock(); return slices.Clone(accepted) }
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := tenantKey(int(next.Add(1) - 1))
				k := tenantKeyKind(key)
				code, err := sc.postAs(k.tenant, k.typ, key, fleetBody(key, k.typ))
				switch {
				case err == nil && code == http.StatusAccepted:
					mu.Lock()
					accepted = append(accepted, &fleetEvent{key: key, typ: k.typ, accepted: time.Now()})
					mu.Unlock()
					continue
				case err == nil && code != http.StatusServiceUnavailable:
					t.Errorf("POST %s: %d, want 202 (or 503 while starting)", key, code)
					return
				}
				// Down or starting: the key's fate is unknown, so it is not
				// owed; if it was stored, the receiver still checks where
				// it goes. The next key tries again a little later.
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		})
	}
	t.Cleanup(func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	})

	fleetAwait(t, "events accepted before the kill", 30*time.Second, func() (bool, string) {
		return count() >= perPhase, fmt.Sprintf("%d accepted", count())
	})
	// What the kill must interrupt: acme's requests in flight and acme's
	// accepted events not yet delivered.
	fleetAwait(t, "acme's deliveries in flight and owed", 10*time.Second, func() (bool, string) {
		owed, state := recv.missing(list(), tenantEntitled, []string{"acme-all"})
		in := recv.nodeInFlight("solo")
		return owed > 0 && in > 0, fmt.Sprintf("%s; %d in flight", state, in)
	})
	owed, state := recv.missing(list(), tenantEntitled, tenantTestSubs)
	killedAt := count()
	sc.kill()
	t.Logf("SIGKILLed with %d events accepted, %d deliveries owed (%s), %v in", killedAt, owed, state, time.Since(began).Round(time.Millisecond))
	sc.start()
	fleetAwait(t, "events accepted after the restart", 30*time.Second, func() (bool, string) {
		return count() >= killedAt+perPhase, fmt.Sprintf("%d accepted", count())
	})
	close(stop)
	wg.Wait()

	// acme's endpoint is the slowest: at worst every event waits its turn
	// there, slots at a time, one hold each; the rest is slack for a busy
	// machine.
	evs := list()
	drain := time.Duration(len(evs)) * hold / slots
	settled := fleetAwait(t, "every accepted event at every entitled endpoint", drain+30*time.Second, func() (bool, string) {
		n, state := recv.missing(evs, tenantEntitled, tenantTestSubs)
		return n == 0, state
	})
	recv.checkProblems(t)
	checkTenantEntitlement(t, recv)
	st := recv.tb.Stats()
	var dups int64
	for _, sub := range tenantTestSubs {
		dups += st["/"+sub].Duplicates
	}
	t.Logf("%d events accepted (%d posted), all delivered where entitled %v after the last one; %d duplicates; %v in all",
		len(evs), next.Load(), settled.Sub(evs[len(evs)-1].accepted).Round(time.Millisecond), dups, time.Since(began).Round(time.Millisecond))
}

// tenantFleetSubs are tenantTestSubs on the fleet harness.
func tenantFleetSubs(slots int) []fleetSub {
	retry := "retry: {base: 10ms, cap: 100ms, max_attempts: 100, max_age: 1h}"
	return []fleetSub{
		{ID: "ops-all", Extra: retry},
		{ID: "acme-all", Extra: fmt.Sprintf("tenant: acme\nconcurrency: {max: %d}\n%s", slots, retry)},
		{ID: "globex-all", Extra: "tenant: globex\n" + retry},
	}
}

// TestFleetTenantEventsAcrossTakeover: the same tenants and subscriptions
// on three `sluice serve` nodes sharing a 3-node JetStream cluster.
// Producers spread over the nodes post acme's, globex's and platform
// events; acme's endpoint is slow, and its lane's owner is SIGKILLed
// while it has acme's requests in flight and events owed, so another node
// takes the lane over (within lease_ttl + 2 s, as killSluice checks) and
// delivers what the dead node left. At the end every event answered 202
// by any node reached every endpoint entitled to it, and no endpoint got
// one request of an event it is not entitled to, from any node.
func TestFleetTenantEventsAcrossTakeover(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet: real sidecars and a JetStream cluster")
	}
	began := time.Now()
	const (
		hold     = 20 * time.Millisecond // acme's endpoint's latency
		slots    = 2
		perPhase = 200 // events accepted before the kill, and after it
	)
	w := newFleetWorld(t, tenantFleetSubs(slots), map[string]time.Duration{"acme-all": hold})
	w.cfg.Top = tenantTestTenants
	ids := []string{"node-a", "node-b", "node-c"}
	for _, id := range ids {
		w.addNode(id, w.cfg)
	}
	w.startAll()
	w.awaitOwned("every lane owned at start", w.nodes[0], ids, 30*time.Second)
	t.Logf("fleet up in %v", time.Since(began).Round(time.Millisecond))

	// 4 producers, one event per 10 ms each: acme is owed half of them,
	// 200/s, more than its endpoint takes (slots per hold, 100/s).
	w.load = newFleetLoad(t, w.current)
	w.load.key = tenantKey
	w.load.run(4, 10*time.Millisecond)
	w.awaitAccepted("load before the kill", perPhase)
	owners := w.awaitOwned("owners before the kill", w.nodes[0], ids, 30*time.Second)
	victim := slices.Index(ids, owners["acme-all"])
	fleetAwait(t, "acme's deliveries in flight on its owner and owed", 10*time.Second, func() (bool, string) {
		owed, state := w.recv.missing(w.load.list(), tenantEntitled, []string{"acme-all"})
		in := w.recv.nodeInFlight(ids[victim])
		return owed > 0 && in > 0, fmt.Sprintf("%s; %d in flight from %s", state, in, ids[victim])
	})
	owed, state := w.recv.missing(w.load.list(), tenantEntitled, tenantTestSubs)
	t.Logf("owners %v; killing %s with %d deliveries owed (%s)", owners, ids[victim], owed, state)
	w.killSluice(victim, owners)
	w.awaitAccepted("load after the takeover", w.load.accepted()+perPhase)
	w.load.halt()
	w.load.checkProblems(t)
	loadDone := time.Now()

	// The lane has moved already (killSluice); at worst every event waits
	// its turn at acme's endpoint, slots at a time, one hold each; the
	// rest is slack for a busy machine.
	evs := w.load.list()
	drain := time.Duration(len(evs)) * hold / slots
	settled := fleetAwait(t, "every accepted event at every entitled endpoint", fleetMoveBound+drain+30*time.Second, func() (bool, string) {
		n, state := w.recv.missing(evs, tenantEntitled, tenantTestSubs)
		return n == 0, state
	})
	w.recv.checkProblems(t)
	checkTenantEntitlement(t, w.recv)
	t.Logf("%d events accepted (%d re-posts answered duplicate, refusals %v), all delivered where entitled %v after the producers stopped; %v in all",
		len(evs), w.load.reposts, w.load.refused, settled.Sub(loadDone).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}
