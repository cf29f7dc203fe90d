package delivery

import (
	"github.com/sluicehq/sluice/proxy/api"
)

// A lane's snapshot for the admin API and the demo.

func (l *lane) status() api.LaneStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := api.LaneStatus{
		Subscription: l.id, State: "active", InFlight: l.inFlight, Cap: l.sub.MaxConcurrency, Cursor: l.cursor,
		Delivered: l.delivered.Load(), Retried: l.retried.Load(), DeadLettered: l.deadLettered.Load(),
		Attempts: l.attempts.Load(), LastStatus: int(l.lastStatus.Load()), Scheduled: l.scheduled.Load(),
		Breaker: l.breakerState().String(), PausedBy: l.pausedBy, Deferred: l.deferred.Load(),
		ShortCircuit: l.shortCircuits.Load(), RateLimited: l.rateLimited.Load(), QuotaDropped: l.quotaRejections.Load(),
	}
	st.Cap = l.limit()
	if h := l.hold(); h != nil {
		st.EndpointHeld = h.count
		if l.e.now().Before(h.until) {
			until := h.until
			st.HeldUntil, st.HeldBy = &until, h.by
		}
	}
	st.Ordering = l.orderingStatus()
	if lim := l.limitSeq(); lim > l.cursor {
		st.Backlog = lim - l.cursor
		// A filtered lane parked until one of its types arrives has a
		// stale cursor but nothing to send.
		if l.match != nil && l.inFlight == 0 && len(l.buf) == 0 && !l.e.feed.seenSince(l.sub.Types, l.next) {
			st.Backlog = 0
		}
	}
	switch {
	case l.left:
		st.State = "draining"
	case l.paused():
		st.State = "paused"
	}
	return st
}
