package badger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

// Replay schedules a dead letter for delivery again and records the
// replay on it, in one transaction: after a crash either both happened or
// neither. The retry is due at `due` with attempt count 0, so the next try
// is attempt 1 of a fresh schedule; the dead letter stays (with its body,
// which the lane uses if the log has compacted the event).
//
// The check and the write are one step under stateMu: replays of one
// letter that race schedule it once. A letter already replayed answers
// ErrReplayed unless force; one whose seq has a retry scheduled (a replay
// not yet resolved, or a retry of its own) answers ErrRetryScheduled
// whatever force says. Both refusals return the letter as it is.
func (l *Log) Replay(sub string, seq uint64, due time.Time, force bool) (*queue.DeadLetter, error) {
	rv, err := encodeRetry(queue.Retry{FirstAttempt: due, Replay: true})
	if err != nil {
		return nil, fmt.Errorf("replay %s/%d: %w", sub, seq, err)
	}
	l.stateMu.Lock()
	defer l.stateMu.Unlock()
	l.ref(seq, 1)
	var (
		d       *queue.DeadLetter
		refused error
	)
	err = l.update(func(txn *badgerdb.Txn) error {
		var err error
		if d, err = readDeadLetter(txn, sub, seq); err != nil {
			return err
		}
		if d.Replays > 0 && !force {
			refused = queue.ErrReplayed
			return nil
		}
		if _, ok, err := retryDue(txn, sub, seq); err != nil {
			return err
		} else if ok {
			refused = queue.ErrRetryScheduled
			return nil
		}
		r := *d
		r.Replays++
		r.ReplayedAt = due
		if err := writeDeadLetter(txn, &r); err != nil {
			return err
		}
		d = &r
		return putRetry(txn, sub, dueNanos(due), seq, rv)
	})
	if err != nil || refused != nil {
		l.ref(seq, -1)
	}
	switch {
	case errors.Is(err, badgerdb.ErrKeyNotFound):
		return nil, fmt.Errorf("replay %s/%d: %w", sub, seq, queue.ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("replay %s/%d: %w", sub, seq, err)
	case refused != nil:
		return d, fmt.Errorf("replay %s/%d: %w", sub, seq, refused)
	}
	return d, nil
}

// DeadLetters lists dead letters of sub ("" for all subscriptions) in key
// order, starting after the given subscription/seq position, at most limit.
func (l *Log) DeadLetters(sub string, afterSub string, afterSeq uint64, limit int) ([]*queue.DeadLetter, error) {
	var out []*queue.DeadLetter
	prefix := prefixDeadLetter
	if sub != "" {
		prefix = deadLetterPrefix(sub)
	}
	err := l.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefix, PrefetchValues: true})
		defer it.Close()
		start := prefix
		if afterSub != "" {
			start = deadLetterKey(afterSub, afterSeq+1)
		}
		for it.Seek(start); it.Valid() && len(out) < limit; it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			d, err := decodeDeadLetter(v)
			if err != nil {
				return err
			}
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

// readDeadLetter reads and decodes one dead letter in txn; the error is
// badgerdb.ErrKeyNotFound when there is none.
func readDeadLetter(txn *badgerdb.Txn, sub string, seq uint64) (*queue.DeadLetter, error) {
	item, err := txn.Get(deadLetterKey(sub, seq))
	if err != nil {
		return nil, err
	}
	// A copy: the decoded Body aliases the value, which Badger reuses.
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, err
	}
	return decodeDeadLetter(v)
}

func writeDeadLetter(txn *badgerdb.Txn, d *queue.DeadLetter) error {
	v, err := appendDeadLetter(nil, d)
	if err != nil {
		return err
	}
	return txn.Set(deadLetterKey(d.Subscription, d.Seq), v)
}

// DeadLetter reads one dead letter; ErrNotFound when there is none.
func (l *Log) DeadLetter(sub string, seq uint64) (*queue.DeadLetter, error) {
	var d *queue.DeadLetter
	err := l.db.View(func(txn *badgerdb.Txn) error {
		var err error
		d, err = readDeadLetter(txn, sub, seq)
		return err
	})
	if errors.Is(err, badgerdb.ErrKeyNotFound) {
		return nil, fmt.Errorf("dead letter %s/%d: %w", sub, seq, queue.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("dead letter %s/%d: %w", sub, seq, err)
	}
	return d, nil
}

// trimBatch bounds the deletes of one transaction of TrimDeadLetters.
const trimBatch = 1000

// TrimDeadLetters implements queue.DeadLetterTrimmer: one key-only scan of
// sub's letters (their keys sort by seq, oldest first), then the oldest
// past keep deleted in transactions of trimBatch, each skipping a letter
// whose seq has a retry scheduled. Under stateMu, as Replay: a replay of
// a letter cannot slip in between the check and the delete.
func (l *Log) TrimDeadLetters(sub string, keep int) (int, error) {
	keep = max(keep, 0)
	l.stateMu.Lock()
	defer l.stateMu.Unlock()
	prefix := deadLetterPrefix(sub)
	var seqs []uint64
	err := l.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefix})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) != len(prefix)+8 {
				return fmt.Errorf("dead letter key of %d bytes: %w", len(k), queue.ErrCorrupt)
			}
			seqs = append(seqs, binary.BigEndian.Uint64(k[len(prefix):]))
		}
		return nil
	})
	if err != nil || len(seqs) <= keep {
		return 0, err
	}
	old := seqs[:len(seqs)-keep]
	deleted := 0
	for len(old) > 0 {
		batch := old[:min(len(old), trimBatch)]
		old = old[len(batch):]
		n := 0
		err := l.update(func(txn *badgerdb.Txn) error {
			n = 0
			for _, seq := range batch {
				if _, replaying, err := retryDue(txn, sub, seq); err != nil {
					return err
				} else if replaying {
					continue
				}
				if err := txn.Delete(deadLetterKey(sub, seq)); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		if err != nil {
			return deleted, fmt.Errorf("trim dead letters of %s: %w", sub, err)
		}
		deleted += n
	}
	return deleted, nil
}
