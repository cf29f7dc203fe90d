package badger

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/queue"
)

// TestAppendAnsweredAfterItsSync: with Sync, every Append returns only
// after a sync that ended after the append began, whether the committer
// synced itself (appends one at a time: nothing to overlap the sync with)
// or handed the batch to the syncer (32 appenders at once); and once all
// are answered no batch stays counted as handed over.
func TestAppendAnsweredAfterItsSync(t *testing.T) {
	q, err := Open(Options{Dir: t.TempDir(), Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	check := func(id string) error {
		start := time.Now().UnixNano()
		if _, _, err := q.Append(&queue.Event{ID: id, Type: "t", AcceptedAt: time.Now(), Body: []byte("{}")}); err != nil {
			return err
		}
		if synced := q.lastSync.Load(); synced < start {
			return fmt.Errorf("%s answered with the last sync at %d, before it began at %d", id, synced, start)
		}
		return nil
	}
	for i := range 20 {
		if err := check(fmt.Sprint("alone-", i)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 32*20)
	for w := range 32 {
		wg.Go(func() {
			for i := range 20 {
				if err := check(fmt.Sprintf("crowd-%d-%d", w, i)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The syncer answers a batch's appenders before it counts the batch
	// done, so the count may trail the last answer by a moment.
	deadline := time.Now().Add(5 * time.Second)
	for q.syncing.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d batches still counted as with the syncer 5 s after every append was answered", q.syncing.Load())
		}
		time.Sleep(time.Millisecond) // polling an atomic: nothing signals it
	}
}

// TestAppendBatchOneCommit: AppendBatch hands its events to the committer
// at once: with no other appender they take consecutive seqs and one sync
// covers them all (the point of a batch: the sync is the cost of a
// durable append). A disk guard over its limit refuses the batch whole.
func TestAppendBatchOneCommit(t *testing.T) {
	q, err := Open(Options{Dir: t.TempDir(), Sync: true, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	mk := func(prefix string, n int) []*queue.Event {
		evs := make([]*queue.Event, n)
		for i := range evs {
			evs[i] = &queue.Event{ID: fmt.Sprintf("%s-%d", prefix, i), Type: "t", AcceptedAt: time.Now(), Body: []byte(`{"n":1}`)}
		}
		return evs
	}
	q.AppendBatch(mk("warm", 1), make([]queue.AppendResult, 1))
	before := q.lastSync.Load()
	syncs := func() uint64 {
		var m dto.Metric
		if err := q.m.sync.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}
	n0 := syncs()
	evs := mk("b", 500)
	res := make([]queue.AppendResult, len(evs))
	q.AppendBatch(evs, res)
	for i, r := range res {
		if r.Err != nil || r.Dup || r.Seq != uint64(i+2) {
			t.Fatalf("event %d: %+v, want seq %d", i, r, i+2)
		}
	}
	if got := syncs() - n0; got != 1 {
		t.Errorf("a batch of 500 took %d syncs, want 1", got)
	}
	if q.lastSync.Load() == before {
		t.Error("the batch was answered without a sync")
	}

	q.disk = &diskGuard{max: 1} // over any usage: every admission fails
	res = make([]queue.AppendResult, 3)
	q.AppendBatch(mk("full", 3), res)
	for i, r := range res {
		if !errors.Is(r.Err, queue.ErrDiskFull) {
			t.Fatalf("event %d with the disk full: %+v, want ErrDiskFull", i, r)
		}
	}
	q.disk = nil
	if h := q.Head(); h != 501 {
		t.Fatalf("head = %d, want 501: a refused batch wrote something", h)
	}
}
