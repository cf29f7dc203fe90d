package main

// End-to-end tests of fleet mode: real `sluice
// serve` processes sharing an embedded 3-node JetStream cluster
// (internal/natscluster) on loopback, a real receiver (testbed) that
// verifies every signature and records which node sent each delivery
// (every node's config sets `headers: {X-Node: <node id>}` on every
// subscription), SIGKILLs of sidecars and of NATS servers, a rolling
// replacement of every node, and a node cut off from NATS by a TCP proxy.
//
//	go test -race -run Fleet ./cmd/sluice            # the default size, ~2–3 min on 2 cores
//	SLUICE_FLEET_SOAK=5 go test -run FleetCrashSoak -timeout 30m -v ./cmd/sluice
//
// SLUICE_SOAK (the size knob of the single-node soak) also makes the fleet
// soak run its full size (5 kill cycles, 450 events per phase instead of
// 300) unless SLUICE_FLEET_SOAK names a number of cycles. Helpers and
// their knobs are in fleettest_test.go: SLUICE_FLEET_LOGS=DIR keeps every
// node's log, SLUICE_FLEET_LOG_LEVEL=debug makes them say more,
// SLUICE_FLEET_BIN runs a given sluice binary instead of a fresh build.
//
// Timing assertions are only the contract's bounds: a killed node's lanes
// move within lease_ttl + 2 s; a node that cannot renew stops dispatching
// within lease_ttl/2 (+ the watchdog's tick); 50/s + burst per second.
// Everything else is awaited with deadlines.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/natscluster"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
	sluicejs "github.com/sluicehq/sluice/queue/jetstream"
	"github.com/sluicehq/sluice/testbed"
)

const (
	fleetLeaseTTL = 2 * time.Second
	// fleetMoveBound is how soon a killed node's lanes must deliver again
	// elsewhere: lease_ttl + 2 s, the lease's expiry plus a claim.
	fleetMoveBound = fleetLeaseTTL + 2*time.Second
	fleetHoleCap   = 4
	fleetRate      = 50
	fleetBurst     = 50 // config's default burst: ceil(per_second)
)

// fleetSoakSize is the number of kill cycles and the events per phase.
func fleetSoakSize(t *testing.T) (cycles, perPhase int) {
	cycles, perPhase = 1, 300
	if v := os.Getenv("SLUICE_FLEET_SOAK"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SLUICE_FLEET_SOAK=%q: want a number of kill cycles", v)
		}
		return n, 450
	}
	if os.Getenv("SLUICE_SOAK") != "" {
		return 5, 450
	}
	return
}

// fleetSoakSubs: a black hole with a cap of 4, a healthy endpoint limited
// to 50/s (burst by default 50), a flaky one (every other request 500) and
// one filtered to type t.a. None ever dead-letters: every accepted event
// must reach each of them.
var fleetSoakSubs = []fleetSub{
	{ID: "blackhole", Extra: `
concurrency: {max: 4}
timeout: 1s
retry: {base: 100ms, cap: 3s, max_attempts: 100, max_age: 1h}
breaker: {cool_down: 200ms, max_cool_down: 1s}`},
	{ID: "rated", Extra: `
rate: {per_second: 50}
retry: {base: 20ms, cap: 200ms, max_attempts: 100, max_age: 1h}`},
	{ID: "flaky", Extra: `
retry: {base: 10ms, cap: 100ms, max_attempts: 100, max_age: 1h}
breaker: {failure_ratio: 0.9, cool_down: 100ms, max_cool_down: 500ms}`},
	{ID: "typed", Types: `["t.a"]`, Extra: `
retry: {base: 20ms, cap: 200ms, max_attempts: 100, max_age: 1h}`},
}

func fleetSubIDs(subs []fleetSub) []string {
	ids := make([]string, len(subs))
	for i, s := range subs {
		ids[i] = s.ID
	}
	return ids
}

// fleetKill is one fault the soak injected.
type fleetKill struct {
	what string // "sluice node-1", "nats node-2"
	at   time.Time
	// dead is when the killed sluice node's process was reaped (zero for
	// a NATS node): it sent nothing after, though the receiver may log
	// what it sent just before a moment later.
	dead time.Time
}

// fleetWorld holds one fleet test's parts.
type fleetWorld struct {
	t    *testing.T
	dir  string
	cl   *natscluster.Cluster
	recv *fleetRecorder
	cfg  fleetConfig
	load *fleetLoad

	mu    sync.Mutex
	nodes []*fleetNode // the current node of each slot

	kills []fleetKill
}

func newFleetWorld(t *testing.T, subs []fleetSub, hold map[string]time.Duration) *fleetWorld {
	w := &fleetWorld{t: t, dir: t.TempDir(), cl: startNATS(t), recv: newFleetRecorder(t, hold)}
	w.cfg = fleetConfig{URLs: w.cl.URLs(), LeaseTTL: fleetLeaseTTL, Subs: subs}
	return w
}

func (w *fleetWorld) current() []*fleetNode {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.nodes)
}

func (w *fleetWorld) addNode(id string, cfg fleetConfig) *fleetNode {
	n := newFleetNode(w.t, w.dir, id, w.recv.tb.URL(), cfg)
	w.mu.Lock()
	w.nodes = append(w.nodes, n)
	w.mu.Unlock()
	return n
}

// startAll starts the nodes and waits until each is ready. The first one
// starts alone: it creates the stream and the buckets (nodes setting up a
// fresh cluster together are TestFleetConcurrentFirstStart's subject).
func (w *fleetWorld) startAll() {
	nodes := w.current()
	nodes[0].start()
	nodes[0].awaitReady(60 * time.Second)
	for _, n := range nodes[1:] {
		n.start()
	}
	for _, n := range nodes[1:] {
		n.awaitReady(60 * time.Second)
	}
}

func (w *fleetWorld) replace(slot int, n *fleetNode) {
	w.mu.Lock()
	w.nodes[slot] = n
	w.mu.Unlock()
}

// awaitOwned waits until ask's admin API names a live owner (one of ids)
// for every subscription; it returns the owners.
func (w *fleetWorld) awaitOwned(what string, ask *fleetNode, ids []string, timeout time.Duration) map[string]string {
	w.t.Helper()
	var owners map[string]string
	fleetAwait(w.t, what, timeout, func() (bool, string) {
		o, err := ask.owners()
		if err != nil {
			return false, err.Error()
		}
		owners = o
		for _, s := range w.cfg.Subs {
			if !slices.Contains(ids, o[s.ID]) {
				return false, fmt.Sprintf("owners %v, want each one of %v", o, ids)
			}
		}
		return true, ""
	})
	return owners
}

func (w *fleetWorld) awaitAccepted(what string, n int) {
	w.t.Helper()
	fleetAwait(w.t, what, 90*time.Second, func() (bool, string) {
		w.load.mu.Lock()
		probs := len(w.load.problems)
		w.load.mu.Unlock()
		if probs > 0 {
			w.load.checkProblems(w.t)
			w.t.FailNow()
		}
		got := w.load.accepted()
		return got >= n, fmt.Sprintf("%d accepted, want %d", got, n)
	})
}

// entitled says whether sub is owed ev: typed takes t.a only.
func fleetEntitled(sub string, ev *fleetEvent) bool { return sub != "typed" || ev.typ == "t.a" }

// awaitDelivered waits until every accepted event reached every
// subscription entitled to it.
func (w *fleetWorld) awaitDelivered(what string, subs []string, timeout time.Duration) time.Time {
	w.t.Helper()
	evs := w.load.list()
	return fleetAwait(w.t, what, timeout, func() (bool, string) {
		n, state := w.recv.missing(evs, fleetEntitled, subs)
		return n == 0, state
	})
}

// TestFleetCrashSoak: three `sluice serve` nodes share a 3-node JetStream
// cluster; 8 producers spread over them post events with unique
// Idempotency-Keys while, in each cycle, the owner of one lane is
// SIGKILLed (and restarted later with the same node id and config) and the
// NATS server leading the event stream is killed (and restarted). At the
// end the black hole is released so it drains. Then:
//
//   - every 202 reached every entitled subscription: 0 lost;
//   - each duplicate is explained by a kill: its first copy was
//     acknowledged within lease_ttl + 3 s before (or, for a NATS server,
//     around) a kill, and the copy came after it; or, as in the rollout
//     and fencing tests, by a loss of that lane's lease that the
//     acknowledging node logged within lease_ttl of the first copy and
//     before the copy (fleetLossExplains: a renewal refused or late on a
//     busy machine stops the lane, and what it acknowledged past its
//     durable cursor is sent again by the at-least-once contract);
//   - the receiver never saw more than 4 requests of the black hole in
//     flight at once, across the whole fleet;
//   - the rate-limited subscription's first deliveries, counted per
//     one-second bucket of arrival, never exceeded 50 plus its burst of 50;
//   - the killed node's lanes were owned by another node (admin API) and
//     delivered from it within lease_ttl + 2 s of the SIGKILL;
//   - any node's completion ledger says delivered for a sample of events
//     accepted by any node;
//   - every node exits 0 on SIGTERM at the end.
func TestFleetCrashSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet soak: real sidecars and a JetStream cluster for a minute")
	}
	cycles, perPhase := fleetSoakSize(t)
	began := time.Now()
	w := newFleetWorld(t, fleetSoakSubs, nil)
	w.recv.tb.SetMode("/blackhole", testbed.ModeBlackhole)
	w.recv.tb.SetMode("/flaky", testbed.ModeFlaky)
	ids := fleetSoakIDs()
	for _, id := range ids {
		w.addNode(id, w.cfg)
	}
	w.startAll()
	w.awaitOwned("every lane owned at start", w.nodes[0], ids, 30*time.Second)
	t.Logf("fleet up in %v", time.Since(began).Round(time.Millisecond))

	// 8 producers, each one event per 100 ms: 80/s, more than the rated
	// subscription's 50/s, so its limiter is what paces it.
	w.load = newFleetLoad(t, w.current)
	w.load.run(8, 100*time.Millisecond)
	target := perPhase
	w.awaitAccepted("load before the first kill", target)
	rotation := []string{"blackhole", "rated", "flaky", "typed"}
	for c := range cycles {
		// SIGKILL, mid-load, the owner of this cycle's lane: the black
		// hole's first (its owner also owns a lane that acknowledges, see
		// fleetSoakIDs).
		sub := rotation[c%len(rotation)]
		owners := w.awaitOwned("owners before kill", w.nodes[(c+1)%3], ids, 30*time.Second)
		victim := slices.Index(ids, owners[sub])
		t.Logf("cycle %d: owners %v; killing %s", c, owners, ids[victim])
		w.killSluice(victim, owners)
		target += perPhase
		w.awaitAccepted("load with a node down", target)
		w.nodes[victim].start()
		w.nodes[victim].awaitReady(60 * time.Second)
		w.awaitOwned("every lane owned after the restart", w.nodes[victim], ids, 30*time.Second)
		target += perPhase
		w.awaitAccepted("load after the restart", target)

		// Kill the NATS server that leads the event stream, mid-load.
		k := w.streamLeader()
		at := time.Now()
		w.cl.Kill(k)
		w.kills = append(w.kills, fleetKill{what: fmt.Sprintf("nats node-%d", k), at: at})
		t.Logf("cycle %d: killed NATS server %d (stream leader) at +%v", c, k, at.Sub(began).Round(time.Millisecond))
		target += perPhase
		w.awaitAccepted("load with a NATS server down", target)
		if err := w.cl.Restart(k); err != nil {
			t.Fatalf("restart NATS server %d: %v", k, err)
		}
		target += perPhase
		w.awaitAccepted("load after the NATS restart", target)
	}
	w.load.halt()
	w.load.checkProblems(t)
	loadDone := time.Now()

	// The black hole recovers: new requests are answered, held ones cut.
	w.recv.tb.SetMode("/blackhole", testbed.ModeOK)
	w.recv.tb.Release()
	subs := fleetSubIDs(fleetSoakSubs)
	settled := w.awaitDelivered("every accepted event delivered", subs, 180*time.Second)
	t.Logf("settled %v after the producers stopped", settled.Sub(loadDone).Round(time.Millisecond))

	w.checkLedger(subs, 30)
	for _, n := range w.current() {
		n.term(20 * time.Second)
	}

	w.recv.checkProblems(t)
	w.checkSoak(subs)
	t.Logf("fleet soak: %d cycles, %d events accepted (%d re-posts answered duplicate, refusals %v), %v in all",
		cycles, w.load.accepted(), w.load.reposts, w.load.refused, time.Since(began).Round(time.Millisecond))
}

func (w *fleetWorld) killList() string {
	var parts []string
	for _, k := range w.kills {
		parts = append(parts, k.what+" at "+k.at.Format(time.StampMilli))
	}
	return strings.Join(parts, ", ")
}

// fleetSoakIDs names the soak's three nodes so that the black hole's
// owner also owns a lane whose endpoint acknowledges (policy.Owner is the
// fleet's rendezvous hashing, fixed by protocol): its SIGKILL then moves a
// lane with requests held in flight and one with acknowledgements not yet
// in its durable cursor.
func fleetSoakIDs() []string {
	for k := 0; ; k++ {
		ids := []string{fmt.Sprintf("node-%d", 3*k), fmt.Sprintf("node-%d", 3*k+1), fmt.Sprintf("node-%d", 3*k+2)}
		count := map[string]int{}
		for _, s := range fleetSoakSubs {
			count[policy.Owner(s.ID, ids)]++
		}
		if n := count[policy.Owner("blackhole", ids)]; n >= 2 && n < len(fleetSoakSubs) {
			return ids
		}
	}
}

// streamLeader is the NATS server leading the event stream, or 0.
func (w *fleetWorld) streamLeader() int {
	for i := range 3 {
		if s := w.cl.Server(i); s != nil && s.JetStreamIsStreamLeader("$G", "SLUICE_EVENTS") {
			return i
		}
	}
	return 0
}

// killSluice SIGKILLs node slot, then checks that its lanes are owned and
// delivered elsewhere within fleetMoveBound.
func (w *fleetWorld) killSluice(slot int, owners map[string]string) {
	t := w.t
	victim := w.nodes[slot]
	var moved []string
	for sub, o := range owners {
		if o == victim.id {
			moved = append(moved, sub)
		}
	}
	slices.Sort(moved)
	at := victim.kill()
	w.kills = append(w.kills, fleetKill{what: "sluice " + victim.id, at: at, dead: time.Now()})
	survivor := w.nodes[(slot+1)%3]
	ownedAt := fleetAwait(t, "the killed node's lanes owned elsewhere", fleetMoveBound+10*time.Second, func() (bool, string) {
		o, err := survivor.owners()
		if err != nil {
			return false, err.Error()
		}
		for _, sub := range moved {
			if o[sub] == "" || o[sub] == victim.id {
				return false, fmt.Sprintf("owners %v", o)
			}
		}
		return true, ""
	})
	// The first delivery of each moved lane from another node.
	firstAt := map[string]time.Time{}
	fleetAwait(t, "the killed node's lanes delivering elsewhere", fleetMoveBound+10*time.Second, func() (bool, string) {
		got := w.recv.snapshot()
		for _, sub := range moved {
			for _, rs := range got[sub] {
				for _, r := range rs {
					if r.at.After(at) && r.node != victim.id && (firstAt[sub].IsZero() || r.at.Before(firstAt[sub])) {
						firstAt[sub] = r.at
					}
				}
			}
		}
		return len(firstAt) == len(moved), fmt.Sprintf("first deliveries elsewhere %v of lanes %v", firstAt, moved)
	})
	t.Logf("SIGKILL %s (lanes %v): owned elsewhere after %v", victim.id, moved, ownedAt.Sub(at).Round(time.Millisecond))
	if d := ownedAt.Sub(at); d > fleetMoveBound {
		t.Errorf("the lanes of SIGKILLed %s were owned elsewhere only %v after the kill, want at most lease_ttl + 2 s = %v", victim.id, d, fleetMoveBound)
	}
	for _, sub := range moved {
		d := firstAt[sub].Sub(at)
		t.Logf("  %s: first delivery from another node %v after the kill", sub, d.Round(time.Millisecond))
		if d > fleetMoveBound {
			t.Errorf("lane %s of SIGKILLed %s delivered again elsewhere only %v after the kill, want at most %v", sub, victim.id, d, fleetMoveBound)
		}
	}
}

// checkLedger asks every node's completion ledger about a sample of events
// (accepted by any node): each entitled subscription must be listed as
// delivered, whoever owns its lane.
func (w *fleetWorld) checkLedger(subs []string, sample int) {
	t := w.t
	evs := w.load.list()
	rng := rand.New(rand.NewPCG(uint64(len(evs)), 7))
	rng.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
	evs = evs[:min(sample, len(evs))]
	for _, n := range w.current() {
		bad := 0
		var last string
		// Cursors are written on an interval: give the last ones a moment.
		deadline := time.Now().Add(15 * time.Second)
		for _, ev := range evs {
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				st, err := n.api.Event(ctx, ev.key)
				cancel()
				last = ""
				switch {
				case err != nil:
					last = err.Error()
				case st.Seq != ev.seq:
					last = fmt.Sprintf("seq %d, accepted as %d", st.Seq, ev.seq)
				default:
					listed := map[string]string{}
					for _, d := range st.Deliveries {
						listed[d.Subscription] = d.State
					}
					for _, sub := range subs {
						want := fleetEntitled(sub, ev)
						state, ok := listed[sub]
						switch {
						case want && state != "delivered":
							last += fmt.Sprintf(" %s is %q;", sub, state)
						case !want && ok:
							last += fmt.Sprintf(" %s (not entitled) listed as %q;", sub, state)
						}
					}
				}
				if last == "" || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond) // polling the sidecar's state
			}
			if last != "" {
				if bad++; bad <= 3 {
					t.Errorf("ledger of %s (seq %d, accepted by %s) on %s: %s", ev.key, ev.seq, ev.node, n.id, last)
				}
			}
		}
		if bad > 3 {
			t.Errorf("ledger on %s: %d of %d sampled events wrong", n.id, bad, len(evs))
		}
	}
}

// checkSoak: nothing lost, duplicates explained, the black hole's cap and
// the rate limit held fleet-wide.
func (w *fleetWorld) checkSoak(subs []string) {
	t := w.t
	got := w.recv.snapshot()
	evs := w.load.list()
	for sub := range got {
		if !slices.Contains(subs, sub) {
			t.Errorf("deliveries to /%s, which is no subscription", sub)
		}
	}
	// A kill explains a duplicate whose first copy was acknowledged from
	// lease_ttl + 3 s before it: what was in flight, or acknowledged but
	// not yet in the durable cursor, on a node that then died or lost its
	// lease. A NATS server's kill also explains first copies acknowledged
	// up to a request timeout plus a lease later: a write in flight at the
	// kill may fail only at its timeout, and the lane may be lost and
	// taken up again after that.
	const window = fleetLeaseTTL + 3*time.Second
	const natsAfter = sluicejs.DefaultRequestTimeout + fleetLeaseTTL + time.Second
	// receiverLag bounds how long after a node died the receiver may log a
	// request that node sent before: loopback and the handler, on a busy
	// machine.
	const receiverLag = time.Second
	dups, explained := map[string]int{}, map[string]int{}
	losses := map[string]map[string][]time.Time{}
	for _, n := range w.current() { // a restarted node keeps its log
		losses[n.id] = fleetLeaseLosses(n.log.String())
	}
	acked := 0
	for _, sub := range subs {
		lost := 0
		for _, ev := range evs {
			rs := got[sub][ev.key]
			var ackAt []fleetReq
			for _, r := range rs {
				if r.status/100 == 2 {
					ackAt = append(ackAt, r)
				}
			}
			if !fleetEntitled(sub, ev) {
				if len(rs) > 0 {
					t.Errorf("%s (%s) went to %s, which is not entitled to it", ev.key, ev.typ, sub)
				}
				continue
			}
			if len(ackAt) == 0 {
				if lost++; lost <= 5 {
					t.Errorf("LOST: %s (seq %d, accepted by %s) never reached %s: %d requests", ev.key, ev.seq, ev.node, sub, len(rs))
				}
				continue
			}
			acked++
			first := ackAt[0]
			for _, r := range ackAt[1:] {
				dups[sub]++
				why := ""
				for _, k := range w.kills {
					lo := k.at.Add(-window)
					hi := k.at
					switch {
					case strings.HasPrefix(k.what, "nats"):
						hi = k.at.Add(natsAfter)
					case first.node == strings.TrimPrefix(k.what, "sluice "):
						// The killed node's own acknowledgement of a request
						// it sent before it died, which the receiver logged
						// after the SIGKILL was sent (3 ms after, once under
						// load): its cursor never recorded it.
						hi = k.dead.Add(receiverLag)
					}
					if !first.at.Before(lo) && !first.at.After(hi) && r.at.After(k.at) {
						why = k.what
						break
					}
				}
				if why == "" {
					if _, ok := fleetLossExplains(losses, sub, first, r, fleetLeaseTTL); ok {
						why = "lease lost by " + first.node
					}
				}
				if why != "" {
					explained[why]++
					continue
				}
				t.Errorf("unexplained duplicate: %s (seq %d) acknowledged by %s at %s (from %s) and again at %s (from %s); kills %s",
					ev.key, ev.seq, sub, first.at.Format(time.StampMilli), first.node, r.at.Format(time.StampMilli), r.node, w.killList())
			}
		}
		if lost > 5 {
			t.Errorf("LOST: %d events in all never reached %s", lost, sub)
		}
	}
	total := 0
	for _, n := range dups {
		total += n
	}
	t.Logf("%d (event, subscription) deliveries acknowledged, 0 lost; %d duplicates (%.2f%%) by subscription %v, explained by %v",
		acked, total, 100*float64(total)/float64(max(acked, 1)), dups, explained)

	// The black hole's cap, fleet-wide, as the receiver counted it.
	st := w.recv.tb.Stats()["/blackhole"]
	t.Logf("black hole: %d requests, at most %d in flight at once", st.Requests, st.MaxInFlight)
	if st.MaxInFlight > fleetHoleCap {
		t.Errorf("the receiver saw %d requests of the black hole in flight at once across the fleet, cap %d", st.MaxInFlight, fleetHoleCap)
	}

	// The rate limit, fleet-wide: first deliveries per second of arrival.
	buckets := map[int64]int{}
	for _, rs := range got["rated"] {
		buckets[rs[0].at.Unix()]++
	}
	worst, worstAt := 0, int64(0)
	for s, n := range buckets {
		if n > worst {
			worst, worstAt = n, s
		}
	}
	t.Logf("rated: at most %d first deliveries in one second (at %s), limit %d/s + burst %d", worst,
		time.Unix(worstAt, 0).Format(time.TimeOnly), fleetRate, fleetBurst)
	if worst > fleetRate+fleetBurst {
		secs := slices.Sorted(maps.Keys(buckets))
		var b strings.Builder
		for _, s := range secs {
			fmt.Fprintf(&b, "%s:%d ", time.Unix(s, 0).Format(time.TimeOnly), buckets[s])
		}
		t.Errorf("rated got %d first deliveries in the second from %s, more than %d/s + burst %d; per second: %s; kills %s",
			worst, time.Unix(worstAt, 0).Format(time.TimeOnly), fleetRate, fleetBurst, b.String(), w.killList())
	}
}

// TestFleetRollout replaces the three nodes one by one, as a Kubernetes
// rollout does (SIGTERM, then a new process with an empty data dir and a
// new node id), while a black-hole tenant and a failing one hold thousands
// of undelivered events and producers keep posting. Then both endpoints
// recover, and every accepted event reaches every subscription: 0 lost.
// The handovers are graceful (the old owner writes its cursor and releases
// its leases before it exits), so nothing acknowledged is sent again.
//
// Except after a lease lost on the way: a node whose renewal comes back
// later than lease_ttl/2 (a busy machine starves it of CPU) stops its
// lanes, because it can no longer prove that nobody else may deliver them,
// and what it acknowledged and has no cursor for is the lanes' next
// owner's to send again: the at-least-once price of that stop, not of a
// handover. Such a duplicate passes only if the node that acknowledged
// the first copy logged the loss of that lane's lease around it (and
// before the copy); any other duplicate fails as before.
func TestFleetRollout(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet rollout: real sidecars and a JetStream cluster")
	}
	began := time.Now()
	subs := []fleetSub{
		{ID: "healthy", Extra: `retry: {base: 20ms, cap: 200ms, max_attempts: 100, max_age: 1h}`},
		{ID: "hole", Extra: `
concurrency: {max: 4}
timeout: 1s
retry: {base: 100ms, cap: 3s, max_attempts: 100, max_age: 1h}
breaker: {cool_down: 200ms, max_cool_down: 1s}`},
		{ID: "down", Extra: `
retry: {base: 100ms, cap: 3s, max_attempts: 100, max_age: 1h}
breaker: {cool_down: 200ms, max_cool_down: 1s}`},
	}
	w := newFleetWorld(t, subs, nil)
	w.recv.tb.SetMode("/hole", testbed.ModeBlackhole)
	w.recv.tb.SetMode("/down", testbed.ModeFail)
	var ids []string
	for i := range 3 {
		id := fmt.Sprintf("slot%d-gen0", i)
		ids = append(ids, id)
		w.addNode(id, w.cfg)
	}
	w.startAll()
	w.awaitOwned("every lane owned at start", w.nodes[0], ids, 30*time.Second)
	everyNode := w.current() // the replaced ones too: their logs explain duplicates

	// Thousands of events the two tenants cannot take: a burst, then a
	// steady trickle through the rollout.
	const backlog = 3000
	w.load = newFleetLoad(t, w.current)
	w.load.run(12, time.Millisecond)
	w.awaitAccepted("the backlog", backlog)
	w.load.halt()
	w.load.checkProblems(t)
	accepted := w.load.accepted()
	w.awaitDelivered("the backlog reaches the healthy subscription", []string{"healthy"}, 60*time.Second)
	t.Logf("%d events accepted in %v; healthy has them all", accepted, time.Since(began).Round(time.Millisecond))

	w.load.run(3, 50*time.Millisecond)
	for slot := range 3 {
		old := w.nodes[slot]
		termAt := time.Now()
		old.term(20 * time.Second)
		t.Logf("%s stopped %v after SIGTERM", old.id, time.Since(termAt).Round(time.Millisecond))
		id := fmt.Sprintf("slot%d-gen1", slot)
		ids = append(ids, id)
		n := newFleetNode(t, w.dir, id, w.recv.tb.URL(), w.cfg)
		everyNode = append(everyNode, n)
		w.replace(slot, n)
		n.start()
		n.awaitReady(60 * time.Second)
		live := []string{}
		for _, m := range w.current() {
			live = append(live, m.id)
		}
		owners := w.awaitOwned("every lane owned by a live node", n, live, 30*time.Second)
		t.Logf("replaced %s by %s; owners %v", old.id, id, owners)
	}
	w.load.halt()
	w.load.checkProblems(t)

	// Every lane is now delivered by a node that never saw the backlog
	// arrive, and the two tenants' lanes still hold it all.
	fleetAwait(t, "the new nodes see the outage backlog", 20*time.Second, func() (bool, string) {
		ls, err := w.nodes[0].lanes()
		if err != nil {
			return false, err.Error()
		}
		ok := true
		for _, l := range ls {
			if l.Subscription != "healthy" {
				ok = ok && l.Backlog+uint64(l.Scheduled)+uint64(l.InFlight) >= uint64(backlog)
			}
		}
		b, _ := json.Marshal(ls)
		return ok, string(b)
	})
	recoverAt := time.Now()
	w.recv.tb.SetMode("/hole", testbed.ModeOK)
	w.recv.tb.SetMode("/down", testbed.ModeOK)
	w.recv.tb.Release()
	ids3 := fleetSubIDs(subs)
	settled := w.awaitDelivered("every event delivered after the recovery", ids3, 180*time.Second)
	for _, n := range w.current() {
		n.term(20 * time.Second)
	}
	w.recv.checkProblems(t)
	got := w.recv.snapshot()
	losses := map[string]map[string][]time.Time{}
	nLost := 0
	for _, n := range everyNode {
		losses[n.id] = fleetLeaseLosses(n.log.String())
		for _, ats := range losses[n.id] {
			nLost += len(ats)
		}
	}
	dups, byLoss := map[string]int{}, map[string]int{}
	for _, sub := range ids3 {
		for id, rs := range got[sub] {
			var acks []fleetReq
			for _, r := range rs {
				if r.status/100 == 2 {
					acks = append(acks, r)
				}
			}
			for _, again := range acks[min(1, len(acks)):] {
				if _, ok := fleetLossExplains(losses, sub, acks[0], again, fleetLeaseTTL); ok {
					byLoss[sub]++
					continue
				}
				if dups[sub]++; dups[sub] <= 3 {
					t.Errorf("duplicate after graceful handovers, with no lease loss of %s logged by %s to explain it: %s acknowledged %d times by %s: %+v",
						sub, acks[0].node, id, len(acks), sub, rs)
				}
			}
		}
	}
	if nLost > 0 {
		t.Logf("%d leases lost (not renewed in time: not handovers); duplicates they explain: %v", nLost, byLoss)
	}
	st := w.recv.tb.Stats()["/hole"]
	if st.MaxInFlight > 4 {
		t.Errorf("the receiver saw %d requests of hole in flight at once, cap 4", st.MaxInFlight)
	}
	t.Logf("rollout: %d events accepted, all delivered to %v %v after the recovery; unexplained duplicates %v; %v in all",
		w.load.accepted(), ids3, settled.Sub(recoverAt).Round(time.Millisecond), dups, time.Since(began).Round(time.Millisecond))
}

// TestFleetFencing cuts one of two nodes off from NATS mid-delivery, with
// a TCP proxy it reaches NATS through, while the other stays connected.
// Two kinds of cut (natsProxy): "sever" closes the connections, so the
// client sees them drop; "stall" holds the traffic on open connections and
// delivers it late when the partition heals, so what the cut-off node
// wrote with its old lease (renewals, cursors) reaches the servers after
// the other node has taken the lease. Either way:
//
//   - the cut-off node stops dispatching: the receiver gets nothing from it
//     later than lease_ttl/2 (+ the watchdog's tick and 250 ms) after the
//     cut, and on each lane its last request comes before the other node's
//     first;
//   - no subscription ever has two nodes' requests in flight at once (the
//     receiver holds each request 40 ms and counts per node), nor more
//     than its cap of 2, even when one of the cut-off node's lanes is a
//     black hole whose exchanges outlast the lease ("sever_black_hole");
//   - the other node owns and delivers the lanes within lease_ttl + 2 s;
//   - when severed, /readyz answers 503 and ingest 503 with Retry-After;
//   - after the cut heals nothing is lost, and the only duplicates are of
//     what the cut-off node acknowledged and could not record before it
//     stopped: nothing the other node acknowledged is sent again, which a
//     stale cursor write taking effect would cause (when stalled, the
//     node's cursor and lease writes from the cut reach the servers late,
//     and must be refused).
func TestFleetFencing(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet fencing: real sidecars and a JetStream cluster")
	}
	t.Run("sever", func(t *testing.T) { testFencing(t, false, false) })
	t.Run("stall", func(t *testing.T) { testFencing(t, true, false) })
	t.Run("sever_black_hole", func(t *testing.T) { testFencing(t, false, true) })
}

// testFencing cuts the node off (stall: holds its traffic; else severs
// it); withHole makes one of its lanes a black hole.
func testFencing(t *testing.T, stall, withHole bool) {
	began := time.Now()
	const hold = 40 * time.Millisecond
	var subs []fleetSub
	holds := map[string]time.Duration{}
	for i := range 10 {
		id := fmt.Sprintf("s%d", i)
		subs = append(subs, fleetSub{ID: id, Extra: `
concurrency: {max: 2}
timeout: 3s
retry: {base: 20ms, cap: 200ms, max_attempts: 100, max_age: 1h}`})
		holds[id] = hold
	}
	w := newFleetWorld(t, subs, holds)
	px := startNATSProxy(t, w.cl.URL(0))
	cutCfg := w.cfg
	cutCfg.URLs = []string{px.URL()}
	cut := w.addNode("cut", cutCfg)
	other := w.addNode("other", w.cfg)
	w.startAll()
	ids := []string{"cut", "other"}
	// Settled, not just owned: cut starts first and holds every lane until
	// it sees other join and hands other's share over. A lane counted as
	// cut's then (the black hole among them) moved gracefully before the
	// cut, and the test no longer cut off what it says it did.
	owners := w.awaitOwned("every lane owned", other, ids, 30*time.Second)
	fleetAwait(t, "every lane with its rendezvous owner", 30*time.Second, func() (bool, string) {
		o, err := other.owners()
		if err != nil {
			return false, err.Error()
		}
		owners = o
		for _, sub := range fleetSubIDs(subs) {
			if o[sub] != policy.Owner(sub, ids) {
				return false, fmt.Sprintf("owners %v", o)
			}
		}
		return true, ""
	})
	var cutLanes []string
	for sub, o := range owners {
		if o == "cut" {
			cutLanes = append(cutLanes, sub)
		}
	}
	slices.Sort(cutLanes)
	if len(cutLanes) == 0 {
		t.Fatalf("rendezvous gave all 10 lanes to other (owners %v); the test needs cut to own one", owners)
	}
	t.Logf("cut owns %v", cutLanes)
	// With withHole, one of cut's lanes is a black hole: its exchanges are
	// in flight at the cut and last until their 3 s timeout, longer than
	// the lease: they must end (or the lane must not move) before other
	// sends to it, or the endpoint sees both nodes' requests at once.
	hole := ""
	if withHole {
		hole = cutLanes[0]
		w.recv.tb.SetMode("/"+hole, testbed.ModeBlackhole)
	}

	// Producers post to other only: cut's ingest is checked by hand.
	w.load = newFleetLoad(t, func() []*fleetNode { return []*fleetNode{other} })
	w.load.run(2, 20*time.Millisecond)
	w.awaitAccepted("load before the cut", 100)
	fleetAwait(t, "cut delivering", 20*time.Second, func() (bool, string) {
		n := w.recv.nodeInFlight("cut")
		held := int64(2)
		if hole != "" {
			held = w.recv.tb.Stats()["/"+hole].InFlight
		}
		return n > 0 && held == 2, fmt.Sprintf("%d in flight from cut, %d held by the black hole", n, held)
	})
	how := "severed"
	if stall {
		how = "stalled"
		px.stall()
	} else {
		px.sever()
	}
	cutAt := time.Now()
	t.Logf("%s cut's link to NATS at +%v, with %d deliveries in flight", how, cutAt.Sub(began).Round(time.Millisecond), w.recv.nodeInFlight("cut"))

	// The other node takes the lanes and delivers them.
	w.awaitOwned("other owns every lane", other, []string{"other"}, fleetMoveBound+10*time.Second)
	ownedAfter := time.Since(cutAt)
	firstOther := map[string]time.Time{}
	fleetAwait(t, "other delivering cut's lanes", fleetMoveBound+10*time.Second, func() (bool, string) {
		got := w.recv.snapshot()
		for _, sub := range cutLanes {
			for _, rs := range got[sub] {
				for _, r := range rs {
					if r.node == "other" && r.at.After(cutAt) && (firstOther[sub].IsZero() || r.at.Before(firstOther[sub])) {
						firstOther[sub] = r.at
					}
				}
			}
		}
		return len(firstOther) == len(cutLanes), fmt.Sprintf("first deliveries from other %v", firstOther)
	})
	t.Logf("other owns every lane %v after the cut", ownedAfter.Round(time.Millisecond))
	if ownedAfter > fleetMoveBound {
		t.Errorf("other owned cut's lanes %v after the cut, want at most lease_ttl + 2 s = %v", ownedAfter, fleetMoveBound)
	}
	for _, sub := range cutLanes {
		if d := firstOther[sub].Sub(cutAt); d > fleetMoveBound {
			t.Errorf("%s: other delivered it first %v after the cut, want at most %v", sub, d, fleetMoveBound)
		}
	}

	// While cut off, cut says so, and refuses events.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	readyErr := cut.api.Ready(ctx)
	cancel()
	postAt := time.Now()
	// A key of the producers' form, far above theirs: when stalled, the
	// POST may be accepted after all, once the link heals.
	probe := fleetKey(1 << 30)
	probeType, _ := fleetType(probe)
	code, _, hdr, err := cut.post(probeType, probe)
	postTook := time.Since(postAt)
	t.Logf("cut off: /readyz %v; POST answered %d %v (Retry-After %q) in %v", readyErr, code, err, hdr.Get("Retry-After"), postTook.Round(time.Millisecond))
	if !stall {
		var ae *client.APIError
		if !errors.As(readyErr, &ae) || ae.Status != http.StatusServiceUnavailable {
			t.Errorf("/readyz of the severed node: %v, want 503", readyErr)
		}
		if err != nil || code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
			t.Errorf("POST to the severed node: %d %v (Retry-After %q), want 503 with Retry-After", code, err, hdr.Get("Retry-After"))
		}
	}
	w.awaitAccepted("load while cut off", w.load.accepted()+100)

	healAt := time.Now()
	if stall {
		px.resume()
	} else {
		px.restore()
	}
	cut.awaitReady(30 * time.Second)
	w.awaitOwned("every lane owned after the cut healed", other, ids, 30*time.Second)
	w.awaitAccepted("load after the cut healed", w.load.accepted()+100)
	w.load.halt()
	w.load.checkProblems(t)
	if hole != "" {
		w.recv.tb.SetMode("/"+hole, testbed.ModeOK)
		w.recv.tb.Release()
	}
	w.awaitDelivered("every event delivered", fleetSubIDs(subs), 120*time.Second)

	m, err := cut.metrics()
	if err != nil {
		t.Fatal(err)
	}
	refused, _ := metricSum(m, "sluice_fleet_lease_renewals_total", `result="lost"`)
	failed, _ := metricSum(m, "sluice_fleet_lease_renewals_total", `result="error"`)
	log := cut.log.String()
	t.Logf("cut: lease renewals refused %v, failed %v; log lines: %d lease lost, %d naming a fenced write",
		refused, failed, strings.Count(log, "lease lost"), strings.Count(log, queue.ErrFenced.Error()))
	if stall && !strings.Contains(log, "timeout waiting for ack") {
		// What cut wrote while stalled reached the servers when the link
		// healed, after other had taken the leases; the checks below show
		// none of it took effect.
		t.Errorf("cut logged no write that timed out while stalled: the test sent no late write")
	}
	for _, n := range w.current() {
		n.term(20 * time.Second)
	}
	w.recv.checkProblems(t)

	// What the receiver saw.
	got := w.recv.snapshot()
	stopBound := cutAt.Add(fleetLeaseTTL/2 + fleetLeaseTTL/10 + 250*time.Millisecond)
	for _, sub := range fleetSubIDs(subs) {
		var lastCut time.Time
		for _, rs := range got[sub] {
			for _, r := range rs {
				if r.node == "cut" && r.at.After(cutAt) && r.at.Before(healAt) && r.at.After(lastCut) {
					lastCut = r.at
				}
			}
		}
		if lastCut.IsZero() {
			continue
		}
		t.Logf("%s: last request from cut %v after the cut; first from other %v after", sub,
			lastCut.Sub(cutAt).Round(time.Millisecond), firstOther[sub].Sub(cutAt).Round(time.Millisecond))
		if lastCut.After(stopBound) {
			t.Errorf("%s: cut, cut off from NATS, still sent a request %v after the cut, want none after %v", sub, lastCut.Sub(cutAt), stopBound.Sub(cutAt))
		}
		if !firstOther[sub].IsZero() && !lastCut.Before(firstOther[sub]) {
			t.Errorf("%s: two owners: cut sent at %s, after other's first request at %s", sub,
				lastCut.Format(time.StampMilli), firstOther[sub].Format(time.StampMilli))
		}
	}
	for _, sub := range fleetSubIDs(subs) {
		if sub == hole {
			// Not MaxInFlight: each of the hole's exchanges ends at its
			// lease-bounded deadline and the lane sends the next at once,
			// on a new connection, and the receiver may read that request
			// before it notices the old connection close, so its count can
			// pass the cap for a moment with the client at 2. What the cut
			// must never do is overlap the new owner: that it checks per
			// request, from arrival to hang-up (the hang-up is seen within
			// moments of the close; requests end leaseSafety, 250 ms,
			// before the lease could move).
			if o := w.recv.heldOverlaps(sub); len(o) > 0 {
				t.Errorf("%s (a black hole): requests of two nodes in flight at once: the exchanges the cut-off node had in flight "+
					"outlived its lease and overlapped the new owner's (%d):\n%s", sub, len(o), strings.Join(o[:min(len(o), 5)], "\n"))
			}
			continue
		}
		if st := w.recv.tb.Stats()["/"+sub]; st.MaxInFlight > 2 {
			t.Errorf("%s: the receiver saw %d requests in flight at once, cap 2", sub, st.MaxInFlight)
		}
	}
	// Duplicates: only of what cut acknowledged but could not record, until
	// it stopped. One whose first copy other acknowledged (other never lost
	// NATS), or cut after it stopped, means a cursor went back: a stale
	// write took effect. Unless that node logged the loss of that lane's
	// lease around the first copy: a busy machine can delay any node's
	// renewal past lease_ttl/2, and the node then stops the lane, its
	// unrecorded acknowledgements left to the next owner (at least once).
	// The stale writes this test sends arrive while other holds the lease,
	// so they cannot hide behind a loss unless other logged one of that
	// lane then.
	losses := map[string]map[string][]time.Time{}
	for _, n := range w.current() {
		losses[n.id] = fleetLeaseLosses(n.log.String())
	}
	dups, regressed, byLoss := 0, 0, 0
	for sub, m := range got {
		for id, rs := range m {
			var acks []fleetReq
			for _, r := range rs {
				if r.status/100 == 2 {
					acks = append(acks, r)
				}
			}
			if len(acks) < 2 {
				continue
			}
			dups += len(acks) - 1
			first := acks[0]
			if first.node == "cut" && !first.at.After(stopBound) {
				continue
			}
			if _, ok := fleetLossExplains(losses, sub, first, acks[1], fleetLeaseTTL); ok {
				byLoss += len(acks) - 1
				continue
			}
			if regressed++; regressed <= 3 {
				t.Errorf("%s of %s first acknowledged from %s at %s, after the cut, yet sent again, and %s logged no loss of its lease then: %+v — a cursor went back",
					id, sub, first.node, first.at.Format(time.StampMilli), first.node, acks)
			}
		}
	}
	t.Logf("fencing (%s): %d events, %d duplicates (%d explained by leases lost to late renewals, %d by nothing), %v in all", how, w.load.accepted(), dups,
		byLoss, regressed, time.Since(began).Round(time.Millisecond))
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestFleetBadInput: faults at start-up, each a clear error naming the
// config key. The cases run in parallel on one cluster, each with its own
// stream:
//
//   - unreachable: NATS not up yet: the node logs its retries (with
//     backoff), /readyz answers 503, and once a server listens on the
//     address the node comes up;
//   - (NATS never up: the node waits as long as that takes, answering
//     ingest 503, and stops at once on SIGTERM; TestFleetNATSDownAtStart
//     and TestFleetSIGTERMWhileNATSAway check it;)
//   - incompatible_stream: a stream of that name with other subjects and
//     work-queue retention: exit 1 naming the stream and the setting, and
//     the stream is left as it was;
//   - too_many_replicas: replicas 5 on 3 servers: exit 1 naming
//     jetstream.replicas;
//   - credentials_missing, credentials_garbage: exit 1 naming
//     jetstream.credentials_file.
func TestFleetBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet faults: real sidecars and a JetStream cluster")
	}
	t.Parallel() // mostly idle processes: overlaps the other parallel fleet tests only
	cl := startNATS(t)
	recvURL := "http://127.0.0.1:1" // nothing is ever delivered

	// A node that runs with cfg: its exit status and log, or its log so
	// far if it still runs at the deadline.
	run := func(t *testing.T, id string, cfg fleetConfig) *fleetNode {
		n := newFleetNode(t, t.TempDir(), id, recvURL, cfg)
		n.start()
		return n
	}
	mustExit := func(t *testing.T, n *fleetNode, timeout time.Duration, want ...string) {
		t.Helper()
		select {
		case <-n.exited():
		case <-time.After(timeout):
			t.Fatalf("%s still running after %v; log:\n%s", n.id, timeout, n.log.String())
		}
		out := n.log.String()
		t.Logf("%s exited %d: %s", n.id, n.exitCode(), lastLines(out, 2))
		if code := n.exitCode(); code == 0 {
			t.Errorf("%s exited 0, want an error; log:\n%s", n.id, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s's error does not name %q; log:\n%s", n.id, w, out)
			}
		}
	}

	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		// A port nobody listens on: the node retries with backoff, is not
		// ready, and connects once a NATS server comes up there.
		addr := freePort(t)
		n := run(t, "unreachable", fleetConfig{URLs: []string{"nats://" + addr}, Replicas: 1})
		n.log.await(t, "NATS not reachable", 3, 30*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := n.api.Ready(ctx)
		cancel()
		t.Logf("/readyz while NATS is unreachable: %v", err)
		if ae := (*client.APIError)(nil); !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable {
			t.Errorf("/readyz while NATS is unreachable: %v, want 503", err)
		}
		select {
		case <-n.exited():
			t.Fatalf("exited while retrying; log:\n%s", n.log.String())
		default:
		}
		host, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		srv, err := server.NewServer(&server.Options{Host: host, Port: p, JetStream: true, StoreDir: t.TempDir(),
			NoSigs: true, NoLog: true, MaxPayload: 8 << 20})
		if err != nil {
			t.Fatal(err)
		}
		srv.Start()
		defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Skipf("the closed port %s was taken meanwhile", addr)
		}
		n.awaitReady(60 * time.Second)
	})

	t.Run("incompatible_stream", func(t *testing.T) {
		t.Parallel()
		nc, err := nats.Connect(cl.URL(0))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// Someone else's stream of the same name: other subjects, work-queue
		// retention.
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FOREIGN", Subjects: []string{"orders.>"},
			Retention: jetstream.WorkQueuePolicy, Replicas: 3}); err != nil {
			t.Fatal(err)
		}
		n := run(t, "incompatible", fleetConfig{URLs: cl.URLs(), Stream: "FOREIGN"})
		mustExit(t, n, 60*time.Second, "FOREIGN")
		out := n.log.String()
		if !strings.Contains(out, "subjects") && !strings.Contains(out, "retention") {
			t.Errorf("the error names neither the subjects nor the retention that differ; log:\n%s", out)
		}
		// The stream was refused, not changed.
		s, err := js.Stream(ctx, "FOREIGN")
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; !slices.Equal(c.Subjects, []string{"orders.>"}) || c.Retention != jetstream.WorkQueuePolicy {
			t.Errorf("sluice changed the existing stream: %+v", c)
		}
	})

	t.Run("too_many_replicas", func(t *testing.T) {
		t.Parallel()
		n := run(t, "replicas", fleetConfig{URLs: cl.URLs(), Stream: "FIVE", Replicas: 5})
		mustExit(t, n, 60*time.Second, "jetstream.replicas")
	})

	t.Run("credentials_missing", func(t *testing.T) {
		t.Parallel()
		n := run(t, "nocreds", fleetConfig{URLs: cl.URLs(), Stream: "CREDS1",
			JetStream: "credentials_file: " + t.TempDir() + "/missing.creds"})
		mustExit(t, n, 30*time.Second, "jetstream.credentials_file")
	})

	t.Run("credentials_garbage", func(t *testing.T) {
		t.Parallel()
		f := t.TempDir() + "/bad.creds"
		if err := os.WriteFile(f, []byte("this is no NATS credentials file\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		n := run(t, "badcreds", fleetConfig{URLs: cl.URLs(), Stream: "CREDS2", JetStream: "credentials_file: " + f})
		mustExit(t, n, 60*time.Second, "jetstream.credentials_file")
	})
}

// TestFleetConcurrentFirstStart: the nodes of a new fleet start at once
// on a fresh cluster, as a Deployment's pods do, and set up the stream
// and the buckets together: every node must come up.
func TestFleetConcurrentFirstStart(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet start-up: real sidecars and a JetStream cluster")
	}
	t.Parallel() // mostly idle processes: overlaps the other parallel fleet tests only
	w := newFleetWorld(t, []fleetSub{{ID: "a"}, {ID: "b"}}, nil)
	var ids []string
	for i := range 3 {
		ids = append(ids, fmt.Sprintf("node-%d", i))
		w.addNode(ids[i], w.cfg)
	}
	for _, n := range w.current() {
		n.start()
	}
	for _, n := range w.current() {
		n.awaitReady(60 * time.Second)
	}
	w.awaitOwned("every lane owned", w.nodes[0], ids, 30*time.Second)
}

// TestFleetNATSDownAtStart: every NATS server is down when the fleet's
// sidecars start (a fault-injection run SIGKILLed them during a fleet's
// start-up, and every sidecar exited on "nats: outbound buffer limit
// exceeded"; the set-up side of it is jetstream's
// TestOpenOutlivesOutageDuringSetUp). While the cluster is away each
// sidecar stays up and answers its producer only 503 with Retry-After
// (docs/fleet.md); once the servers are back the sidecars finish
// starting, and every event answered 202 is delivered.
func TestFleetNATSDownAtStart(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet start-up: real sidecars and a JetStream cluster")
	}
	t.Parallel() // mostly idle processes: overlaps the other parallel fleet tests only
	w := newFleetWorld(t, []fleetSub{{ID: "a"}}, nil)
	for i := range w.cfg.URLs {
		w.cl.Kill(i)
	}
	for i := range 3 {
		w.addNode(fmt.Sprintf("node-%d", i), w.cfg)
	}
	nodes := w.current()
	for _, n := range nodes {
		n.start()
	}

	// A sidecar refuses an append it cannot place within the backend's
	// request timeout; the producers wait twice that, so a request left
	// without an answer is the sidecar's failure, not the client's.
	answerBound := 2 * sluicejs.DefaultRequestTimeout
	p := &strictProducers{refused: make([]int, len(nodes))}
	fleetAwait(t, "every sidecar's ingest answers while NATS is down", answerBound, func() (bool, string) {
		for i, n := range nodes {
			code, _, h, err := n.post("t.a", "probe-"+n.id)
			if err != nil || code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
				return false, fmt.Sprintf("%s: %d %v", n.id, code, err)
			}
			p.refused[i]++
		}
		return true, ""
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, n := range nodes {
		c := unixClient(n.ingestSock)
		c.Timeout = answerBound
		wg.Go(func() { p.run(n, i, c, stop) })
	}
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(halt)
	fleetAwait(t, "every producer refused with 503 while NATS is down", answerBound, func() (bool, string) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return !slices.ContainsFunc(p.refused, func(n int) bool { return n < 5 }) || len(p.problems) > 0,
			fmt.Sprintf("503s per node %v", p.refused)
	})
	for _, n := range nodes {
		if !n.running() {
			t.Fatalf("%s exited while NATS was down (status %d)", n.id, n.exitCode())
		}
	}

	for i := range w.cfg.URLs {
		if err := w.cl.Restart(i); err != nil {
			t.Fatalf("restart NATS node %d: %v", i, err)
		}
	}
	restarted := len(p.list())
	for _, n := range nodes {
		n.awaitReady(30 * time.Second) // dial and set-up backoffs (≤ 5 s), elections, set-up
	}
	fleetAwait(t, "events accepted after NATS returned", answerBound+10*time.Second, func() (bool, string) {
		got := len(p.list())
		return got >= restarted+30, fmt.Sprintf("%d accepted, %d of them after the restart", got, got-restarted)
	})
	halt()
	p.mu.Lock()
	for _, pr := range p.problems {
		t.Errorf("producer: %s", pr)
	}
	t.Logf("503s per node %v; %d accepted", p.refused, len(p.accepted))
	p.mu.Unlock()
	evs := p.list()
	fleetAwait(t, "every 202 delivered", 30*time.Second, func() (bool, string) {
		n, state := w.recv.missing(evs, fleetEntitled, []string{"a"})
		return n == 0, state
	})
	w.recv.checkProblems(t)
	for _, n := range nodes {
		n.term(10 * time.Second)
	}
}

// strictProducers post to one node each and accept only 202, or 503 with
// Retry-After; anything else, or no answer, is a problem.
type strictProducers struct {
	next atomic.Int64

	mu       sync.Mutex
	accepted []*fleetEvent
	refused  []int // 503s, per producer
	problems []string
}

func (p *strictProducers) problemf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.problems) < 20 {
		p.problems = append(p.problems, fmt.Sprintf(format, args...))
	}
}

func (p *strictProducers) list() []*fleetEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.accepted)
}

func (p *strictProducers) run(n *fleetNode, i int, c *http.Client, stop chan struct{}) {
	tick := time.NewTicker(20 * time.Millisecond) // the workload's pace
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		key := fleetKey(int(p.next.Add(1) - 1))
		typ, _ := fleetType(key)
		sent := time.Now()
		code, ans, h, err := n.postVia(c, typ, key)
		switch {
		case err != nil:
			p.problemf("POST %s to %s: %v (running: %v)", key, n.id, err, n.running())
		case code == http.StatusAccepted && ans.ID == key && ans.Seq > 0:
			p.mu.Lock()
			p.accepted = append(p.accepted, &fleetEvent{key: key, typ: typ, seq: ans.Seq, node: n.id, firstSent: sent, accepted: time.Now()})
			p.mu.Unlock()
		case code == http.StatusServiceUnavailable && h.Get("Retry-After") != "":
			p.mu.Lock()
			p.refused[i]++
			p.mu.Unlock()
		default:
			p.problemf("POST %s to %s: %d %+v Retry-After %q, want 202, or 503 with Retry-After", key, n.id, code, ans, h.Get("Retry-After"))
		}
	}
}

// TestFleetSIGTERMWhileNATSAway: a sidecar waiting for NATS servers that
// are not there (it would wait as long as that takes) stops at once on
// SIGTERM, with status 0: it accepted nothing, so nothing is left to drain.
func TestFleetSIGTERMWhileNATSAway(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet start-up: a real sidecar")
	}
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "nats://" + ln.Addr().String()
	ln.Close() // a port nothing listens on
	n := newFleetNode(t, t.TempDir(), "node-0", "http://127.0.0.1:1", fleetConfig{URLs: []string{url}, Subs: []fleetSub{{ID: "a"}}})
	n.start()
	fleetAwait(t, "ingest answers 503 while NATS is away", 2*sluicejs.DefaultRequestTimeout, func() (bool, string) {
		code, _, h, err := n.post("t.a", "k-0")
		return err == nil && code == http.StatusServiceUnavailable && h.Get("Retry-After") != "", fmt.Sprintf("%d %v", code, err)
	})
	n.term(5 * time.Second) // the dial's backoff is at most 5 s; it does not wait for it
	if !strings.Contains(n.log.String(), "stopped while starting") {
		t.Errorf("log lacks %q", "stopped while starting")
	}
}
