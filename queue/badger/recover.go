package badger

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

// recover checks the format version, upgrades a dir of an older format,
// rebuilds the in-memory state: head, compaction boundary, retry
// references, and the events below the boundary still on disk; and writes
// the i/ entries of events the last process had not indexed (dedup.go).
// No new event will take a seq at or below floor, nor one that a durable
// record names (named).
func (l *Log) recover(floor uint64) error {
	var format uint64 // 0: no format key yet (a new dir)
	err := l.db.View(func(txn *badgerdb.Txn) error {
		item, err := txn.Get(keyFormat)
		if errors.Is(err, badgerdb.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		if len(v) != 8 {
			return fmt.Errorf("format version: %w", queue.ErrCorrupt)
		}
		format = binary.BigEndian.Uint64(v)
		return nil
	})
	if err != nil {
		return err
	}
	if format > formatVersion {
		return fmt.Errorf("format %d, this sluice reads up to %d: %w", format, formatVersion, queue.ErrNewerFormat)
	}
	// Format 3 added the retry index (key.go); an older dir gets it built
	// from its retry records before m/format says 3, so a crash during the
	// upgrade leaves an older format that is upgraded again.
	var index *badgerdb.WriteBatch
	var indexed uint64 // m/indexed
	var raised bool    // the head was raised above m/head and the log's events
	if format < 3 {
		index = l.db.NewWriteBatch()
		defer index.Cancel()
	}
	err = l.db.View(func(txn *badgerdb.Txn) error {
		var head uint64
		if item, err := txn.Get(keyHead); err == nil {
			v, err := item.ValueCopy(nil)
			if err != nil || len(v) != 8 {
				return fmt.Errorf("head: %w", queue.ErrCorrupt)
			}
			head = binary.BigEndian.Uint64(v)
		} else if !errors.Is(err, badgerdb.ErrKeyNotFound) {
			return err
		}
		low := uint64(1)
		if item, err := txn.Get(keyLow); err == nil {
			v, err := item.ValueCopy(nil)
			if err != nil || len(v) != 8 {
				return fmt.Errorf("compaction boundary: %w", queue.ErrCorrupt)
			}
			low = binary.BigEndian.Uint64(v)
		} else if !errors.Is(err, badgerdb.ErrKeyNotFound) {
			return err
		}
		// The last event key can only be past m/head if a write of the head
		// was lost; trust the log.
		rit := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixEvent, Reverse: true})
		defer rit.Close()
		if rit.Seek(eventKey(^uint64(0))); rit.Valid() {
			head = max(head, seqFromEventKey(rit.Item().Key()))
		}
		named, err := named(txn)
		if err != nil {
			return err
		}
		if top := max(floor, named, low-1); top > head {
			l.log.Warn("data dir: sequence numbers up to the head were lost; new events start above every one still named",
				"data_dir", l.opts.Dir, "head", head, "named", top)
			head, raised = top, true
		}
		l.head.Store(head)
		l.assigned.Store(head)
		l.low.Store(low)
		// Before format 5 every event had its i/ entry as it was written.
		indexed = head
		if format == formatVersion {
			indexed = 0
			if item, err := txn.Get(keyIndexed); err == nil {
				v, err := item.ValueCopy(nil)
				if err != nil || len(v) != 8 {
					return fmt.Errorf("dedup index mark: %w", queue.ErrCorrupt)
				}
				indexed = binary.BigEndian.Uint64(v)
			} else if !errors.Is(err, badgerdb.ErrKeyNotFound) {
				return err
			}
		}
		retries := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixRetry})
		defer retries.Close()
		for retries.Rewind(); retries.Valid(); retries.Next() {
			k := retries.Item().Key()
			if len(k) < len(prefixRetry)+18 {
				return fmt.Errorf("retry key: %w", queue.ErrCorrupt)
			}
			seq := binary.BigEndian.Uint64(k[len(k)-8:])
			l.retryRefs[seq]++
			if index != nil {
				sub := string(k[len(prefixRetry) : len(k)-17])
				if err := index.Set(retryIndexKey(sub, seq), bytes.Clone(k[len(k)-16:len(k)-8])); err != nil {
					return fmt.Errorf("index retries: %w", err)
				}
			}
		}
		// Events below the boundary are those retries hold, and those a
		// Compact freed but had not deleted when the process stopped: the
		// next Compact deletes the latter.
		eit := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixEvent})
		defer eit.Close()
		for eit.Rewind(); eit.Valid(); eit.Next() {
			seq := seqFromEventKey(eit.Item().Key())
			if seq >= low {
				break
			}
			// Compact leaves no group below its boundary; should one be
			// there, the boundary goes back to it for the next Compact.
			var first uint64
			if err := eit.Item().Value(func(v []byte) (err error) {
				first, err = firstSeq(seq, v)
				return err
			}); err != nil {
				return err
			}
			if first != seq {
				l.low.Store(first)
				break
			}
			if l.retryRefs[seq] > 0 {
				l.held[seq] = struct{}{}
			} else {
				l.released = append(l.released, seq)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if raised {
		// At once: the evidence that raised it (a dropped part of a
		// damaged log, Open) is gone once Badger has opened the dir.
		if err := l.db.Update(func(txn *badgerdb.Txn) error { return txn.Set(keyHead, u64(l.head.Load())) }); err != nil {
			return fmt.Errorf("write head: %w", err)
		}
		if err := l.db.Sync(); err != nil {
			return fmt.Errorf("write head: %w", err)
		}
	}
	if index != nil {
		if err := index.Flush(); err != nil {
			return fmt.Errorf("index retries: %w", err)
		}
	}
	// Ids of the events the last process wrote but had not indexed, before
	// the format says 5: a crash here leaves a dir that Open indexes again.
	if err := l.indexTail(indexed, l.head.Load()); err != nil {
		return err
	}
	l.indexed.Store(l.head.Load())
	l.idsLow = l.head.Load()
	if format < formatVersion {
		// Every older format is readable as it is (key.go); rewriting
		// m/format makes an older sluice refuse the dir rather than misread it.
		// m/indexed goes in the same transaction: in a format-5 dir its
		// absence means nothing is indexed.
		err := l.db.Update(func(txn *badgerdb.Txn) error {
			if err := txn.Set(keyIndexed, u64(l.head.Load())); err != nil {
				return err
			}
			return txn.Set(keyFormat, u64(formatVersion))
		})
		if err != nil {
			return fmt.Errorf("write format version: %w", err)
		}
	}
	return nil
}

// named is the highest sequence number a durable record names: a cursor,
// a membership's cut-off, a retry record or a dead letter. Normally none
// is above the head, which is written with every batch; after a loss (a
// damaged log opened anyway, a log cut short) they may be, and a new event
// taking such a seq would be taken for the lost one: a cursor would skip
// it, a replay deliver the old body under it.
func named(txn *badgerdb.Txn) (uint64, error) {
	var top uint64
	each := func(prefix []byte, values bool, f func(k, v []byte) error) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefix, PrefetchValues: values})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if !values {
				if err := f(k, nil); err != nil {
					return err
				}
				continue
			}
			if err := it.Item().Value(func(v []byte) error { return f(k, v) }); err != nil {
				return err
			}
		}
		return nil
	}
	lastSeq := func(k, _ []byte) error {
		if len(k) >= 8 {
			top = max(top, binary.BigEndian.Uint64(k[len(k)-8:]))
		}
		return nil
	}
	err := each(prefixCursor, true, func(k, v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("cursor %s: %w", k[len(prefixCursor):], queue.ErrCorrupt)
		}
		top = max(top, binary.BigEndian.Uint64(v))
		return nil
	})
	if err == nil {
		err = each(prefixMember, true, func(k, v []byte) error {
			var rec memberRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("membership %s: %v: %w", k[len(prefixMember):], err, queue.ErrCorrupt)
			}
			top = max(top, rec.From-min(rec.From, 1), rec.Until)
			return nil
		})
	}
	if err == nil {
		err = each(prefixRetry, false, lastSeq)
	}
	if err == nil {
		err = each(prefixDeadLetter, false, lastSeq)
	}
	return top, err
}
