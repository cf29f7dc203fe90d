package jetstream

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/queue"
)

// Record writes the outcome of one delivery attempt, with the Badger
// backend's semantics (queue.Outcome), fenced by this node's lease on the
// subscription:
//
//   - Acked deletes the retry record the attempt came from (o.From), if
//     any, and for a replay sets DeliveredAt = o.At on its dead letter.
//   - RetryScheduled writes o.Retry in place of o.From (one key:
//     retry.<sub>.<seq>).
//   - DeadLettered writes o.DeadLetter and deletes o.From. A letter already
//     kept for the seq keeps its replay history (Replays, ReplayedAt), so
//     a replayed letter that failed again is not replayed again without
//     force.
//   - o.Pause, when set, records the subscription as paused too; a
//     subscription the store does not know fails the whole outcome
//     (ErrNotFound).
//
// One key is one message; more keys go as one atomic batch, so after a
// crash either all of it happened or none. The dead letter's and the
// membership's writes expect the revisions read (a replay or a pause
// from another node in between is read again, not overwritten). An Acked
// outcome of a first attempt without Pause writes nothing.
func (s *Store) Record(o queue.Outcome) error {
	switch o.Kind {
	case queue.Acked:
		if o.From == nil && o.Pause == "" {
			return nil
		}
	case queue.RetryScheduled:
		if o.Retry == nil || o.Retry.Subscription != o.Subscription || o.Retry.Seq != o.Seq {
			return fmt.Errorf("record %s/%d: a scheduled retry needs its record, for the same delivery", o.Subscription, o.Seq)
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
	if err := s.checkOpen(); err != nil {
		return err
	}
	sub, seq := o.Subscription, o.Seq
	if err := checkSub(sub); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	var (
		rv    []byte
		retry queue.Retry // as a read returns it, for the index
	)
	if o.Kind == queue.RetryScheduled {
		var err error
		if rv, err = encodeRetry(*o.Retry); err != nil {
			return fmt.Errorf("record %s/%d: %w", sub, seq, err)
		}
		if retry, err = decodeRetry(sub, seq, rv); err != nil {
			return err
		}
	}

	l := s.st.lane(sub)
	l.wmu.Lock()
	defer l.wmu.Unlock()
	err := s.writeLane(sub, func(ctx context.Context) ([]write, error) {
		var ws []write
		// The retry key: written, deleted, or left alone.
		switch {
		case o.Kind == queue.RetryScheduled:
			ws = append(ws, write{m: s.newPut(retryKey(sub, seq), rv)})
		case o.From != nil:
			ws = append(ws, write{m: s.newPurge(retryKey(sub, seq))})
		}
		// The dead letter.
		if o.Kind == queue.DeadLettered || o.Kind == queue.Acked && o.From != nil && o.From.Replay {
			w, ok, err := s.letterWrite(ctx, o)
			if err != nil {
				return nil, err
			}
			if ok {
				ws = append(ws, w)
			}
		}
		// The membership.
		if o.Pause != "" {
			cur, ok, err := s.readMember(ctx, sub)
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, queue.ErrNotFound
			}
			mm := cur.m
			mm.Paused = o.Pause
			v, err := encodeMember(mm)
			if err != nil {
				return nil, err
			}
			m := s.newPut(memberKey(sub), v)
			expectRev(m, cur.rev)
			ws = append(ws, write{m: m, cas: true})
		}
		return ws, nil
	})
	if err != nil {
		return fmt.Errorf("record %v of %s/%d: %w", o.Kind, sub, seq, s.stateErr(err))
	}
	switch {
	case o.Kind == queue.RetryScheduled:
		s.indexed(sub, func(ix *retryIndex) { ix.put(retry) })
	case o.From != nil:
		s.indexed(sub, func(ix *retryIndex) { ix.remove(seq) })
	}
	return nil
}

// letterWrite is the dead letter's part of o: the letter of a
// DeadLettered outcome (keeping the history of one already kept), or a
// replay's ACK noted on its letter; ok is false when there is nothing to
// write (a replay's ACK without its letter: Replay always keeps one).
func (s *Store) letterWrite(ctx context.Context, o queue.Outcome) (w write, ok bool, err error) {
	key := deadKey(o.Subscription, o.Seq)
	e, err := s.get(ctx, key)
	if err != nil {
		return write{}, false, err
	}
	var old *queue.DeadLetter
	if e.exists() {
		if old, err = decodeDeadLetter(e.data); err != nil {
			return write{}, false, err
		}
	}
	var d queue.DeadLetter
	switch {
	case o.Kind == queue.DeadLettered:
		d = *o.DeadLetter
		if old != nil {
			d.Replays, d.ReplayedAt = old.Replays, old.ReplayedAt
			if d.EventID == "" {
				// A letter written without the event (event_missing)
				// keeps the copy the old one has.
				d.EventID, d.Type, d.ContentType, d.AcceptedAt, d.Body = old.EventID, old.Type, old.ContentType, old.AcceptedAt, old.Body
			}
		}
	case old == nil:
		return write{}, false, nil
	default:
		d = *old
		d.DeliveredAt = o.At
	}
	v, err := encodeDeadLetter(&d)
	if err != nil {
		return write{}, false, err
	}
	m := s.newPut(key, v)
	expectRev(m, e.rev)
	return write{m: m, cas: true}, true, nil
}
