package api

import "time"

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
	EndpointHeld uint64 `json:"endpoint_held"`          // dispatches the endpoint's announced limit held back
	// HeldUntil is set while the endpoint's announced limit holds the
	// lane: its RateLimit or X-RateLimit-* fields (HeldBy names which)
	// said it takes no more until then.
	HeldUntil *time.Time `json:"held_until,omitempty"`
	HeldBy    string     `json:"held_by,omitempty"`
	// OldestAge is how long the oldest unresolved log entry past the
	// cursor has waited, in seconds; 0 when caught up.
	OldestAge float64 `json:"oldest_age_seconds"`
	// Ordering is the per-key ordering state of an ordered subscription;
	// nil (left out) for the others.
	Ordering *OrderingStatus `json:"ordering,omitempty"`
}

// OrderingStatus is an ordered lane's state in LaneStatus.
type OrderingStatus struct {
	Mode string `json:"mode"` // key or fifo
	// ActiveKeys counts the keys held now: an event of each is in flight,
	// scheduled for retry or ready to go.
	ActiveKeys int `json:"active_keys"`
	// Parked counts the events read past because their key was held (at
	// most 1,024); Ready, those of them whose turn came.
	Parked int `json:"parked"`
	Ready  int `json:"ready"`
	// Blocked: the lane stopped reading the log at the parked or the key
	// bound until a key resolves (head-of-line blocking).
	Blocked bool `json:"blocked,omitempty"`
	// Rebuilding: the lane waits for its deliveries in flight to rebuild
	// its held keys (after a reload changed the mode).
	Rebuilding bool `json:"rebuilding,omitempty"`
}

// Delivery is one subscription's state for one event in the completion
// ledger.
type Delivery struct {
	Subscription string     `json:"subscription"`
	State        string     `json:"state"` // pending, in_flight, retry_scheduled, delivered, dead_lettered, filtered
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

// ReplayResult says what happened to one dead letter asked to be replayed.
type ReplayResult struct {
	Subscription string `json:"subscription"`
	Seq          uint64 `json:"seq"`
	EventID      string `json:"event_id,omitempty"`
	Replayed     bool   `json:"replayed"`
	Skipped      string `json:"skipped,omitempty"` // why not
}

// ReplayForceHint ends the Skipped of a dead letter already replayed; the
// CLI swaps it for its own flag's name.
const ReplayForceHint = "set force to replay again"
