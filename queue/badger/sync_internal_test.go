package badger

import (
	"fmt"
	"sync"
	"testing"
	"time"

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
