package badger

import (
	"bytes"
	"fmt"

	badgerdb "github.com/dgraph-io/badger/v4"
)

// Compact deletes the events below seq `below` that no retry still needs.
// The caller passes the smallest durable cursor+1 over every entitled lane.
// Events a retry holds stay until their last retry is resolved; a later
// Compact deletes them.
//
// The work goes in chunks of compactChunk records, each decided under
// refMu and written in a transaction of its own: every retry write takes
// refMu, and a range of 100,000 seqs decided at once held it for as long
// as the whole range took.
//
// Groups (format 6, key.go) go whole. The one that straddles below is
// written again without its events below it, and an event a retry holds
// is copied out of its group into a record of its own first: after
// Compact no record but those holds any event below below.
func (l *Log) Compact(below uint64) (int, error) {
	l.compactMu.Lock()
	defer l.compactMu.Unlock()
	below = min(below, l.head.Load()+1)
	// An event leaves the log only with its i/ entry written: after a
	// crash Open finds the ids of unindexed events in the log alone
	// (dedup.go). The head was read first, so every event below below
	// is queued for the index by now.
	if err := l.index(); err != nil {
		return 0, fmt.Errorf("compact: %w", err)
	}
	below = min(below, l.indexed.Load()+1)
	low := l.low.Load()
	l.refMu.Lock()
	released := l.released
	l.released = nil
	l.refMu.Unlock()
	n := 0
	// Deletes go in small transactions: Badger writes one request at a
	// time, and one request of thousands of deletes would hold appends
	// behind it for milliseconds.
	for i := 0; i < len(released); i += compactChunk {
		chunk := released[i:min(i+compactChunk, len(released))]
		if err := l.deleteEvents(chunk); err != nil {
			l.refMu.Lock()
			l.released = append(l.released, released[i:]...)
			l.refMu.Unlock()
			return n, fmt.Errorf("compact: %w", err)
		}
		n += len(chunk)
	}
	if below <= low {
		return n, nil
	}
	for from := low; ; {
		recs, err := l.recordsBelow(from, below)
		if err != nil {
			return n, fmt.Errorf("compact: %w", err)
		}
		if len(recs) == 0 {
			break
		}
		d, err := l.compactRecords(recs, below)
		n += d
		if err != nil {
			return n, fmt.Errorf("compact: %w", err)
		}
		from = recs[len(recs)-1].key + 1
	}
	if err := l.update(func(txn *badgerdb.Txn) error { return txn.Set(keyLow, u64(below)) }); err != nil {
		return n, fmt.Errorf("compact: %w", err)
	}
	l.low.Store(below)
	return n, nil
}

// holdsAny reports whether a retry holds an event in from..to; the caller
// holds refMu.
func (l *Log) holdsAny(from, to uint64) bool {
	if len(l.retryRefs) == 0 {
		return false
	}
	for s := from; s <= to; s++ {
		if l.retryRefs[s] > 0 {
			return true
		}
	}
	return false
}

func (l *Log) deleteEvents(seqs []uint64) error {
	if len(seqs) == 0 {
		return nil
	}
	err := l.update(func(txn *badgerdb.Txn) error {
		for _, seq := range seqs {
			if err := txn.Delete(eventKey(seq)); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		l.deleted.Add(uint64(len(seqs)))
	}
	return err
}

// compactChunk is how many deletes one compaction transaction carries.
const compactChunk = 256

// record is one e/ record met by Compact: its key (the last seq), its
// first seq, and for the group that straddles the bound a copy of its
// value. A group wholly below the bound is deleted whole unless a retry
// holds one of its events, which is rare: only then is its value read
// again (compactRecords), so Compact copies no value in the common case.
type record struct {
	key   uint64
	first uint64 // == key for an event's own record
	val   []byte // the straddling group's value, or a held group's
	size  int    // of its value, when it is in the LSM tree
}

// compactBytes bounds the group values one compaction chunk holds.
const compactBytes = 1 << 20

// recordsBelow reads the next chunk of records at or after from whose
// first seq is below below.
func (l *Log) recordsBelow(from, below uint64) ([]record, error) {
	var recs []record
	err := l.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixEvent})
		defer it.Close()
		size := 0
		for it.Seek(eventKey(from)); it.Valid() && len(recs) < compactChunk && size < compactBytes; it.Next() {
			item := it.Item()
			r := record{key: seqFromEventKey(item.Key())}
			r.first = r.key
			if item.ValueSize() > 2*groupMaxBytes {
				// An event's own record (a group's events add up to
				// groupMaxBytes at most, with their framing well within
				// twice that) in the value log, whose GC gives its space
				// back: no need to read it.
				if r.key >= below {
					return nil
				}
				recs = append(recs, r)
				continue
			}
			if item.ValueSize() < valueThreshold { // in the tree: reclaim counts it
				r.size = int(item.ValueSize())
			}
			if err := item.Value(func(v []byte) (err error) {
				if r.first, err = firstSeq(r.key, v); err != nil {
					return err
				}
				if r.first != r.key && r.key >= below {
					r.val = bytes.Clone(v)
				}
				return nil
			}); err != nil {
				return err
			}
			if r.first >= below {
				return nil
			}
			recs = append(recs, r)
			size += len(r.val)
			if r.key >= below {
				return nil // the group that straddles below: the last
			}
		}
		return nil
	})
	return recs, err
}

// compactRecords deletes the events below below of recs (which no retry
// holds) in one transaction, and returns how many.
func (l *Log) compactRecords(recs []record, below uint64) (int, error) {
	type copyOut struct {
		seq uint64
		rec []byte
	}
	var (
		deletes []uint64  // keys of records to delete
		copies  []copyOut // held events of groups, to write on their own
		rewrite *record   // the straddling group, less its events below below
		keep    []byte
		n       int
		bytes   int // values in the tree of the records deleted or rewritten
	)
	l.refMu.Lock()
	for i := range recs {
		r := &recs[i]
		if r.first == r.key { // an event's own record, below below
			if l.retryRefs[r.key] > 0 {
				l.held[r.key] = struct{}{}
			} else {
				deletes = append(deletes, r.key)
				bytes += r.size
				n++
			}
			continue
		}
		if r.val == nil { // a group wholly below below
			if !l.holdsAny(r.first, r.key) {
				deletes = append(deletes, r.key)
				bytes += r.size
				n += int(r.key - r.first + 1)
				continue
			}
			v, err := l.get(eventKey(r.key))
			if err != nil {
				l.refMu.Unlock()
				return 0, err
			}
			r.val = v
		}
		bytes += r.size
		var g groupWriter
		rest, lastHeld := 0, false
		err := records(r.key, r.val, func(seq uint64, rec []byte) error {
			switch {
			case seq >= below:
				if rest == 0 {
					keep = g.begin(keep[:0])
				}
				keep = g.addRecord(keep, rec)
				rest++
			case l.retryRefs[seq] > 0:
				l.held[seq] = struct{}{}
				copies = append(copies, copyOut{seq, rec})
				lastHeld = seq == r.key
			default:
				n++
			}
			return nil
		})
		if err != nil {
			l.refMu.Unlock()
			return 0, err
		}
		switch {
		case rest > 0:
			rewrite = &record{key: r.key, val: g.value(keep)}
		case !lastHeld:
			// A held last event's own record replaces the group under
			// the same key: deleting the key too would delete it.
			deletes = append(deletes, r.key)
		}
	}
	l.refMu.Unlock()
	err := l.update(func(txn *badgerdb.Txn) error {
		for _, c := range copies {
			if err := txn.Set(eventKey(c.seq), c.rec); err != nil {
				return err
			}
		}
		if rewrite != nil {
			if err := txn.Set(eventKey(rewrite.key), rewrite.val); err != nil {
				return err
			}
		}
		for _, k := range deletes {
			if err := txn.Delete(eventKey(k)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	l.deleted.Add(uint64(n))
	l.deletedBytes.Add(uint64(bytes))
	return n, nil
}
