package badger

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

func encodeRetry(r queue.Retry) ([]byte, error) {
	return json.Marshal(retryRecord{V: recordVersion, Attempt: r.Attempt, FirstAttempt: r.FirstAttempt.UnixNano(), LastStatus: r.LastStatus, LastError: r.LastError, Replay: r.Replay})
}

func decodeRetry(sub string, seq uint64, due time.Time, v []byte) (queue.Retry, error) {
	var rec retryRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return queue.Retry{}, fmt.Errorf("retry %s/%d: %v: %w", sub, seq, err, queue.ErrCorrupt)
	}
	return queue.Retry{
		Subscription: sub, Seq: seq, Due: due, Attempt: rec.Attempt, Replay: rec.Replay,
		FirstAttempt: time.Unix(0, rec.FirstAttempt), LastStatus: rec.LastStatus, LastError: rec.LastError,
	}, nil
}

// putRetry writes a retry record and its index entry.
func putRetry(txn *badgerdb.Txn, sub string, due, seq uint64, v []byte) error {
	if err := txn.Set(retryKeyAt(sub, due, seq), v); err != nil {
		return err
	}
	return txn.Set(retryIndexKey(sub, seq), u64(due))
}

// deleteRetry deletes a retry record and its index entry, and reports
// whether the record was there (for the reference count).
func deleteRetry(txn *badgerdb.Txn, sub string, due, seq uint64) (found bool, err error) {
	k := retryKeyAt(sub, due, seq)
	switch _, err := txn.Get(k); {
	case errors.Is(err, badgerdb.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	if err := txn.Delete(k); err != nil {
		return false, err
	}
	// The index names this record unless a second record of the seq was
	// written after it (only ever by the replay race this index closes,
	// in a dir of an older format); then it names that one and stays.
	ik := retryIndexKey(sub, seq)
	item, err := txn.Get(ik)
	if errors.Is(err, badgerdb.ErrKeyNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	var same bool
	if err := item.Value(func(v []byte) error {
		same = len(v) == 8 && binary.BigEndian.Uint64(v) == due
		return nil
	}); err != nil {
		return false, err
	}
	if same {
		return true, txn.Delete(ik)
	}
	return true, nil
}

// retryDue returns the due of sub's retry of seq, from the index; ok is
// false when there is none.
func retryDue(txn *badgerdb.Txn, sub string, seq uint64) (due uint64, ok bool, err error) {
	item, err := txn.Get(retryIndexKey(sub, seq))
	if errors.Is(err, badgerdb.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	err = item.Value(func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("retry index %s/%d: %w", sub, seq, queue.ErrCorrupt)
		}
		due = binary.BigEndian.Uint64(v)
		return nil
	})
	return due, err == nil, err
}

// ref counts d more (or fewer) retry records of seq. A seq below the
// compaction boundary whose last reference goes is released: the next
// Compact deletes its event.
func (l *Log) ref(seq uint64, d int32) {
	l.refMu.Lock()
	if n := l.retryRefs[seq] + d; n > 0 {
		l.retryRefs[seq] = n
	} else {
		delete(l.retryRefs, seq)
		if _, ok := l.held[seq]; ok {
			delete(l.held, seq)
			l.released = append(l.released, seq)
		}
	}
	l.refMu.Unlock()
}

// DueRetries returns up to limit of sub's retries due at or before now,
// earliest first, skipping those for which skip (may be nil) is true, and
// the due time of the first retry it left for later (zero if none is known).
func (l *Log) DueRetries(sub string, now time.Time, limit int, skip func(seq uint64) bool) ([]queue.Retry, time.Time, error) {
	var (
		out  []queue.Retry
		next time.Time
	)
	err := l.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: retryPrefix(sub), PrefetchValues: true, PrefetchSize: min(limit+1, 64)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			due, seq, err := parseRetryKey(sub, it.Item().Key())
			if err != nil {
				return err
			}
			if due.After(now) || len(out) >= limit {
				next = due
				return nil
			}
			if skip != nil && skip(seq) {
				continue
			}
			var r queue.Retry
			if err := it.Item().Value(func(v []byte) error {
				var err error
				r, err = decodeRetry(sub, seq, due, v)
				return err
			}); err != nil {
				return err
			}
			out = append(out, r)
		}
		return nil
	})
	return out, next, err
}

// Retries returns sub's scheduled retries, earliest first, at most limit.
func (l *Log) Retries(sub string, limit int) ([]queue.Retry, error) {
	out, _, err := l.DueRetries(sub, time.Unix(0, 1<<62), limit, nil)
	return out, err
}

// RetryOf returns sub's scheduled retry of seq; nil when there is none.
// Two point lookups (the index, then the record): the completion ledger
// calls it for every lane an event was for.
func (l *Log) RetryOf(sub string, seq uint64) (*queue.Retry, error) {
	var r *queue.Retry
	err := l.db.View(func(txn *badgerdb.Txn) error {
		due, ok, err := retryDue(txn, sub, seq)
		if !ok || err != nil {
			return err
		}
		item, err := txn.Get(retryKeyAt(sub, due, seq))
		if errors.Is(err, badgerdb.ErrKeyNotFound) {
			return fmt.Errorf("retry index %s/%d names no record: %w", sub, seq, queue.ErrCorrupt)
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			rr, err := decodeRetry(sub, seq, time.Unix(0, int64(due)), v)
			r = &rr
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("retry of %s/%d: %w", sub, seq, err)
	}
	return r, nil
}

// RetrySummaries summarises every subscription's retry schedule in one
// key-only scan, for start-up. cursors holds the durable cursors
// (Membership.Cursor); a subscription missing from it has Ahead nil.
func (l *Log) RetrySummaries(cursors map[string]uint64) (map[string]*queue.RetrySummary, error) {
	out := map[string]*queue.RetrySummary{}
	err := l.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixRetry})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) < len(prefixRetry)+18 {
				return fmt.Errorf("retry key: %w", queue.ErrCorrupt)
			}
			sub := k[len(prefixRetry) : len(k)-17]
			rs := out[string(sub)]
			if rs == nil {
				rs = &queue.RetrySummary{}
				out[string(sub)] = rs
			}
			rs.Count++
			seq := binary.BigEndian.Uint64(k[len(k)-8:])
			if c, ok := cursors[string(sub)]; ok && seq > c {
				if rs.Ahead == nil {
					rs.Ahead = map[uint64]struct{}{}
				}
				rs.Ahead[seq] = struct{}{}
			}
		}
		return nil
	})
	return out, err
}
