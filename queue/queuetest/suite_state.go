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

// The contract of queue.State: memberships, cursors, the retry schedule,
// outcomes, dead letters and replays, compaction and recovery.

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

// testJoinCreate: a create-only join makes a new member like any join,
// and refuses one that exists (ErrExists) without changing it, also when
// it is leaving.
func testJoinCreate(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	appendN(t, s, "before", 2)
	ms, err := s.JoinAll([]queue.JoinRequest{{Subscription: "api", Snapshot: []byte(`{"url":"x"}`), Create: true}})
	if err != nil || len(ms) != 1 || ms[0].From != 3 || ms[0].Cursor != 2 {
		t.Fatalf("create-only join of a new subscription = %+v, %v; want from 3, cursor 2", ms, err)
	}
	appendN(t, s, "member", 2)
	for _, leave := range []bool{false, true} {
		if leave {
			if _, err := s.Leave("api"); err != nil {
				t.Fatal(err)
			}
		}
		_, err := s.JoinAll([]queue.JoinRequest{{Subscription: "api", Snapshot: []byte(`{"url":"y"}`), Create: true}})
		if !errors.Is(err, queue.ErrExists) {
			t.Fatalf("create-only join of an existing subscription (leaving %v): %v, want ErrExists", leave, err)
		}
		if m, ok := membership(t, s, "api"); !ok || m.From != 3 || m.Left != leave || string(m.Snapshot) != `{"url":"x"}` {
			t.Fatalf("membership after a refused create (leaving %v) = %+v, %v; want it unchanged", leave, m, ok)
		}
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
	if seq, _, _, err := s.Lookup("a-1"); err != nil || seq != 2 {
		t.Fatalf("dedup entry of a compacted event after reopen: %d, %v", seq, err)
	}
	if seq, _ := MustAppend(t, s, Event("c", "t", "x")); seq != 7 {
		t.Fatalf("first append after reopen: seq %d, want 7 (never reused)", seq)
	}
	if m := join(t, s, "z", nil); m.From != 8 {
		t.Fatalf("a new member after reopen starts at %d, want 8", m.From)
	}
}

// testTrimDeadLetters: a backend that trims (queue.DeadLetterTrimmer)
// deletes a subscription's oldest dead letters past keep, keeps the
// newest, keeps a letter with a replay in flight whatever its age, and
// leaves another subscription's letters (one whose id extends this one's)
// alone.
func testTrimDeadLetters(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	tr, ok := s.(queue.DeadLetterTrimmer)
	if !ok {
		t.Skip("this backend keeps every dead letter")
	}
	join(t, s, "s", nil)
	join(t, s, "s-2", nil)
	for i := range 10 {
		seq, _ := MustAppend(t, s, Event(fmt.Sprint("e-", i), "t", "{}"))
		for _, sub := range []string{"s", "s-2"} {
			record(t, s, queue.Outcome{Kind: queue.DeadLettered, Subscription: sub, Seq: seq, At: t0, DeadLetter: &queue.DeadLetter{
				Subscription: sub, Seq: seq, EventID: fmt.Sprint("e-", i), Type: "t", Reason: "rejected", Attempts: 1, DeadAt: t0, Body: []byte("{}")}})
		}
	}
	// The second oldest is being replayed: it keeps its letter.
	if _, err := s.Replay("s", 2, t0, false); err != nil {
		t.Fatal(err)
	}
	n, err := tr.TrimDeadLetters("s", 3)
	if err != nil || n != 6 {
		t.Fatalf("trim: %d, %v; want the 7 oldest but the replayed one, 6", n, err)
	}
	left, err := s.DeadLetters("s", "", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, d := range left {
		seqs = append(seqs, d.Seq)
	}
	if fmt.Sprint(seqs) != "[2 8 9 10]" {
		t.Fatalf("letters left: %v, want [2 8 9 10]", seqs)
	}
	if other, err := s.DeadLetters("s-2", "", 0, 100); err != nil || len(other) != 10 {
		t.Fatalf("s-2 has %d letters after trimming s (%v), want 10", len(other), err)
	}
	if n, err := tr.TrimDeadLetters("s", 3); err != nil || n != 0 {
		t.Fatalf("trim again: %d, %v; want 0 (the replayed one stays)", n, err)
	}
	s = e.reopen(t, s, Options{})
	if left, err := s.DeadLetters("s", "", 0, 100); err != nil || len(left) != 4 {
		t.Fatalf("after reopen: %d letters of s (%v), want 4", len(left), err)
	}
}
