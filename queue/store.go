package queue

import (
	"context"
	"time"
)

// Store is what the delivery engine needs of a backend: the event log and
// the delivery state kept beside it. Every backend (Badger today, NATS
// JetStream for fleet mode) implements it and passes queuetest.Run, the
// contract suite; the engine sees nothing else of it.
//
// Each method is safe for concurrent use. Errors wrap ErrNotFound,
// ErrClosed, ErrCorrupt or ErrDiskFull where those apply.
type Store interface {
	Log
	State
	// Close commits what is queued and releases the backend; calling it
	// again does nothing.
	Close() error
}

// DeadLetterTrimmer bounds a subscription's dead letters; both backends
// implement it (queuetest's TrimDeadLetters holds them to it), and the
// engine trims a tenant's subscriptions with it, so that one tenant's
// black hole cannot fill the disk for everyone. It is a separate
// interface so that a store of a test may leave it out.
type DeadLetterTrimmer interface {
	// TrimDeadLetters deletes sub's oldest dead letters past the newest
	// keep, except those with a retry scheduled for their seq (a replay
	// in flight needs the letter's body), and returns how many it
	// deleted.
	TrimDeadLetters(sub string, keep int) (int, error)
}

// Match selects events by their tenant ("" for a platform event) and
// type, which a backend reads without decoding the rest of an event, so a
// lane can skip what it is not entitled to cheaply. It must not keep its
// arguments.
type Match func(tenant, typ []byte) bool

// Log is the append-only log of accepted events.
type Log interface {
	// Append makes ev durable and returns its sequence number; a repeated
	// id within the dedup window returns the original seq with dup true
	// and writes nothing. ev.ID and ev.AcceptedAt must be set; after
	// Append returns, ev.Body belongs to the log and must not change.
	Append(ev *Event) (seq uint64, dup bool, err error)
	// AppendBatch appends every event of evs as Append would, together:
	// one hand-off to the backend and one wait, so a batch shares its
	// writes and its sync (Badger) or its round trips (JetStream) instead
	// of paying them per event. res must be as long as evs; res[i] is
	// evs[i]'s answer. The events the batch stores get increasing seqs in
	// the order of evs. An id seen earlier in the same batch is a
	// duplicate of that event (its seq, Dup true), as a second Append
	// would be. Each event succeeds or fails on its own: an error in
	// res[i] means evs[i] was not accepted (a retry with the same id is
	// then either stored or answered as a duplicate, never stored twice).
	AppendBatch(evs []*Event, res []AppendResult)
	// Head is the last sequence number durable and published (0: empty).
	Head() uint64
	// Lookup returns the seq, type and tenant ("" for a platform event) of
	// the event with this id while the id is remembered (the dedup window),
	// also once the event is compacted away; ErrNotFound after. The
	// tenant lets the ledger answer a tenant for its own events only.
	Lookup(id string) (seq uint64, typ, tenant string, err error)
	// Event reads one event; ErrNotFound once compacted.
	Event(seq uint64) (*Event, error)
	// Events returns up to limit events with from <= seq <= to whose
	// tenant and type satisfy match (nil: all), and the seq to continue
	// from. Fewer than limit with next <= to means the scan stopped at its
	// bound.
	Events(from, to uint64, limit int, match Match) (evs []*Event, next uint64, err error)
	// CountEvents counts events with from <= seq <= to whose tenant and
	// type satisfy match, stopping once the count passes limit.
	CountEvents(from, to uint64, match Match, limit int) (int, error)
	// Compact deletes the events below `below` that no retry still needs.
	Compact(below uint64) (int, error)
	// DiskUsage is the last measurement of the log's storage.
	DiskUsage() DiskUsage
}

// AppendResult is one event's answer from Log.AppendBatch: its seq (the
// original's when Dup), or Err when it was not accepted.
type AppendResult struct {
	Seq uint64
	Dup bool
	Err error
}

// State is the delivery state of every subscription: memberships (who is
// owed which events: those accepted while it was a member), cursors, the retry schedule and the
// dead letters.
type State interface {
	// Memberships returns every subscription the store knows, with its
	// durable cursor.
	Memberships() ([]Membership, error)
	// JoinAll makes each requested subscription a member: a new one is
	// entitled to the events appended from now on (From = head+1), a known
	// one takes the new snapshot, one that was leaving becomes active again.
	JoinAll(reqs []JoinRequest) ([]Membership, error)
	// Leave ends sub's entitlement at the current head (Until = head).
	Leave(sub string) (Membership, error)
	// SetPaused records why sub's deliveries are paused ("" resumes).
	SetPaused(sub, reason string) error
	// Retire forgets a subscription that has drained; its dead letters stay.
	Retire(sub string) error
	// SaveCursors writes the given cursors together.
	SaveCursors(cursors map[string]uint64) error

	// Record writes the outcome of one delivery attempt in one
	// transaction: after a crash either all of it happened or none.
	Record(o Outcome) error
	// DueRetries returns up to limit of sub's retries due at or before now,
	// earliest first, skipping those skip (may be nil) reports, and the due
	// time of the first one left for later (zero if none is known).
	DueRetries(sub string, now time.Time, limit int, skip func(seq uint64) bool) ([]Retry, time.Time, error)
	// Retries returns sub's scheduled retries, earliest first, at most limit.
	Retries(sub string, limit int) ([]Retry, error)
	// RetryOf returns sub's scheduled retry of seq; nil when there is none.
	// It is a point lookup, not a scan of the schedule.
	RetryOf(sub string, seq uint64) (*Retry, error)
	// RetrySummaries summarises every subscription's retry schedule, for
	// start-up; cursors holds the durable cursors.
	RetrySummaries(cursors map[string]uint64) (map[string]*RetrySummary, error)

	// DeadLetter reads one dead letter; ErrNotFound when there is none.
	DeadLetter(sub string, seq uint64) (*DeadLetter, error)
	// DeadLetters lists dead letters of sub ("" for all) in key order,
	// after the given position, at most limit.
	DeadLetters(sub, afterSub string, afterSeq uint64, limit int) ([]*DeadLetter, error)
	// Replay schedules a dead letter for delivery again, due at `due`, and
	// records the replay on it. The check and the write are one atomic
	// step, so concurrent replays of one letter schedule it once: a letter
	// already replayed answers ErrReplayed unless force, and one with a
	// retry scheduled answers ErrRetryScheduled whatever force says; both
	// refusals return the letter as it is (for its ReplayedAt), and a
	// missing letter answers ErrNotFound.
	Replay(sub string, seq uint64, due time.Time, force bool) (*DeadLetter, error)
}

// OutcomeKind is how one delivery attempt was resolved.
type OutcomeKind uint8

const (
	// Acked: the endpoint acknowledged; a retry record the attempt came
	// from is deleted (a replay's delivery is recorded on its dead letter).
	Acked OutcomeKind = iota + 1
	// RetryScheduled: a retry record is written (replacing the one the
	// attempt came from).
	RetryScheduled
	// DeadLettered: a dead letter is written (with its body copy) and the
	// retry record the attempt came from is deleted. A letter already
	// kept for this seq keeps its replay history (Replays, ReplayedAt),
	// which is what makes replay once-only.
	DeadLettered
)

// Outcome is the durable resolution of one delivery attempt: what Record
// writes, in one transaction.
type Outcome struct {
	Kind OutcomeKind
	// Subscription and Seq name the delivery.
	Subscription string
	Seq          uint64
	// From is the retry record this attempt came from; nil for a first
	// attempt (then Acked writes nothing at all).
	From *Retry
	// At is when the outcome was decided (a replay's delivery time).
	At time.Time
	// Retry is the record to schedule, for RetryScheduled.
	Retry *Retry
	// DeadLetter is the letter to keep, for DeadLettered.
	DeadLetter *DeadLetter
	// Pause, when not empty, also records the subscription as paused with
	// this reason (a 410 Gone), in the same transaction.
	Pause string
}

// Fleet is what a Store shared by several nodes adds (JetStream, in fleet
// mode): which lanes this node may deliver. The proxy asserts it on its
// Store; a Store without it (Badger) owns every lane.
//
// Ownership: each subscription's lane is delivered by one node at a time,
// the holder of its lease. Before Own is called, writes are not fenced (a
// store opened by a test or a tool is its only writer); after, every
// cursor, retry and dead-letter write of a subscription is fenced by this
// node's lease on it and fails with ErrFenced without one.
type Fleet interface {
	// NodeID names this node in the fleet.
	NodeID() string
	// Own joins the fleet (heartbeats) and starts claiming the lanes this
	// node should own; h is told as ownership changes, until Close.
	Own(h OwnerHandler) error
	// Owner returns the node holding sub's lease, "" when none does.
	Owner(sub string) string
	// Owns reports whether this node holds sub's lease now.
	Owns(sub string) bool
	// LeaseExpiry is the earliest moment another node could hold sub's
	// lease, as far as this node knows (its last renewal sent, plus the
	// TTL); zero when this node does not hold it. A delivery must end
	// before it, or a lane could have two owners' requests in flight.
	LeaseExpiry(sub string) time.Time
	// Ready is nil while appends can be accepted, else why not (for
	// /readyz).
	Ready() error
	// Lane reads sub's durable state, for a lane that was just gained: its
	// membership with the cursor, and its retry schedule.
	Lane(sub string) (Membership, *RetrySummary, error)
	// Member reads sub's membership (with its cursor) alone, in one point
	// read: for a node that needs a subscription's settings, not its
	// retry schedule (MemberWatcher, a create's check that the id is
	// free). ErrNotFound when there is none.
	Member(sub string) (Membership, error)
	// PublishLanes stores snapshots of the lanes this node owns (opaque
	// JSON the proxy makes); LaneSnapshots returns the latest snapshot of
	// every lane, whichever node published it.
	PublishLanes(snaps map[string][]byte) error
	LaneSnapshots() (map[string]LaneSnapshot, error)
}

// Records is what a Store may add for the admin API's own small records
// (the hashes of tenant tokens issued through the API): named values kept
// beside the delivery state, shared by every node in fleet mode. Both
// backends implement it; the proxy asserts it on its Store.
//
// A key is one or more dot-separated segments of [A-Za-z0-9_-], the first
// naming the kind ("token.<hash>"), at most MaxRecordKeyBytes; a bad key
// is an error naming it that wraps ErrBadKey (CheckRecordKey).
type Records interface {
	// PutRecord stores value under key, durably, replacing what was there.
	PutRecord(key string, value []byte) error
	// GetRecord reads one record; ErrNotFound when there is none.
	GetRecord(key string) ([]byte, error)
	// ListRecords returns every record whose key starts with prefix.
	ListRecords(prefix string) (map[string][]byte, error)
	// DeleteRecord removes a record; deleting a missing one is no error.
	DeleteRecord(key string) error
}

// MemberWatcher is what an OwnerHandler may add to hear of the
// memberships any node writes: a subscription created, changed or deleted
// through another node's admin API, or retired by its owner. After Own,
// MembersChanged is called once with initial true and every subscription
// with a membership then, and afterwards with each one whose membership
// was written or removed; the handler reads what it needs (Fleet.Lane).
// Calls never overlap.
type MemberWatcher interface {
	MembersChanged(subs []string, initial bool)
}

// LaneSnapshot is one lane's state as its owner last published it.
type LaneSnapshot struct {
	Node string
	At   time.Time
	Data []byte
}

// OwnerHandler is how a Fleet tells the delivery engine about ownership.
// Calls for one subscription never overlap.
type OwnerHandler interface {
	// Gained: this node now holds sub's lease. State read after the call
	// starts (Fleet.Lane) is current: the previous owner can write no more.
	Gained(sub string)
	// Release: stop starting deliveries of sub, wait for those in flight
	// until ctx ends, and write sub's cursor; the lease is released once
	// it returns. ctx is already done when the lease was lost, not given
	// up: then writes fail with ErrFenced anyway.
	Release(ctx context.Context, sub string)
	// Changed: another node changed sub's state (a replay, a pause) while
	// this node owns it; re-read what Lane returns.
	Changed(sub string)
}
