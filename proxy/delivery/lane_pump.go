package delivery

import (
	"math/rand/v2"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

// Pumping a lane: starting fresh deliveries and due retries, as far as
// the cap and the gates allow.

func (l *lane) pump() {
	l.mu.Lock()
	l.pumpLocked()
	l.mu.Unlock()
}

// pumpLocked starts as many deliveries as the cap, the gates (global slot,
// rate, breaker) and the available work allow: writes that failed first,
// then due retries, then new events in order.
func (l *lane) pumpLocked() {
	e := l.e
	l.hungry = false
	if l.retired || l.foreign || l.releasing.Load() {
		return
	}
	now := e.now()
	// Not while stopping: the final cursor flush may already have run, and
	// an outcome recorded after it would be delivered again after the
	// restart as well as kept. Left unrecorded, it simply runs again.
	if len(l.unrecorded) > 0 && !e.stopping.Load() && !l.recordPending(now) {
		// The store refuses writes: sending more would only pile up
		// outcomes it cannot take.
		return
	}
	if l.releasing.Load() {
		// The lease went while recordPending wrote (fleet mode).
		return
	}
	if l.paused() || e.stopping.Load() {
		return
	}
	// Per-key ordering (ordering.go): held keys are rebuilt from the
	// retry schedule before anything starts.
	ord := l.order()
	if ord != nil && ord.stale && !l.rebuildOrder(ord, now) {
		return
	}
	limit := l.limit()
	if l.inFlight < limit && !l.nextDue.IsZero() && l.dueBy(l.nextDue, now) {
		if !l.startRetries(now, limit) {
			l.updateCursor()
			l.armNextDue(now)
			return
		}
	}
	if ord != nil {
		l.pumpOrdered(ord, now, limit) // new work through the key gate (ordering.go)
		l.updateCursor()
		l.armNextDue(now)
		return
	}
	rechecked := false
	for l.inFlight < limit {
		ev := l.nextFresh()
		if ev == nil {
			if l.parkHungry(&rechecked) {
				continue
			}
			break
		}
		// Body variants (variant.go): a body the variant cannot
		// render is dead-lettered here, before any gate.
		if skip, err := l.unrenderable(ev, nil, now); skip {
			if err != nil {
				l.unread(ev) // not written: it waits
				break
			}
			continue
		}
		probe, ok := l.admit(now)
		if !ok {
			l.unread(ev) // back in front: it waits
			break
		}
		l.window = append(l.window, slot{seq: ev.Seq})
		l.start(&job{lane: l, sub: l.sub, ev: ev, attempt: 1, first: now, started: now, probe: probe})
	}
	l.updateCursor()
	l.armNextDue(now)
}

// parkHungry parks the lane in the feed until a commit, its pump having
// found nothing to read, and reports whether to read once more: a commit
// between nextFresh and markHungry would find the lane not yet hungry.
// It says so at most once per pump (*rechecked). l.mu is held.
func (l *lane) parkHungry(rechecked *bool) bool {
	l.hungry = true
	l.e.feed.markHungry(l)
	if !*rechecked && len(l.buf) == 0 && l.next <= l.limitSeq() {
		*rechecked = true
		return true
	}
	return false
}

// armNextDue makes sure a wake-up is armed for the lane's next retry: the
// timer heap keeps only each lane's earliest wake-up, so a pump that ran
// early must arm the later one again. l.mu is held.
func (l *lane) armNextDue(now time.Time) {
	if !l.nextDue.IsZero() && l.nextDue.After(now) {
		l.e.timers.add(l, l.nextDue)
	}
}

// startRetries starts due retries; false means the global limit stopped it.
func (l *lane) startRetries(now time.Time, limit int) bool {
	e := l.e
	if !l.mayPass(now) {
		// Do not spend the shared budget on retries this lane cannot send:
		// an open breaker would otherwise drain it for every other tenant.
		return true
	}
	rs, next, err := e.store.DueRetries(l.id, now, limit-l.inFlight, l.isRetrying)
	if err == nil && len(rs) == 0 && !next.IsZero() && l.farAhead(next, now) {
		// Nothing is due, and the earliest record is due later than this
		// lane could have scheduled it: the wall clock stepped back since.
		// Records are sorted by due time, so every one from there on is
		// as suspect; take them as due now instead of waiting out the
		// step. The budget and the breaker still pace them.
		rs, next, err = e.store.DueRetries(l.id, farFuture, limit-l.inFlight, l.isRetrying)
	}
	if err != nil {
		e.log.Error("read retry schedule", "subscription", l.id, "err", err)
		l.nextDue = now.Add(time.Second)
		e.timers.add(l, l.nextDue)
		return true
	}
	l.nextDue = next
	if !next.IsZero() {
		e.timers.add(l, next)
	}
	for i := range rs {
		r := &rs[i]
		ev, err := e.feed.event(r.Seq)
		if err != nil {
			// A replayed dead letter may outlive its event in the log: its
			// own body copy serves.
			if dl, derr := e.store.DeadLetter(l.id, r.Seq); derr == nil && dl.EventID != "" {
				ev, err = &queue.Event{Seq: r.Seq, ID: dl.EventID, Type: dl.Type, ContentType: dl.ContentType, AcceptedAt: dl.AcceptedAt, Body: dl.Body,
					OrderingKey: dl.OrderingKey, TraceParent: dl.TraceParent, TraceState: dl.TraceState, Tenant: dl.Tenant, CloudEvent: dl.CloudEvent}, nil
			}
		}
		if err != nil {
			// The log lost an event a retry needed: keep the failure
			// visible as a dead letter rather than retrying forever.
			e.log.Error("event for retry missing", "subscription", l.id, "seq", r.Seq, "err", err)
			o := queue.Outcome{Kind: queue.DeadLettered, Subscription: l.id, Seq: r.Seq, From: r, At: now,
				DeadLetter: newDeadLetter(l.id, l.sub.Tenant, &queue.Event{Seq: r.Seq}, missingReason(err), r.Attempt,
					policy.Exchange{Status: r.LastStatus}, "", now)}
			o.DeadLetter.LastError = r.LastError
			if err := l.record(o); err != nil {
				e.log.Error("dead-letter", "subscription", l.id, "seq", r.Seq, "err", err)
			} else {
				l.resolved(nil, o)
			}
			continue
		}
		// The tenant rule holds for retries too: a subscription the
		// operator moved to another tenant since the first attempt must
		// not send the old tenant's event to the new one.
		if !e.feed.entitled(l.sub.Tenant, ev.Tenant, ev.Type) {
			l.notEntitled(r, ev, now)
			continue
		}
		// Body variants (variant.go): dead-lettered before any
		// gate, or, not written, still due.
		if skip, _ := l.unrenderable(ev, r, now); skip {
			continue
		}
		if e.slots.full() {
			// No process-wide slot: take no budget token for a retry that
			// cannot start. acquire queues the lane for the next free slot.
			if e.slots.acquire(l) {
				e.slots.giveBack()
			}
			l.nextDue = now
			return false
		}
		if b := l.sub.bulkhead; b != nil && b.full() {
			// Nor for one the tenant's cap holds back.
			b.park(l)
			l.nextDue = now
			return false
		}
		if !e.budget.TryRetryPaced() {
			// The shared budget is spent for now: defer, never drop. The
			// retries stay due on disk and the lane looks again after a
			// jittered part of the budget's pace, so lanes do not return
			// as one burst. (Rewriting each deferred record with a new due
			// time, as first built, cost 34,813 writes for 8,000 retries
			// in the bench's outage scenario.)
			l.deferred.Add(1)
			pace := e.budget.Pace()
			l.nextDue = now.Add(pace/2 + time.Duration(rand.Int64N(int64(pace))))
			e.timers.add(l, l.nextDue)
			return true
		}
		probe, ok := l.admit(now)
		if !ok {
			l.nextDue = now // the rest are still due
			return false
		}
		if l.retrying == nil {
			l.retrying = map[uint64]struct{}{} // most lanes never retry
		}
		l.retrying[r.Seq] = struct{}{}
		l.start(&job{lane: l, sub: l.sub, ev: ev, retry: r, attempt: r.Attempt + 1, first: r.FirstAttempt, started: now, probe: probe})
	}
	return true
}

// reasonEventMissing is the dead-letter reason of a retry whose event the
// log no longer holds (and no dead letter keeps a copy of).
const reasonEventMissing = "event_missing"

// farFuture is a due time past every retry record's.
var farFuture = time.Unix(0, 1<<62)

func (l *lane) isRetrying(seq uint64) bool { _, ok := l.retrying[seq]; return ok }

func (l *lane) start(j *job) {
	l.inFlight++
	if l.auto != nil {
		l.auto.Dispatched()
	}
	l.e.slots.submit(j)
}

// notEntitled dead-letters retry r, whose event ev the lane's tenant may
// not receive, without an attempt (policy.ReasonNotEntitled). The letter
// is the operator's: the tenant now holding the subscription must not
// read the event either. l.mu is held.
func (l *lane) notEntitled(r *queue.Retry, ev *queue.Event, now time.Time) {
	o := queue.Outcome{Kind: queue.DeadLettered, Subscription: l.id, Seq: r.Seq, From: r, At: now,
		DeadLetter: newDeadLetter(l.id, "", ev, policy.ReasonNotEntitled, r.Attempt, policy.Exchange{Status: r.LastStatus}, "", now)}
	if err := l.record(o); err != nil {
		l.e.log.Error("dead-letter", "subscription", l.id, "seq", r.Seq, "err", err)
		return
	}
	l.resolved(nil, o)
	l.e.log.Warn("retry of another tenant's event dead-lettered: the subscription moved to another tenant", "subscription", l.id, "seq", r.Seq)
}
