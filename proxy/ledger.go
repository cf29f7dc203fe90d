package proxy

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// ErrNotFound is returned for an unknown subscription, event or dead letter.
var ErrNotFound = errors.New("not found")

// Pause stops a subscription's deliveries (its events wait on disk) and
// records why; the pause survives restarts until Resume.
func (s *Server) Pause(id, reason string) error {
	l := s.d.lane(id)
	if l == nil {
		return fmt.Errorf("subscription %q: %w", id, ErrNotFound)
	}
	if reason == "" {
		reason = "paused by an operator"
	}
	if err := s.q.SetPaused(id, reason); err != nil {
		return err
	}
	l.mu.Lock()
	l.pausedBy = reason
	l.mu.Unlock()
	return nil
}

// Resume lifts a run-time pause (an operator's, or a 410 Gone's).
func (s *Server) Resume(id string) error {
	l := s.d.lane(id)
	if l == nil {
		return fmt.Errorf("subscription %q: %w", id, ErrNotFound)
	}
	if err := s.q.SetPaused(id, ""); err != nil {
		return err
	}
	l.mu.Lock()
	l.pausedBy = ""
	l.mu.Unlock()
	l.pump()
	return nil
}

// Delivery is one subscription's state for one event in the completion
// ledger.
type Delivery struct {
	Subscription string     `json:"subscription"`
	State        string     `json:"state"` // pending, in_flight, retry_scheduled, delivered, dead_lettered
	Attempt      int        `json:"attempt,omitempty"`
	DueAt        *time.Time `json:"due_at,omitempty"`
	Reason       string     `json:"reason,omitempty"`
	LastStatus   int        `json:"last_status,omitempty"`
	At           *time.Time `json:"at,omitempty"` // when dead-lettered
}

// EventStatus is the completion ledger of one event: every entitled
// subscription and where its delivery stands, derived from cursors,
// in-flight windows, retry records and dead letters.
type EventStatus struct {
	ID         string     `json:"id"`
	Seq        uint64     `json:"seq"`
	Type       string     `json:"type,omitempty"` // empty only for an id indexed by format 1 and compacted since
	AcceptedAt *time.Time `json:"accepted_at,omitempty"`
	Deliveries []Delivery `json:"deliveries"`
}

// Event answers the ledger for an event id still in the dedup window.
func (s *Server) Event(id string) (*EventStatus, error) {
	seq, typ, err := s.q.Lookup(id)
	if errors.Is(err, queue.ErrNotFound) {
		return nil, fmt.Errorf("event %q (ids are kept for dedup_window): %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	st := &EventStatus{ID: id, Seq: seq, Type: typ, Deliveries: []Delivery{}}
	ev, evErr := s.d.event(seq)
	if evErr == nil {
		st.Type = ev.Type
		at := ev.AcceptedAt
		st.AcceptedAt = &at
	}
	for _, l := range s.d.laneList() {
		dl, d := l.ledger(seq, st.Type)
		if !dl {
			continue
		}
		if d.State == "" {
			// Resolved (at or below the cursor), and neither retrying nor
			// dead: acknowledged, or not of this lane's types.
			if r, _ := s.q.RetryOf(l.id, seq); r != nil {
				due := r.Due
				d.State, d.Attempt, d.DueAt, d.LastStatus = "retry_scheduled", r.Attempt, &due, r.LastStatus
			} else if dead, err := s.q.DeadLetter(l.id, seq); err == nil && !dead.DeliveredAt.IsZero() {
				at := dead.DeliveredAt
				d.State, d.Reason, d.At = "delivered", "replayed dead letter", &at
			} else if err == nil {
				at := dead.DeadAt
				d.State, d.Reason, d.Attempt, d.LastStatus, d.At = "dead_lettered", dead.Reason, dead.Attempts, dead.LastStatus, &at
			} else {
				d.State = "delivered"
			}
		}
		st.Deliveries = append(st.Deliveries, d)
	}
	return st, nil
}

// ledger says whether the lane is entitled to seq of type typ ("" when
// unknown: an event compacted away whose dedup entry predates format 2)
// and, when it knows from memory, the state.
func (l *lane) ledger(seq uint64, typ string) (entitled bool, d Delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d.Subscription = l.id
	if l.left && seq > l.until {
		return false, d
	}
	if seq < l.fromSeq {
		return false, d
	}
	if typ != "" && !l.wants(typ) {
		return false, d
	}
	if _, ok := l.retrying[seq]; ok {
		d.State = "in_flight"
		return true, d
	}
	for _, w := range l.window {
		if w.seq == seq && !w.done {
			d.State = "in_flight"
			return true, d
		}
	}
	if seq > l.cursor {
		d.State = "pending"
	}
	return true, d
}

// ReplayResult says what happened to one dead letter asked to be replayed.
type ReplayResult struct {
	Subscription string `json:"subscription"`
	Seq          uint64 `json:"seq"`
	EventID      string `json:"event_id,omitempty"`
	Replayed     bool   `json:"replayed"`
	Skipped      string `json:"skipped,omitempty"` // why not
}

// Replay schedules one dead letter for delivery again. A dead letter
// already replayed is skipped unless force: replaying twice must not
// deliver twice by accident. The replay and its record on the dead letter
// are one transaction, and the retry record survives a crash.
func (s *Server) Replay(sub string, seq uint64, force bool) (ReplayResult, error) {
	res := ReplayResult{Subscription: sub, Seq: seq}
	l := s.d.lane(sub)
	if l == nil {
		return res, fmt.Errorf("subscription %q: %w", sub, ErrNotFound)
	}
	dl, err := s.q.DeadLetter(sub, seq)
	if errors.Is(err, queue.ErrNotFound) {
		return res, fmt.Errorf("dead letter %s/%d: %w", sub, seq, ErrNotFound)
	}
	if err != nil {
		return res, err
	}
	res.EventID = dl.EventID
	// The queue checks and replays in one step: two replays that race
	// schedule one retry.
	now := s.opts.Now()
	switch cur, err := s.q.Replay(sub, seq, now, force); {
	case errors.Is(err, queue.ErrReplayed):
		res.Skipped = "already replayed at " + cur.ReplayedAt.UTC().Format(time.RFC3339) + "; set force to replay again"
		return res, nil
	case errors.Is(err, queue.ErrRetryScheduled):
		res.Skipped = "a retry is already scheduled"
		return res, nil
	case err != nil:
		return res, err
	}
	l.scheduled.Add(1)
	l.mu.Lock()
	if l.nextDue.IsZero() || now.Before(l.nextDue) {
		l.nextDue = now
	}
	l.mu.Unlock()
	l.pump()
	res.Replayed = true
	return res, nil
}
