package badger_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

func TestMain(m *testing.M) {
	if crashChild() {
		return
	}
	goleak.VerifyTestMain(m,
		// Badger's caches run goroutines that stop shortly after Close.
		goleak.IgnoreAnyFunction("github.com/dgraph-io/ristretto/v2.(*defaultPolicy[...]).processItems"),
		goleak.IgnoreAnyFunction("github.com/dgraph-io/ristretto/v2.(*Cache[...]).processItems"),
		goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

func TestAppendReopenKeepsEventsInOrder(t *testing.T) {
	dir := t.TempDir()
	q := queuetest.MustOpen(t, dir, badger.Options{Sync: true})
	for i := range 10 {
		seq, dup := queuetest.MustAppend(t, q, queuetest.Event(fmt.Sprintf("ev-%d", i), "t.created", fmt.Sprintf(`{"n":%d}`, i)))
		if seq != uint64(i+1) || dup {
			t.Fatalf("append %d: seq %d dup %v, want seq %d", i, seq, dup, i+1)
		}
	}
	q.Close()

	q = queuetest.MustOpen(t, dir, badger.Options{})
	if h := q.Head(); h != 10 {
		t.Fatalf("head after reopen = %d, want 10", h)
	}
	evs, next, err := q.Events(1, q.Head(), 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 10 || next != 11 {
		t.Fatalf("read %d events, next %d; want 10, 11", len(evs), next)
	}
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) || ev.ID != fmt.Sprintf("ev-%d", i) || string(ev.Body) != fmt.Sprintf(`{"n":%d}`, i) || ev.Type != "t.created" || ev.ContentType != "application/json" {
			t.Fatalf("event %d = %+v", i, ev)
		}
	}
}

func TestEventsFiltersByType(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	for i := range 20 {
		typ := "a"
		if i%4 == 0 {
			typ = "b"
		}
		queuetest.MustAppend(t, q, queuetest.Event(fmt.Sprint(i), typ, "x"))
	}
	evs, next, err := q.Events(1, 20, 3, func(typ []byte) bool { return string(typ) == "b" })
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 || evs[0].Seq != 1 || evs[1].Seq != 5 || evs[2].Seq != 9 || next != 10 {
		t.Fatalf("got %d events (next %d): %v", len(evs), next, evs)
	}
	// Bounded by `to`.
	evs, next, _ = q.Events(10, 16, 10, func(typ []byte) bool { return string(typ) == "b" })
	if len(evs) != 1 || evs[0].Seq != 13 || next != 17 {
		t.Fatalf("to-bounded read: %d events, next %d", len(evs), next)
	}
}

func TestInvariant2_DuplicateEventIDAppendsOnce(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{Sync: true})
	seq, _ := queuetest.MustAppend(t, q, queuetest.Event("same", "t", "first"))
	seq2, dup := queuetest.MustAppend(t, q, queuetest.Event("same", "t", "second"))
	if !dup || seq2 != seq {
		t.Fatalf("second append: seq %d dup %v, want seq %d dup true", seq2, dup, seq)
	}
	// Concurrent appends of one id land in one batch or several; either way one seq.
	var wg sync.WaitGroup
	seqs := make([]uint64, 32)
	for i := range seqs {
		wg.Go(func() { seqs[i], _ = queuetest.MustAppend(t, q, queuetest.Event("burst", "t", "x")) })
	}
	wg.Wait()
	for _, s := range seqs {
		if s != seqs[0] {
			t.Fatalf("concurrent duplicates got different seqs: %v", seqs)
		}
	}
	if q.Head() != 2 {
		t.Fatalf("head = %d, want 2 (one event per id)", q.Head())
	}
	ev, err := q.Event(seq)
	if err != nil || string(ev.Body) != "first" {
		t.Fatalf("original body replaced: %v %v", ev, err)
	}
	if got, _, err := q.Lookup("burst"); err != nil || got != seqs[0] {
		t.Fatalf("lookup = %d, %v", got, err)
	}
}

func TestDedupWindowExpires(t *testing.T) {
	// Badger TTLs have one-second resolution.
	q := queuetest.MustOpen(t, "", badger.Options{DedupWindow: time.Second})
	seq, _ := queuetest.MustAppend(t, q, queuetest.Event("k", "t", "x"))
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, err := q.Lookup("k"); errors.Is(err, queue.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("dedup entry did not expire")
		}
		time.Sleep(50 * time.Millisecond) // waiting on Badger's wall-clock TTL; nothing to await
	}
	seq2, dup := queuetest.MustAppend(t, q, queuetest.Event("k", "t", "x"))
	if dup || seq2 == seq {
		t.Fatalf("after the window: seq %d dup %v", seq2, dup)
	}
}

func TestGroupCommitConcurrentAppendsGetContiguousSeqs(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{Sync: true})
	const writers, each = 32, 40
	var mu sync.Mutex
	got := map[uint64]string{}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				seq, _ := queuetest.MustAppend(t, q, queuetest.Event(id, "t", id))
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
	for s := uint64(1); s <= writers*each; s++ {
		id, ok := got[s]
		if !ok {
			t.Fatalf("seq %d never assigned", s)
		}
		ev, err := q.Event(s)
		if err != nil || string(ev.Body) != id {
			t.Fatalf("event %d = %v, %v; want body %s", s, ev, err, id)
		}
	}
}

func TestOnCommitSeesEventsInOrderBeforeAppendReturns(t *testing.T) {
	var mu sync.Mutex
	var seen []uint64
	q := queuetest.MustOpen(t, "", badger.Options{OnCommit: func(evs []*queue.Event) {
		mu.Lock()
		for _, e := range evs {
			seen = append(seen, e.Seq)
		}
		mu.Unlock()
	}})
	for i := range 5 {
		seq, _ := queuetest.MustAppend(t, q, queuetest.Event(fmt.Sprint(i), "t", "x"))
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n != int(seq) {
			t.Fatalf("after append of seq %d OnCommit saw %d events", seq, n)
		}
	}
	queuetest.MustAppend(t, q, queuetest.Event("0", "t", "dup"))
	if len(seen) != 5 {
		t.Fatalf("a duplicate reached OnCommit: %v", seen)
	}
}

func TestInvariant7_MembershipCutoff(t *testing.T) {
	dir := t.TempDir()
	q := queuetest.MustOpen(t, dir, badger.Options{Sync: true})
	for i := range 3 {
		queuetest.MustAppend(t, q, queuetest.Event(fmt.Sprint(i), "t", "x"))
	}
	m, err := q.Join("late", []byte(`{"url":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.From != 4 || m.Cursor != 3 || !m.Active() {
		t.Fatalf("late joiner = %+v, want from 4, cursor 3", m)
	}
	queuetest.MustAppend(t, q, queuetest.Event("3", "t", "x"))
	queuetest.MustAppend(t, q, queuetest.Event("4", "t", "x"))
	m, err = q.Leave("late")
	if err != nil {
		t.Fatal(err)
	}
	if m.Active() || m.Until != 5 {
		t.Fatalf("after leave = %+v, want until 5", m)
	}
	queuetest.MustAppend(t, q, queuetest.Event("5", "t", "x"))
	q.Close()

	// The record of who was entitled survives a restart.
	q = queuetest.MustOpen(t, dir, badger.Options{})
	ms, err := q.Memberships()
	if err != nil || len(ms) != 1 {
		t.Fatalf("memberships = %v, %v", ms, err)
	}
	if got := ms[0]; got.From != 4 || got.Until != 5 || got.Active() || string(got.Snapshot) != `{"url":"x"}` {
		t.Fatalf("membership after reopen = %+v", got)
	}
	// Rejoining before retirement keeps the original start.
	m, _ = q.Join("late", nil)
	if m.From != 4 || !m.Active() {
		t.Fatalf("rejoin = %+v", m)
	}
	if err := q.Retire("late"); err != nil {
		t.Fatal(err)
	}
	if ms, _ := q.Memberships(); len(ms) != 0 {
		t.Fatalf("retired membership still listed: %v", ms)
	}
}

func TestCursorsSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	q := queuetest.MustOpen(t, dir, badger.Options{Sync: true})
	q.Join("a", nil)
	q.Join("b", nil)
	if err := q.SaveCursors(map[string]uint64{"a": 7, "b": 3}); err != nil {
		t.Fatal(err)
	}
	q.Close()
	q = queuetest.MustOpen(t, dir, badger.Options{})
	ms, _ := q.Memberships()
	got := map[string]uint64{}
	for _, m := range ms {
		got[m.Subscription] = m.Cursor
	}
	if got["a"] != 7 || got["b"] != 3 {
		t.Fatalf("cursors = %v", got)
	}
}

func TestRetryScheduleOrderSkipAndReplace(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	t0 := time.Unix(1_700_000_000, 0)
	for i, due := range []time.Duration{3 * time.Second, time.Second, 2 * time.Second, time.Hour} {
		r := queue.Retry{Subscription: "s", Seq: uint64(i + 1), Due: t0.Add(due), Attempt: 1, FirstAttempt: t0, LastStatus: 503}
		if err := q.ScheduleRetry(r, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Another subscription's retries are never returned.
	q.ScheduleRetry(queue.Retry{Subscription: "s2", Seq: 9, Due: t0}, nil)

	due, next, err := q.DueRetries("s", t0.Add(5*time.Second), 10, func(seq uint64) bool { return seq == 3 })
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 2 || due[0].Seq != 2 || due[1].Seq != 1 || !next.Equal(t0.Add(time.Hour)) {
		t.Fatalf("due = %+v next %v", due, next)
	}
	if due[0].LastStatus != 503 || due[0].Attempt != 1 || !due[0].FirstAttempt.Equal(t0) {
		t.Fatalf("record fields lost: %+v", due[0])
	}
	// Limit leaves the rest for later and reports the next due time.
	due, next, _ = q.DueRetries("s", t0.Add(5*time.Second), 1, nil)
	if len(due) != 1 || due[0].Seq != 2 || !next.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("limited: %+v next %v", due, next)
	}
	// Rescheduling replaces the record.
	prev := due[0]
	if err := q.ScheduleRetry(queue.Retry{Subscription: "s", Seq: 2, Due: t0.Add(2 * time.Hour), Attempt: 2, FirstAttempt: t0}, &prev); err != nil {
		t.Fatal(err)
	}
	all, _ := q.Retries("s", 10)
	if len(all) != 4 || all[3].Seq != 2 || all[3].Attempt != 2 {
		t.Fatalf("after reschedule: %+v", all)
	}
	if err := q.DropRetry(all[0]); err != nil {
		t.Fatal(err)
	}
	if all, _ = q.Retries("s", 10); len(all) != 3 {
		t.Fatalf("after drop: %+v", all)
	}
}

func TestCompactionKeepsEventsARetryNeeds(t *testing.T) {
	dir := t.TempDir()
	q := queuetest.MustOpen(t, dir, badger.Options{})
	for i := range 10 {
		queuetest.MustAppend(t, q, queuetest.Event(fmt.Sprint(i), "t", fmt.Sprint(i)))
	}
	r := queue.Retry{Subscription: "s", Seq: 4, Due: time.Now(), Attempt: 1, FirstAttempt: time.Now()}
	q.ScheduleRetry(r, nil)
	n, err := q.Compact(8)
	if err != nil || n != 6 {
		t.Fatalf("compacted %d (%v), want 6", n, err)
	}
	if _, err := q.Event(3); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("event 3 after compaction: %v", err)
	}
	if ev, err := q.Event(4); err != nil || string(ev.Body) != "3" {
		t.Fatalf("event 4 (retry pending) = %v, %v", ev, err)
	}
	evs, _, _ := q.Events(1, 10, 10, nil)
	if len(evs) != 3 || evs[0].Seq != 8 {
		t.Fatalf("Events after compaction start at %v", evs)
	}
	q.Close()
	// After a restart the retry still protects its event, and the head is kept.
	q = queuetest.MustOpen(t, dir, badger.Options{})
	q.Compact(11)
	if _, err := q.Event(4); err != nil {
		t.Fatalf("event 4 compacted after restart: %v", err)
	}
	if q.Head() != 10 {
		t.Fatalf("head = %d after compacting everything", q.Head())
	}
	seq, _ := queuetest.MustAppend(t, q, queuetest.Event("new", "t", "x"))
	if seq != 11 {
		t.Fatalf("seq after full compaction = %d, want 11 (never reused)", seq)
	}
	q.DropRetry(r)
	q.Compact(12)
	if _, err := q.Event(4); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("event 4 kept after its retry was dropped: %v", err)
	}
}

func TestInvariant5_DeadLetterKeepsEverything(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	ev := queuetest.Event("ev-1", "card.shipped", `{"card":1}`)
	seq, _ := queuetest.MustAppend(t, q, ev)
	prev := queue.Retry{Subscription: "partner", Seq: seq, Due: time.Now(), Attempt: 3, FirstAttempt: time.Now()}
	q.ScheduleRetry(prev, nil)
	dl := &queue.DeadLetter{Subscription: "partner", Seq: seq, EventID: ev.ID, Type: ev.Type, ContentType: ev.ContentType,
		AcceptedAt: ev.AcceptedAt, Reason: "rejected", Attempts: 4, LastStatus: 404, Response: "no such hook", DeadAt: time.Now(), Body: ev.Body}
	if err := q.AddDeadLetter(dl, &prev); err != nil {
		t.Fatal(err)
	}
	q.Compact(q.Head() + 1)
	got, err := q.GetDeadLetter("partner", seq)
	if err != nil {
		t.Fatal(err)
	}
	if got.EventID != "ev-1" || got.Reason != "rejected" || got.Attempts != 4 || got.LastStatus != 404 || !bytes.Equal(got.Body, ev.Body) || got.Response != "no such hook" {
		t.Fatalf("dead letter = %+v body %q", got, got.Body)
	}
	if rs, _ := q.Retries("partner", 10); len(rs) != 0 {
		t.Fatalf("retry record kept after dead-lettering: %v", rs)
	}
	list, err := q.DeadLetters("", "", 0, 10)
	if err != nil || len(list) != 1 {
		t.Fatalf("list = %v, %v", list, err)
	}
}

func TestAppendAfterCloseFails(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	q.Close()
	if _, _, err := q.Append(queuetest.Event("x", "t", "x")); !errors.Is(err, queue.ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
}

func BenchmarkAppend(b *testing.B) {
	for _, mode := range []struct {
		name string
		sync bool
	}{{"fsync", true}, {"async", false}} {
		b.Run(mode.name, func(b *testing.B) {
			q := queuetest.MustOpen(b, "", badger.Options{Sync: mode.sync})
			body := bytes.Repeat([]byte("x"), 512)
			var n sync.Mutex
			i := 0
			b.SetParallelism(32) // many producers share each sync
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n.Lock()
					i++
					id := fmt.Sprintf("b-%d", i)
					n.Unlock()
					if _, _, err := q.Append(&queue.Event{ID: id, Type: "bench", AcceptedAt: time.Now(), Body: body}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
