package badger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

// recover checks the format version, upgrades a dir of an older format,
// rebuilds the in-memory state: head, compaction boundary, retry
// references, and the events below the boundary still on disk; and writes
// the i/ entries of events the last process had not indexed (dedup.go).
func (l *Log) recover() error {
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
