package queuetest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// Run is the contract of queue.Store: each subtest opens stores of b at
// fresh places and checks one promise of the interface against them. The
// subtests run in parallel; the whole suite takes seconds, most of it the
// dedup window's expiry.
func Run(t *testing.T, b Backend) {
	for _, c := range []struct {
		name string
		test func(*testing.T, *env)
	}{
		{"AppendReadReopen", testAppendReadReopen},
		{"EventsFilterAndBounds", testEventsFilterAndBounds},
		{"DedupWithinWindow", testDedupWithinWindow},
		{"DedupAfterWindow", testDedupAfterWindow},
		{"OnCommitBeforeAppendReturns", testOnCommit},
		{"ConcurrentAppends", testConcurrentAppends},
		{"MembershipCutoff", testMembershipCutoff},
		{"Pause", testPause},
		{"CursorsSurviveReopen", testCursors},
		{"RetrySchedule", testRetrySchedule},
		{"RetrySummaries", testRetrySummaries},
		{"RecordEachKind", testRecordEachKind},
		{"DeadLetters", testDeadLetters},
		{"ReplayOnce", testReplayOnce},
		{"ReplayHistoryKept", testReplayHistoryKept},
		{"CompactionKeepsWhatRetriesNeed", testCompaction},
		{"Recovery", testRecovery},
		{"AppendAfterClose", testAppendAfterClose},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.test(t, &env{b: b, place: b.NewPlace(t)})
		})
	}
}

// env is one subtest's place and the backend to open it with.
type env struct {
	b     Backend
	place string
}

func (e *env) open(t *testing.T, opts Options) queue.Store {
	t.Helper()
	return e.b.Open(t, e.place, opts)
}

// reopen closes s and opens its place again.
func (e *env) reopen(t *testing.T, s queue.Store, opts Options) queue.Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	return e.open(t, opts)
}

func appendN(t *testing.T, s queue.Store, prefix string, n int) {
	t.Helper()
	for i := range n {
		MustAppend(t, s, Event(fmt.Sprintf("%s-%d", prefix, i), "t", fmt.Sprint(i)))
	}
}

func join(t *testing.T, s queue.Store, sub string, snapshot []byte) queue.Membership {
	t.Helper()
	ms, err := s.JoinAll([]queue.JoinRequest{{Subscription: sub, Snapshot: snapshot}})
	if err != nil || len(ms) != 1 {
		t.Fatalf("join %s: %v %v", sub, ms, err)
	}
	return ms[0]
}

func membership(t *testing.T, s queue.Store, sub string) (queue.Membership, bool) {
	t.Helper()
	ms, err := s.Memberships()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Subscription == sub {
			return m, true
		}
	}
	return queue.Membership{}, false
}

func record(t *testing.T, s queue.Store, o queue.Outcome) {
	t.Helper()
	if err := s.Record(o); err != nil {
		t.Fatalf("record %v of %s/%d: %v", o.Kind, o.Subscription, o.Seq, err)
	}
}

func scheduled(t *testing.T, s queue.Store, r queue.Retry) {
	t.Helper()
	record(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: r.Subscription, Seq: r.Seq, Retry: &r})
}

func retries(t *testing.T, s queue.Store, sub string) []queue.Retry {
	t.Helper()
	rs, err := s.Retries(sub, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// deadLetter appends an event and dead-letters it for sub (a member), as a
// lane does after a permanent failure of a first attempt.
func deadLetter(t *testing.T, s queue.Store, sub string) *queue.DeadLetter {
	t.Helper()
	ev := Event("ev-"+sub, "card.shipped", `{"card":1}`)
	seq, _ := MustAppend(t, s, ev)
	d := &queue.DeadLetter{Subscription: sub, Seq: seq, EventID: ev.ID, Type: ev.Type, ContentType: ev.ContentType,
		AcceptedAt: ev.AcceptedAt, Reason: "rejected", Attempts: 1, LastStatus: 400, DeadAt: time.Now(), Body: ev.Body}
	record(t, s, queue.Outcome{Kind: queue.DeadLettered, Subscription: sub, Seq: seq, DeadLetter: d})
	return d
}

var t0 = time.Unix(1_700_000_000, 0)

func testAppendReadReopen(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	if h := s.Head(); h != 0 {
		t.Fatalf("head of a new store = %d", h)
	}
	for i := range 10 {
		seq, dup := MustAppend(t, s, Event(fmt.Sprintf("ev-%d", i), "t.created", fmt.Sprintf(`{"n":%d}`, i)))
		if seq != uint64(i+1) || dup {
			t.Fatalf("append %d: seq %d dup %v, want seq %d", i, seq, dup, i+1)
		}
	}
	s = e.reopen(t, s, Options{})
	if h := s.Head(); h != 10 {
		t.Fatalf("head after reopen = %d, want 10", h)
	}
	evs, next, err := s.Events(1, s.Head(), 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 10 || next != 11 {
		t.Fatalf("read %d events, next %d; want 10, 11", len(evs), next)
	}
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) || ev.ID != fmt.Sprintf("ev-%d", i) || string(ev.Body) != fmt.Sprintf(`{"n":%d}`, i) || ev.Type != "t.created" || ev.ContentType != "application/json" || ev.AcceptedAt.IsZero() {
			t.Fatalf("event %d = %+v", i, ev)
		}
	}
	ev, err := s.Event(4)
	if err != nil || ev.ID != "ev-3" || string(ev.Body) != `{"n":3}` {
		t.Fatalf("Event(4) = %+v, %v", ev, err)
	}
	if _, err := s.Event(11); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Event past the head: %v, want ErrNotFound", err)
	}
}

func testEventsFilterAndBounds(t *testing.T, e *env) {
	s := e.open(t, Options{})
	for i := range 20 {
		typ := "a"
		if i%4 == 0 {
			typ = "b"
		}
		MustAppend(t, s, Event(fmt.Sprint(i), typ, "x"))
	}
	isB := func(typ []byte) bool { return string(typ) == "b" }
	evs, next, err := s.Events(1, 20, 3, isB)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 || evs[0].Seq != 1 || evs[1].Seq != 5 || evs[2].Seq != 9 || next != 10 {
		t.Fatalf("got %d events (next %d): %v", len(evs), next, evs)
	}
	// Bounded by `to`.
	evs, next, _ = s.Events(10, 16, 10, isB)
	if len(evs) != 1 || evs[0].Seq != 13 || next != 17 {
		t.Fatalf("to-bounded read: %d events, next %d", len(evs), next)
	}
	if n, err := s.CountEvents(1, 20, isB, 100); err != nil || n != 5 {
		t.Fatalf("CountEvents of type b = %d, %v; want 5", n, err)
	}
	if n, err := s.CountEvents(1, 20, nil, 100); err != nil || n != 20 {
		t.Fatalf("CountEvents of all = %d, %v; want 20", n, err)
	}
	// It stops once the count passes limit.
	if n, err := s.CountEvents(1, 20, nil, 3); err != nil || n <= 3 || n > 20 {
		t.Fatalf("CountEvents with limit 3 = %d, %v; want more than 3", n, err)
	}
}

func testDedupWithinWindow(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	seq, _ := MustAppend(t, s, Event("same", "t.a", "first"))
	seq2, dup := MustAppend(t, s, Event("same", "t.a", "second"))
	if !dup || seq2 != seq {
		t.Fatalf("second append: seq %d dup %v, want seq %d dup true", seq2, dup, seq)
	}
	// Concurrent appends of one id land in one batch or several; either way one seq.
	var wg sync.WaitGroup
	seqs := make([]uint64, 32)
	for i := range seqs {
		wg.Go(func() { seqs[i], _ = MustAppend(t, s, Event("burst", "t.b", "x")) })
	}
	wg.Wait()
	for _, q := range seqs {
		if q != seqs[0] {
			t.Fatalf("concurrent duplicates got different seqs: %v", seqs)
		}
	}
	if s.Head() != 2 {
		t.Fatalf("head = %d, want 2 (one event per id)", s.Head())
	}
	ev, err := s.Event(seq)
	if err != nil || string(ev.Body) != "first" {
		t.Fatalf("original body replaced: %v %v", ev, err)
	}
	if got, typ, err := s.Lookup("burst"); err != nil || got != seqs[0] || typ != "t.b" {
		t.Fatalf("lookup = %d %q, %v; want %d t.b", got, typ, err, seqs[0])
	}
	if _, _, err := s.Lookup("never"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("lookup of an unknown id: %v, want ErrNotFound", err)
	}
	// Remembered across a reopen.
	s = e.reopen(t, s, Options{})
	if seq3, dup := MustAppend(t, s, Event("same", "t.a", "third")); !dup || seq3 != seq {
		t.Fatalf("append after reopen: seq %d dup %v, want the original %d", seq3, dup, seq)
	}
}

func testDedupAfterWindow(t *testing.T, e *env) {
	// Badger's TTLs have one-second resolution; a JetStream window is at
	// least as coarse.
	s := e.open(t, Options{DedupWindow: time.Second})
	seq, _ := MustAppend(t, s, Event("k", "t", "x"))
	if _, _, err := s.Lookup("k"); err != nil {
		t.Fatalf("lookup within the window: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, _, err := s.Lookup("k"); errors.Is(err, queue.ErrNotFound) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the id was still remembered 10 s into a 1 s window")
		}
		time.Sleep(50 * time.Millisecond) // polls the backend's wall-clock expiry; nothing to await
	}
	seq2, dup := MustAppend(t, s, Event("k", "t", "y"))
	if dup || seq2 == seq {
		t.Fatalf("after the window: seq %d dup %v, want a new event", seq2, dup)
	}
	if ev, err := s.Event(seq); err != nil || string(ev.Body) != "x" {
		t.Fatalf("the first event after its id expired: %v, %v", ev, err)
	}
}

func testOnCommit(t *testing.T, e *env) {
	var (
		mu   sync.Mutex
		seen []uint64
	)
	s := e.open(t, Options{OnCommit: func(evs []*queue.Event) {
		mu.Lock()
		for _, ev := range evs {
			seen = append(seen, ev.Seq)
		}
		mu.Unlock()
	}})
	for i := range 5 {
		seq, _ := MustAppend(t, s, Event(fmt.Sprint(i), "t", "x"))
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n != int(seq) {
			t.Fatalf("after the append of seq %d OnCommit saw %d events", seq, n)
		}
	}
	MustAppend(t, s, Event("0", "t", "dup"))
	mu.Lock()
	defer mu.Unlock()
	for i, seq := range seen {
		if seq != uint64(i+1) {
			t.Fatalf("OnCommit saw %v, want 1..5 in order", seen)
		}
	}
	if len(seen) != 5 {
		t.Fatalf("a duplicate reached OnCommit: %v", seen)
	}
}

func testConcurrentAppends(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	const writers, each = 32, 40
	var (
		mu  sync.Mutex
		got = map[uint64]string{}
		wg  sync.WaitGroup
	)
	for w := range writers {
		wg.Go(func() {
			var last uint64
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				seq, _ := MustAppend(t, s, Event(id, "t", id))
				if seq <= last {
					t.Errorf("writer %d: seq %d after %d", w, seq, last)
				}
				last = seq
				mu.Lock()
				if prev, ok := got[seq]; ok {
					t.Errorf("seq %d given to %s and %s", seq, prev, id)
				}
				got[seq] = id
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for seq := uint64(1); seq <= writers*each; seq++ {
		id, ok := got[seq]
		if !ok {
			t.Fatalf("seq %d never assigned", seq)
		}
		ev, err := s.Event(seq)
		if err != nil || string(ev.Body) != id || ev.ID != id {
			t.Fatalf("event %d = %v, %v; want %s", seq, ev, err, id)
		}
	}
	if s.Head() != writers*each {
		t.Fatalf("head = %d, want %d", s.Head(), writers*each)
	}
}

func testMembershipCutoff(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	appendN(t, s, "before", 3)
	m := join(t, s, "late", []byte(`{"url":"x"}`))
	if m.From != 4 || m.Cursor != 3 || !m.Active() {
		t.Fatalf("late joiner = %+v, want from 4, cursor 3", m)
	}
	appendN(t, s, "member", 2)
	m, err := s.Leave("late")
	if err != nil {
		t.Fatal(err)
	}
	if m.Active() || m.Until != 5 || m.From != 4 {
		t.Fatalf("after leave = %+v, want from 4 until 5", m)
	}
	appendN(t, s, "after", 1)
	if _, err := s.Leave("nobody"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("leave of an unknown subscription: %v, want ErrNotFound", err)
	}
	// The record of who was entitled survives a restart.
	s = e.reopen(t, s, Options{})
	ms, err := s.Memberships()
	if err != nil || len(ms) != 1 {
		t.Fatalf("memberships = %v, %v", ms, err)
	}
	if got := ms[0]; got.From != 4 || got.Until != 5 || got.Active() || string(got.Snapshot) != `{"url":"x"}` || got.Cursor != 3 {
		t.Fatalf("membership after reopen = %+v", got)
	}
	// Rejoining before retirement keeps the original start and takes the
	// new snapshot.
	m = join(t, s, "late", []byte(`{"url":"y"}`))
	if m.From != 4 || !m.Active() || string(m.Snapshot) != `{"url":"y"}` {
		t.Fatalf("rejoin = %+v", m)
	}
	if m, _ := membership(t, s, "late"); !m.Active() || m.Until != 0 || string(m.Snapshot) != `{"url":"y"}` {
		t.Fatalf("membership after rejoin = %+v", m)
	}
	if err := s.Retire("late"); err != nil {
		t.Fatal(err)
	}
	if ms, _ := s.Memberships(); len(ms) != 0 {
		t.Fatalf("retired membership still listed: %v", ms)
	}
	// Joining again after retirement is a new member: owed only what comes next.
	if m := join(t, s, "late", nil); m.From != s.Head()+1 {
		t.Fatalf("join after retirement = %+v, want from %d", m, s.Head()+1)
	}
}

func testPause(t *testing.T, e *env) {
	s := e.open(t, Options{})
	join(t, s, "a", nil)
	if err := s.SetPaused("a", "operator"); err != nil {
		t.Fatal(err)
	}
	s = e.reopen(t, s, Options{})
	if m, _ := membership(t, s, "a"); m.Paused != "operator" {
		t.Fatalf("pause after reopen: %+v", m)
	}
	// A join (a reload) keeps the pause.
	if m := join(t, s, "a", []byte("{}")); m.Paused != "operator" {
		t.Fatalf("join of a paused member = %+v, want it still paused", m)
	}
	if err := s.SetPaused("a", ""); err != nil {
		t.Fatal(err)
	}
	if m, _ := membership(t, s, "a"); m.Paused != "" {
		t.Fatalf("after resume: %+v", m)
	}
	if err := s.SetPaused("nobody", "x"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("pause of an unknown subscription: %v, want ErrNotFound", err)
	}
}

func testCursors(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	appendN(t, s, "e", 10)
	join(t, s, "a", nil)
	join(t, s, "b", nil)
	for _, c := range []map[string]uint64{{"a": 3, "b": 1}, {"a": 5}, {"a": 7, "b": 3}} {
		if err := s.SaveCursors(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SaveCursors(nil); err != nil {
		t.Fatalf("save of no cursors: %v", err)
	}
	s = e.reopen(t, s, Options{})
	ms, _ := s.Memberships()
	got := map[string]uint64{}
	for _, m := range ms {
		got[m.Subscription] = m.Cursor
	}
	if len(got) != 2 || got["a"] != 7 || got["b"] != 3 {
		t.Fatalf("cursors after reopen = %v, want the last written: a 7, b 3", got)
	}
	// A join (a reload) leaves a known member's cursor to its lane.
	if m := join(t, s, "a", []byte("{}")); m.Cursor != 7 {
		t.Fatalf("join of a known member reset its cursor to %d", m.Cursor)
	}
	if m, _ := membership(t, s, "a"); m.Cursor != 7 {
		t.Fatalf("cursor after the join = %d, want 7", m.Cursor)
	}
}

func testRetrySchedule(t *testing.T, e *env) {
	s := e.open(t, Options{})
	appendN(t, s, "e", 9)
	for i, due := range []time.Duration{3 * time.Second, time.Second, 2 * time.Second, time.Hour} {
		scheduled(t, s, queue.Retry{Subscription: "s", Seq: uint64(i + 1), Due: t0.Add(due), Attempt: 1, FirstAttempt: t0, LastStatus: 503, LastError: "http_5xx"})
	}
	// Another subscription's retries are never returned.
	scheduled(t, s, queue.Retry{Subscription: "s2", Seq: 9, Due: t0})
	scheduled(t, s, queue.Retry{Subscription: "s.1", Seq: 8, Due: t0})

	due, next, err := s.DueRetries("s", t0.Add(5*time.Second), 10, func(seq uint64) bool { return seq == 3 })
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 2 || due[0].Seq != 2 || due[1].Seq != 1 || !next.Equal(t0.Add(time.Hour)) {
		t.Fatalf("due = %+v next %v", due, next)
	}
	if r := due[0]; r.LastStatus != 503 || r.LastError != "http_5xx" || r.Attempt != 1 || !r.FirstAttempt.Equal(t0) || r.Subscription != "s" || !r.Due.Equal(t0.Add(time.Second)) || r.Replay {
		t.Fatalf("record fields lost: %+v", r)
	}
	// Limit leaves the rest for later and reports the next due time.
	due, next, _ = s.DueRetries("s", t0.Add(5*time.Second), 1, nil)
	if len(due) != 1 || due[0].Seq != 2 || !next.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("limited: %+v next %v", due, next)
	}
	// Nothing due yet: the earliest due time.
	due, next, _ = s.DueRetries("s", t0, 10, nil)
	if len(due) != 0 || !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("before the first due: %+v next %v", due, next)
	}
	// Rescheduling replaces the record.
	prev := queue.Retry{Subscription: "s", Seq: 2, Due: t0.Add(time.Second), Attempt: 1, FirstAttempt: t0}
	next2 := queue.Retry{Subscription: "s", Seq: 2, Due: t0.Add(2 * time.Hour), Attempt: 2, FirstAttempt: t0}
	record(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 2, From: &prev, Retry: &next2})
	all := retries(t, s, "s")
	if len(all) != 4 || all[3].Seq != 2 || all[3].Attempt != 2 {
		t.Fatalf("after reschedule: %+v", all)
	}
	if r, err := s.RetryOf("s", 2); err != nil || r == nil || r.Attempt != 2 || !r.Due.Equal(next2.Due) {
		t.Fatalf("RetryOf after reschedule = %+v, %v", r, err)
	}
	if r, err := s.RetryOf("s", 9); err != nil || r != nil {
		t.Fatalf("RetryOf a seq another subscription retries = %+v, %v", r, err)
	}
	record(t, s, queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: all[0].Seq, From: &all[0], At: t0})
	if all = retries(t, s, "s"); len(all) != 3 {
		t.Fatalf("after an ACK: %+v", all)
	}
	if rs, _ := s.Retries("s2", 10); len(rs) != 1 || rs[0].Seq != 9 {
		t.Fatalf("s2's retries: %+v", rs)
	}
}

func testRetrySummaries(t *testing.T, e *env) {
	s := e.open(t, Options{})
	appendN(t, s, "e", 6)
	for _, r := range []queue.Retry{{Subscription: "a", Seq: 2, Due: t0}, {Subscription: "a", Seq: 5, Due: t0.Add(-time.Hour)}, {Subscription: "b", Seq: 6, Due: t0}} {
		scheduled(t, s, r)
	}
	sums, err := s.RetrySummaries(map[string]uint64{"a": 3})
	if err != nil {
		t.Fatal(err)
	}
	a, b := sums["a"], sums["b"]
	if len(sums) != 2 || a == nil || b == nil || a.Count != 2 || b.Count != 1 {
		t.Fatalf("summaries = %v", sums)
	}
	if _, ok := a.Ahead[5]; !ok || len(a.Ahead) != 1 {
		t.Fatalf("a's retries above its cursor 3 = %v, want {5}", a.Ahead)
	}
	if b.Ahead != nil {
		t.Fatalf("b has no cursor given, Ahead = %v, want nil", b.Ahead)
	}
}

func testRecordEachKind(t *testing.T, e *env) {
	s := e.open(t, Options{})
	join(t, s, "s", nil)
	for _, id := range []string{"a", "b", "c"} {
		MustAppend(t, s, Event(id, "t", id))
	}
	// A first attempt that is acked writes nothing at all.
	record(t, s, queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: 1})
	r1 := queue.Retry{Subscription: "s", Seq: 2, Due: t0, Attempt: 1, FirstAttempt: t0, LastStatus: 503, LastError: "http_5xx"}
	record(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 2, Retry: &r1})
	got, err := s.RetryOf("s", 2)
	if err != nil || got == nil || got.Attempt != 1 || got.LastStatus != 503 || got.LastError != "http_5xx" || !got.Due.Equal(t0) || !got.FirstAttempt.Equal(t0) {
		t.Fatalf("RetryOf after RetryScheduled = %+v, %v", got, err)
	}
	// The next attempt replaces the record it came from.
	r2 := r1
	r2.Due, r2.Attempt = t0.Add(time.Minute), 2
	record(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 2, From: &r1, Retry: &r2})
	if rs := retries(t, s, "s"); len(rs) != 1 || rs[0].Attempt != 2 || !rs[0].Due.Equal(r2.Due) {
		t.Fatalf("after the second retry: %+v, want only attempt 2", rs)
	}
	// An ACK of the retry deletes it.
	record(t, s, queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: 2, From: &r2, At: t0})
	if rs := retries(t, s, "s"); len(rs) != 0 {
		t.Fatalf("retry kept after its ACK: %+v", rs)
	}
	if r, err := s.RetryOf("s", 2); r != nil || err != nil {
		t.Fatalf("RetryOf after the ACK = %+v, %v", r, err)
	}
	// A retry dead-lettered with a pause: both, in one call.
	r3 := queue.Retry{Subscription: "s", Seq: 3, Due: t0, Attempt: 1, FirstAttempt: t0}
	record(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 3, Retry: &r3})
	dl := &queue.DeadLetter{Subscription: "s", Seq: 3, EventID: "c", Type: "t", Reason: "gone", Attempts: 2, LastStatus: 410, DeadAt: t0, Body: []byte("c")}
	record(t, s, queue.Outcome{Kind: queue.DeadLettered, Subscription: "s", Seq: 3, From: &r3, DeadLetter: dl, Pause: "endpoint answered 410 Gone"})
	if rs := retries(t, s, "s"); len(rs) != 0 {
		t.Fatalf("retry kept after dead-lettering: %+v", rs)
	}
	d, err := s.DeadLetter("s", 3)
	if err != nil || d.Reason != "gone" || d.LastStatus != 410 || d.Attempts != 2 || !bytes.Equal(d.Body, []byte("c")) {
		t.Fatalf("dead letter = %+v, %v", d, err)
	}
	if m, _ := membership(t, s, "s"); m.Paused != "endpoint answered 410 Gone" {
		t.Fatalf("membership after a Record with Pause: %+v", m)
	}
	// An ACK can carry a pause too.
	record(t, s, queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: 1, Pause: "operator"})
	if m, _ := membership(t, s, "s"); m.Paused != "operator" {
		t.Fatalf("membership after an Acked with Pause: %+v", m)
	}
	// Pause of a subscription the store does not know fails the whole
	// outcome: the retry is not written either.
	r4 := queue.Retry{Subscription: "nobody", Seq: 1, Due: t0}
	err = s.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "nobody", Seq: 1, Retry: &r4, Pause: "x"})
	if !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Record with Pause of an unknown subscription: %v, want ErrNotFound", err)
	}
	if rs := retries(t, s, "nobody"); len(rs) != 0 {
		t.Fatalf("a failed Record wrote its retry: %+v", rs)
	}
	if _, err := s.DeadLetter("s", 1); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("dead letter of an acked seq: %v, want ErrNotFound", err)
	}
	// Outcomes that do not hold together are refused.
	for _, bad := range []queue.Outcome{
		{Kind: queue.RetryScheduled, Subscription: "s", Seq: 1},
		{Kind: queue.DeadLettered, Subscription: "s", Seq: 1},
		{Kind: queue.RetryScheduled, Subscription: "s", Seq: 1, Retry: &queue.Retry{Subscription: "s", Seq: 2, Due: t0}},
		{Kind: 0, Subscription: "s", Seq: 1},
	} {
		if err := s.Record(bad); err == nil {
			t.Fatalf("Record(%+v) accepted", bad)
		}
	}
	if rs := retries(t, s, "s"); len(rs) != 0 {
		t.Fatalf("a refused Record wrote: %+v", rs)
	}
}

func testDeadLetters(t *testing.T, e *env) {
	s := e.open(t, Options{})
	join(t, s, "partner", nil)
	ev := Event("ev-1", "card.shipped", `{"card":1}`)
	seq, _ := MustAppend(t, s, ev)
	prev := queue.Retry{Subscription: "partner", Seq: seq, Due: t0, Attempt: 3, FirstAttempt: t0}
	scheduled(t, s, prev)
	dl := &queue.DeadLetter{Subscription: "partner", Seq: seq, EventID: ev.ID, Type: ev.Type, ContentType: ev.ContentType,
		AcceptedAt: ev.AcceptedAt, Reason: "rejected", Attempts: 4, LastStatus: 404, LastError: "http_4xx", Response: "no such hook", DeadAt: t0, Body: ev.Body}
	record(t, s, queue.Outcome{Kind: queue.DeadLettered, Subscription: "partner", Seq: seq, From: &prev, DeadLetter: dl})
	// The letter outlives the event: compaction takes the event.
	if _, err := s.Compact(s.Head() + 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Event(seq); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("event after compaction: %v, want ErrNotFound", err)
	}
	got, err := s.DeadLetter("partner", seq)
	if err != nil {
		t.Fatal(err)
	}
	if got.EventID != "ev-1" || got.Type != "card.shipped" || got.ContentType != "application/json" || !got.AcceptedAt.Equal(ev.AcceptedAt) ||
		got.Reason != "rejected" || got.Attempts != 4 || got.LastStatus != 404 || got.LastError != "http_4xx" ||
		!bytes.Equal(got.Body, ev.Body) || got.Response != "no such hook" || !got.DeadAt.Equal(t0) || got.Subscription != "partner" || got.Seq != seq {
		t.Fatalf("dead letter = %+v body %q", got, got.Body)
	}
	if rs := retries(t, s, "partner"); len(rs) != 0 {
		t.Fatalf("retry record kept after dead-lettering: %v", rs)
	}
	if _, err := s.DeadLetter("partner", seq+1); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("a missing dead letter: %v, want ErrNotFound", err)
	}
	// Listing: all, one subscription's, and pages after a position.
	join(t, s, "a", nil)
	deadLetter(t, s, "a")
	list, err := s.DeadLetters("", "", 0, 10)
	if err != nil || len(list) != 2 || list[0].Subscription != "a" || list[1].Subscription != "partner" {
		t.Fatalf("list all = %v, %v; want a's then partner's", list, err)
	}
	if list, _ := s.DeadLetters("partner", "", 0, 10); len(list) != 1 || list[0].Seq != seq {
		t.Fatalf("list partner = %v", list)
	}
	if page, _ := s.DeadLetters("", "", 0, 1); len(page) != 1 || page[0].Subscription != "a" {
		t.Fatalf("first page = %v", page)
	}
	if page, _ := s.DeadLetters("", list[0].Subscription, list[0].Seq, 10); len(page) != 1 || page[0].Subscription != "partner" {
		t.Fatalf("page after a's letter = %v", page)
	}
	s = e.reopen(t, s, Options{})
	if got, err := s.DeadLetter("partner", seq); err != nil || !bytes.Equal(got.Body, ev.Body) {
		t.Fatalf("dead letter after reopen = %+v, %v", got, err)
	}
}

func testReplayOnce(t *testing.T, e *env) {
	s := e.open(t, Options{})
	join(t, s, "s", nil)
	seq := deadLetter(t, s, "s").Seq
	due := t0
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		replayed int
	)
	for range 32 {
		wg.Go(func() {
			_, err := s.Replay("s", seq, due, false)
			switch {
			case err == nil:
				mu.Lock()
				replayed++
				mu.Unlock()
			case !errors.Is(err, queue.ErrReplayed):
				t.Errorf("concurrent replay: %v", err)
			}
		})
	}
	wg.Wait()
	if replayed != 1 {
		t.Fatalf("32 concurrent replays: %d succeeded, want 1", replayed)
	}
	if rs := retries(t, s, "s"); len(rs) != 1 || !rs[0].Replay || rs[0].Attempt != 0 || !rs[0].Due.Equal(due) {
		t.Fatalf("retries after concurrent replays: %+v, want one replay retry", rs)
	}
	d, err := s.Replay("s", seq, due, false)
	if !errors.Is(err, queue.ErrReplayed) || d == nil || d.Replays != 1 || !d.ReplayedAt.Equal(due) {
		t.Fatalf("replay without force: %+v, %v; want ErrReplayed with the letter", d, err)
	}
	// Forced replays that race while the replay is scheduled all refuse.
	for range 8 {
		wg.Go(func() {
			if _, err := s.Replay("s", seq, due, true); !errors.Is(err, queue.ErrRetryScheduled) {
				t.Errorf("forced replay with a retry scheduled: %v, want ErrRetryScheduled", err)
			}
		})
	}
	wg.Wait()
	r, err := s.RetryOf("s", seq)
	if err != nil || r == nil || !r.Replay {
		t.Fatalf("RetryOf the replay = %+v, %v", r, err)
	}
	at := due.Add(time.Second)
	record(t, s, queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: seq, From: r, At: at})
	if d, _ := s.DeadLetter("s", seq); !d.DeliveredAt.Equal(at) || d.Replays != 1 {
		t.Fatalf("letter after the replay's ACK: %+v", d)
	}
	// Forced, concurrently: one more retry, one more replay counted.
	replayed = 0
	for range 16 {
		wg.Go(func() {
			if _, err := s.Replay("s", seq, due, true); err == nil {
				mu.Lock()
				replayed++
				mu.Unlock()
			} else if !errors.Is(err, queue.ErrRetryScheduled) {
				t.Errorf("forced replay: %v", err)
			}
		})
	}
	wg.Wait()
	if rs := retries(t, s, "s"); replayed != 1 || len(rs) != 1 {
		t.Fatalf("16 forced replays: %d succeeded, %d retries; want 1 and 1", replayed, len(rs))
	}
	if d, _ := s.DeadLetter("s", seq); d.Replays != 2 {
		t.Fatalf("replays = %d after a forced replay, want 2", d.Replays)
	}
	if _, err := s.Replay("s", seq+1, due, true); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("replay of no letter: %v, want ErrNotFound", err)
	}
	// A replay is durable: its retry and its count survive a reopen.
	s = e.reopen(t, s, Options{})
	if d, _ := s.DeadLetter("s", seq); d.Replays != 2 {
		t.Fatalf("replays after reopen = %d, want 2", d.Replays)
	}
	if _, err := s.Replay("s", seq, due, true); !errors.Is(err, queue.ErrRetryScheduled) {
		t.Fatalf("forced replay after reopen with the replay scheduled: %v", err)
	}
}

func testReplayHistoryKept(t *testing.T, e *env) {
	s := e.open(t, Options{})
	join(t, s, "s", nil)
	dl := deadLetter(t, s, "s")
	seq := dl.Seq
	if _, err := s.Replay("s", seq, t0, false); err != nil {
		t.Fatal(err)
	}
	r, _ := s.RetryOf("s", seq)
	if r == nil {
		t.Fatal("no retry after the replay")
	}
	// The replay fails for good: a new letter over the replayed one.
	again := *dl
	again.Reason, again.Attempts, again.LastStatus, again.DeadAt = "rejected", 1, 422, t0.Add(time.Minute)
	record(t, s, queue.Outcome{Kind: queue.DeadLettered, Subscription: "s", Seq: seq, From: r, DeadLetter: &again})
	d, err := s.DeadLetter("s", seq)
	if err != nil || d.Replays != 1 || !d.ReplayedAt.Equal(t0) || d.LastStatus != 422 || !bytes.Equal(d.Body, dl.Body) {
		t.Fatalf("letter dead-lettered again: %+v, %v; want replays 1 at %v, status 422, the body", d, err, t0)
	}
	if again.Replays != 0 {
		t.Fatal("Record changed the caller's letter")
	}
	if _, err := s.Replay("s", seq, t0, false); !errors.Is(err, queue.ErrReplayed) {
		t.Fatalf("replay without force of a letter replayed once: %v, want ErrReplayed", err)
	}
	if _, err := s.Replay("s", seq, t0, true); err != nil {
		t.Fatalf("forced replay: %v", err)
	}
	if d, _ := s.DeadLetter("s", seq); d.Replays != 2 {
		t.Fatalf("replays after a forced replay = %d, want 2", d.Replays)
	}
}

func testCompaction(t *testing.T, e *env) {
	s := e.open(t, Options{})
	for i := range 10 {
		MustAppend(t, s, Event(fmt.Sprint(i), "t", fmt.Sprint(i)))
	}
	r := queue.Retry{Subscription: "s", Seq: 4, Due: t0, Attempt: 1, FirstAttempt: t0}
	scheduled(t, s, r)
	n, err := s.Compact(8)
	if err != nil || n != 6 {
		t.Fatalf("compacted %d (%v), want 6", n, err)
	}
	if _, err := s.Event(3); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("event 3 after compaction: %v", err)
	}
	if ev, err := s.Event(4); err != nil || string(ev.Body) != "3" {
		t.Fatalf("event 4 (retry pending) = %v, %v", ev, err)
	}
	evs, _, _ := s.Events(1, 10, 10, nil)
	if len(evs) != 3 || evs[0].Seq != 8 {
		t.Fatalf("Events after compaction start at %v", evs)
	}
	// Compacting again below the boundary deletes nothing more.
	if n, err := s.Compact(8); err != nil || n != 0 {
		t.Fatalf("second compact to the same boundary: %d %v", n, err)
	}
	// After a restart the retry still protects its event, and the head is kept.
	s = e.reopen(t, s, Options{})
	if _, err := s.Compact(11); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Event(4); err != nil {
		t.Fatalf("event 4 compacted after restart: %v", err)
	}
	if s.Head() != 10 {
		t.Fatalf("head = %d after compacting everything", s.Head())
	}
	seq, _ := MustAppend(t, s, Event("new", "t", "x"))
	if seq != 11 {
		t.Fatalf("seq after full compaction = %d, want 11 (never reused)", seq)
	}
	// The retry is rescheduled: it still holds the event.
	r2 := r
	r2.Due, r2.Attempt = t0.Add(time.Minute), 2
	record(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 4, From: &r, Retry: &r2})
	if _, err := s.Compact(12); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Event(4); err != nil {
		t.Fatalf("event 4 compacted while its rescheduled retry needs it: %v", err)
	}
	// Resolved, then a later Compact: gone.
	record(t, s, queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: 4, From: &r2, At: t0})
	if _, err := s.Event(4); err != nil {
		t.Fatalf("event 4 deleted before the next Compact: %v", err)
	}
	if _, err := s.Compact(12); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Event(4); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("event 4 kept after its retry was resolved: %v", err)
	}
}

func testRecovery(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	appendN(t, s, "a", 3)
	join(t, s, "x", []byte(`{"v":1}`))
	join(t, s, "y", nil)
	appendN(t, s, "b", 3)
	if _, err := s.Leave("y"); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveCursors(map[string]uint64{"x": 5, "y": 4}); err != nil {
		t.Fatal(err)
	}
	scheduled(t, s, queue.Retry{Subscription: "x", Seq: 5, Due: t0, Attempt: 2, FirstAttempt: t0, LastStatus: 502})
	d := &queue.DeadLetter{Subscription: "x", Seq: 4, EventID: "b-0", Type: "t", Reason: "rejected", Attempts: 1, DeadAt: t0, Body: []byte("0")}
	record(t, s, queue.Outcome{Kind: queue.DeadLettered, Subscription: "x", Seq: 4, DeadLetter: d})
	// Everything but the retry's event compacted away.
	if _, err := s.Compact(s.Head() + 1); err != nil {
		t.Fatal(err)
	}

	s = e.reopen(t, s, Options{Sync: true})
	if s.Head() != 6 {
		t.Fatalf("head after reopen = %d, want 6", s.Head())
	}
	x, okx := membership(t, s, "x")
	y, oky := membership(t, s, "y")
	if !okx || !oky || x.From != 4 || x.Cursor != 5 || !x.Active() || string(x.Snapshot) != `{"v":1}` || y.Until != 6 || y.Active() || y.Cursor != 4 {
		t.Fatalf("memberships after reopen: x %+v, y %+v", x, y)
	}
	if rs := retries(t, s, "x"); len(rs) != 1 || rs[0].Seq != 5 || rs[0].Attempt != 2 || rs[0].LastStatus != 502 {
		t.Fatalf("retries after reopen: %+v", rs)
	}
	if r, err := s.RetryOf("x", 5); err != nil || r == nil {
		t.Fatalf("RetryOf after reopen = %+v, %v", r, err)
	}
	if ev, err := s.Event(5); err != nil || ev.ID != "b-1" {
		t.Fatalf("the retry's event after reopen: %+v, %v", ev, err)
	}
	if got, err := s.DeadLetter("x", 4); err != nil || got.EventID != "b-0" || string(got.Body) != "0" {
		t.Fatalf("dead letter after reopen: %+v, %v", got, err)
	}
	if seq, _, err := s.Lookup("a-1"); err != nil || seq != 2 {
		t.Fatalf("dedup entry of a compacted event after reopen: %d, %v", seq, err)
	}
	if seq, _ := MustAppend(t, s, Event("c", "t", "x")); seq != 7 {
		t.Fatalf("first append after reopen: seq %d, want 7 (never reused)", seq)
	}
	if m := join(t, s, "z", nil); m.From != 8 {
		t.Fatalf("a new member after reopen starts at %d, want 8", m.From)
	}
}

func testAppendAfterClose(t *testing.T, e *env) {
	s := e.open(t, Options{})
	MustAppend(t, s, Event("x", "t", "x"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Append(Event("y", "t", "y")); !errors.Is(err, queue.ErrClosed) {
		t.Fatalf("append after close: %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}
