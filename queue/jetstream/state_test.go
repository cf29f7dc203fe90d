package jetstream_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/jetstream"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// The delivery state's own tests, beyond the contract suite: what holds
// when several nodes share one stream, fencing, retention, delete markers.

var st0 = time.Unix(1_700_000_000, 0)

// stateStream names a fresh stream for one test.
func stateStream() string { return fmt.Sprintf("ST%d", places.Add(1)) }

// openNode opens a store on stream as node id; it is closed when the test
// ends.
func openNode(tb testing.TB, stream, id string) *jetstream.Store {
	tb.Helper()
	s, err := jetstream.Open(jetstream.Options{
		URLs: cluster.URLs(), Stream: stream, Replicas: 3, NodeID: id,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		tb.Fatalf("open %s on %s: %v", id, stream, err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// stateKV is the test's own handle on <stream>_STATE.
func stateKV(tb testing.TB, stream string) natsjs.KeyValue {
	tb.Helper()
	nc, err := nats.Connect(strings.Join(cluster.URLs(), ","))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := natsjs.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), stream+"_STATE")
	if err != nil {
		tb.Fatal(err)
	}
	return kv
}

func mustJoin(tb testing.TB, s queue.Store, subs ...string) []queue.Membership {
	tb.Helper()
	reqs := make([]queue.JoinRequest, len(subs))
	for i, sub := range subs {
		reqs[i] = queue.JoinRequest{Subscription: sub, Snapshot: []byte(`{"v":1}`)}
	}
	ms, err := s.JoinAll(reqs)
	if err != nil {
		tb.Fatalf("join: %v", err)
	}
	return ms
}

func mustRecord(tb testing.TB, s queue.Store, o queue.Outcome) {
	tb.Helper()
	if err := s.Record(o); err != nil {
		tb.Fatalf("record %v of %s/%d: %v", o.Kind, o.Subscription, o.Seq, err)
	}
}

func memberOf(tb testing.TB, s queue.Store, sub string) (queue.Membership, bool) {
	tb.Helper()
	ms, err := s.Memberships()
	if err != nil {
		tb.Fatal(err)
	}
	for _, m := range ms {
		if m.Subscription == sub {
			return m, true
		}
	}
	return queue.Membership{}, false
}

// Two nodes that see the same new subscriptions at once, while events
// keep coming, agree on every cut-off: the first create wins and the
// other node takes its From.
func TestStateJoinCutoffAgreesAcrossNodes(t *testing.T) {
	t.Parallel()
	stream := stateStream()
	a, b := openNode(t, stream, "node-a"), openNode(t, stream, "node-b")
	for i := range 3 {
		queuetest.MustAppend(t, a, queuetest.Event(fmt.Sprint("pre-", i), "t", "x"))
	}
	// Few (a get each) and many (one scan) at once.
	for _, n := range []int{5, 40} {
		subs := make([]string, n)
		for i := range subs {
			subs[i] = fmt.Sprintf("sub-%d.%d", n, i)
		}
		var (
			wg     sync.WaitGroup
			ma, mb []queue.Membership
		)
		stop := make(chan struct{})
		appended := make(chan struct{})
		go func() {
			defer close(appended)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				queuetest.MustAppend(t, b, queuetest.Event(fmt.Sprintf("during-%d-%d", n, i), "t", "x"))
			}
		}()
		wg.Go(func() { ma = mustJoin(t, a, subs...) })
		wg.Go(func() { mb = mustJoin(t, b, subs...) })
		wg.Wait()
		close(stop)
		<-appended
		for i := range subs {
			if ma[i].From != mb[i].From || ma[i].From == 0 || ma[i].Cursor != ma[i].From-1 || mb[i].Cursor != mb[i].From-1 {
				t.Fatalf("%s: node a has %+v, node b %+v: want one cut-off", subs[i], ma[i], mb[i])
			}
		}
		// And what is stored is what both were told.
		for _, s := range []*jetstream.Store{a, b} {
			ms, err := s.Memberships()
			if err != nil {
				t.Fatal(err)
			}
			stored := map[string]queue.Membership{}
			for _, m := range ms {
				stored[m.Subscription] = m
			}
			for i, sub := range subs {
				if m, ok := stored[sub]; !ok || m.From != ma[i].From || !m.Active() {
					t.Fatalf("%s: %s stored as %+v, want from %d", s.NodeID(), sub, m, ma[i].From)
				}
			}
		}
	}
}

// 32 replays of one letter, half from each of two nodes, schedule it
// once; forced replays while it is scheduled all refuse.
func TestStateReplayOnceAcrossNodes(t *testing.T) {
	t.Parallel()
	stream := stateStream()
	a, b := openNode(t, stream, "node-a"), openNode(t, stream, "node-b")
	mustJoin(t, a, "s")
	ev := queuetest.Event("ev-1", "t", `{"x":1}`)
	seq, _ := queuetest.MustAppend(t, a, ev)
	mustRecord(t, a, queue.Outcome{Kind: queue.DeadLettered, Subscription: "s", Seq: seq, DeadLetter: &queue.DeadLetter{
		Subscription: "s", Seq: seq, EventID: ev.ID, Type: ev.Type, Reason: "rejected", Attempts: 1, DeadAt: st0, Body: ev.Body}})

	var (
		wg sync.WaitGroup
		mu sync.Mutex
		ok int
	)
	for i := range 32 {
		s := []*jetstream.Store{a, b}[i%2]
		wg.Go(func() {
			_, err := s.Replay("s", seq, st0, false)
			switch {
			case err == nil:
				mu.Lock()
				ok++
				mu.Unlock()
			case !errors.Is(err, queue.ErrReplayed):
				t.Errorf("replay on %s: %v", s.NodeID(), err)
			}
		})
	}
	wg.Wait()
	if ok != 1 {
		t.Fatalf("32 replays from two nodes: %d succeeded, want 1", ok)
	}
	for _, s := range []*jetstream.Store{a, b} {
		r, err := s.RetryOf("s", seq)
		if err != nil || r == nil || !r.Replay || r.Attempt != 0 || !r.Due.Equal(st0) {
			t.Fatalf("retry on %s: %+v, %v; want the replay's", s.NodeID(), r, err)
		}
		if d, err := s.DeadLetter("s", seq); err != nil || d.Replays != 1 || !d.ReplayedAt.Equal(st0) || !bytes.Equal(d.Body, ev.Body) {
			t.Fatalf("letter on %s: %+v, %v; want replayed once", s.NodeID(), d, err)
		}
	}
	// A fresh reader sees one retry.
	if rs, err := openNode(t, stream, "node-c").Retries("s", 10); err != nil || len(rs) != 1 {
		t.Fatalf("retries after the replays: %+v, %v; want 1", rs, err)
	}
	for i := range 16 {
		s := []*jetstream.Store{a, b}[i%2]
		wg.Go(func() {
			if d, err := s.Replay("s", seq, st0, true); !errors.Is(err, queue.ErrRetryScheduled) || d == nil || d.Replays != 1 {
				t.Errorf("forced replay on %s while scheduled: %+v, %v; want ErrRetryScheduled with the letter", s.NodeID(), d, err)
			}
		})
	}
	wg.Wait()
}

// A node whose lease moved on writes nothing: a single-key write and an
// atomic batch both fail with ErrFenced and leave every key as it was; a
// cursor is skipped. The same writes on the current revision go through,
// and a conflict on a key's own revision while the lease holds is read
// again and retried, not reported as fencing.
func TestStateFencedWritesWriteNothing(t *testing.T) {
	t.Parallel()
	stream := stateStream()
	s := openNode(t, stream, "node-a")
	kv := stateKV(t, stream)
	ctx := context.Background()
	joined := mustJoin(t, s, "s")[0]
	seq, _ := queuetest.MustAppend(t, s, queuetest.Event("ev-1", "t", "body"))
	r := queue.Retry{Subscription: "s", Seq: seq, Due: st0, Attempt: 1, FirstAttempt: st0, LastStatus: 503}
	mustRecord(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: seq, Retry: &r})

	stale, err := kv.Create(ctx, "lease.s", []byte("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	current, err := kv.Put(ctx, "lease.s", []byte("node-b")) // another node took it
	if err != nil {
		t.Fatal(err)
	}
	subj := jetstream.LeaseSubject(s, "s")
	var hook func()
	rev := stale
	jetstream.FenceWith(s, func(string) (string, uint64, bool, func(), error) {
		if h := hook; h != nil {
			hook = nil
			h()
		}
		return subj, rev, true, func() {}, nil
	})

	dead := &queue.DeadLetter{Subscription: "s", Seq: seq, EventID: "ev-1", Type: "t", Reason: "gone", Attempts: 2, LastStatus: 410, DeadAt: st0, Body: []byte("body")}
	batch := queue.Outcome{Kind: queue.DeadLettered, Subscription: "s", Seq: seq, From: &r, DeadLetter: dead, Pause: "410"}
	r2 := r
	r2.Attempt, r2.Due = 2, st0.Add(time.Minute)
	single := queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: seq, From: &r, Retry: &r2}
	for _, o := range []queue.Outcome{batch, single} {
		if err := s.Record(o); !errors.Is(err, queue.ErrFenced) {
			t.Fatalf("record %v on a stale lease: %v, want ErrFenced", o.Kind, err)
		}
	}
	if err := s.SaveCursors(map[string]uint64{"s": seq}); err != nil {
		t.Fatalf("save of a cursor whose lane moved: %v, want it skipped", err)
	}
	if err := s.Retire("s"); !errors.Is(err, queue.ErrFenced) {
		t.Fatalf("retire on a stale lease: %v, want ErrFenced", err)
	}
	// Nothing of any of it was written.
	if got, err := s.RetryOf("s", seq); err != nil || got == nil || got.Attempt != 1 || !got.Due.Equal(st0) {
		t.Fatalf("retry after fenced writes: %+v, %v; want attempt 1 untouched", got, err)
	}
	if _, err := s.DeadLetter("s", seq); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("dead letter after a fenced batch: %v, want ErrNotFound", err)
	}
	if m, ok := memberOf(t, s, "s"); !ok || m.Paused != "" || m.Cursor != joined.Cursor {
		t.Fatalf("membership after fenced writes: %+v, want unpaused, cursor %d", m, joined.Cursor)
	}

	// On the current revision, with the membership changed by someone
	// else just before the batch goes: one conflict, then it is stored.
	rev = current
	hook = func() {
		e, err := kv.Get(ctx, "member.s")
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := kv.Update(ctx, "member.s", e.Value(), e.Revision()); err != nil {
			t.Error(err)
		}
	}
	mustRecord(t, s, batch)
	if hook != nil {
		t.Fatal("the conflict was not set up")
	}
	if got, err := s.RetryOf("s", seq); err != nil || got != nil {
		t.Fatalf("retry after the dead-lettering: %+v, %v; want none", got, err)
	}
	if d, err := s.DeadLetter("s", seq); err != nil || d.LastStatus != 410 || string(d.Body) != "body" {
		t.Fatalf("dead letter: %+v, %v", d, err)
	}
	if m, _ := memberOf(t, s, "s"); m.Paused != "410" {
		t.Fatalf("membership after the dead-lettering: %+v, want paused", m)
	}
	if err := s.SaveCursors(map[string]uint64{"s": seq}); err != nil {
		t.Fatal(err)
	}
	if m, _ := memberOf(t, s, "s"); m.Cursor != seq {
		t.Fatalf("cursor %d, want %d", m.Cursor, seq)
	}
}

// gains tells of the lanes a node gains.
type gains chan string

func (g gains) Gained(sub string)               { g <- sub }
func (g gains) Release(context.Context, string) {}
func (g gains) Changed(string)                  {}

// With the fleet side's real lease: the owner's writes are fenced on it,
// and once another node holds it (here: a write over it), every write of
// the old owner fails with ErrFenced (whether the old owner has noticed
// yet or the servers refuse it) and writes nothing; its cursor is skipped.
func TestStateFencedByLease(t *testing.T) {
	t.Parallel()
	stream := stateStream()
	s := openNode(t, stream, "node-a")
	mustJoin(t, s, "s")
	seq, _ := queuetest.MustAppend(t, s, queuetest.Event("ev-1", "t", "body"))
	g := make(gains, 16)
	if err := s.Own(g); err != nil {
		t.Fatal(err)
	}
	select {
	case sub := <-g:
		if sub != "s" {
			t.Fatalf("gained %s, want s", sub)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the lease of s not gained within 15s")
	}
	if _, _, fenced, done, err := jetstream.Fence(s, "s"); err != nil || !fenced {
		t.Fatalf("fence after Gained: %v, %v", fenced, err)
	} else {
		done()
	}
	r := queue.Retry{Subscription: "s", Seq: seq, Due: st0, Attempt: 1, FirstAttempt: st0}
	mustRecord(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: seq, Retry: &r})
	if err := s.SaveCursors(map[string]uint64{"s": seq - 1}); err != nil {
		t.Fatal(err)
	}

	if _, err := stateKV(t, stream).Put(context.Background(), "lease.s", []byte("node-b")); err != nil {
		t.Fatal(err)
	}
	d := &queue.DeadLetter{Subscription: "s", Seq: seq, EventID: "ev-1", Reason: "rejected", DeadAt: st0, Body: []byte("body")}
	if err := s.Record(queue.Outcome{Kind: queue.DeadLettered, Subscription: "s", Seq: seq, From: &r, DeadLetter: d, Pause: "x"}); !errors.Is(err, queue.ErrFenced) {
		t.Fatalf("dead-lettering after the lease moved: %v, want ErrFenced", err)
	}
	if err := s.SaveCursors(map[string]uint64{"s": seq}); err != nil {
		t.Fatalf("cursor after the lease moved: %v, want it skipped", err)
	}
	if got, err := s.RetryOf("s", seq); err != nil || got == nil || got.Attempt != 1 {
		t.Fatalf("retry after a fenced dead-lettering: %+v, %v", got, err)
	}
	if _, err := s.DeadLetter("s", seq); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("dead letter after a fenced dead-lettering: %v, want ErrNotFound", err)
	}
	if m, _ := memberOf(t, s, "s"); m.Paused != "" || m.Cursor != seq-1 {
		t.Fatalf("membership after fenced writes: %+v, want unpaused at cursor %d", m, seq-1)
	}
}

// The retention floor follows memberships, cursors and retries, and a
// write of this node is in it as soon as the write returns.
func TestStateRetentionFloor(t *testing.T) {
	t.Parallel()
	stream := stateStream()
	s := openNode(t, stream, "node-a")
	floor := func(want uint64) {
		t.Helper()
		got, err := jetstream.RetentionFloor(s)
		if err != nil || got != want {
			t.Fatalf("retention floor = %d, %v; want %d", got, err, want)
		}
	}
	floor(^uint64(0)) // nothing holds anything
	for i := range 5 {
		queuetest.MustAppend(t, s, queuetest.Event(fmt.Sprint("a-", i), "t", "x"))
	}
	mustJoin(t, s, "a", "b")
	floor(6) // new members need what comes next
	for i := range 5 {
		queuetest.MustAppend(t, s, queuetest.Event(fmt.Sprint("b-", i), "t", "x"))
	}
	if err := s.SaveCursors(map[string]uint64{"a": 8, "b": 9}); err != nil {
		t.Fatal(err)
	}
	floor(9)
	r := queue.Retry{Subscription: "b", Seq: 3, Due: st0}
	mustRecord(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "b", Seq: 3, Retry: &r})
	floor(3)
	mustRecord(t, s, queue.Outcome{Kind: queue.Acked, Subscription: "b", Seq: 3, From: &r, At: st0})
	floor(9)
	if _, err := s.Leave("a"); err != nil { // until 10, cursor 8: still owed 9 and 10
		t.Fatal(err)
	}
	floor(9)
	if err := s.SaveCursors(map[string]uint64{"a": 10}); err != nil { // drained
		t.Fatal(err)
	}
	floor(10)
	if err := s.Retire("b"); err != nil {
		t.Fatal(err)
	}
	floor(^uint64(0))
	// Another node sees the same state from scratch.
	if got, err := jetstream.RetentionFloor(openNode(t, stream, "node-b")); err != nil || got != ^uint64(0) {
		t.Fatalf("another node's floor = %d, %v", got, err)
	}
}

// Deletes leave purge markers that expire, so they do not pile up.
func TestStateDeleteMarkersExpire(t *testing.T) {
	t.Parallel()
	s := openNode(t, stateStream(), "node-a")
	mustJoin(t, s, "s")
	r := queue.Retry{Subscription: "s", Seq: 1, Due: st0}
	mustRecord(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 1, Retry: &r})
	mustRecord(t, s, queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: 1, From: &r, At: st0})
	if err := s.Retire("s"); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"retry.s.1", "member.s", "cursor.s"} {
		m, err := jetstream.StateMsg(s, key)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if m.Header.Get("KV-Operation") != "PURGE" || m.Header.Get(natsjs.MsgTTLHeader) == "" || len(m.Data) != 0 {
			t.Fatalf("%s after its delete: headers %v, %d bytes; want a purge marker with a TTL", key, m.Header, len(m.Data))
		}
	}
	// The deleted membership is gone, and a new one of the same id is new.
	if _, ok := memberOf(t, s, "s"); ok {
		t.Fatal("retired membership listed")
	}
	if m := mustJoin(t, s, "s")[0]; m.From != s.Head()+1 {
		t.Fatalf("rejoin after retirement: %+v", m)
	}
}

// Lane reads a gained lane's state: membership, cursor, and the retries,
// those above the cursor apart.
func TestStateLane(t *testing.T) {
	t.Parallel()
	s := openNode(t, stateStream(), "node-a")
	mustJoin(t, s, "s.1")
	for i := range 6 {
		queuetest.MustAppend(t, s, queuetest.Event(fmt.Sprint(i), "t", "x"))
	}
	for _, seq := range []uint64{2, 5} {
		r := queue.Retry{Subscription: "s.1", Seq: seq, Due: st0.Add(time.Duration(seq) * time.Second)}
		mustRecord(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s.1", Seq: seq, Retry: &r})
	}
	// Another subscription whose id extends this one's: not this lane's.
	mustJoin(t, s, "s.1.x")
	r := queue.Retry{Subscription: "s.1.x", Seq: 4, Due: st0}
	mustRecord(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s.1.x", Seq: 4, Retry: &r})
	if err := s.SaveCursors(map[string]uint64{"s.1": 3}); err != nil {
		t.Fatal(err)
	}
	m, sum, err := s.Lane("s.1")
	if err != nil {
		t.Fatal(err)
	}
	if m.Cursor != 3 || m.From != 1 || sum.Count != 2 || len(sum.Ahead) != 1 {
		t.Fatalf("lane = %+v, %+v; want cursor 3, 2 retries, 1 ahead", m, sum)
	}
	if _, ok := sum.Ahead[5]; !ok {
		t.Fatalf("ahead = %v, want {5}", sum.Ahead)
	}
	due, next, err := s.DueRetries("s.1", st0.Add(3*time.Second), 10, nil)
	if err != nil || len(due) != 1 || due[0].Seq != 2 || !next.Equal(st0.Add(5*time.Second)) {
		t.Fatalf("due = %+v next %v, %v", due, next, err)
	}
	if _, _, err := s.Lane("nobody"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("lane of no membership: %v, want ErrNotFound", err)
	}
}

// Dead letters list in key order, seqs numerically, ids with dots apart,
// and page on from any position.
func TestStateDeadLettersOrder(t *testing.T) {
	t.Parallel()
	s := openNode(t, stateStream(), "node-a")
	letters := []struct {
		sub string
		seq uint64
	}{{"b", 1}, {"a", 10}, {"a.b", 3}, {"a", 2}, {"a", 100}}
	for _, l := range letters {
		mustRecord(t, s, queue.Outcome{Kind: queue.DeadLettered, Subscription: l.sub, Seq: l.seq, DeadLetter: &queue.DeadLetter{
			Subscription: l.sub, Seq: l.seq, EventID: fmt.Sprint(l.sub, l.seq), Reason: "rejected", DeadAt: st0, Body: []byte(l.sub)}})
	}
	name := func(ds []*queue.DeadLetter) string {
		var b strings.Builder
		for _, d := range ds {
			fmt.Fprintf(&b, "%s/%d ", d.Subscription, d.Seq)
		}
		return b.String()
	}
	for _, tc := range []struct {
		sub, afterSub string
		afterSeq      uint64
		limit         int
		want          string
	}{
		{"", "", 0, 10, "a/2 a/10 a/100 a.b/3 b/1 "},
		{"", "", 0, 2, "a/2 a/10 "},
		{"", "a", 10, 2, "a/100 a.b/3 "},
		{"", "a", 100, 10, "a.b/3 b/1 "},
		{"a", "", 0, 10, "a/2 a/10 a/100 "},
		{"a.b", "", 0, 10, "a.b/3 "},
		{"a", "a", 2, 10, "a/10 a/100 "},
		{"c", "", 0, 10, ""},
	} {
		got, err := s.DeadLetters(tc.sub, tc.afterSub, tc.afterSeq, tc.limit)
		if err != nil || name(got) != tc.want {
			t.Errorf("DeadLetters(%q, %q, %d, %d) = %q, %v; want %q", tc.sub, tc.afterSub, tc.afterSeq, tc.limit, name(got), err, tc.want)
		}
		for _, d := range got {
			if string(d.Body) != d.Subscription {
				t.Errorf("letter %s/%d has body %q", d.Subscription, d.Seq, d.Body)
			}
		}
	}
}

// Many subscriptions: joined with pipelined creates, read with one scan.
func TestStateManyMemberships(t *testing.T) {
	t.Parallel()
	n := 10000
	if testing.Short() {
		n = 2000
	}
	stream := stateStream()
	s := openNode(t, stream, "node-a")
	subs := make([]string, n)
	for i := range subs {
		subs[i] = fmt.Sprintf("tenant-%05d", i)
	}
	start := time.Now()
	mustJoin(t, s, subs...)
	joined := time.Since(start)
	start = time.Now()
	ms, err := s.Memberships()
	if err != nil || len(ms) != n {
		t.Fatalf("memberships: %d, %v; want %d", len(ms), err, n)
	}
	read := time.Since(start)
	cursors := make(map[string]uint64, n)
	for _, sub := range subs {
		cursors[sub] = 7
	}
	start = time.Now()
	if err := s.SaveCursors(cursors); err != nil {
		t.Fatal(err)
	}
	saved := time.Since(start)
	// Joined again as the proxy does after reading them: nothing to write.
	reqs := make([]queue.JoinRequest, n)
	for i := range ms {
		reqs[i] = queue.JoinRequest{Subscription: ms[i].Subscription, Snapshot: ms[i].Snapshot, Known: &ms[i]}
	}
	start = time.Now()
	if _, err := s.JoinAll(reqs); err != nil {
		t.Fatal(err)
	}
	rejoined := time.Since(start)
	if m, _ := memberOf(t, s, subs[n-1]); m.Cursor != 7 {
		t.Fatalf("cursor after SaveCursors: %+v", m)
	}
	t.Logf("%d subscriptions: JoinAll (new) %v, Memberships %v, SaveCursors %v, JoinAll (known, unchanged) %v", n, joined, read, saved, rejoined)
}

// An existing <S>_STATE with settings the state cannot work with is
// refused, named.
func TestStateBucketIncompatible(t *testing.T) {
	t.Parallel()
	stream := stateStream()
	nc, err := nats.Connect(strings.Join(cluster.URLs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := natsjs.New(nc)
	if _, err := js.CreateKeyValue(context.Background(), natsjs.KeyValueConfig{Bucket: stream + "_STATE", History: 5, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	_, err = jetstream.Open(jetstream.Options{URLs: cluster.URLs(), Stream: stream, Replicas: 3, NodeID: "node-a", Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), stream+"_STATE") || !strings.Contains(err.Error(), "history 5") || !strings.Contains(err.Error(), "limit_marker_ttl") {
		t.Fatalf("open over an incompatible state bucket: %v; want it refused, naming the bucket and settings", err)
	}
}

// Cut off from NATS the state answers ErrUnavailable with the cause;
// after Close, ErrClosed.
func TestStateUnavailableThenClosed(t *testing.T) {
	t.Parallel()
	s := openNode(t, stateStream(), "node-a")
	mustJoin(t, s, "s")
	jetstream.CutConnection(s)
	r := queue.Retry{Subscription: "s", Seq: 1, Due: st0}
	for name, err := range map[string]error{
		"record":      s.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 1, Retry: &r}),
		"memberships": func() error { _, err := s.Memberships(); return err }(),
		"save":        s.SaveCursors(map[string]uint64{"s": 1}),
		"replay":      func() error { _, err := s.Replay("s", 1, st0, false); return err }(),
	} {
		if !errors.Is(err, queue.ErrUnavailable) || err.Error() == queue.ErrUnavailable.Error() {
			t.Errorf("%s while cut off: %v, want ErrUnavailable with its cause", name, err)
		}
	}
	s.Close()
	if err := s.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 1, Retry: &r}); !errors.Is(err, queue.ErrClosed) {
		t.Errorf("record after close: %v, want ErrClosed", err)
	}
	if _, err := s.Memberships(); !errors.Is(err, queue.ErrClosed) {
		t.Errorf("memberships after close: %v, want ErrClosed", err)
	}
}

// What one outcome costs: one message (a retry) and an atomic batch (a
// dead-lettering with its retry's delete), on the 3-node cluster.
func BenchmarkRecord(b *testing.B) {
	s := openNode(b, stateStream(), "node-a")
	mustJoin(b, s, "s")
	b.Run("retry", func(b *testing.B) {
		for i := range b.N {
			r := queue.Retry{Subscription: "s", Seq: uint64(i + 1), Due: st0, Attempt: 1}
			mustRecord(b, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: r.Seq, Retry: &r})
		}
	})
	b.Run("dead-letter-batch", func(b *testing.B) {
		body := bytes.Repeat([]byte("x"), 1024)
		for i := range b.N {
			seq := uint64(i + 1)
			r := queue.Retry{Subscription: "s", Seq: seq, Due: st0, Attempt: 1}
			d := &queue.DeadLetter{Subscription: "s", Seq: seq, EventID: fmt.Sprint(i), Reason: "rejected", DeadAt: st0, Body: body}
			mustRecord(b, s, queue.Outcome{Kind: queue.DeadLettered, Subscription: "s", Seq: seq, From: &r, DeadLetter: d})
		}
	})
}

// SaveCursors of 1,000 lanes: pipelined, fenced one by one.
func BenchmarkSaveCursors1000(b *testing.B) {
	s := openNode(b, stateStream(), "node-a")
	cursors := map[string]uint64{}
	for i := range 1000 {
		cursors[fmt.Sprintf("lane-%d", i)] = 1
	}
	b.ResetTimer()
	for i := range b.N {
		for sub := range cursors {
			cursors[sub] = uint64(i)
		}
		if err := s.SaveCursors(cursors); err != nil {
			b.Fatal(err)
		}
	}
}

// DueRetries on the hot path: from the lane's index, 10,000 retries
// scheduled, 16 asked for at a time.
func BenchmarkDueRetries(b *testing.B) {
	s := openNode(b, stateStream(), "node-a")
	for i := range 10000 {
		r := queue.Retry{Subscription: "s", Seq: uint64(i + 1), Due: st0.Add(time.Duration(i) * time.Millisecond)}
		mustRecord(b, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: r.Seq, Retry: &r})
	}
	now := st0.Add(time.Hour)
	if rs, _, err := s.DueRetries("s", now, 16, nil); err != nil || len(rs) != 16 {
		b.Fatalf("due: %d, %v", len(rs), err)
	}
	b.ResetTimer()
	for range b.N {
		if _, _, err := s.DueRetries("s", now, 16, nil); err != nil {
			b.Fatal(err)
		}
	}
}
