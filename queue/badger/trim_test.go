package badger_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// TestTrimDeadLetters: a subscription's oldest dead letters past keep go,
// the newest stay, a letter with a replay in flight stays whatever its
// age, and another subscription's letters (one whose id extends this
// one's) are untouched.
func TestTrimDeadLetters(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{Sync: true})
	if _, err := q.JoinAll([]queue.JoinRequest{{Subscription: "s"}, {Subscription: "s-2"}}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i := range 10 {
		seq, _ := queuetest.MustAppend(t, q, queuetest.Event(fmt.Sprint("e-", i), "t", "{}"))
		for _, sub := range []string{"s", "s-2"} {
			d := &queue.DeadLetter{Subscription: sub, Seq: seq, EventID: fmt.Sprint("e-", i), Type: "t", Reason: "rejected", Attempts: 1, DeadAt: now, Body: []byte("{}")}
			if err := q.Record(queue.Outcome{Kind: queue.DeadLettered, Subscription: sub, Seq: seq, At: now, DeadLetter: d}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The second oldest is being replayed: it keeps its letter.
	if _, err := q.Replay("s", 2, now, false); err != nil {
		t.Fatal(err)
	}
	n, err := q.TrimDeadLetters("s", 3)
	if err != nil || n != 6 {
		t.Fatalf("trim: %d, %v; want the 7 oldest but the replayed one, 6", n, err)
	}
	left, err := q.DeadLetters("s", "", 0, 100)
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
	if other, _ := q.DeadLetters("s-2", "", 0, 100); len(other) != 10 {
		t.Fatalf("s-2 has %d letters after trimming s, want 10", len(other))
	}
	if n, err := q.TrimDeadLetters("s", 3); err != nil || n != 0 {
		t.Fatalf("trim again: %d, %v; want 0 (the replayed one stays)", n, err)
	}
}
