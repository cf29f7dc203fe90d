package badger

import (
	"errors"
	"fmt"
	"github.com/sluicehq/sluice/queue"
	"testing"
	"time"

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
	// Make it what format 1 wrote.
	err = q.db.Update(func(txn *badgerdb.Txn) error {
		if err := txn.Set(keyFormat, u64(1)); err != nil {
			return err
		}
		return txn.Set(idKey("old"), u64(1))
	})
	if err != nil {
		t.Fatal(err)
	}
	q.Close()

	q, err = Open(Options{Dir: dir, MinFreeBytes: -1})
	if err != nil {
		t.Fatalf("open a format-1 dir: %v", err)
	}
	defer q.Close()
	if seq, typ, err := q.Lookup("old"); err != nil || seq != 1 || typ != "" {
		t.Fatalf("format-1 entry: seq %d type %q %v; want 1, unknown type", seq, typ, err)
	}
	if seq, dup, err := q.Append(&queue.Event{ID: "old", Type: "t.a", Body: []byte("{}")}); err != nil || !dup || seq != 1 {
		t.Fatalf("append of a format-1 id: seq %d dup %v %v; want the original seq 1 as a duplicate", seq, dup, err)
	}
	if seq, _, err := q.Append(&queue.Event{ID: "new", Type: "t.b", Body: []byte("{}")}); err != nil || seq != 2 {
		t.Fatalf("append: %d %v", seq, err)
	}
	if seq, typ, err := q.Lookup("new"); err != nil || seq != 2 || typ != "t.b" {
		t.Fatalf("format-2 entry: seq %d type %q %v", seq, typ, err)
	}
	var f []byte
	q.db.View(func(txn *badgerdb.Txn) error {
		item, err := txn.Get(keyFormat)
		if err == nil {
			f, err = item.ValueCopy(nil)
		}
		return err
	})
	if len(f) != 8 || f[7] != formatVersion {
		t.Fatalf("m/format after open = %v, want %d", f, formatVersion)
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
	var f []byte
	q.db.View(func(txn *badgerdb.Txn) error {
		item, err := txn.Get(keyFormat)
		if err == nil {
			f, err = item.ValueCopy(nil)
		}
		return err
	})
	if len(f) != 8 || f[7] != formatVersion {
		t.Fatalf("m/format after open = %v, want %d", f, formatVersion)
	}
}
