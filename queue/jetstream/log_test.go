package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/internal/natscluster"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/jetstream"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// The log side's own tests: what the contract suite cannot say about a
// shared log (other nodes' appends, a cluster without quorum, a stream
// someone else made, a full stream). They open stores with the log side
// only (OpenLog): the delivery state and the fleet are not needed, and
// Compact asks a jetstream.Retention the test sets.

// logStream returns a stream name no other test uses.
func logStream() string { return fmt.Sprintf("L%d", places.Add(1)) }

// logOptions are a test store's options on the shared cluster.
func logOptions(stream string) jetstream.Options {
	return jetstream.Options{
		URLs: cluster.URLs(), Stream: stream, Replicas: 3, NodeID: "test",
		CompactInterval: -1, Logger: quietLogger(),
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func openLog(t testing.TB, o jetstream.Options, ret *jetstream.Retention) *jetstream.Store {
	t.Helper()
	s, err := jetstream.OpenLog(t, o, ret)
	if err != nil {
		t.Fatalf("open %s: %v", o.Stream, err)
	}
	return s
}

// rawJS is a plain client of the shared cluster, for streams made by hand.
func rawJS(t testing.TB, urls []string) natsjs.JetStream {
	t.Helper()
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func TestStreamRefusesIncompatible(t *testing.T) {
	base := func(name string) natsjs.StreamConfig {
		return natsjs.StreamConfig{
			Name: name, Subjects: []string{name + ".ev.>"}, Retention: natsjs.LimitsPolicy,
			Storage: natsjs.FileStorage, Replicas: 3, Duplicates: queue.DefaultDedupWindow,
			Discard: natsjs.DiscardNew, AllowDirect: true,
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*natsjs.StreamConfig)
		want   []string // every one in the error
	}{
		{"subjects", func(c *natsjs.StreamConfig) { c.Subjects = []string{c.Name + ".other.>"} }, []string{"subjects", ".other.>", ".ev.>", "jetstream.stream"}},
		{"retention", func(c *natsjs.StreamConfig) { c.Retention = natsjs.InterestPolicy }, []string{"retention interest", "limits"}},
		{"replicas", func(c *natsjs.StreamConfig) { c.Replicas = 1 }, []string{"1 replicas", "jetstream.replicas is 3"}},
		{"duplicate window", func(c *natsjs.StreamConfig) { c.Duplicates = time.Minute }, []string{"duplicate window of 1m0s", "dedup_window is 24h0m0s"}},
		{"memory storage", func(c *natsjs.StreamConfig) { c.Storage = natsjs.MemoryStorage }, []string{"memory storage", "file storage"}},
		{"discard old", func(c *natsjs.StreamConfig) { c.Discard = natsjs.DiscardOld }, []string{"discard old", "discard new"}},
		{"max age", func(c *natsjs.StreamConfig) { c.MaxAge = 48 * time.Hour }, []string{"max_age 48h0m0s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := logStream()
			cfg := base(name)
			tc.change(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := rawJS(t, cluster.URLs()).CreateStream(ctx, cfg); err != nil {
				t.Fatalf("create %s by hand: %v", name, err)
			}
			// Open as a whole refuses it before anything else is made.
			o := logOptions(name)
			_, err := jetstream.Open(o)
			if err == nil {
				t.Fatal("Open accepted an incompatible stream")
			}
			t.Logf("refused: %v", err)
			for _, w := range append(tc.want, "jetstream.stream "+name) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			// Nothing was changed.
			st, err := rawJS(t, cluster.URLs()).Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.CachedInfo().Config; got.Replicas != cfg.Replicas || got.Duplicates != cfg.Duplicates ||
				got.Storage != cfg.Storage || got.Discard != cfg.Discard || got.Retention != cfg.Retention {
				t.Errorf("the refused stream was changed: %+v", got)
			}
		})
	}
}

func TestStreamMaxBytesFollowsConfig(t *testing.T) {
	name := logStream()
	o := logOptions(name)
	o.MaxBytes = 1 << 20
	s := openLog(t, o, nil)
	jetstream.CloseLog(s)
	o.MaxBytes = 2 << 20
	s = openLog(t, o, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := rawJS(t, cluster.URLs()).Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.MaxBytes; got != 2<<20 {
		t.Fatalf("max_bytes = %d after reopening with 2 MiB", got)
	}
	if u := s.DiskUsage(); u.Free < 0 || u.Free > 2<<20 {
		t.Fatalf("DiskUsage with max_bytes 2 MiB: %+v", u)
	}
}

func TestReplicasLargerThanCluster(t *testing.T) {
	o := logOptions(logStream())
	o.Replicas = 5
	_, err := jetstream.Open(o)
	if err == nil {
		t.Fatal("Open made a 5-replica stream on 3 servers")
	}
	t.Logf("refused: %v", err)
	for _, w := range []string{"jetstream.replicas 5", "3 servers"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %q", err, w)
		}
	}
}

// TestOpenUnreachable: with nothing at the address Open keeps dialling
// (a sidecar may start before its NATS servers) until Cancel, and then
// says what it could not reach.
func TestOpenUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a port nothing listens on
	o := logOptions(logStream())
	o.URLs = []string{"nats://" + addr}
	o.ConnectTimeout = 300 * time.Millisecond // bounds servers without JetStream, not unreachable ones
	cancel := make(chan struct{})
	o.Cancel = cancel
	done := make(chan error, 1)
	go func() {
		_, err := jetstream.Open(o)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("Open gave up on its own while NATS was away: %v", err)
	case <-time.After(3 * o.ConnectTimeout):
	}
	close(cancel)
	err = <-done
	if err == nil || !errors.Is(err, queue.ErrClosed) || !strings.Contains(err.Error(), "jetstream.urls") || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Open with nothing at %s, cancelled: %v, want queue.ErrClosed naming jetstream.urls and the address", addr, err)
	}
}

// TestOpenOutlivesOutageDuringSetUp: every NATS server goes down after
// Open has connected and before the stream and buckets are set up (a
// fresh fleet's start-up, in the fault-injection run that found every
// sidecar exiting on "nats: outbound buffer limit exceeded"). Open keeps
// trying instead of failing, finishes once the servers are back, and the
// store then appends.
func TestOpenOutlivesOutageDuringSetUp(t *testing.T) {
	c, err := natscluster.Start(natscluster.Options{Dir: t.TempDir(), MaxPayloadBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	o := logOptions("OUTAGE")
	o.URLs = c.URLs()
	o.RequestTimeout = 2 * time.Second
	retrying := make(chan struct{}, 1)
	o.Logger = slog.New(&noticeHandler{msg: "set-up not done yet", seen: retrying})
	o = jetstream.AfterConnect(o, func() {
		for i := range c.URLs() {
			c.Kill(i)
		}
	})
	type opened struct {
		s   *jetstream.Store
		err error
	}
	done := make(chan opened, 1)
	go func() {
		s, err := jetstream.Open(o)
		done <- opened{s, err}
	}()
	// Each attempt ends within a request timeout, refused or timed out.
	select {
	case <-retrying:
	case r := <-done:
		if r.s != nil {
			r.s.Close()
		}
		t.Fatalf("Open returned while every server was down: %v", r.err)
	case <-time.After(3 * o.RequestTimeout):
		t.Fatal("Open did not retry its set-up")
	}
	for i := range c.URLs() {
		if err := c.Restart(i); err != nil {
			t.Fatalf("restart node %d: %v", i, err)
		}
	}
	var s *jetstream.Store
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Open after the servers came back: %v", r.err)
		}
		s = r.s
		t.Cleanup(func() { s.Close() })
	case <-time.After(15 * o.RequestTimeout): // a liveness bound: elections, then a few set-up steps
		t.Fatal("Open did not finish after the servers came back")
	}
	// The stream's leader may still be being elected: ErrUnavailable is
	// what a producer would hear as 503, and retry.
	deadline := time.Now().Add(10 * o.RequestTimeout)
	for {
		_, _, err := s.Append(queuetest.Event("after", "t", "x"))
		if err == nil {
			break
		}
		if !errors.Is(err, queue.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("append after the outage: %v", err)
		}
	}
}

// noticeHandler is a slog.Handler that tells seen (without blocking) when
// a record whose message contains msg is logged.
type noticeHandler struct {
	msg  string
	seen chan struct{}
}

func (h *noticeHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *noticeHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *noticeHandler) WithGroup(string) slog.Handler            { return h }
func (h *noticeHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.msg) {
		select {
		case h.seen <- struct{}{}:
		default:
		}
	}
	return nil
}

// TestAppendNoQuorum: with two of three servers down the stream has no
// quorum; Append says so (queue.ErrUnavailable) within its deadline, and
// once the servers are back a retry of the same id is stored once.
func TestAppendNoQuorum(t *testing.T) {
	c, err := natscluster.Start(natscluster.Options{Dir: t.TempDir(), MaxPayloadBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	o := logOptions("Q")
	o.URLs = c.URLs()
	o.RequestTimeout = 2 * time.Second
	s := openLog(t, o, nil)
	queuetest.MustAppend(t, s, queuetest.Event("before", "t", "x"))

	c.Kill(1)
	c.Kill(2)
	done := make(chan error, 1)
	go func() {
		_, _, err := s.Append(queuetest.Event("during", "t", "y"))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, queue.ErrUnavailable) {
			t.Fatalf("append without quorum: %v, want ErrUnavailable", err)
		}
		if !strings.Contains(err.Error(), "during") {
			t.Errorf("the error %q does not name the event", err)
		}
		t.Logf("append without quorum: %v", err)
	case <-time.After(30 * time.Second): // a liveness bound, far above RequestTimeout
		t.Fatal("append without quorum did not return")
	}

	for _, i := range []int{1, 2} {
		if err := c.Restart(i); err != nil {
			t.Fatalf("restart node %d: %v", i, err)
		}
	}
	// The producer retries "during" until the stream has a leader again.
	deadline := time.Now().Add(40 * time.Second)
	var seq uint64
	for {
		var err error
		seq, _, err = s.Append(queuetest.Event("during", "t", "y"))
		if err == nil {
			break
		}
		if !errors.Is(err, queue.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("append after the restarts: %v", err)
		}
	}
	again, dup, err := s.Append(queuetest.Event("during", "t", "y"))
	if err != nil || !dup || again != seq {
		t.Fatalf("the retried id again: seq %d dup %v err %v, want the seq %d as a duplicate", again, dup, err, seq)
	}
	// Read up to the seq Append returned, not to the head: when the
	// attempt without quorum got no PubAck but was stored once the
	// servers came back, the retry is its duplicate, and returns before
	// the stream follower (resubscribing after the restarts) has handed
	// that seq to OnCommit.
	evs, _, err := s.Events(1, seq, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.ID == "during" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the stream holds %d events with id \"during\", want 1: %v", n, evs)
	}
}

// TestAppendDiskFull: a stream at its max_bytes refuses new events
// (queue.ErrDiskFull, counted in the metrics) until compaction frees room.
func TestAppendDiskFull(t *testing.T) {
	o := logOptions(logStream())
	o.MaxBytes = 32 << 10
	reg := prometheus.NewRegistry()
	o.Registerer = reg
	s := openLog(t, o, nil)
	body := strings.Repeat("x", 1024)
	var full error
	for i := range 100 {
		if _, _, err := s.Append(queuetest.Event(fmt.Sprint("e", i), "t", body)); err != nil {
			full = err
			break
		}
	}
	if !errors.Is(full, queue.ErrDiskFull) {
		t.Fatalf("appending 100 KiB to a 32 KiB stream: %v, want ErrDiskFull", full)
	}
	if u := s.DiskUsage(); !u.Full || !strings.Contains(u.Reason, "max_bytes") {
		t.Fatalf("DiskUsage after a refused append: %+v", u)
	}
	if got := counter(t, reg, "sluice_jetstream_publish_errors_total", "disk_full"); got < 1 {
		t.Fatalf("publish errors with cause disk_full = %v", got)
	}
	if got := histogramCount(t, reg, "sluice_queue_append_duration_seconds"); got < 1 {
		t.Fatalf("append histogram count = %d", got)
	}
	// Everything delivered and compacted: appends resume.
	if n, err := s.Compact(s.Head() + 1); err != nil || n == 0 {
		t.Fatalf("compact: %d, %v", n, err)
	}
	if _, _, err := s.Append(queuetest.Event("after", "t", body)); err != nil {
		t.Fatalf("append after compaction: %v", err)
	}
	if s.DiskUsage().Full {
		t.Fatal("DiskUsage still full after an accepted append")
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name, cause string) float64 {
	t.Helper()
	for _, m := range gather(t, reg, name) {
		for _, l := range m.GetLabel() {
			if l.GetName() == "cause" && l.GetValue() == cause {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func histogramCount(t testing.TB, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	for _, m := range gather(t, reg, name) {
		return m.GetHistogram().GetSampleCount()
	}
	return 0
}

func gather(t testing.TB, reg *prometheus.Registry, name string) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// TestOnCommitSeesOtherNodes: two stores on one stream, both appending;
// each one's OnCommit sees every event, its own and the other's, once, in
// seq order, with nothing missing.
func TestOnCommitSeesOtherNodes(t *testing.T) {
	name := logStream()
	const each = 50
	type seen struct {
		mu   sync.Mutex
		seqs []uint64
		ids  map[string]bool
		all  chan struct{}
	}
	open := func(node string) (*jetstream.Store, *seen) {
		sn := &seen{ids: map[string]bool{}, all: make(chan struct{})}
		o := logOptions(name)
		o.NodeID = node
		o.OnCommit = func(evs []*queue.Event) {
			sn.mu.Lock()
			defer sn.mu.Unlock()
			for _, ev := range evs {
				sn.seqs = append(sn.seqs, ev.Seq)
				sn.ids[ev.ID] = true
			}
			if len(sn.seqs) == 2*each {
				close(sn.all)
			}
		}
		return openLog(t, o, nil), sn
	}
	a, seenA := open("a")
	b, seenB := open("b")
	var wg sync.WaitGroup
	for node, s := range map[string]*jetstream.Store{"a": a, "b": b} {
		wg.Go(func() {
			for i := range each {
				queuetest.MustAppend(t, s, queuetest.Event(fmt.Sprintf("%s-%d", node, i), "t", node))
			}
		})
	}
	wg.Wait()
	for node, sn := range map[string]*seen{"a": seenA, "b": seenB} {
		select {
		case <-sn.all:
		case <-time.After(30 * time.Second): // a liveness bound
			sn.mu.Lock()
			t.Fatalf("store %s saw %d of %d events", node, len(sn.seqs), 2*each)
		}
		sn.mu.Lock()
		for i, seq := range sn.seqs {
			if seq != uint64(i+1) {
				t.Fatalf("store %s saw seqs %v, want 1..%d in order", node, sn.seqs, 2*each)
			}
		}
		for _, other := range []string{"a", "b"} {
			for i := range each {
				if id := fmt.Sprintf("%s-%d", other, i); !sn.ids[id] {
					t.Fatalf("store %s never saw %s", node, id)
				}
			}
		}
		sn.mu.Unlock()
	}
}

// TestCompactKeepsHeldAndIndexesIDs: Compact purges below the lowest held
// seq, deletes what no retry holds above it, and ids of compacted events
// stay known to Lookup (with their type) for the dedup window, also in a
// store opened later.
func TestCompactKeepsHeldAndIndexesIDs(t *testing.T) {
	name := logStream()
	ret := &jetstream.Retention{}
	s := openLog(t, logOptions(name), ret)
	for i := range 10 {
		queuetest.MustAppend(t, s, queuetest.Event(fmt.Sprint("c-", i), fmt.Sprint("t.", i%2), fmt.Sprint(i)))
	}
	ret.Set(4, nil, map[string][]uint64{"s": {4}})
	if n, err := s.Compact(8); err != nil || n != 6 {
		t.Fatalf("compact below 8 holding 4: %d, %v; want 6", n, err)
	}
	if _, err := s.Event(3); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("event 3 after compaction: %v", err)
	}
	if ev, err := s.Event(4); err != nil || ev.ID != "c-3" {
		t.Fatalf("held event 4: %+v, %v", ev, err)
	}
	if _, err := s.Event(6); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("event 6 (above the held one) after compaction: %v", err)
	}
	evs, next, err := s.Events(1, 10, 10, nil)
	if err != nil || len(evs) != 3 || evs[0].Seq != 8 || next != 11 {
		t.Fatalf("Events after compaction: %v, next %d, %v", evs, next, err)
	}
	lookup := func(s *jetstream.Store, id string, seq uint64, typ string) {
		t.Helper()
		if got, gotTyp, _, err := s.Lookup(id); err != nil || got != seq || gotTyp != typ {
			t.Fatalf("lookup %s = %d %q, %v; want %d %q", id, got, gotTyp, err, seq, typ)
		}
	}
	lookup(s, "c-1", 2, "t.1") // purged
	lookup(s, "c-5", 6, "t.1") // deleted
	lookup(s, "c-3", 4, "t.1") // held
	// Appending a compacted id again is still a duplicate.
	if seq, dup := queuetest.MustAppend(t, s, queuetest.Event("c-1", "t.1", "again")); !dup || seq != 2 {
		t.Fatalf("a compacted id again: seq %d dup %v", seq, dup)
	}

	jetstream.CloseLog(s)
	s = openLog(t, logOptions(name), ret)
	if s.Head() != 10 {
		t.Fatalf("head after reopen = %d", s.Head())
	}
	lookup(s, "c-1", 2, "t.1")
	// The retry is resolved: the next compaction takes the held event too.
	ret.Set(0, nil, nil)
	if n, err := s.Compact(11); err != nil || n != 4 {
		t.Fatalf("compact below 11 after the retry resolved: %d, %v; want 4 (4, 8, 9, 10)", n, err)
	}
	if _, err := s.Event(4); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("event 4 after its retry resolved and a compaction: %v", err)
	}
	lookup(s, "c-3", 4, "t.1")
	if seq, _ := queuetest.MustAppend(t, s, queuetest.Event("new", "t", "x")); seq != 11 {
		t.Fatalf("seq after compacting everything = %d, want 11", seq)
	}
}

// TestCompactInterval: a node compacts at most once per CompactInterval.
func TestCompactInterval(t *testing.T) {
	o := logOptions(logStream())
	o.CompactInterval = time.Hour
	s := openLog(t, o, nil)
	for i := range 4 {
		queuetest.MustAppend(t, s, queuetest.Event(fmt.Sprint(i), "t", "x"))
	}
	if n, err := s.Compact(3); err != nil || n != 2 {
		t.Fatalf("first compact: %d, %v; want 2", n, err)
	}
	if n, err := s.Compact(5); err != nil || n != 0 {
		t.Fatalf("a second compact within the interval: %d, %v; want 0", n, err)
	}
	if _, err := s.Event(3); err != nil {
		t.Fatalf("event 3 after the skipped compaction: %v", err)
	}
}

// TestCountEventsLongRange: a long range is counted by a headers-only
// consumer; it agrees with the direct batches, stops past limit, and
// counts what lies past the head too.
func TestCountEventsLongRange(t *testing.T) {
	s := openLog(t, logOptions(logStream()), nil)
	const n = 1200
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				queuetest.MustAppend(t, s, queuetest.Event(fmt.Sprint("e-", i), "t"+fmt.Sprint(i%10), "x"))
			}
		})
	}
	wg.Wait()
	// Which types landed where depends on the writers' interleaving: ask
	// the direct batches, then the consumer.
	isT3 := func(_, typ []byte) bool { return string(typ) == "t3" }
	for _, r := range [][2]uint64{{1, n}, {100, n}, {1, 700}, {600, n + 50}} {
		want, err := jetstream.CountEventsDirect(s, r[0], r[1], isT3, n)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.CountEvents(r[0], r[1], isT3, n); err != nil || got != want {
			t.Fatalf("CountEvents(%d, %d) = %d, %v; the direct batches count %d", r[0], r[1], got, err, want)
		}
	}
	if got, err := s.CountEvents(1, n, isT3, 10); err != nil || got <= 10 || got > n/10 {
		t.Fatalf("CountEvents with limit 10 = %d, %v; want more than 10", got, err)
	}
}

// gainHandler tells when this node gains a lane; it gives every lane up
// at once when asked.
type gainHandler chan string

func (h gainHandler) Gained(sub string)               { h <- sub }
func (h gainHandler) Release(context.Context, string) {}
func (h gainHandler) Changed(string)                  {}

// TestCompactInFleetKeepsWhatMembershipsOwe: once a store has joined the
// fleet (Own), its caller's `below` no longer decides alone: events a
// membership's durable cursor has not passed stay, whichever node owns the
// lane.
func TestCompactInFleetKeepsWhatMembershipsOwe(t *testing.T) {
	o := logOptions(logStream())
	o.LeaseTTL = 2 * time.Second
	s, err := jetstream.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.JoinAll([]queue.JoinRequest{{Subscription: "owed"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		queuetest.MustAppend(t, s, queuetest.Event(fmt.Sprint(i), "t", "x"))
	}
	gained := make(gainHandler, 1)
	if err := s.Own(gained); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gained:
	case <-time.After(30 * time.Second): // a liveness bound
		t.Fatal("the only node never gained the lane")
	}
	if err := s.SaveCursors(map[string]uint64{"owed": 4}); err != nil {
		t.Fatal(err)
	}
	// The caller claims everything is delivered; the membership says 5..10
	// are still owed.
	if n, err := s.Compact(s.Head() + 1); err != nil || n != 4 {
		t.Fatalf("compact in a fleet with the cursor at 4: %d, %v; want 4", n, err)
	}
	if _, err := s.Event(5); err != nil {
		t.Fatalf("event 5, owed to the membership, after compaction: %v", err)
	}
	if _, err := s.Event(4); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("event 4 after compaction: %v", err)
	}
}

// TestDuplicateAckOfOwnAttempt: when a publish attempt timed out but was
// stored, Append's retry gets a duplicate PubAck; the event is still new
// (202), unless an earlier request with the same id stored it: the stored
// accepted-at, which ingest stamps per request, tells the two apart.
func TestDuplicateAckOfOwnAttempt(t *testing.T) {
	s := backend().Open(t, backend().NewPlace(t), queuetest.Options{}).(*jetstream.Store)
	ev := queuetest.Event("own-1", "t", "{}")
	seq, _ := queuetest.MustAppend(t, s, ev)
	if !jetstream.OwnEarlierAttempt(s, seq, ev) {
		t.Fatal("the stored event is this request's attempt, but was taken for another request's")
	}
	later := &queue.Event{ID: ev.ID, Type: ev.Type, ContentType: ev.ContentType, Body: ev.Body,
		AcceptedAt: ev.AcceptedAt.Add(time.Millisecond)} // a second request with the same id
	if jetstream.OwnEarlierAttempt(s, seq, later) {
		t.Fatal("a later request with the same id was taken for the stored attempt: it would answer 202, not duplicate")
	}
}

// TestEventContextHeaders: an event's ordering key and trace context go
// out as the headers Sluice-Ordering-Key, traceparent and tracestate, and
// another node's stream follower reads them back; a message written before
// those headers existed (published here by hand, with the old headers
// only) reads with them empty, on the follower and by direct get.
func TestEventContextHeaders(t *testing.T) {
	name := logStream()
	a := openLog(t, logOptions(name), nil)
	got := make(chan *queue.Event, 4)
	o := logOptions(name)
	o.NodeID = "b"
	o.OnCommit = func(evs []*queue.Event) {
		for _, ev := range evs {
			got <- ev
		}
	}
	openLog(t, o, nil)
	const tp, ts = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "rojo=00f067aa0ba902b7"
	ev := queuetest.Event("keyed", "t", `{}`)
	ev.OrderingKey, ev.TraceParent, ev.TraceState = "vehicle-17", tp, ts
	queuetest.MustAppend(t, a, ev)
	js := rawJS(t, cluster.URLs())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m := &nats.Msg{Subject: name + ".ev.b2xk", Data: []byte(`{"old":1}`), Header: nats.Header{
		natsjs.MsgIDHeader:   {"old"},
		"Sluice-Type":        {"t"},
		"Sluice-Accepted-At": {fmt.Sprint(time.Now().UnixNano())},
	}}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Header.Get("Sluice-Ordering-Key") != "vehicle-17" || raw.Header.Get("traceparent") != tp || raw.Header.Get("tracestate") != ts {
		t.Fatalf("stored headers %v", raw.Header)
	}
	for i, want := range []struct{ id, key, tp, ts string }{{"keyed", "vehicle-17", tp, ts}, {"old", "", "", ""}} {
		select {
		case ev := <-got:
			if ev.ID != want.id || ev.OrderingKey != want.key || ev.TraceParent != want.tp || ev.TraceState != want.ts {
				t.Fatalf("the follower read event %d as %+v, want %+v", i+1, ev, want)
			}
		case <-time.After(30 * time.Second): // a liveness bound
			t.Fatalf("the other node's follower never saw event %d", i+1)
		}
	}
	old, err := a.Event(2)
	if err != nil || old.ID != "old" || old.OrderingKey != "" || old.TraceParent != "" || old.TraceState != "" || string(old.Body) != `{"old":1}` {
		t.Fatalf("Event of an old message = %+v, %v", old, err)
	}
}

// TestAppendDoesNotWaitForOtherNodes: an append whose seq follows another
// node's event that this node's follower has not delivered yet returns at
// its PubAck, readable at once; OnCommit gets both, in seq order, once the
// follower delivers the other node's event.
func TestAppendDoesNotWaitForOtherNodes(t *testing.T) {
	name := logStream()
	seen := newCommitSeqs(2)
	oa := logOptions(name)
	oa.NodeID = "a"
	// Far above the liveness bound below: an append that waited for the
	// other node's event would wait this long.
	oa.RequestTimeout = 2 * time.Minute
	oa.OnCommit = seen.onCommit
	a := openLog(t, oa, nil)
	ob := logOptions(name)
	ob.NodeID = "b"
	b := openLog(t, ob, nil)

	jetstream.StopFollower(a)
	seqB, _ := queuetest.MustAppend(t, b, queuetest.Event("from-b", "t", "b"))
	// The append runs aside so the bound below can end the test; its
	// error comes back here, where t.Fatal may be called.
	type appended struct {
		seq uint64
		err error
	}
	done := make(chan appended, 1)
	go func() {
		seq, _, err := a.Append(queuetest.Event("from-a", "t", "a"))
		done <- appended{seq, err}
	}()
	var seqA uint64
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("append from-a: %v", r.err)
		}
		seqA = r.seq
	case <-time.After(30 * time.Second): // a liveness bound
		t.Fatal("the append waited for another node's event to reach OnCommit")
	}
	if seqA != seqB+1 {
		t.Fatalf("seqs %d (b) and %d (a), want consecutive", seqB, seqA)
	}
	if got := seen.seqs(); len(got) != 0 {
		t.Fatalf("OnCommit saw %v before the event below them", got)
	}
	if h := a.Head(); h != 0 {
		t.Fatalf("head %d, want 0: OnCommit has seen nothing", h)
	}
	if ev, err := a.Event(seqA); err != nil || ev.ID != "from-a" {
		t.Fatalf("the appended event: %v, %v", ev, err)
	}
	if evs, _, err := a.Events(1, seqA, 10, nil); err != nil || len(evs) != 2 {
		t.Fatalf("events 1..%d: %d, %v", seqA, len(evs), err)
	}

	if err := jetstream.StartFollower(a); err != nil {
		t.Fatal(err)
	}
	seen.await(t, []uint64{seqB, seqA})
	if h := a.Head(); h != seqA {
		t.Fatalf("head %d, want %d", h, seqA)
	}
}

// TestAppendWaitsPastTheWindow: appended events held for another node's
// event the follower has not delivered are bounded by PublishWindow;
// past it an append waits for OnCommit (here until RequestTimeout, as
// the follower is stopped), and OnCommit still gets every event in order.
func TestAppendWaitsPastTheWindow(t *testing.T) {
	name := logStream()
	seen := newCommitSeqs(3)
	reg := prometheus.NewRegistry()
	oa := logOptions(name)
	oa.NodeID, oa.PublishWindow, oa.RequestTimeout, oa.Registerer = "a", 1, time.Second, reg
	oa.OnCommit = seen.onCommit
	a := openLog(t, oa, nil)
	ob := logOptions(name)
	ob.NodeID = "b"
	b := openLog(t, ob, nil)
	waits := func() uint64 { return histogramCount(t, reg, "sluice_jetstream_append_commit_wait_seconds") }

	jetstream.StopFollower(a)
	queuetest.MustAppend(t, b, queuetest.Event("from-b", "t", "b"))
	queuetest.MustAppend(t, a, queuetest.Event("a-1", "t", "a")) // one held: within the window
	if n := waits(); n != 0 {
		t.Fatalf("%d appends waited within the window", n)
	}
	queuetest.MustAppend(t, a, queuetest.Event("a-2", "t", "a")) // two held: past it
	if n := waits(); n != 1 {
		t.Fatalf("%d appends waited, want the one past the window", n)
	}
	if err := jetstream.StartFollower(a); err != nil {
		t.Fatal(err)
	}
	seen.await(t, []uint64{1, 2, 3})
}

// commitSeqs records the seqs OnCommit is handed; all closes once n have
// come.
type commitSeqs struct {
	mu   sync.Mutex
	seen []uint64
	n    int
	all  chan struct{}
}

func newCommitSeqs(n int) *commitSeqs { return &commitSeqs{n: n, all: make(chan struct{})} }

func (c *commitSeqs) onCommit(evs []*queue.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range evs {
		c.seen = append(c.seen, ev.Seq)
	}
	if len(c.seen) == c.n {
		close(c.all)
	}
}

func (c *commitSeqs) seqs() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.seen)
}

// await waits for n seqs, within a liveness bound, and checks they are
// want, in that order.
func (c *commitSeqs) await(t *testing.T, want []uint64) {
	t.Helper()
	select {
	case <-c.all:
	case <-time.After(30 * time.Second): // a liveness bound
		t.Fatalf("OnCommit saw %v, want %v", c.seqs(), want)
	}
	if got := c.seqs(); !slices.Equal(got, want) {
		t.Fatalf("OnCommit saw %v, want %v in order", got, want)
	}
}
