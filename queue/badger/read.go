package badger

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

// Lookup returns the sequence number of the event with this id, and its
// type ("" for an entry written by format 1), while the id is remembered
// (the dedup window); ErrNotFound after.
func (l *Log) Lookup(id string) (seq uint64, typ, tenant string, err error) {
	// recent first: an event not indexed yet is only there, and one that
	// is moves from recent to its i/ entry only after that is written.
	l.idsMu.RLock()
	e, ok := l.recentID(id, time.Now().Unix(), l.head.Load())
	l.idsMu.RUnlock()
	if ok {
		return e.seq, e.typ, e.tenant, nil
	}
	var found bool
	err = l.db.View(func(txn *badgerdb.Txn) error {
		seq, typ, tenant, found, err = lookupIndexed(txn, idKey(id), id)
		return err
	})
	if err == nil && !found {
		return 0, "", "", queue.ErrNotFound
	}
	return seq, typ, tenant, err
}

// get reads a copy of key's value, badgerdb.ErrKeyNotFound when there is
// none.
func (l *Log) get(key []byte) (v []byte, err error) {
	err = l.db.View(func(txn *badgerdb.Txn) error {
		item, err := txn.Get(key)
		if err != nil {
			return err
		}
		v, err = item.ValueCopy(nil)
		return err
	})
	return v, err
}

// Event reads one event by sequence number: in the first record at or
// after seq, a group or its own (format 6, key.go).
func (l *Log) Event(seq uint64) (*queue.Event, error) {
	var ev *queue.Event
	err := l.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixEvent})
		defer it.Close()
		if it.Seek(eventKey(seq)); !it.Valid() {
			return badgerdb.ErrKeyNotFound
		}
		item := it.Item()
		return item.Value(func(v []byte) error {
			return records(seqFromEventKey(item.Key()), v, func(s uint64, rec []byte) error {
				if s != seq {
					return nil
				}
				var err error
				ev, err = decodeEvent(seq, bytes.Clone(rec))
				return err
			})
		})
	})
	if err == nil && ev == nil {
		err = badgerdb.ErrKeyNotFound
	}
	if errors.Is(err, badgerdb.ErrKeyNotFound) {
		return nil, fmt.Errorf("event %d: %w", seq, queue.ErrNotFound)
	}
	if errors.Is(err, queue.ErrCorrupt) {
		ce := &queue.CorruptEventError{First: seq, Last: seq, Err: err}
		l.reportCorrupt(ce)
		return nil, ce
	}
	return ev, err
}

// reportCorrupt logs an unreadable record and counts its events, once per
// record: lanes meet it once each, and before they dead-lettered it they
// met it on every read, which flooded the log with the same error.
func (l *Log) reportCorrupt(ce *queue.CorruptEventError) {
	l.corruptMu.Lock()
	defer l.corruptMu.Unlock()
	if _, ok := l.corrupt[ce.Last]; ok {
		return
	}
	if len(l.corrupt) < maxCorruptReported {
		l.corrupt[ce.Last] = struct{}{}
	}
	l.m.corrupt.Add(float64(ce.Last - ce.First + 1))
	l.log.Error("event unreadable: its copy in the log is damaged; every lane it may be owed to dead-letters it (reason corrupt)",
		"data_dir", l.opts.Dir, "first_seq", ce.First, "last_seq", ce.Last, "err", ce.Err)
}

// maxCorruptReported bounds the memory of reportCorrupt; past it a record
// may be reported again.
const maxCorruptReported = 1 << 16

// maxScan bounds how many non-matching events one Events call walks past,
// so a lane far behind on a type it rarely matches yields between pages.
const maxScan = 8192

// Events returns up to limit events with from <= seq <= to whose type
// satisfies match (nil matches all), and the sequence number to continue
// from. Fewer than limit events with next <= to means the scan stopped at
// its bound, not that there is nothing left. An unreadable record ends the
// page before it; met first, it is a *queue.CorruptEventError naming its
// seqs, so that a reader can settle them and go on past.
func (l *Log) Events(from, to uint64, limit int, match queue.Match) (evs []*queue.Event, next uint64, err error) {
	from = max(from, l.low.Load())
	next = from
	if from > to {
		return nil, next, nil
	}
	// Read the head before the snapshot: every event up to it was
	// committed before the read began, so the snapshot holds them all. Read
	// after, it could name events the snapshot cannot see.
	head := l.head.Load()
	err = l.db.View(func(txn *badgerdb.Txn) error {
		opts := badgerdb.IteratorOptions{Prefix: prefixEvent}
		if match == nil {
			opts.PrefetchValues, opts.PrefetchSize = true, min(limit, 100)
		}
		it := txn.NewIterator(opts)
		defer it.Close()
		scanned := 0
		prevKey := from - 1 // the seq of the record before: a record holds the seqs after it
		for it.Seek(eventKey(from)); it.Valid() && len(evs) < limit && scanned < maxScan; it.Next() {
			item := it.Item()
			keySeq := seqFromEventKey(item.Key())
			var bad uint64 // the event that failed to decode; 0: the record itself
			err := item.Value(func(v []byte) error {
				return records(keySeq, v, func(seq uint64, rec []byte) error {
					if seq < from {
						return nil
					}
					if seq > to || len(evs) >= limit || scanned >= maxScan {
						return errStopped
					}
					next = seq + 1
					scanned++
					if match != nil {
						tenant, typ, err := eventTenantType(rec)
						if err != nil {
							bad = seq
							return fmt.Errorf("event %d: %w", seq, err)
						}
						if !match(tenant, typ) {
							return nil
						}
					}
					ev, err := decodeEvent(seq, bytes.Clone(rec))
					if err != nil {
						bad = seq
						return err
					}
					evs = append(evs, ev)
					return nil
				})
			})
			if errors.Is(err, queue.ErrCorrupt) {
				ce := &queue.CorruptEventError{First: bad, Last: bad, Err: err}
				if bad == 0 {
					ce.First, ce.Last = max(from, prevKey+1), keySeq
				}
				if len(evs) > 0 {
					next = ce.First // the next call starts at it
					return nil
				}
				l.reportCorrupt(ce)
				return ce
			}
			prevKey = keySeq
			if err == errStopped {
				if next <= to && len(evs) < limit && scanned < maxScan {
					next = to + 1 // stopped at seq > to
				}
				return nil
			}
			if err != nil {
				return err
			}
		}
		if !it.Valid() {
			// Nothing more is written yet: everything up to the head seen by
			// this read has been scanned.
			next = max(next, min(to, head)+1)
		}
		return nil
	})
	return evs, next, err
}

// CountEvents counts the events with from <= seq <= to whose type satisfies
// match (nil matches all), stopping once the count passes limit.
func (l *Log) CountEvents(from, to uint64, match queue.Match, limit int) (int, error) {
	from = max(from, l.low.Load())
	if from > to {
		return 0, nil
	}
	if match == nil {
		return int(min(to-from+1, uint64(limit)+1)), nil
	}
	n := 0
	err := l.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixEvent})
		defer it.Close()
		for it.Seek(eventKey(from)); it.Valid() && n <= limit; it.Next() {
			item := it.Item()
			err := item.Value(func(v []byte) error {
				return records(seqFromEventKey(item.Key()), v, func(seq uint64, rec []byte) error {
					if seq < from {
						return nil
					}
					if seq > to || n > limit {
						return errStopped
					}
					// An unreadable event counts: its type is unknown, and
					// every lane it may be owed to dead-letters it.
					tenant, typ, err := eventTenantType(rec)
					if err != nil || match(tenant, typ) {
						n++
					}
					return nil
				})
			})
			if err == errStopped {
				return nil
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}
