package queue

import (
	"sync/atomic"
	"time"
)

// Event is one accepted event. Body is shared by every lane that delivers
// it and must never be modified after Append.
type Event struct {
	Seq         uint64
	ID          string
	Type        string
	ContentType string
	AcceptedAt  time.Time
	Body        []byte

	// OrderingKey is the producer's Ordering-Key header, "" when none:
	// events sharing a key reach an `ordering: key` subscription in
	// acceptance order. Ingest bounds it (1..256 printable
	// ASCII bytes).
	OrderingKey string
	// TraceParent and TraceState are the producer's W3C trace context
	// (the traceparent and tracestate headers) as received, "" when none
	// or when the traceparent was invalid; TraceState is kept only with a
	// valid TraceParent.
	TraceParent string
	TraceState  string
	// Tenant is the tenant the event belongs to (the producer's
	// Sluice-Tenant header), "" for a platform event. Only that tenant's
	// subscriptions, and the operator's, may receive it (the tenant
	// rule, docs/security.md); events written before tenants existed decode with "".
	Tenant string
	// CloudEvent is the event's CloudEvents context attributes when it
	// was posted as a CloudEvent, "" otherwise: a compact JSON object of
	// every attribute as received (specversion, id, source, type and the
	// optional and extension ones) except data, data_base64 and
	// datacontenttype, which are Body and ContentType. It lets a
	// CloudEvents delivery carry the event as it came. Ingest bounds it
	// (proxy/cloudevents); events written before it existed decode with "".
	CloudEvent string

	// doc caches Body decoded for the delivery engine's body filters
	// (Decoded, CacheDecoded); no backend reads or stores it.
	doc atomic.Pointer[Decoded]
	// renderings caches Body rendered per body variant (Rendering, in
	// render.go). Like doc, it lives as long as the event and
	// is not counted by Size: renderings come after the event is sized,
	// so whoever caches one charges its budget then (the delivery
	// engine's ring does).
	renderings atomic.Pointer[[]*Rendering]
}

// Decoded is an event's body as the delivery engine decoded it once for
// every lane that filters on it.
type Decoded struct {
	Doc  any  // the body decoded as JSON
	JSON bool // false: the body is not JSON (Doc is nil)
}

// Decoded returns the decoded body cached on e, nil when none is yet.
func (e *Event) Decoded() *Decoded { return e.doc.Load() }

// CacheDecoded keeps d as e's decoded body unless another was kept first
// (two lanes decoding at once), and returns the one kept.
func (e *Event) CacheDecoded(d *Decoded) *Decoded {
	if e.doc.CompareAndSwap(nil, d) {
		return d
	}
	return e.doc.Load()
}

// Size is an estimate of the memory the event holds, for byte budgets.
func (e *Event) Size() int {
	return len(e.Body) + len(e.ID) + len(e.Type) + len(e.ContentType) +
		len(e.OrderingKey) + len(e.TraceParent) + len(e.TraceState) + len(e.Tenant) + len(e.CloudEvent) + 64
}

// Membership records which events a subscription is entitled to (the
// membership cut-off: the events accepted while it is a member): those with From <= seq, and seq <= Until once it has Left.
// Snapshot is the subscription's configuration as the proxy encoded it, so a
// subscription removed from the config can still drain what it was owed.
type Membership struct {
	Subscription string
	From         uint64
	Left         bool   // removed from the config; drains up to Until, then retires
	Until        uint64 // last entitled seq, when Left
	Paused       string // why deliveries are paused at run time (410 Gone, an operator); "" when not
	Cursor       uint64 // every entitled event <= Cursor is resolved
	Snapshot     []byte
}

// Active reports whether the subscription still receives new events.
func (m Membership) Active() bool { return !m.Left }

// JoinRequest asks for one subscription to be a member, with its config
// snapshot.
type JoinRequest struct {
	Subscription string
	Snapshot     []byte
	// Known, when set, is the membership as Memberships returned it, which
	// saves reading it again (the caller must be its only writer).
	Known *Membership
	// Create makes a new membership only: when sub has one already, or
	// another writer makes one first, JoinAll fails with an error wrapping
	// ErrExists and changes nothing of it. Meant for one request alone
	// (the API's create): what the call did for other requests is then
	// not told.
	Create bool
}

// Retry is a scheduled redelivery of one event to one subscription.
type Retry struct {
	Subscription string
	Seq          uint64
	Due          time.Time
	Attempt      int // attempts already made
	FirstAttempt time.Time
	LastStatus   int    // 0 when the last attempt got no answer
	LastError    string // short classification, never a payload or secret
	Replay       bool   // a replayed dead letter: its ACK is recorded on the dead letter
}

// RetrySummary is what start-up needs of one subscription's retry schedule.
type RetrySummary struct {
	// Count is how many retries are scheduled.
	Count int
	// Ahead holds the seqs above the subscription's durable cursor that
	// have a retry record: first attempts that failed after the cursor was
	// last written. A lane resuming from the cursor must not send them
	// again as first attempts, or the event would be in flight twice (the
	// fresh copy and the retry) and, failing, start a second retry chain.
	Ahead map[uint64]struct{}
}

// DeadLetter is a delivery that will not be tried again on its own. It
// keeps a copy of the body so it outlives compaction of the log, and can be
// replayed.
type DeadLetter struct {
	Subscription string    `json:"subscription"`
	Seq          uint64    `json:"seq"`
	EventID      string    `json:"event_id"`
	Type         string    `json:"type"`
	ContentType  string    `json:"content_type,omitempty"`
	AcceptedAt   time.Time `json:"accepted_at"`
	Reason       string    `json:"reason"`
	Attempts     int       `json:"attempts"`
	LastStatus   int       `json:"last_status,omitempty"`
	LastError    string    `json:"last_error,omitempty"`
	Response     string    `json:"response,omitempty"` // bounded snippet of the last response body
	DeadAt       time.Time `json:"dead_at"`
	Replays      int       `json:"replays,omitempty"`
	ReplayedAt   time.Time `json:"replayed_at,omitzero"`
	DeliveredAt  time.Time `json:"delivered_at,omitzero"` // when a replay was acknowledged
	Body         []byte    `json:"-"`

	// OrderingKey, TraceParent and TraceState are the event's (Event): a
	// replay carries the producer's trace context; the key is kept for
	// the record (a replay goes out on its own, outside its key's order).
	// Letters written before they existed decode with them empty.
	OrderingKey string `json:"ordering_key,omitempty"`
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
	// Tenant is the event's tenant (Event.Tenant), "" for a platform
	// event; Owner is the tenant that owned the subscription when the
	// letter was written, "" for the operator. Access to a letter is
	// judged by Owner, never by whoever holds the subscription id now
	// (an id a tenant retired may be taken by no other tenant, but a
	// letter outlives its subscription). Letters written before them
	// decode with both empty: the operator's.
	Tenant string `json:"tenant,omitempty"`
	Owner  string `json:"owner,omitempty"`
	// Scoped says Owner was recorded ("" then means the operator); a
	// letter written before owners were recorded has it false, and its
	// owner is unknown.
	Scoped bool `json:"scoped,omitempty"`
	// CloudEvent is the event's (Event.CloudEvent), so that a replay
	// goes out as the event came; letters written before it decode with
	// it empty.
	CloudEvent string `json:"cloudevent,omitempty"`
}

// DiskUsage is the last measurement of the log's disk use.
type DiskUsage struct {
	Used int64 // bytes allocated by the files of the data dir
	Free int64 // bytes available on its file system; -1 if unknown
	Full bool  // appends are refused
	// Reason says which limit is reached, when Full.
	Reason string
}
