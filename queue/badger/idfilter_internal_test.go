package badger

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// TestIDFilterNeverForgetsWithinTheWindow: every id added is "perhaps"
// while its window lasts, through growth and past the memory bound; parts
// are dropped only a window after the next one began; and most ids never
// added are cleared.
func TestIDFilterNeverForgetsWithinTheWindow(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxBytes int64
	}{{"grows", 64 << 20}, {"capped", 2 * filterBytes(filterMinIDs)}} {
		t.Run(tc.name, func(t *testing.T) {
			const window = time.Hour
			t0 := time.Unix(1_700_000_000, 0)
			f := newIDFilter(window, t0, tc.maxBytes)
			f.ready.Store(true)
			const n = 6 * filterMinIDs
			for i := range n {
				// Spread over half a window: nothing expires.
				now := t0.Add(time.Duration(i) * window / 2 / n).UnixNano()
				f.add(f.hash(fmt.Sprint("id-", i)), now)
				f.expire(now)
			}
			for i := range n {
				if !f.mayContain(f.hash(fmt.Sprint("id-", i))) {
					t.Fatalf("id-%d added, then cleared", i)
				}
			}
			var size int64
			for _, p := range *f.parts.Load() {
				size += p.bytes()
			}
			if size > tc.maxBytes {
				t.Fatalf("%d bytes of filter, bound %d", size, tc.maxBytes)
			}
			fp := 0
			for i := range 10000 {
				if f.mayContain(f.hash(fmt.Sprint("other-", i))) {
					fp++
				}
			}
			if tc.name == "grows" && fp > 300 {
				t.Fatalf("%d of 10000 ids never added are perhaps there", fp)
			}
			// A window after the last part began, only it is kept, and what
			// it holds is still there.
			parts := *f.parts.Load()
			last := parts[len(parts)-1]
			later := time.Unix(0, last.start).Add(window).UnixNano()
			f.add(f.hash("late"), later)
			f.expire(later)
			if got := *f.parts.Load(); got[0] != last && len(parts) > 1 {
				t.Fatalf("parts after a window: %d, the first began at %d, want the last (%d) first", len(got), got[0].start, last.start)
			}
			if !f.mayContain(f.hash("late")) || !f.mayContain(f.hash(fmt.Sprint("id-", n-1))) {
				t.Fatal("an id of the kept part cleared")
			}
		})
	}
}

// TestFilledFilterClearsOnlyNewIDs: a log reopened over ids already
// written builds its filter from their i/ entries; once it is ready the
// old ids are still duplicates and new ones are appended.
func TestFilledFilterClearsOnlyNewIDs(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	for i := range n {
		if _, _, err := q.Append(&queue.Event{ID: fmt.Sprint("old-", i), Type: "t", AcceptedAt: time.Now(), Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	q.Close()
	q, err = Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	<-q.fillDone
	if !q.filter.ready.Load() {
		t.Fatal("filter not ready after its fill")
	}
	cleared := 0
	for i := range n {
		if seq, dup, err := q.Append(&queue.Event{ID: fmt.Sprint("old-", i), Type: "t", AcceptedAt: time.Now(), Body: []byte("x")}); err != nil || !dup || seq != uint64(i+1) {
			t.Fatalf("old-%d again: seq %d dup %v, %v", i, seq, dup, err)
		}
		if !q.filter.mayContain(q.filter.hash(fmt.Sprint("new-", i))) {
			cleared++
		}
		if seq, dup, err := q.Append(&queue.Event{ID: fmt.Sprint("new-", i), Type: "t", AcceptedAt: time.Now(), Body: []byte("x")}); err != nil || dup || seq != uint64(n+i+1) {
			t.Fatalf("new-%d: seq %d dup %v, %v", i, seq, dup, err)
		}
	}
	if cleared < n*9/10 {
		t.Fatalf("the filter cleared %d of %d new ids", cleared, n)
	}
}

// TestOldIDPastRecentIsDuplicate: an id the committer wrote long enough
// ago that recent has dropped it is still a duplicate, found through the
// filter's "perhaps" and the LSM lookup.
func TestOldIDPastRecentIsDuplicate(t *testing.T) {
	q, err := Open(Options{Dir: t.TempDir(), MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	<-q.fillDone
	ev := func(id string) *queue.Event {
		return &queue.Event{ID: id, Type: "t", AcceptedAt: time.Now(), Body: []byte("{}")}
	}
	if _, _, err := q.Append(ev("first")); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		q.idsMu.RLock()
		_, kept := q.recentID("first", time.Now().Unix(), q.head.Load())
		q.idsMu.RUnlock()
		if !kept {
			break
		}
		if _, _, err := q.Append(ev(fmt.Sprint("other-", i))); err != nil {
			t.Fatal(err)
		}
		if err := q.index(); err != nil {
			t.Fatal(err)
		}
	}
	if !q.filter.mayContain(q.filter.hash("first")) {
		t.Fatal("the filter cleared an id written")
	}
	if seq, dup, err := q.Append(ev("first")); err != nil || !dup || seq != 1 {
		t.Fatalf("first again: seq %d dup %v, %v", seq, dup, err)
	}
}

// TestClearedAppendBehindRecentIsLookedUp: an append the filter cleared,
// whose mark is below what recent holds (it waited behind two rotations),
// goes to the committer's LSM lookup without the appender's key, and is
// still appended.
func TestClearedAppendBehindRecentIsLookedUp(t *testing.T) {
	q, err := Open(Options{Dir: t.TempDir(), MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, _, err := q.Append(&queue.Event{ID: "old", Type: "t", AcceptedAt: time.Now(), Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if err := q.index(); err != nil {
		t.Fatal(err)
	}
	<-q.fillDone
	if !q.filter.ready.Load() {
		t.Fatal("filter not ready after its fill")
	}
	// What two rotations after the appender's check leave.
	q.idsMu.Lock()
	q.idsLow = 1 << 40
	clear(q.ids)
	q.idsMu.Unlock()
	if seq, dup, err := q.Append(&queue.Event{ID: "new", Type: "t", AcceptedAt: time.Now(), Body: []byte("{}")}); err != nil || dup || seq != 2 {
		t.Fatalf("append of a cleared id behind recent: seq %d dup %v, %v; want 2, new", seq, dup, err)
	}
}

// TestIndexFillsTransactions: ids enough to fill several Badger
// transactions are indexed, whatever room the last entry leaves for the
// mark: a mark refused by a full transaction once failed every index
// write (and Compact) from then on.
func TestIndexFillsTransactions(t *testing.T) {
	// A small memtable makes small transactions (Badger allows 15% of it).
	q, err := Open(Options{Dir: t.TempDir(), MinFreeBytes: -1, Memory: Memory{MemTable: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	// Past a few transactions' worth, entries of every length, so that one
	// of them ends a transaction with no room left for the mark.
	var evs []*queue.Event
	for i := range 20_000 {
		evs = append(evs, &queue.Event{Seq: uint64(i + 1), ID: fmt.Sprintf("fill-%d-%s", i, strings.Repeat("x", i%37)), Type: "t"})
	}
	for start := 0; start < len(evs); start += 997 {
		batch := evs[start:min(start+997, len(evs))]
		if err := q.writeIndex([]indexBatch{{batch, time.Now().Add(time.Hour).Unix()}}, batch[len(batch)-1].Seq); err != nil {
			t.Fatalf("index through seq %d: %v", batch[len(batch)-1].Seq, err)
		}
	}
	if got := q.indexed.Load(); got != 20_000 {
		t.Fatalf("indexed = %d, want 20000", got)
	}
	if err := q.writeIndex([]indexBatch{{evs, time.Now().Add(time.Hour).Unix()}}, 20_000); err != nil {
		t.Fatalf("all 20,000 ids in one write: %v", err)
	}
}
