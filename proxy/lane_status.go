package proxy

// A lane's snapshot for the admin API and the demo.

// LaneStatus is a snapshot of one lane for the admin API and the demo.
type LaneStatus struct {
	Subscription string `json:"subscription"`
	State        string `json:"state"` // active, paused, draining
	InFlight     int    `json:"in_flight"`
	Cap          int    `json:"cap"`
	Cursor       uint64 `json:"cursor"`
	// Backlog counts log entries past the cursor, an upper bound for a
	// lane filtered by type.
	Backlog      uint64 `json:"backlog"`
	Scheduled    int64  `json:"retries_scheduled"`
	Delivered    uint64 `json:"delivered"`
	Retried      uint64 `json:"retried"`
	DeadLettered uint64 `json:"dead_lettered"`
	Attempts     uint64 `json:"attempts"`
	LastStatus   int    `json:"last_status"`
	Breaker      string `json:"breaker"` // closed, half_open, open
	// Owner is the node delivering the lane, in fleet mode.
	Owner string `json:"owner,omitempty"`
	// Tenant is the subscription's tenant, if it names one; ManagedBy is
	// ManagedByFile or ManagedByAPI.
	Tenant       string `json:"tenant,omitempty"`
	ManagedBy    string `json:"managed_by"`
	PausedBy     string `json:"paused_by,omitempty"`
	Deferred     uint64 `json:"retries_deferred"`       // retries the shared budget pushed back
	ShortCircuit uint64 `json:"short_circuits"`         // dispatches the open breaker refused
	RateLimited  uint64 `json:"rate_limited"`           // dispatches the rate limit held back
	QuotaDropped uint64 `json:"backlog_quota_rejected"` // dead-lettered with reason backlog_quota
	// OldestAge is how long the oldest unresolved log entry past the
	// cursor has waited, in seconds; 0 when caught up.
	OldestAge float64 `json:"oldest_age_seconds"`
	// Ordering is the per-key ordering state of an ordered subscription;
	// nil (left out) for the others.
	Ordering *OrderingStatus `json:"ordering,omitempty"`
}

func (l *lane) status() LaneStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := LaneStatus{
		Subscription: l.id, State: "active", InFlight: l.inFlight, Cap: l.sub.MaxConcurrency, Cursor: l.cursor,
		Delivered: l.delivered.Load(), Retried: l.retried.Load(), DeadLettered: l.deadLettered.Load(),
		Attempts: l.attempts.Load(), LastStatus: int(l.lastStatus.Load()), Scheduled: l.scheduled.Load(),
		Breaker: l.breakerState().String(), PausedBy: l.pausedBy, Deferred: l.deferred.Load(),
		ShortCircuit: l.shortCircuits.Load(), RateLimited: l.rateLimited.Load(), QuotaDropped: l.quotaRejections.Load(),
	}
	st.Cap = l.limit()
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
