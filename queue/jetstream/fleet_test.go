package jetstream_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/jetstream"
)

// The fleet tests run several Stores (nodes) on one stream of the shared
// cluster. Stores are opened with jetstream.OpenFleet (the fleet side
// alone), memberships are written as the state side writes them
// (member.<sub> in <S>_STATE), and a recording handler checks, on every
// call, that no lane is ever told Gained on one node while another holds
// it. Nothing here sleeps to synchronise: every wait is for a condition,
// with a deadline.

var fleets atomic.Int64

// recorder is the OwnerHandler of every node of a test. It keeps who holds
// each lane as the handlers were told (Gained → held until Release) and
// fails the test when a lane is gained while another node holds it.
type recorder struct {
	t      testing.TB
	mu     sync.Mutex
	holder map[string]string // sub → node
	events []event
}

type event struct {
	node, kind, sub string
	done            bool // Release: the context was already done
}

func newRecorder(t testing.TB) *recorder {
	return &recorder{t: t, holder: map[string]string{}}
}

func (r *recorder) handler(node string) queue.OwnerHandler { return nodeHandler{r, node} }

type nodeHandler struct {
	r    *recorder
	node string
}

func (h nodeHandler) Gained(sub string) {
	r := h.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if other := r.holder[sub]; other != "" && other != h.node {
		r.t.Errorf("%s gained %s while %s holds it", h.node, sub, other)
	}
	r.holder[sub] = h.node
	r.events = append(r.events, event{node: h.node, kind: "gained", sub: sub})
}

func (h nodeHandler) Release(ctx context.Context, sub string) {
	r := h.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.holder[sub] != h.node {
		r.t.Errorf("%s told to release %s, held by %q", h.node, sub, r.holder[sub])
	}
	delete(r.holder, sub)
	r.events = append(r.events, event{node: h.node, kind: "release", sub: sub, done: ctx.Err() != nil})
}

func (h nodeHandler) Changed(sub string) {
	r := h.r
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{node: h.node, kind: "changed", sub: sub})
}

// crashed forgets what node held: a crashed process delivers nothing more.
func (r *recorder) crashed(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for sub, n := range r.holder {
		if n == node {
			delete(r.holder, sub)
		}
	}
}

func (r *recorder) holders() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string, len(r.holder))
	for k, v := range r.holder {
		out[k] = v
	}
	return out
}

func (r *recorder) count(node, kind, sub string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if (node == "" || e.node == node) && e.kind == kind && (sub == "" || e.sub == sub) {
			n++
		}
	}
	return n
}

func (r *recorder) eventsOf(node string) []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []event
	for _, e := range r.events {
		if e.node == node {
			out = append(out, e)
		}
	}
	return out
}

// fleet is one test's stream and its nodes.
type fleet struct {
	t      *testing.T
	stream string
	ttl    time.Duration
	rec    *recorder
	nc     *nats.Conn
	js     natsjs.JetStream
	nodes  map[string]*jetstream.Store
	regs   map[string]*prometheus.Registry
	log    *slog.Logger
}

func newFleet(t *testing.T, ttl time.Duration) *fleet {
	t.Helper()
	f := &fleet{
		t:      t,
		stream: fmt.Sprintf("FLEET%d", fleets.Add(1)),
		ttl:    ttl,
		rec:    newRecorder(t),
		nodes:  map[string]*jetstream.Store{},
		regs:   map[string]*prometheus.Registry{},
		log:    testLogger(t),
	}
	nc, err := nats.Connect(strings.Join(cluster.URLs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f.nc = nc
	if f.js, err = natsjs.New(nc); err != nil {
		t.Fatal(err)
	}
	// Last, once the nodes closed: the test's stream and buckets go, so
	// the shared cluster does not carry their Raft groups into later tests.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, b := range []string{"_STATE", "_NODES", "_LANES"} {
			f.js.DeleteKeyValue(ctx, f.stream+b)
		}
		f.js.DeleteStream(ctx, f.stream)
	})
	return f
}

// open opens node id (through urls, the cluster's by default) and makes
// it Own with the recorder.
func (f *fleet) open(id string, urls ...string) *jetstream.Store {
	f.t.Helper()
	s := f.openOnly(id, urls...)
	if err := s.Own(f.rec.handler(id)); err != nil {
		f.t.Fatalf("Own on %s: %v", id, err)
	}
	return s
}

// options are node id's store options, through urls (the cluster's by
// default), with a registry of its own, returned beside them.
func (f *fleet) options(id string, urls []string) (jetstream.Options, *prometheus.Registry) {
	if len(urls) == 0 {
		urls = cluster.URLs()
	}
	reg := prometheus.NewRegistry()
	return jetstream.Options{
		URLs: urls, Stream: f.stream, Replicas: 3, NodeID: id,
		LeaseTTL: f.ttl, RequestTimeout: 2 * time.Second, Registerer: reg,
		Logger: f.log.With("store", id),
	}, reg
}

func (f *fleet) openOnly(id string, urls ...string) *jetstream.Store {
	f.t.Helper()
	o, reg := f.options(id, urls)
	s, err := jetstream.OpenFleet(f.t, o)
	if err != nil {
		f.t.Fatalf("open %s: %v", id, err)
	}
	// Closed before OpenFleet's own cleanup: the handlers stop checking
	// the node first (its engine stops before Close), since the others
	// take its lanes at once.
	f.t.Cleanup(func() {
		f.rec.crashed(id)
		jetstream.CloseFleet(s)
	})
	f.nodes[id], f.regs[id] = s, reg
	return s
}

// openWhole opens node id as serve does (Open: the log, the state and the
// fleet, the state's writes fenced by the leases), through urls (the
// cluster's by default), and makes it Own with the recorder.
func (f *fleet) openWhole(id string, urls ...string) *jetstream.Store {
	f.t.Helper()
	o, reg := f.options(id, urls)
	s, err := jetstream.Open(o)
	if err != nil {
		f.t.Fatalf("open %s: %v", id, err)
	}
	f.t.Cleanup(func() {
		f.rec.crashed(id)
		s.Close()
	})
	f.nodes[id], f.regs[id] = s, reg
	if err := s.Own(f.rec.handler(id)); err != nil {
		f.t.Fatalf("Own on %s: %v", id, err)
	}
	return s
}

// state is the test's own handle on <S>_STATE.
func (f *fleet) state() natsjs.KeyValue {
	f.t.Helper()
	kv, err := f.js.KeyValue(context.Background(), f.stream+"_STATE")
	if err != nil {
		f.t.Fatal(err)
	}
	return kv
}

// joinThrough makes subs members through s, as a whole store's callers do.
func joinThrough(t *testing.T, s *jetstream.Store, subs []string) {
	t.Helper()
	reqs := make([]queue.JoinRequest, len(subs))
	for i, sub := range subs {
		reqs[i] = queue.JoinRequest{Subscription: sub}
	}
	if _, err := s.JoinAll(reqs); err != nil {
		t.Fatal(err)
	}
}

// join writes memberships as the state side does.
func (f *fleet) join(subs ...string) {
	f.t.Helper()
	kv := f.state()
	for _, sub := range subs {
		if _, err := kv.Create(context.Background(), "member."+sub, []byte(`{"from":1}`)); err != nil {
			f.t.Fatalf("create membership %s: %v", sub, err)
		}
	}
}

// metric sums the series of name on node id whose label values include
// label ("" for all of them).
func (f *fleet) metric(id, name, label string) float64 {
	f.t.Helper()
	mfs, err := f.regs[id].Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			if label != "" && !slices.ContainsFunc(m.GetLabel(), func(lp *dto.LabelPair) bool { return lp.GetValue() == label }) {
				continue
			}
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
		return sum
	}
	f.t.Fatalf("no metric %s on %s", name, id)
	return 0
}

// awaitLive waits until every node sees n live nodes.
func (f *fleet) awaitLive(n int, ids ...string) {
	f.t.Helper()
	await(f.t, 10*time.Second, fmt.Sprintf("%d live nodes seen by %v", n, ids), func() bool {
		for _, id := range ids {
			if f.metric(id, "sluice_fleet_nodes_live", "") != float64(n) {
				return false
			}
		}
		return true
	})
}

// awaitOwners waits until every sub is held, per the handlers, by its
// rendezvous owner among live, and every node in live agrees (Owner, Owns).
func (f *fleet) awaitOwners(within time.Duration, subs, live []string) {
	f.t.Helper()
	await(f.t, within, fmt.Sprintf("every lane held by its owner among %v", live), func() bool {
		h := f.rec.holders()
		for _, sub := range subs {
			want := policy.Owner(sub, live)
			if h[sub] != want {
				return false
			}
			for _, id := range live {
				s := f.nodes[id]
				if s.Owner(sub) != want || s.Owns(sub) != (id == want) {
					return false
				}
			}
		}
		return true
	})
}

// testLogger logs through t (shown with -v or on failure), and drops what
// is logged once the test is over (the NATS client's callbacks may still
// fire then).
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.over = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	t    testing.TB
	mu   sync.Mutex
	over bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.over {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func await(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		<-tick.C
	}
}

func subIDs(n int) []string {
	subs := make([]string, n)
	for i := range subs {
		subs[i] = fmt.Sprintf("sub-%02d", i)
	}
	return subs
}

func ownedBy(subs, live []string, node string) []string {
	var out []string
	for _, sub := range subs {
		if policy.Owner(sub, live) == node {
			out = append(out, sub)
		}
	}
	return out
}

func TestFleetOwnership(t *testing.T) {
	f := newFleet(t, 3*time.Second)
	abc := []string{"a", "b", "c"}
	for _, id := range abc {
		f.open(id)
	}
	f.awaitLive(3, abc...)
	subs := subIDs(30)
	f.join(subs...)
	f.awaitOwners(10*time.Second, subs, abc)

	for _, sub := range subs {
		if n := f.rec.count("", "gained", sub); n != 1 {
			t.Errorf("%s gained %d times, want once", sub, n)
		}
	}
	if n := f.rec.count("", "release", ""); n != 0 {
		t.Errorf("%d releases in a stable fleet", n)
	}
	var held, taken float64
	for _, id := range abc {
		held += f.metric(id, "sluice_fleet_leases_held", "")
		taken += f.metric(id, "sluice_fleet_lease_takeovers_total", "")
	}
	if held != 30 || taken != 30 {
		t.Errorf("leases held %v, takeovers %v over the fleet, want 30 and 30", held, taken)
	}
	if age := f.metric("a", "sluice_fleet_heartbeat_age_seconds", ""); age <= 0 {
		t.Errorf("heartbeat age %v on a joined node, want the time since its last heartbeat", age)
	}

	// Renewals keep the leases: wait for a few rounds on every node.
	for _, id := range abc {
		await(t, 10*time.Second, "renewals on "+id, func() bool {
			return f.metric(id, "sluice_fleet_lease_renewals_total", "ok") >= 2*float64(len(ownedBy(subs, abc, id)))
		})
	}
	if n := f.rec.count("", "release", ""); n != 0 {
		t.Errorf("%d releases while renewing", n)
	}

	// The owner fences its writes with the lease; the others may not write.
	sub := subs[0]
	owner := policy.Owner(sub, abc)
	subject, rev, fenced, done, err := jetstream.Fence(f.nodes[owner], sub)
	if err != nil || !fenced || rev == 0 || subject != "$KV."+f.stream+"_STATE.lease."+sub {
		t.Fatalf("owner's fence(%s) = %q, %d, %v, %v", sub, subject, rev, fenced, err)
	}
	done()
	done() // done twice is harmless
	for _, id := range abc {
		if id == owner {
			continue
		}
		if _, _, _, _, err := jetstream.Fence(f.nodes[id], sub); !errors.Is(err, queue.ErrFenced) {
			t.Errorf("fence(%s) on %s, not its owner: %v, want ErrFenced", sub, id, err)
		}
	}
}

// A node closed gracefully hands its lanes over at once: with a lease TTL
// longer than the wait, the others can only have them because the leases
// were deleted, not expired. It comes back under the same id at once (its
// heartbeat was deleted too) and takes back its share, each lane given up
// on purpose by its interim owner.
func TestFleetGracefulHandover(t *testing.T) {
	const ttl = 30 * time.Second
	const within = 10 * time.Second // well before ttl: only a release explains it
	f := newFleet(t, ttl)
	abc, ab := []string{"a", "b", "c"}, []string{"a", "b"}
	for _, id := range abc {
		f.open(id)
	}
	f.awaitLive(3, abc...)
	subs := subIDs(30)
	f.join(subs...)
	f.awaitOwners(within, subs, abc)
	fromC := ownedBy(subs, abc, "c")
	if len(fromC) == 0 {
		t.Fatal("c owns nothing")
	}

	f.rec.crashed("c") // the engine stops its lanes before Close
	jetstream.CloseFleet(f.nodes["c"])
	if n := len(f.rec.eventsOf("c")); n != len(fromC) {
		t.Errorf("c's handler heard %d calls, want only its %d Gained (Close never calls it)", n, len(fromC))
	}
	f.awaitLive(2, ab...)
	f.awaitOwners(within, subs, ab)

	f.open("c")
	f.awaitLive(3, abc...)
	f.awaitOwners(within, subs, abc)
	for _, sub := range fromC {
		released := false
		for _, id := range ab {
			for _, e := range f.rec.eventsOf(id) {
				if e.kind == "release" && e.sub == sub {
					released = true
					if e.done {
						t.Errorf("%s released %s with a done context, want a live one (a handover, not a loss)", id, sub)
					}
				}
			}
		}
		if !released {
			t.Errorf("%s came back to c without its interim owner releasing it", sub)
		}
	}
}

// A crashed node's lanes move only after its leases expired: in the lease
// watch, each lane's first write by another node is stamped by the
// servers at least a lease TTL after c's last write of it (the servers'
// own timestamps, not the test's clock). The node comes back under the
// same id once its old heartbeat expired; a second live process with that
// id is refused.
func TestFleetCrash(t *testing.T) {
	const ttl = 2 * time.Second
	f := newFleet(t, ttl)
	abc, ab := []string{"a", "b", "c"}, []string{"a", "b"}
	for _, id := range abc {
		f.open(id)
	}
	f.awaitLive(3, abc...)
	subs := subIDs(30)
	f.join(subs...)
	f.awaitOwners(10*time.Second, subs, abc)
	fromC := ownedBy(subs, abc, "c")

	type write struct {
		node string // "" for a delete or expiry marker
		at   time.Time
	}
	var mu sync.Mutex
	writes := map[string][]write{}
	w, err := f.state().Watch(context.Background(), "lease.>", natsjs.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	go func() {
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			mu.Lock()
			sub := strings.TrimPrefix(e.Key(), "lease.")
			node := ""
			if e.Operation() == natsjs.KeyValuePut {
				node = string(e.Value())
			}
			writes[sub] = append(writes[sub], write{node, e.Created()})
			mu.Unlock()
		}
	}()
	await(t, 10*time.Second, "the test's lease watch sees c renew each of its leases", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, sub := range fromC {
			if len(writes[sub]) == 0 {
				return false
			}
		}
		return true
	})

	f.rec.crashed("c")
	jetstream.Crash(f.nodes["c"])
	f.awaitLive(2, ab...)
	f.awaitOwners(15*time.Second, subs, ab)
	// The nodes know their new leases before the test's own watch has
	// delivered the puts: await them there too.
	await(t, 10*time.Second, "the test's lease watch sees each of c's leases taken by another node", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, sub := range fromC {
			taken := false
			for _, w := range writes[sub] {
				taken = taken || (w.node != "" && w.node != "c")
			}
			if !taken {
				return false
			}
		}
		return true
	})

	mu.Lock()
	for _, sub := range fromC {
		var lastC, next write
		for _, w := range writes[sub] {
			if w.node == "c" {
				lastC = w
			} else if w.node != "" {
				next = w
				break
			}
		}
		switch {
		case lastC.node == "" || next.node == "":
			t.Errorf("lease writes of %s: %v, want c's renewals, then the new owner's", sub, writes[sub])
		case next.at.Sub(lastC.at) < ttl:
			t.Errorf("%s taken by %s %s after c's last renewal, before the lease (%s) expired", sub, next.node, next.at.Sub(lastC.at), ttl)
		default:
			t.Logf("%s taken by %s %s after c's last renewal", sub, next.node, next.at.Sub(lastC.at))
		}
	}
	mu.Unlock()

	// c restarts: its old heartbeat may still be live, Own waits it out.
	f.open("c")
	f.awaitLive(3, abc...)
	f.awaitOwners(15*time.Second, subs, abc)

	// A second live process with c's id is refused, naming the id.
	dup := f.openOnly("c")
	err = dup.Own(f.rec.handler("c-dup"))
	if err == nil || !strings.Contains(err.Error(), `node_id "c"`) {
		t.Fatalf("Own of a second node c = %v, want an error naming node_id \"c\"", err)
	}
	if n := len(f.rec.eventsOf("c-dup")); n != 0 {
		t.Errorf("the refused duplicate's handler heard %d calls", n)
	}
}

// A node cut off from NATS stops (Release with a done context) before its
// leases can expire elsewhere; its stale fenced write is refused by the
// servers, and fence refuses locally.
func TestFleetSeveredNodeIsFenced(t *testing.T) {
	f := newFleet(t, 2*time.Second)
	abc, ab := []string{"a", "b", "c"}, []string{"a", "b"}
	p := newProxy(t, cluster.URL(0))
	f.open("a")
	f.open("b")
	c := f.open("c", p.URL())
	f.awaitLive(3, abc...)
	subs := subIDs(12)
	f.join(subs...)
	f.awaitOwners(10*time.Second, subs, abc)
	fromC := ownedBy(subs, abc, "c")
	if len(fromC) == 0 {
		t.Fatal("c owns nothing")
	}
	sub := fromC[0]

	// A fenced write while c holds the lease goes through...
	write := func(subject string, rev uint64) error {
		m := nats.NewMsg("$KV." + f.stream + "_STATE.cursor." + sub)
		m.Data = []byte("42")
		m.Header.Set("Nats-Expected-Last-Subject-Sequence", strconv.FormatUint(rev, 10))
		m.Header.Set("Nats-Expected-Last-Subject-Sequence-Subject", subject)
		_, err := f.js.PublishMsg(context.Background(), m)
		return err
	}
	subject, rev, fenced, done, err := jetstream.Fence(c, sub)
	if err != nil || !fenced {
		t.Fatalf("fence(%s) on c: %v, %v", sub, fenced, err)
	}
	if err := write(subject, rev); err != nil {
		t.Fatalf("fenced write of the lease holder: %v", err)
	}
	done()
	// ... and one c prepares now, to send once it was cut off, must not.
	subject, rev, _, done, err = jetstream.Fence(c, sub)
	if err != nil {
		t.Fatal(err)
	}
	done()

	p.sever()
	await(t, 10*time.Second, "c releases every lane with a done context", func() bool {
		for _, s := range fromC {
			if f.rec.count("c", "release", s) != 1 {
				return false
			}
		}
		return true
	})
	for _, e := range f.rec.eventsOf("c") {
		if e.kind == "release" && !e.done {
			t.Errorf("c released %s with a live context after losing NATS", e.sub)
		}
	}
	if _, _, _, _, err := jetstream.Fence(c, sub); !errors.Is(err, queue.ErrFenced) {
		t.Errorf("fence(%s) on the cut-off node: %v, want ErrFenced", sub, err)
	}
	if c.Owns(sub) {
		t.Errorf("the cut-off node still Owns %s", sub)
	}
	// The others take over once the leases expired; the recorder checked,
	// call by call, that none gained a lane before c released it.
	f.awaitLive(2, ab...)
	f.awaitOwners(15*time.Second, subs, ab)
	err = write(subject, rev)
	var apiErr *natsjs.APIError
	if !errors.As(err, &apiErr) || (apiErr.ErrorCode != natsjs.JSErrCodeStreamWrongLastSequence && apiErr.ErrorCode != natsjs.JSErrCodeStreamWrongLastSequenceConstant) {
		t.Fatalf("the stale owner's fenced write = %v, want wrong last sequence", err)
	}
	if v := f.metric("c", "sluice_fleet_lease_renewals_total", "error"); v == 0 {
		t.Error("no failed renewal counted on the cut-off node")
	}
}

// A node that could not renew in time stops its lanes (Release with a
// done context) and, when the leases turn out to be still its own on the
// servers (nobody could take them), takes them up again at once: the
// other node never gains them.
func TestFleetStalledNodeStopsAndResumes(t *testing.T) {
	f := newFleet(t, 3*time.Second)
	ab := []string{"a", "b"}
	a := f.open("a")
	f.open("b")
	f.awaitLive(2, ab...)
	subs := subIDs(10)
	f.join(subs...)
	f.awaitOwners(10*time.Second, subs, ab)
	fromA := ownedBy(subs, ab, "a")

	jetstream.StallLeases(a)
	await(t, 10*time.Second, "a stops and resumes each of its lanes", func() bool {
		for _, sub := range fromA {
			if f.rec.count("a", "release", sub) != 1 || f.rec.count("a", "gained", sub) != 2 {
				return false
			}
		}
		return true
	})
	for _, e := range f.rec.eventsOf("a") {
		if e.kind == "release" && !e.done {
			t.Errorf("a released %s with a live context, want a done one (the lease was not trusted)", e.sub)
		}
	}
	f.awaitOwners(10*time.Second, subs, ab)
	for _, sub := range fromA {
		if n := f.rec.count("b", "gained", sub); n != 0 {
			t.Errorf("b gained %s, a's lease all along", sub)
		}
	}
}

func TestFleetUnfencedBeforeOwn(t *testing.T) {
	f := newFleet(t, 2*time.Second)
	s := f.openOnly("tool")
	subject, rev, fenced, done, err := jetstream.Fence(s, "billing")
	if err != nil || fenced || subject != "" || rev != 0 {
		t.Fatalf("fence before Own = %q, %d, %v, %v; want unfenced", subject, rev, fenced, err)
	}
	done()
	if s.Owns("billing") || s.Owner("billing") != "" {
		t.Error("a store that never joined owns a lane")
	}
	mfs, err := f.regs["tool"].Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "sluice_fleet_") {
			t.Errorf("a store that never joined exports %s", mf.GetName())
		}
	}
}

// Change notices reach the owner's handler; lane snapshots published by
// the owner are read on every node.
func TestFleetChangedAndSnapshots(t *testing.T) {
	f := newFleet(t, 2*time.Second)
	ab := []string{"a", "b"}
	a, b := f.open("a"), f.open("b")
	f.awaitLive(2, ab...)
	subs := subIDs(8)
	f.join(subs...)
	f.awaitOwners(10*time.Second, subs, ab)
	fromA, fromB := ownedBy(subs, ab, "a"), ownedBy(subs, ab, "b")
	if len(fromA) == 0 || len(fromB) == 0 {
		t.Fatalf("owners %v / %v: both nodes need a lane", fromA, fromB)
	}

	jetstream.NotifyChanged(b, fromA[0])
	await(t, 5*time.Second, "a hears Changed", func() bool { return f.rec.count("a", "changed", fromA[0]) == 1 })
	if n := f.rec.count("b", "changed", ""); n != 0 {
		t.Errorf("b heard %d Changed about a lane it does not own", n)
	}

	err := a.PublishLanes(map[string][]byte{
		fromA[0]: []byte(`{"in_flight":3}`),
		fromB[0]: []byte(`{"in_flight":99}`), // not a's: skipped
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.PublishLanes(map[string][]byte{fromA[0]: []byte("not json")}); err == nil {
		t.Error("a snapshot that is not JSON was accepted")
	}
	await(t, 5*time.Second, "b reads a's snapshot", func() bool {
		snaps, err := b.LaneSnapshots()
		if err != nil {
			t.Fatal(err)
		}
		snap, ok := snaps[fromA[0]]
		return ok && snap.Node == "a" && string(snap.Data) == `{"in_flight":3}` && !snap.At.IsZero()
	})
	snaps, _ := b.LaneSnapshots()
	if _, ok := snaps[fromB[0]]; ok {
		t.Errorf("a published a snapshot of %s, b's lane", fromB[0])
	}
}

// A node whose watches end while it runs (the client library gives up on
// a watch's consumer when recreating it fails with an error it does not
// retry) watches again from where they stopped: it still hears of the
// subscriptions made, the nodes joined and the leases taken after.
func TestFleetEndedWatchesResume(t *testing.T) {
	f := newFleet(t, 2*time.Second)
	subs := subIDs(8)
	a := f.open("a")
	f.awaitLive(1, "a")
	f.join(subs[:4]...)
	f.awaitOwners(10*time.Second, subs[:4], []string{"a"})

	jetstream.EndWatches(a)
	f.join(subs[4:]...)
	f.open("b")
	ab := []string{"a", "b"}
	f.awaitLive(2, ab...)
	f.awaitOwners(10*time.Second, subs, ab)
	if len(ownedBy(subs, ab, "b")) == 0 || len(ownedBy(subs[4:], ab, "a")) == 0 {
		t.Fatalf("owners %v: b needs a lane, and a one made after its watches ended", subs)
	}
}

func TestFleetRefusesBadSetup(t *testing.T) {
	f := newFleet(t, 2*time.Second)
	if _, err := f.js.CreateKeyValue(context.Background(), natsjs.KeyValueConfig{
		Bucket: f.stream + "_NODES", History: 5, Replicas: 3, LimitMarkerTTL: time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	_, err := jetstream.OpenFleet(t, jetstream.Options{URLs: cluster.URLs(), Stream: f.stream, Replicas: 3, NodeID: "a"})
	if err == nil || !strings.Contains(err.Error(), f.stream+"_NODES") || !strings.Contains(err.Error(), "history") {
		t.Errorf("open on a heartbeat bucket with history: %v, want it refused, naming the bucket and the setting", err)
	}
	t.Cleanup(func() { f.js.DeleteKeyValue(context.Background(), f.stream+"X_STATE") })
	_, err = jetstream.OpenFleet(t, jetstream.Options{URLs: cluster.URLs(), Stream: f.stream + "X", Replicas: 3, NodeID: "a", LeaseTTL: 500 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "lease_ttl") {
		t.Errorf("open with a lease TTL under a second: %v, want it refused", err)
	}
}

// proxy is a loopback TCP proxy in front of one NATS server that can be
// severed. It removes the cluster's other addresses from what the server
// tells the client (INFO connect_urls), so a severed client cannot reach
// the cluster another way.
type proxy struct {
	t      testing.TB
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
}

func newProxy(t testing.TB, natsURL string) *proxy {
	t.Helper()
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, ln: ln, target: u.Host}
	t.Cleanup(p.sever)
	go p.serve()
	return p
}

func (p *proxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() { io.Copy(s, c); s.Close() }()
		go func() { stripDiscovery(c, s); c.Close() }()
	}
}

// sever closes the listener and every connection through it.
func (p *proxy) sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

// stripDiscovery copies the server's side of the NATS protocol to the
// client, dropping connect_urls from every INFO. Messages' payloads are
// copied by their announced size, never parsed.
func stripDiscovery(dst io.Writer, src io.Reader) {
	r := bufio.NewReaderSize(src, 64<<10)
	w := bufio.NewWriterSize(dst, 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
		op := strings.ToUpper(string(line[:min(len(line), 5)]))
		switch {
		case strings.HasPrefix(op, "INFO "):
			var info map[string]any
			if json.Unmarshal(line[5:], &info) == nil {
				delete(info, "connect_urls")
				delete(info, "ws_connect_urls")
				b, _ := json.Marshal(info)
				line = append(append([]byte("INFO "), b...), '\r', '\n')
			}
			w.Write(line)
		case strings.HasPrefix(op, "MSG "), strings.HasPrefix(op, "HMSG "):
			fields := strings.Fields(string(line))
			n, _ := strconv.Atoi(fields[len(fields)-1])
			w.Write(line)
			if _, err := io.CopyN(w, r, int64(n)+2); err != nil {
				return
			}
		default:
			w.Write(line)
		}
		if r.Buffered() == 0 {
			if w.Flush() != nil {
				return
			}
		}
	}
}

// Whole stores (Open: log, state and fleet): the state side's writes are
// fenced by the fleet's leases. A node cut off from NATS has its outcome
// refused with ErrFenced once it stopped owning the lane (its cursor write
// is skipped, as SaveCursors documents); the new owner reads what the old
// one wrote before and writes on.
func TestFleetOpenStoresFenceStateWrites(t *testing.T) {
	f := newFleet(t, 2*time.Second)
	abc, ab := []string{"a", "b", "c"}, []string{"a", "b"}
	p := newProxy(t, cluster.URL(1))
	a := f.openWhole("a")
	f.openWhole("b")
	c := f.openWhole("c", p.URL())
	f.awaitLive(3, abc...)

	subs := subIDs(9)
	joinThrough(t, a, subs)
	f.awaitOwners(10*time.Second, subs, abc)
	fromC := ownedBy(subs, abc, "c")
	if len(fromC) == 0 {
		t.Fatal("c owns nothing")
	}
	sub := fromC[0]
	now := time.Now()
	retry := func(seq uint64) queue.Outcome {
		return queue.Outcome{Kind: queue.RetryScheduled, Subscription: sub, Seq: seq, At: now,
			Retry: &queue.Retry{Subscription: sub, Seq: seq, Due: now.Add(time.Hour), Attempt: 1, FirstAttempt: now}}
	}
	cursor := func(s *jetstream.Store) uint64 {
		t.Helper()
		ms, err := s.Memberships()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.Subscription == sub {
				return m.Cursor
			}
		}
		t.Fatalf("no membership %s", sub)
		return 0
	}
	if err := c.SaveCursors(map[string]uint64{sub: 7}); err != nil {
		t.Fatalf("the owner's cursor write: %v", err)
	}
	if err := c.Record(retry(5)); err != nil {
		t.Fatalf("the owner's outcome: %v", err)
	}
	if err := a.Record(retry(6)); !errors.Is(err, queue.ErrFenced) {
		t.Fatalf("an outcome recorded by a node that does not own %s: %v, want ErrFenced", sub, err)
	}
	if err := a.SaveCursors(map[string]uint64{sub: 8}); err != nil || cursor(a) != 7 {
		t.Fatalf("a cursor write by a node that does not own %s: %v, cursor %d; want it skipped", sub, err, cursor(a))
	}

	p.sever()
	f.awaitLive(2, ab...)
	f.awaitOwners(15*time.Second, subs, ab)
	if err := c.Record(retry(6)); !errors.Is(err, queue.ErrFenced) {
		t.Fatalf("the cut-off node's outcome: %v, want ErrFenced", err)
	}
	if err := c.SaveCursors(map[string]uint64{sub: 9}); err != nil {
		t.Fatalf("the cut-off node's cursor write: %v, want it skipped", err)
	}
	owner := f.nodes[policy.Owner(sub, ab)]
	m, rs, err := owner.Lane(sub)
	if err != nil {
		t.Fatal(err)
	}
	if m.Cursor != 7 {
		t.Errorf("the new owner reads cursor %d of %s, want 7 (the old owner's last write)", m.Cursor, sub)
	}
	if rs == nil || rs.Count != 1 {
		t.Errorf("the new owner reads retry summary %+v of %s, want the old owner's one retry", rs, sub)
	}
	if err := owner.SaveCursors(map[string]uint64{sub: 10}); err != nil || cursor(owner) != 10 {
		t.Errorf("the new owner's cursor write: %v, cursor %d; want 10", err, cursor(owner))
	}
	if err := owner.Record(retry(6)); err != nil {
		t.Errorf("the new owner's outcome: %v", err)
	}
}

// A lease dropped for want of renewal is most often still this node's on
// the servers: the cursor its lane writes as it stops (Release) still
// lands, fenced by the last revision this node wrote, so taking the lease
// up again resends nothing acknowledged before. Once another node wrote
// the lease, the servers refuse that write.
func TestFleetLostLeaseLastCursor(t *testing.T) {
	f := newFleet(t, 3*time.Second)
	ab := []string{"a", "b"}
	a, b := f.openWhole("a"), f.openWhole("b")
	f.awaitLive(2, ab...)
	subs := subIDs(6)
	joinThrough(t, a, subs)
	f.awaitOwners(10*time.Second, subs, ab)
	fromA := ownedBy(subs, ab, "a")
	if len(fromA) == 0 {
		t.Fatal("a owns nothing")
	}
	sub := fromA[0]
	cursor := func() uint64 {
		t.Helper()
		m, err := b.Member(sub)
		if err != nil {
			t.Fatal(err)
		}
		return m.Cursor
	}
	if err := a.SaveCursors(map[string]uint64{sub: 5}); err != nil || cursor() != 5 {
		t.Fatalf("the owner's cursor write: %v, cursor %d; want 5", err, cursor())
	}

	jetstream.StallLeases(a)
	if a.Owns(sub) {
		t.Fatalf("a still owns %s after its leases went stale", sub)
	}
	if err := a.SaveCursors(map[string]uint64{sub: 9}); err != nil || cursor() != 9 {
		t.Fatalf("a's cursor write under the lease it dropped but still holds on the servers: %v, cursor %d; want 9", err, cursor())
	}
	await(t, 10*time.Second, "a takes its leases up again", func() bool { return a.Owns(sub) })
	if n := f.rec.count("b", "gained", sub); n != 0 {
		t.Fatalf("b gained %s, a's lease all along", sub)
	}
}
