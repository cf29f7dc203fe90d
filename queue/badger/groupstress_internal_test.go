package badger

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// TestGroupsKeepWhatRetriesHold: appends in concurrent batches (groups),
// retries scheduled, rescheduled and resolved at random, Compact chasing
// a bound, reopens between rounds: an event with a retry is always there.
func TestGroupsKeepWhatRetriesHold(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := time.Unix(1_700_000_000, 0)
	open := map[uint64]*queue.Retry{} // retries in the schedule
	var below uint64 = 1
	for round := range 4 {
		q, err := Open(Options{Dir: dir, MinFreeBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		for step := range 30 {
			var wg sync.WaitGroup
			for w := range 8 {
				wg.Go(func() {
					for i := range 8 {
						id := fmt.Sprintf("r%d-s%d-w%d-%d", round, step, w, i)
						if _, _, err := q.Append(&queue.Event{ID: id, Type: "t", AcceptedAt: t0, Body: []byte(id)}); err != nil {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			head := q.Head()
			// First attempts of seqs [below, head) fail at random.
			for seq := below; seq < head; seq++ {
				if rng.IntN(10) == 0 {
					r := &queue.Retry{Subscription: "s", Seq: seq, Due: t0.Add(time.Duration(seq)), Attempt: 1, FirstAttempt: t0}
					if err := q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: seq, Retry: r}); err != nil {
						t.Fatal(err)
					}
					open[seq] = r
				}
			}
			// Retries go on, or end.
			for seq, r := range open {
				switch rng.IntN(3) {
				case 0:
					if err := q.Record(queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: seq, From: r, At: t0}); err != nil {
						t.Fatal(err)
					}
					delete(open, seq)
				case 1:
					r2 := *r
					r2.Attempt++
					r2.Due = r.Due.Add(time.Second)
					if err := q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: seq, From: r, Retry: &r2}); err != nil {
						t.Fatal(err)
					}
					open[seq] = &r2
				}
			}
			// Compact to a bound inside the last batch, at random.
			below = max(below, head-uint64(rng.IntN(40)))
			if _, err := q.Compact(below); err != nil {
				t.Fatal(err)
			}
			for seq := range open {
				ev, err := q.Event(seq)
				if err != nil || ev.Seq != seq {
					t.Fatalf("round %d step %d: event %d with a retry open after Compact(%d): %+v, %v", round, step, seq, below, ev, err)
				}
			}
			for seq := below; seq <= head; seq++ {
				if _, err := q.Event(seq); err != nil {
					t.Fatalf("round %d step %d: event %d above the bound %d: %v", round, step, seq, below, err)
				}
			}
		}
		q.Close()
	}
}
