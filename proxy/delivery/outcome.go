package delivery

import (
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

// The outcome path of one delivery attempt, in three steps: decide
// (policy.Resolve), record (one Store.Record, one transaction), update the
// lane (memory, metrics, cursor). A dead letter is made in one place,
// newDeadLetter.

// result is what one HTTP exchange came to: the exchange as policy judges
// it, and a bounded snippet of the response for a dead letter.
type result struct {
	policy.Exchange
	snippet string
	span    trace.Span // the attempt's span (tracing.go); nil with tracing off
	// announced is the endpoint's own account of its limit, when the
	// response gave one (announcedOK).
	announced   policy.Announced
	announcedOK bool
}

// unrecorded is an attempt whose outcome was decided but could not be
// written yet. Redoing it writes the same outcome again; it never sends
// the request again, so the breaker, the rate limit and the budget see
// each exchange exactly once.
type unrecorded struct {
	j *job
	o queue.Outcome
}

// finish settles one attempt: decide (policy.Resolve), record (one
// Store.Record, one transaction), update (memory, metrics, cursor). The
// cursor moves past a first attempt only after its outcome is durable.
func (l *lane) finish(j *job, res result) {
	e := l.e
	e.life.RLock()
	if e.closed {
		// Abandoned at shutdown: nothing written, so the delivery is
		// still unresolved in the log and runs again after restart.
		e.life.RUnlock()
		l.releaseSlot(j)
		abandonAttempt(res.span, res)
		return
	}
	now := e.now()
	l.observe(j, res, now)
	rs := policy.Resolve(res.Exchange, j.sub.Retry, j.attempt, j.first, now)
	endAttempt(res.span, res, rs) // tracing.go
	o := l.outcome(j, res, rs, now)
	var err error
	if o.Pause == "" {
		err = l.record(o)
	}
	l.releaseSlot(j)

	// e.life stays held until the outcome is in the lane's cursor: stop
	// waits for the slot to come back, then takes e.life and writes the
	// cursors. Letting go before updateCursor let a graceful drain miss
	// the ACKs of deliveries that had just finished, and send them again
	// after the restart.
	l.mu.Lock()
	if o.Pause != "" {
		// A pause is written and applied under l.mu, as Pause and Resume
		// do: a resume between the write and the in-memory flag would
		// leave memory paused and the log resumed.
		err = l.record(o)
	}
	l.inFlight--
	l.noteAnnounced(res, now)      // lane_gates.go
	l.noteAttempt(j, res, rs, now) // the attempt log: what was answered, recorded or not
	l.recordBreaker(res, j.probe)
	if l.auto != nil {
		l.auto.Completed(now.Sub(j.started), res.Timeout())
	}
	switch {
	case fenced(err):
		// The lane moved to another node: it resends what this node
		// could not record (at-least-once), so nothing is kept here.
		e.log.Info("outcome not recorded: the lane moved to another node", "subscription", l.id, "seq", j.ev.Seq)
	case err != nil:
		e.log.Error("record delivery outcome", "subscription", l.id, "seq", j.ev.Seq, "err", err)
		l.unrecorded = append(l.unrecorded, unrecorded{j, o})
		e.timers.add(l, now.Add(time.Second))
	default:
		l.resolved(j, o)
	}
	e.life.RUnlock()
	l.pumpLocked()
	l.mu.Unlock()
}

// releaseSlot gives back the slots j held: the process's and its
// tenant's. No lane lock is held.
func (l *lane) releaseSlot(j *job) {
	if b := j.sub.bulkhead; b != nil {
		b.release(l.e.feed)
	}
	l.e.slots.release()
}

// observe counts one exchange: it happened, whatever becomes of its record.
func (l *lane) observe(j *job, res result, now time.Time) {
	e := l.e
	l.attempts.Add(1)
	l.lastStatus.Store(int64(res.Status))
	lm := l.laneMetrics(e.m)
	lm.exchange.Observe(now.Sub(j.started).Seconds())
	switch {
	case res.Outcome == policy.Ack:
		lm.ack.Inc()
		// AcceptedAt is wall-clock (it outlives the process): after the
		// clock steps back it can lie ahead, and a histogram must not
		// get a negative latency.
		lm.latency.Observe(max(now.Sub(j.ev.AcceptedAt), 0).Seconds())
	case res.Timeout():
		lm.timeout.Inc()
	case res.Outcome == policy.Retry:
		lm.retry.Inc()
	default:
		lm.dead.Inc()
	}
	if res.Answered() {
		e.budget.Success()
	}
}

// outcome turns a resolution into the record the store writes.
func (l *lane) outcome(j *job, res result, rs policy.Resolution, now time.Time) queue.Outcome {
	o := queue.Outcome{Subscription: l.id, Seq: j.ev.Seq, From: j.retry, At: now, Pause: rs.Pause}
	switch rs.Outcome {
	case policy.Ack:
		o.Kind = queue.Acked
	case policy.Retry:
		o.Kind = queue.RetryScheduled
		o.Retry = &queue.Retry{Subscription: l.id, Seq: j.ev.Seq, Due: rs.Due, Attempt: j.attempt, FirstAttempt: j.first,
			LastStatus: res.Status, LastError: res.Failure.String(), Replay: j.retry != nil && j.retry.Replay}
	default:
		o.Kind = queue.DeadLettered
		o.DeadLetter = newDeadLetter(l.id, j.sub.Tenant, j.ev, rs.Reason, j.attempt, res.Exchange, res.snippet, now)
	}
	return o
}

// newDeadLetter is the one place a dead letter is made: from a failed
// attempt, a retry whose event is gone, or the backlog quota.
func newDeadLetter(sub, owner string, ev *queue.Event, reason string, attempts int, x policy.Exchange, response string, now time.Time) *queue.DeadLetter {
	return &queue.DeadLetter{
		Subscription: sub, Owner: owner, Scoped: true, Seq: ev.Seq, EventID: ev.ID, Type: ev.Type, ContentType: ev.ContentType,
		AcceptedAt: ev.AcceptedAt, OrderingKey: ev.OrderingKey, TraceParent: ev.TraceParent, TraceState: ev.TraceState, Tenant: ev.Tenant, CloudEvent: ev.CloudEvent,
		Reason: reason, Attempts: attempts, LastStatus: x.Status,
		LastError: x.Failure.String(), Response: response, DeadAt: now, Body: ev.Body,
	}
}

// record writes o; a first attempt's ACK has nothing to write.
func (l *lane) record(o queue.Outcome) error {
	if o.Kind == queue.Acked && o.From == nil && o.Pause == "" {
		return nil
	}
	return l.e.store.Record(o)
}

// resolved updates the lane once o is durable. l.mu is held.
func (l *lane) resolved(j *job, o queue.Outcome) {
	e := l.e
	switch o.Kind {
	case queue.Acked:
		l.delivered.Add(1)
	case queue.RetryScheduled:
		l.retried.Add(1)
		if o.From == nil {
			l.scheduled.Add(1)
		}
		if due := o.Retry.Due; l.nextDue.IsZero() || due.Before(l.nextDue) {
			l.nextDue = due
			e.timers.add(l, due)
		}
	case queue.DeadLettered:
		l.noteDeadLetter(o.DeadLetter)
	}
	if o.From != nil && o.Kind != queue.RetryScheduled {
		l.scheduled.Add(-1)
	}
	if o.Pause != "" && l.pausedBy != o.Pause {
		l.pausedBy = o.Pause
		e.log.Warn("subscription paused: "+o.Pause, "subscription", l.id)
		e.ops.paused(l.id, o.Pause, pausedByEndpoint)
	}
	l.orderResolved(j, o) // an ACK or a dead letter frees its key's next event (ordering.go)
	if j == nil {
		return
	}
	if j.retry != nil {
		delete(l.retrying, j.ev.Seq)
	} else {
		for i := range l.window {
			if l.window[i].seq == j.ev.Seq {
				l.window[i].done = true
				break
			}
		}
	}
	l.updateCursor()
}

// noteDeadLetter counts and logs a dead letter that is durable. Backlog
// quota letters are not logged one by one: a black hole over its quota
// makes thousands a second, and the metric counts them.
func (l *lane) noteDeadLetter(dl *queue.DeadLetter) {
	l.deadLettered.Add(1)
	l.e.m.deadLetters.WithLabelValues(l.id, dl.Reason).Inc()
	l.e.ops.deadLetter(l.id, dl)
	if dl.Reason == policy.ReasonBacklogQuota {
		return
	}
	l.e.log.Warn("dead-lettered", "subscription", l.id, "event", dl.EventID, "reason", dl.Reason,
		"attempts", dl.Attempts, "status", dl.LastStatus, "error", dl.LastError)
}

// recordPending writes the outcomes that could not be written before, in
// order; false means the store still fails and a wake-up is armed.
// l.mu is held.
func (l *lane) recordPending(now time.Time) bool {
	for len(l.unrecorded) > 0 {
		u := l.unrecorded[0]
		if err := l.record(u.o); fenced(err) {
			l.unrecorded = nil // the lane moved: its new owner resends them
			return true
		} else if err != nil {
			l.e.log.Error("record delivery outcome", "subscription", l.id, "seq", u.o.Seq, "err", err)
			l.e.timers.add(l, now.Add(time.Second))
			return false
		}
		l.unrecorded[0] = unrecorded{}
		l.unrecorded = l.unrecorded[1:]
		l.resolved(u.j, u.o)
	}
	l.unrecorded = nil
	return true
}
