package badger

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

// appendBatch writes evs as one batch of the committer (so they share
// group records) and publishes it, as the committer does.
func appendBatch(t *testing.T, q *Log, evs ...*queue.Event) {
	t.Helper()
	batch := make([]*appendReq, len(evs))
	for i, ev := range evs {
		batch[i] = &appendReq{ev: ev, checked: q.assigned.Load(), hash: q.filter.hash(ev.ID), done: make(chan struct{}, 1)}
	}
	w, _, _ := q.write(batch, nil, nil)
	q.publish(w, nil)
	for _, r := range batch {
		if r.err != nil || r.dup {
			t.Fatalf("append %s: seq %d dup %v, %v", r.ev.ID, r.seq, r.dup, r.err)
		}
	}
}

// groupEvents makes events from..from+n-1 whose bodies are pad bytes
// longer than "body <seq>".
func groupEvents(from, n, pad int) []*queue.Event {
	evs := make([]*queue.Event, n)
	for i := range evs {
		seq := from + i
		body := append([]byte(fmt.Sprint("body ", seq)), bytes.Repeat([]byte("p"), pad)...)
		evs[i] = &queue.Event{ID: fmt.Sprint("g-", seq), Type: []string{"t.a", "t.b"}[seq%2], AcceptedAt: time.Unix(int64(seq), 0), Body: body}
	}
	return evs
}

// TestGroupRecords: the events of a batch share one record under the key
// of the last (format 6); every read finds each of them; Compact deletes
// groups whole, writes the group that straddles its bound again without
// the events below it, and copies the events retries hold out of their
// group; all of it holds after a reopen. Small groups stay in the LSM
// tree, larger ones (a busy log's) go to the value log: both are read and
// compacted alike.
func TestGroupRecords(t *testing.T) {
	for _, c := range []struct {
		name   string
		pad    int
		inVlog bool
	}{{"tree", 0, false}, {"value log", 1 << 10, true}} {
		t.Run(c.name, func(t *testing.T) { testGroupRecords(t, c.pad, c.inVlog) })
	}
}

func testGroupRecords(t *testing.T, pad int, inVlog bool) {
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	appendBatch(t, q, groupEvents(1, 10, pad)...)
	appendBatch(t, q, groupEvents(11, 10, pad)...)
	size := func(seq uint64) int64 {
		var n int64 = -1
		q.db.View(func(txn *badgerdb.Txn) error {
			item, err := txn.Get(eventKey(seq))
			if err == nil {
				n = item.ValueSize()
			}
			return err
		})
		return n
	}
	has := func(seq uint64) bool { return size(seq) >= 0 }
	if !has(10) || !has(20) || has(5) || has(11) {
		t.Fatalf("records: e/10 %v, e/20 %v, e/5 %v, e/11 %v; want groups under 10 and 20 only", has(10), has(20), has(5), has(11))
	}
	if n := size(10); (n >= valueThreshold) != inVlog {
		t.Fatalf("group e/10 is %d bytes; want it in the value log: %v (threshold %d)", n, inVlog, valueThreshold)
	}
	check := func(how string, seq uint64, ev *queue.Event) {
		t.Helper()
		want := groupEvents(int(seq), 1, pad)[0]
		if ev.Seq != seq || ev.ID != want.ID || ev.Type != want.Type || string(ev.Body) != string(want.Body) || !ev.AcceptedAt.Equal(want.AcceptedAt) {
			t.Fatalf("%s: event %d read as %+v", how, seq, ev)
		}
	}
	seqs := func(evs []*queue.Event) (s []uint64) {
		for _, ev := range evs {
			s = append(s, ev.Seq)
		}
		return s
	}
	for seq := uint64(1); seq <= 20; seq++ {
		ev, err := q.Event(seq)
		if err != nil {
			t.Fatal(err)
		}
		check("Event", seq, ev)
	}
	if _, err := q.Event(21); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Event(21): %v", err)
	}
	evs, next, err := q.Events(3, 15, 100, nil)
	if err != nil || len(evs) != 13 || next != 16 {
		t.Fatalf("Events(3, 15) = %v next %d, %v", seqs(evs), next, err)
	}
	for _, ev := range evs {
		check("Events", ev.Seq, ev)
	}
	if evs, next, _ := q.Events(1, 20, 4, nil); len(evs) != 4 || evs[3].Seq != 4 || next != 5 {
		t.Fatalf("Events with limit 4 = %v next %d; want 1..4, next 5", seqs(evs), next)
	}
	isA := func(_, typ []byte) bool { return string(typ) == "t.a" }
	if evs, next, _ := q.Events(2, 17, 100, isA); len(evs) != 8 || evs[0].Seq != 2 || evs[7].Seq != 16 || next != 18 {
		t.Fatalf("Events of t.a in 2..17 = %v next %d", seqs(evs), next)
	}
	if n, err := q.CountEvents(2, 17, isA, 100); err != nil || n != 8 {
		t.Fatalf("CountEvents of t.a in 2..17 = %d, %v", n, err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	retries := map[uint64]*queue.Retry{}
	for _, seq := range []uint64{4, 12} {
		r := &queue.Retry{Subscription: "s", Seq: seq, Due: t0, Attempt: 1, FirstAttempt: t0}
		if err := q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: seq, Retry: r}); err != nil {
			t.Fatal(err)
		}
		retries[seq] = r
	}
	if n, err := q.Compact(14); err != nil || n != 11 {
		t.Fatalf("Compact(14) deleted %d, %v; want 11 (1..13 but the held 4 and 12)", n, err)
	}
	afterCompact := func(round string) {
		t.Helper()
		for seq := uint64(1); seq <= 20; seq++ {
			ev, err := q.Event(seq)
			switch {
			case seq == 4 || seq == 12 || seq >= 14:
				if err != nil {
					t.Fatalf("%s: event %d after Compact(14): %v", round, seq, err)
				}
				check(round, seq, ev)
			case !errors.Is(err, queue.ErrNotFound):
				t.Fatalf("%s: event %d kept by Compact(14): %+v, %v", round, seq, ev, err)
			}
		}
		if evs, _, _ := q.Events(1, 20, 100, nil); len(evs) != 7 || evs[0].Seq != 14 {
			t.Fatalf("%s: Events after Compact(14) = %v, want 14..20", round, seqs(evs))
		}
		if !has(4) || !has(12) || !has(20) || has(10) {
			t.Fatalf("%s: records after Compact(14): e/4 %v, e/12 %v, e/20 %v, e/10 %v", round, has(4), has(12), has(20), has(10))
		}
	}
	afterCompact("compacted")
	q.Close()
	if q, err = Open(Options{Dir: dir, MinFreeBytes: -1}); err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	afterCompact("reopened")
	for seq, r := range retries {
		if err := q.Record(queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: seq, From: r, At: t0}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := q.Compact(21); err != nil || n != 9 {
		t.Fatalf("Compact(21) deleted %d, %v; want 9 (4, 12 and 14..20)", n, err)
	}
	for seq := uint64(1); seq <= 20; seq++ {
		if _, err := q.Event(seq); !errors.Is(err, queue.ErrNotFound) {
			t.Fatalf("event %d after compacting everything: %v", seq, err)
		}
	}
	if q.Head() != 20 {
		t.Fatalf("head %d, want 20", q.Head())
	}
}
