package badger

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

func refs(q *Log, seq uint64) int32 {
	q.refMu.Lock()
	defer q.refMu.Unlock()
	return q.retryRefs[seq]
}

// TestRetryRefsExact: the count that keeps an event from compaction
// follows the retry records exactly: a replaced record is not counted
// twice, a From that is not there is not subtracted, a failed Record
// leaves the count as it was.
func TestRetryRefsExact(t *testing.T) {
	q, err := Open(Options{Dir: t.TempDir(), MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := q.Join("s", nil); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, _, err := q.Append(&queue.Event{ID: fmt.Sprint(i), Type: "t", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Unix(1_700_000_000, 0)
	r1 := queue.Retry{Subscription: "s", Seq: 1, Due: t0, Attempt: 1}
	r2 := queue.Retry{Subscription: "s", Seq: 1, Due: t0.Add(time.Second), Attempt: 2}
	steps := []struct {
		what string
		o    queue.Outcome
		fail bool
		want int32
	}{
		{"first retry", queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 1, Retry: &r1}, false, 1},
		{"replaced", queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 1, From: &r1, Retry: &r2}, false, 1},
		{"acked from a record that is gone", queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: 1, From: &r1}, false, 1},
		{"failed: pause of an unknown subscription", queue.Outcome{Kind: queue.RetryScheduled, Subscription: "t", Seq: 1,
			Retry: &queue.Retry{Subscription: "t", Seq: 1, Due: t0}, Pause: "x"}, true, 1},
		{"dead-lettered", queue.Outcome{Kind: queue.DeadLettered, Subscription: "s", Seq: 1, From: &r2, DeadLetter: &queue.DeadLetter{Subscription: "s", Seq: 1}}, false, 0},
		{"dead-lettered again from the gone record", queue.Outcome{Kind: queue.DeadLettered, Subscription: "s", Seq: 1, From: &r2, DeadLetter: &queue.DeadLetter{Subscription: "s", Seq: 1}}, false, 0},
		{"retry replacing a record that is gone", queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 1, From: &r1, Retry: &r2}, false, 1},
		{"mismatched retry", queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 1, Retry: &queue.Retry{Subscription: "s", Seq: 2}}, true, 1},
	}
	for _, s := range steps {
		err := q.Record(s.o)
		if (err != nil) != s.fail {
			t.Fatalf("%s: %v, want failure %v", s.what, err, s.fail)
		}
		if got := refs(q, 1); got != s.want {
			t.Fatalf("%s: refs of seq 1 = %d, want %d", s.what, got, s.want)
		}
	}
	if _, err := q.Replay("s", 1, t0, false); !errors.Is(err, queue.ErrRetryScheduled) {
		t.Fatalf("replay with a retry scheduled: %v", err)
	}
	if got := refs(q, 1); got != 1 {
		t.Fatalf("a refused replay left refs %d, want 1", got)
	}
}

// TestCompactAfterRestartDeletesReleasedEvents: an event held below the
// compaction boundary for a retry, whose retry was resolved before a
// restart, is deleted by the first Compact after it (it used to stay on
// disk for good: recovery only knew events that retries held).
func TestCompactAfterRestartDeletesReleasedEvents(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, _, err := q.Append(&queue.Event{ID: fmt.Sprint(i), Type: "t", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	r := queue.Retry{Subscription: "s", Seq: 2, Due: time.Now(), Attempt: 1}
	if err := q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: r.Subscription, Seq: r.Seq, Retry: &r}); err != nil {
		t.Fatal(err)
	}
	if n, err := q.Compact(6); err != nil || n != 4 {
		t.Fatalf("compact: %d %v, want 4", n, err)
	}
	if err := q.Record(queue.Outcome{Kind: queue.Acked, Subscription: r.Subscription, Seq: r.Seq, From: &r}); err != nil {
		t.Fatal(err)
	}
	q.Close()
	q, err = Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := q.Event(2); err != nil {
		t.Fatalf("event 2 before the first Compact after restart: %v", err)
	}
	if n, err := q.Compact(6); err != nil || n != 1 {
		t.Fatalf("compact after restart: %d %v, want 1 (the released event)", n, err)
	}
	if _, err := q.Event(2); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("event 2 after compaction: %v, want ErrNotFound", err)
	}
}

// TestCompactLargeRangeInChunks: a range far larger than a chunk is
// deleted whole, retries' events kept, whatever the chunking.
func TestCompactLargeRangeInChunks(t *testing.T) {
	q, err := Open(Options{Dir: t.TempDir(), MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	const n = 3*compactChunk + 17
	for i := range n {
		if _, _, err := q.Append(&queue.Event{ID: fmt.Sprint(i), Type: "t", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	keep := []uint64{1, compactChunk, compactChunk + 1, n}
	for _, seq := range keep {
		if err := q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: seq, Retry: &queue.Retry{Subscription: "s", Seq: seq, Due: time.Now()}}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := q.Compact(n + 1)
	if err != nil || got != n-len(keep) {
		t.Fatalf("compact: %d %v, want %d", got, err, n-len(keep))
	}
	for _, seq := range keep {
		if _, err := q.Event(seq); err != nil {
			t.Fatalf("event %d, held by a retry: %v", seq, err)
		}
	}
	if _, err := q.Event(2); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("event 2: %v", err)
	}
}
