package badger

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// TestValueLogGCReclaimsLargeEvents: bodies over the value threshold live
// in the value log, which deleting their keys does not shrink. Once the
// events are compacted away, value-log GC gives the space back; without it
// the data dir only grows.
func TestValueLogGCReclaimsLargeEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 200 MiB")
	}
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	body := bytes.Repeat([]byte("v"), 1<<20)
	for i := range 200 {
		ev := &queue.Event{ID: fmt.Sprintf("big-%d", i), Type: "t", AcceptedAt: time.Now(), Body: body}
		if _, _, err := q.Append(ev); err != nil {
			t.Fatal(err)
		}
	}
	// 40 more that stay live: GC must move them, not lose them.
	for i := range 40 {
		ev := &queue.Event{ID: fmt.Sprintf("live-%d", i), Type: "t", AcceptedAt: time.Now(), Body: append([]byte(fmt.Sprint(i)), body...)}
		if _, _, err := q.Append(ev); err != nil {
			t.Fatal(err)
		}
	}
	full := dirUsage(dir)
	if n, err := q.Compact(201); err != nil || n != 200 {
		t.Fatalf("compact: %d %v", n, err)
	}
	if n := q.collectValueLog(64<<20, true); n == 0 {
		t.Fatalf("value-log GC rewrote nothing after 200 MiB of events were deleted (usage %d MiB)", full>>20)
	}
	if after := dirUsage(dir); after > full/2 {
		t.Fatalf("data dir %d MiB after GC, %d MiB before: the deleted bodies were not reclaimed", after>>20, full>>20)
	}
	evs, _, err := q.Events(201, q.Head(), 100, nil)
	if err != nil || len(evs) != 40 {
		t.Fatalf("live events after GC: %d %v", len(evs), err)
	}
	for i, ev := range evs {
		if ev.ID != fmt.Sprintf("live-%d", i) || !bytes.Equal(ev.Body, append([]byte(fmt.Sprint(i)), body...)) {
			t.Fatalf("live event %d changed by GC: id %s, %d bytes", i, ev.ID, len(ev.Body))
		}
	}
}

// TestValueLogKeptDown: a busy log writes its group records to the value
// log, and its GC must keep pace with the writes rather than wait for the
// minute's pass. Batches go through AppendBatch and are compacted as soon
// as they are written, four times the quota over all, with fsync; with
// GC only once a minute the value log fills the quota within the first
// quarter and the disk guard refuses appends.
func TestValueLogKeptDown(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 256 MiB")
	}
	const quota = 64 << 20
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir, Sync: true, MaxDiskBytes: quota, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	body := bytes.Repeat([]byte("v"), 4<<10)
	evs := make([]*queue.Event, 100)
	res := make([]queue.AppendResult, len(evs))
	written, peak := 0, int64(0)
	for b := 0; written < 4*quota; b++ {
		for i := range evs {
			evs[i] = &queue.Event{ID: fmt.Sprintf("b%d-%d", b, i), Type: "t", AcceptedAt: time.Now(), Body: body}
		}
		q.AppendBatch(evs, res)
		for i, r := range res {
			if r.Err != nil {
				t.Fatalf("batch %d, event %d, after %d MiB of bodies (data dir %d MiB, value log %d MiB): %v",
					b, i, written>>20, dirUsage(dir)>>20, valueLogBytes(dir)>>20, r.Err)
			}
		}
		written += len(evs) * len(body)
		if _, err := q.Compact(q.Head() + 1); err != nil {
			t.Fatal(err)
		}
		if b%10 == 0 {
			peak = max(peak, dirUsage(dir))
		}
	}
	t.Logf("%d MiB of bodies through a %d MiB quota; the data dir at most %d MiB (sampled)", written>>20, quota>>20, peak>>20)
}
