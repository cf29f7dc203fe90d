package delivery

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// Pause stops a subscription's deliveries (its events wait on disk) and
// records why ("" says "paused by an operator"); the pause survives
// restarts until Resume.
func (d *Dispatcher) Pause(id, reason string) error {
	return d.setPaused(id, cmp.Or(reason, "paused by an operator"))
}

// Resume lifts a run-time pause (an operator's, or a 410 Gone's).
func (d *Dispatcher) Resume(id string) error { return d.setPaused(id, "") }

// setPaused writes the pause (reason "" lifts it) and applies it under
// the lane's lock, as a 410 Gone's pause is (lane.finish): whichever
// comes last wins on disk and in memory alike.
func (d *Dispatcher) setPaused(id, reason string) error {
	l := d.lane(id)
	if l == nil {
		return fmt.Errorf("subscription %q: %w", id, queue.ErrNotFound)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := d.store.SetPaused(id, reason); err != nil {
		return err
	}
	if reason != "" && reason != l.pausedBy {
		d.ops.paused(id, reason, pausedByOperator)
	}
	l.pausedBy = reason
	if reason == "" {
		l.pumpLocked()
	}
	return nil
}

// Event answers the completion ledger for an event id still in the
// dedup window: every entitled subscription and where its delivery
// stands, derived from cursors, in-flight windows, retry records and dead
// letters.
func (d *Dispatcher) Event(id string) (*api.EventStatus, error) {
	seq, typ, tenant, err := d.store.Lookup(id)
	if errors.Is(err, queue.ErrNotFound) {
		return nil, fmt.Errorf("event %q (ids are kept for dedup_window): %w", id, queue.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	st := &api.EventStatus{ID: id, Seq: seq, Type: typ, Deliveries: []api.Delivery{}}
	ev, evErr := d.feed.event(seq)
	if evErr == nil {
		st.Type = ev.Type
		at := ev.AcceptedAt
		st.AcceptedAt = &at
	}
	cursors := d.ownersCursors()
	for _, l := range d.laneList() {
		entitled, dv := l.ledger(seq, tenant, st.Type, cursors)
		if !entitled {
			continue
		}
		l.mu.Lock()
		sub := l.sub
		l.mu.Unlock()
		if evErr == nil && !sub.passes(ev) {
			dv.State = "filtered" // resolved without a delivery: the body filter passed it over
		}
		if dv.State == "" {
			// Resolved (at or below the cursor), and neither retrying nor
			// dead: acknowledged, or not of this lane's types.
			if err := d.resolvedState(l.id, seq, &dv); err != nil {
				return nil, fmt.Errorf("event %q, subscription %s: %w", id, l.id, err)
			}
		}
		st.Deliveries = append(st.Deliveries, dv)
	}
	return st, nil
}

// resolvedState fills d for a delivery at or below its lane's cursor,
// from the retry schedule and the dead letters. A read that fails is an
// error, never reported as "delivered".
func (d *Dispatcher) resolvedState(sub string, seq uint64, dv *api.Delivery) error {
	r, err := d.store.RetryOf(sub, seq)
	if err != nil {
		return err
	}
	if r != nil {
		due := r.Due
		dv.State, dv.Attempt, dv.DueAt, dv.LastStatus = "retry_scheduled", r.Attempt, &due, r.LastStatus
		return nil
	}
	dead, err := d.store.DeadLetter(sub, seq)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		dv.State = "delivered"
	case err != nil:
		return err
	case !dead.DeliveredAt.IsZero():
		at := dead.DeliveredAt
		dv.State, dv.Reason, dv.At = "delivered", "replayed dead letter", &at
	default:
		at := dead.DeadAt
		dv.State, dv.Reason, dv.Attempt, dv.LastStatus, dv.At = "dead_lettered", dead.Reason, dead.Attempts, dead.LastStatus, &at
	}
	return nil
}

// ledger says whether the lane is entitled to seq of tenant ("" for a
// platform event: the dedup index keeps it, so it is known after
// compaction too) and type typ ("" when unknown: an event compacted away
// whose dedup entry predates format 2) and, when it knows from memory, the
// state. A lane's entitlement follows the tenant rule, so a
// tenant's ledger tells it nothing of another tenant's events.
//
// A foreign lane (fleet mode) knows nothing in memory: its owner's
// published cursor (cursors) says whether seq is still pending.
func (l *lane) ledger(seq uint64, tenant, typ string, cursors map[string]uint64) (entitled bool, d api.Delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d.Subscription = l.id
	if l.left && seq > l.until {
		return false, d
	}
	if seq < l.fromSeq {
		return false, d
	}
	switch {
	case typ != "" && !l.wants(tenant, typ):
		return false, d
	case typ == "" && !l.e.feed.entitled(l.sub.Tenant, tenant, typ):
		return false, d // its type unknown: the tenant rule still holds
	}
	if l.foreign {
		if c, ok := cursors[l.id]; !ok || seq > c {
			d.State = "pending" // or in flight on its owner
		}
		return true, d
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

// Replay schedules one dead letter for delivery again. A dead letter
// already replayed is skipped unless force: replaying twice must not
// deliver twice by accident. The check and the replay are one atomic step
// of the store (queue.State.Replay), so concurrent replays of one letter
// schedule it once, and the retry record survives a crash.
func (d *Dispatcher) Replay(sub string, seq uint64, force bool) (api.ReplayResult, error) {
	res := api.ReplayResult{Subscription: sub, Seq: seq}
	l := d.lane(sub)
	if l == nil {
		return res, fmt.Errorf("subscription %q: %w", sub, queue.ErrNotFound)
	}
	// A letter goes back only to the tenant it was written for, and only
	// to a lane entitled to its event (tenant isolation): were a subscription
	// id ever held by another tenant than the letter's, the letter must
	// not reach that tenant's URL. Letters written before owners were
	// recorded (not Scoped) carry no such record and replay as before.
	if dl, err := d.store.DeadLetter(sub, seq); err == nil && dl.Scoped {
		l.mu.Lock()
		// The tenant rule only: the subscription may have changed its
		// types since, and a replay of what it was owed is still its own.
		ok := dl.Owner == l.sub.Tenant && l.e.feed.entitled(l.sub.Tenant, dl.Tenant, dl.Type)
		l.mu.Unlock()
		if !ok {
			return res, fmt.Errorf("dead letter %s/%d: %w", sub, seq, queue.ErrNotFound)
		}
	}
	now := d.now()
	dl, err := d.store.Replay(sub, seq, now, force)
	if dl != nil {
		res.EventID = dl.EventID // the store answers a refusal with the letter too
	}
	switch {
	case errors.Is(err, queue.ErrReplayed):
		res.Skipped = "already replayed at " + dl.ReplayedAt.UTC().Format(time.RFC3339) + "; " + api.ReplayForceHint
		return res, nil
	case errors.Is(err, queue.ErrRetryScheduled):
		res.Skipped = "a retry is already scheduled"
		return res, nil
	case err != nil:
		return res, err
	}
	res.EventID = dl.EventID
	l.scheduled.Add(1)
	l.mu.Lock()
	if l.nextDue.IsZero() || now.Before(l.nextDue) {
		l.nextDue = now
	}
	l.pumpLocked()
	l.mu.Unlock()
	res.Replayed = true
	return res, nil
}
