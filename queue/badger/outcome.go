package badger

import (
	"errors"
	"fmt"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

// Record writes the outcome of one delivery attempt in one transaction:
// after a crash either all of it happened or none.
//
//   - Acked deletes the retry record the attempt came from (o.From), if
//     any, and for a replay sets DeliveredAt = o.At on its dead letter.
//   - RetryScheduled writes o.Retry in place of o.From.
//   - DeadLettered writes o.DeadLetter in place of o.From. A letter already
//     kept for the seq keeps its replay history (Replays, ReplayedAt):
//     without it a replayed letter that failed again could be replayed
//     again without force.
//   - o.Pause, when set, records the subscription as paused too.
//
// An Acked outcome of a first attempt without Pause writes nothing.
func (l *Log) Record(o queue.Outcome) error {
	var rv []byte
	switch o.Kind {
	case queue.Acked:
		if o.From == nil && o.Pause == "" {
			return nil
		}
	case queue.RetryScheduled:
		if o.Retry == nil || o.Retry.Subscription != o.Subscription || o.Retry.Seq != o.Seq {
			return fmt.Errorf("record %s/%d: a scheduled retry needs its record, for the same delivery", o.Subscription, o.Seq)
		}
		var err error
		if rv, err = encodeRetry(*o.Retry); err != nil {
			return fmt.Errorf("record %s/%d: %w", o.Subscription, o.Seq, err)
		}
	case queue.DeadLettered:
		if o.DeadLetter == nil || o.DeadLetter.Subscription != o.Subscription || o.DeadLetter.Seq != o.Seq {
			return fmt.Errorf("record %s/%d: a dead-lettering needs its letter, for the same delivery", o.Subscription, o.Seq)
		}
	default:
		return fmt.Errorf("record %s/%d: unknown outcome kind %d", o.Subscription, o.Seq, o.Kind)
	}
	if o.From != nil && (o.From.Subscription != o.Subscription || o.From.Seq != o.Seq) {
		return fmt.Errorf("record %s/%d: the retry it came from is %s/%d", o.Subscription, o.Seq, o.From.Subscription, o.From.Seq)
	}
	if o.Pause != "" {
		l.seqMu.Lock() // memberships are written under seqMu (JoinAll, Leave)
		defer l.seqMu.Unlock()
	}
	l.stateMu.Lock()
	defer l.stateMu.Unlock()
	if o.Kind == queue.RetryScheduled {
		// Count the reference before the write, so compaction cannot
		// delete the event between the write and the count.
		l.ref(o.Seq, 1)
	}
	var fromFound bool
	err := l.update(func(txn *badgerdb.Txn) error {
		var err error
		if o.From != nil {
			if fromFound, err = deleteRetry(txn, o.Subscription, dueNanos(o.From.Due), o.Seq); err != nil {
				return err
			}
		}
		switch o.Kind {
		case queue.Acked:
			if o.From != nil && o.From.Replay {
				d, err := readDeadLetter(txn, o.Subscription, o.Seq)
				if errors.Is(err, badgerdb.ErrKeyNotFound) {
					break // no letter (Replay always keeps one): nothing to note
				}
				if err != nil {
					return err
				}
				d.DeliveredAt = o.At
				if err := writeDeadLetter(txn, d); err != nil {
					return err
				}
			}
		case queue.RetryScheduled:
			if err := putRetry(txn, o.Subscription, dueNanos(o.Retry.Due), o.Seq, rv); err != nil {
				return err
			}
		case queue.DeadLettered:
			d := *o.DeadLetter
			old, err := readDeadLetter(txn, o.Subscription, o.Seq)
			switch {
			case err == nil:
				d.Replays, d.ReplayedAt = old.Replays, old.ReplayedAt
				if d.EventID == "" {
					// A letter written without the event (event_missing)
					// keeps the copy the old one has.
					d.EventID, d.Type, d.ContentType, d.AcceptedAt, d.Body = old.EventID, old.Type, old.ContentType, old.AcceptedAt, old.Body
				}
			case !errors.Is(err, badgerdb.ErrKeyNotFound):
				return err
			}
			if err := writeDeadLetter(txn, &d); err != nil {
				return err
			}
		}
		if o.Pause != "" {
			m, err := readMembership(txn, o.Subscription)
			if err != nil {
				return err
			}
			m.Paused = o.Pause
			return writeMembership(txn, m)
		}
		return nil
	})
	if err != nil {
		if o.Kind == queue.RetryScheduled {
			l.ref(o.Seq, -1)
		}
		if errors.Is(err, badgerdb.ErrKeyNotFound) {
			err = queue.ErrNotFound // the membership Pause names
		}
		return fmt.Errorf("record %s/%d: %w", o.Subscription, o.Seq, err)
	}
	if fromFound {
		l.ref(o.Seq, -1)
	}
	return nil
}
