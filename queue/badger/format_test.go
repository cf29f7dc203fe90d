package badger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"

	badgerdb "github.com/dgraph-io/badger/v4"
)

// TestNewerFormatIsRefused: a data dir written by a newer sluice is refused
// at open, never misread or rewritten.
func TestNewerFormatIsRefused(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	db, err := badgerdb.Open(badgerdb.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(txn *badgerdb.Txn) error { return txn.Set(keyFormat, u64(formatVersion+1)) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(Options{Dir: dir}); !errors.Is(err, queue.ErrNewerFormat) {
		t.Fatalf("open of a newer data dir: %v, want ErrNewerFormat", err)
	}
}

// TestFormat1DirIsUpgraded: a data dir of format 1 (dedup entries of the
// seq alone) opens, its entries still deduplicate, new entries carry the
// type, and m/format is rewritten so an older sluice refuses the dir.
func TestFormat1DirIsUpgraded(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := q.Append(&queue.Event{ID: "old", Type: "t.a", Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	// Make it what format 1 wrote, once Close has written the i/ entry
	// (format 5 writes it after the event).
	q.Close()
	rawUpdate(t, dir, func(txn *badgerdb.Txn) error {
		if err := txn.Set(keyFormat, u64(1)); err != nil {
			return err
		}
		return txn.Set(idKey("old"), u64(1))
	})

	q, err = Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("open a format-1 dir: %v", err)
	}
	defer q.Close()
	if seq, typ, _, err := q.Lookup("old"); err != nil || seq != 1 || typ != "" {
		t.Fatalf("format-1 entry: seq %d type %q %v; want 1, unknown type", seq, typ, err)
	}
	if seq, dup, err := q.Append(&queue.Event{ID: "old", Type: "t.a", Body: []byte("{}")}); err != nil || !dup || seq != 1 {
		t.Fatalf("append of a format-1 id: seq %d dup %v %v; want the original seq 1 as a duplicate", seq, dup, err)
	}
	if seq, _, err := q.Append(&queue.Event{ID: "new", Type: "t.b", Body: []byte("{}")}); err != nil || seq != 2 {
		t.Fatalf("append: %d %v", seq, err)
	}
	if seq, typ, _, err := q.Lookup("new"); err != nil || seq != 2 || typ != "t.b" {
		t.Fatalf("format-2 entry: seq %d type %q %v", seq, typ, err)
	}
	if f := readMark(t, q, keyFormat); f != formatVersion {
		t.Fatalf("m/format after open = %d, want %d", f, formatVersion)
	}
}

// TestFormat2DirGetsRetryIndex: a format-2 dir (retry records without the
// q/ index) opens, RetryOf finds its retries, and resolving one keeps the
// index exact.
func TestFormat2DirGetsRetryIndex(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	for seq := uint64(1); seq <= 3; seq++ {
		if _, _, err := q.Append(&queue.Event{ID: fmt.Sprint(seq), Type: "t", AcceptedAt: t0, Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
		for _, sub := range []string{"a", "b"} {
			r := queue.Retry{Subscription: sub, Seq: seq, Due: t0.Add(time.Duration(seq) * time.Second), Attempt: int(seq), FirstAttempt: t0}
			if err := q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: r.Subscription, Seq: r.Seq, Retry: &r}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Make it what format 2 wrote: no index.
	err = q.db.Update(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixRetryIndex})
		var keys [][]byte
		for it.Rewind(); it.Valid(); it.Next() {
			keys = append(keys, it.Item().KeyCopy(nil))
		}
		it.Close()
		if len(keys) != 6 {
			return fmt.Errorf("%d index keys, want 6", len(keys))
		}
		for _, k := range keys {
			if err := txn.Delete(k); err != nil {
				return err
			}
		}
		return txn.Set(keyFormat, u64(2))
	})
	if err != nil {
		t.Fatal(err)
	}
	q.Close()

	q, err = Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("open a format-2 dir: %v", err)
	}
	defer q.Close()
	for seq := uint64(1); seq <= 3; seq++ {
		for _, sub := range []string{"a", "b"} {
			r, err := q.RetryOf(sub, seq)
			if err != nil || r == nil || r.Attempt != int(seq) || !r.Due.Equal(t0.Add(time.Duration(seq)*time.Second)) {
				t.Fatalf("RetryOf(%s, %d) in an upgraded dir = %+v, %v", sub, seq, r, err)
			}
		}
	}
	if r, err := q.RetryOf("a", 4); r != nil || err != nil {
		t.Fatalf("RetryOf a seq without retry = %+v, %v", r, err)
	}
	r, _ := q.RetryOf("a", 2)
	if err := q.Record(queue.Outcome{Kind: queue.Acked, Subscription: "a", Seq: 2, From: r}); err != nil {
		t.Fatal(err)
	}
	if r, err := q.RetryOf("a", 2); r != nil || err != nil {
		t.Fatalf("RetryOf after the ACK = %+v, %v", r, err)
	}
	if r, _ := q.RetryOf("b", 2); r == nil {
		t.Fatal("another subscription's retry of the seq lost from the index")
	}
	if f := readMark(t, q, keyFormat); f != formatVersion {
		t.Fatalf("m/format after open = %d, want %d", f, formatVersion)
	}
}

// TestFormat3EventsReadAfterUpgrade: a format-3 dir's event records (the
// version-1 layout, built here byte by byte rather than by appendEvent)
// open and read with no ordering key or trace context, through Event and
// through Events with and without a type filter; an event appended after
// the upgrade keeps them; an event without them is still written as
// those exact version-1 bytes (the compact case costs nothing more); and
// m/format says the current version (4 or later).
func TestFormat3EventsReadAfterUpgrade(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_700_000_000, 123)
	if _, _, err := q.Append(&queue.Event{ID: "old", Type: "t.a", ContentType: "application/json", AcceptedAt: at, Body: []byte(`{"a":1}`)}); err != nil {
		t.Fatal(err)
	}
	// What format 3 wrote for that event: version 1 | id | type | content
	// type | accepted-at | body.
	old := []byte{1, 3, 'o', 'l', 'd', 3, 't', '.', 'a', 16}
	old = append(old, "application/json"...)
	old = binary.BigEndian.AppendUint64(old, uint64(at.UnixNano()))
	old = append(old, `{"a":1}`...)
	var stored []byte
	err = q.db.Update(func(txn *badgerdb.Txn) error {
		item, err := txn.Get(eventKey(1))
		if err != nil {
			return err
		}
		if stored, err = item.ValueCopy(nil); err != nil {
			return err
		}
		if err := txn.Set(eventKey(1), old); err != nil {
			return err
		}
		return txn.Set(keyFormat, u64(3))
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stored, old) {
		t.Fatalf("an event without ordering key or trace context encodes as\n%x\nwant format 3's\n%x", stored, old)
	}
	q.Close()

	q, err = Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("open a format-3 dir: %v", err)
	}
	defer q.Close()
	check := func(how string, ev *queue.Event) {
		t.Helper()
		if ev.ID != "old" || ev.Type != "t.a" || ev.ContentType != "application/json" || !ev.AcceptedAt.Equal(at) || string(ev.Body) != `{"a":1}` ||
			ev.OrderingKey != "" || ev.TraceParent != "" || ev.TraceState != "" {
			t.Fatalf("%s: format-3 event read as %+v", how, ev)
		}
	}
	ev, err := q.Event(1)
	if err != nil {
		t.Fatal(err)
	}
	check("Event", ev)
	for _, match := range []queue.Match{nil, func(_, typ []byte) bool { return string(typ) == "t.a" }} {
		evs, _, err := q.Events(1, 10, 10, match)
		if err != nil || len(evs) != 1 {
			t.Fatalf("Events: %d events, %v", len(evs), err)
		}
		check("Events", evs[0])
	}
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if _, _, err := q.Append(&queue.Event{ID: "new", Type: "t.b", AcceptedAt: at, Body: []byte("{}"),
		OrderingKey: "vehicle-17", TraceParent: tp, TraceState: "vendor=x"}); err != nil {
		t.Fatal(err)
	}
	evs, _, err := q.Events(1, 10, 10, func(_, typ []byte) bool { return string(typ) == "t.b" })
	if err != nil || len(evs) != 1 {
		t.Fatalf("Events of the new type: %d events, %v", len(evs), err)
	}
	if ev := evs[0]; ev.ID != "new" || ev.OrderingKey != "vehicle-17" || ev.TraceParent != tp || ev.TraceState != "vendor=x" || string(ev.Body) != "{}" {
		t.Fatalf("new event read as %+v", ev)
	}
	if f := readMark(t, q, keyFormat); f != formatVersion || formatVersion < 4 {
		t.Fatalf("m/format after open = %d, want %d", f, formatVersion)
	}
}

// rawUpdate changes a closed log's dir with Badger directly.
func rawUpdate(t *testing.T, dir string, f func(txn *badgerdb.Txn) error) {
	t.Helper()
	db, err := badgerdb.Open(badgerdb.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(f); err != nil {
		t.Fatal(err)
	}
}

// readMark reads an 8-byte m/ key of an open log.
func readMark(t *testing.T, q *Log, key []byte) uint64 {
	t.Helper()
	var v uint64
	err := q.db.View(func(txn *badgerdb.Txn) error {
		item, err := txn.Get(key)
		if err != nil {
			return err
		}
		b, err := item.ValueCopy(nil)
		if len(b) == 8 {
			v = binary.BigEndian.Uint64(b)
		}
		return err
	})
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return v
}

// TestFormat4DirDedupsAfterUpgrade: a format-4 dir (an i/ entry written
// with every event, no m/indexed) opens; its ids still deduplicate, also
// once their events are compacted; m/indexed is the head and m/format 5.
func TestFormat4DirDedupsAfterUpgrade(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, _, err := q.Append(&queue.Event{ID: id, Type: "t." + id, AcceptedAt: time.Now(), Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	q.Close()
	// What format 4 left: the same i/ entries (written with the events
	// then, by Close's indexing here), no mark.
	rawUpdate(t, dir, func(txn *badgerdb.Txn) error {
		if err := txn.Delete(keyIndexed); err != nil {
			return err
		}
		return txn.Set(keyFormat, u64(4))
	})
	q, err = Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("open a format-4 dir: %v", err)
	}
	defer q.Close()
	if f, m := readMark(t, q, keyFormat), readMark(t, q, keyIndexed); f != formatVersion || m != 3 {
		t.Fatalf("after the upgrade m/format = %d, m/indexed = %d; want %d, 3", f, m, formatVersion)
	}
	if _, err := q.Compact(3); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"a", "b", "c"} {
		if seq, typ, _, err := q.Lookup(id); err != nil || seq != uint64(i+1) || typ != "t."+id {
			t.Fatalf("Lookup(%s) = %d %q, %v", id, seq, typ, err)
		}
		if seq, dup, err := q.Append(&queue.Event{ID: id, Type: "t", AcceptedAt: time.Now(), Body: []byte("{}")}); err != nil || !dup || seq != uint64(i+1) {
			t.Fatalf("append of %s again = %d dup %v, %v", id, seq, dup, err)
		}
	}
}

// TestUnindexedTailIsIndexedOnOpen: events whose i/ entries the process
// never wrote (killed before its indexer ran: m/indexed behind the head)
// get them on the next Open, before any append, so their ids are
// duplicates there and after compaction and another reopen.
func TestUnindexedTailIsIndexedOnOpen(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"a", "b", "c", "d"}
	for _, id := range ids {
		if _, _, err := q.Append(&queue.Event{ID: id, Type: "t." + id, AcceptedAt: time.Now(), Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	q.Close()
	rawUpdate(t, dir, func(txn *badgerdb.Txn) error {
		for _, id := range ids[1:] {
			if err := txn.Delete(idKey(id)); err != nil {
				return err
			}
		}
		return txn.Set(keyIndexed, u64(1))
	})
	for round := range 2 {
		q, err = Open(Options{Dir: dir, MinFreeBytes: -1})
		if err != nil {
			t.Fatal(err)
		}
		if m := readMark(t, q, keyIndexed); m != 4 {
			t.Fatalf("round %d: m/indexed after open = %d, want the head 4", round, m)
		}
		for i, id := range ids {
			if seq, typ, _, err := q.Lookup(id); err != nil || seq != uint64(i+1) || typ != "t."+id {
				t.Fatalf("round %d: Lookup(%s) = %d %q, %v", round, id, seq, typ, err)
			}
			if seq, dup, err := q.Append(&queue.Event{ID: id, Type: "t", AcceptedAt: time.Now(), Body: []byte("{}")}); err != nil || !dup || seq != uint64(i+1) {
				t.Fatalf("round %d: append of %s again = %d dup %v, %v", round, id, seq, dup, err)
			}
		}
		if _, err := q.Compact(q.Head() + 1); err != nil {
			t.Fatal(err)
		}
		if _, err := q.Event(4); !errors.Is(err, queue.ErrNotFound) {
			t.Fatalf("round %d: event 4 after compaction: %v", round, err)
		}
		q.Close()
	}
}
