package jetstream

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/queue"
)

// Headers of an event message besides Nats-Msg-Id (the event id). nats.go
// keeps header keys as written, so these are read by exact key.
const (
	hdrType        = "Sluice-Type"
	hdrContentType = "Sluice-Content-Type"
	hdrAcceptedAt  = "Sluice-Accepted-At" // unix nanoseconds
	// The event's ordering key and the producer's W3C trace context, each
	// only when the event has it; a message without them (one written
	// before they existed) reads with them empty. The trace context keeps
	// its W3C header names so tools reading the stream see it as such
	// (a NATS server with an account trace_dest may trace such messages;
	// it never changes them).
	hdrOrderingKey = "Sluice-Ordering-Key"
	hdrTraceParent = "traceparent"
	hdrTraceState  = "tracestate"
	// The tenant the event belongs to (the tenant rule, docs/security.md), only when
	// it has one; a message written before tenants existed reads as a
	// platform event.
	hdrTenant = "Sluice-Tenant"
	// The event's CloudEvents attributes (queue.Event.CloudEvent), only
	// when it was posted as a CloudEvent; a message written before they
	// existed reads without them.
	hdrCloudEvent = "Sluice-CloudEvent"
)

// logSide is the state of the event log: the publish window, the stream
// follower feeding OnCommit, the head.
type logSide struct {
	api string // JetStream API prefix, "$JS.API."
	m   *logMetrics

	// head is the last seq handed to OnCommit, known from a PubAck or the
	// follower (at Open, the stream's last seq); low the seq below which
	// Events sees nothing (compacted; held events stay for their retries).
	head atomic.Uint64
	low  atomic.Uint64

	fol follower
	// The publish window: calls are the publish attempts waiting for their
	// answer, by the token ending their reply subject (replyPfx + token),
	// which onReply finds them by; window holds a slot for each.
	replyPfx string
	replySub *nats.Subscription
	window   chan struct{}
	cmu      sync.Mutex
	calls    map[uint64]*appendCall
	lastTok  uint64
	wmu      sync.Mutex
	wq       waitHeap // appends waiting for the head to pass their seq
	// warnedAt (unix nanos) rate-limits the warning of an append that
	// returned before OnCommit saw it.
	warnedAt atomic.Int64

	state    atomic.Pointer[streamState] // last stream info (the disk usage)
	diskFull atomic.Bool                 // the last append was refused for max_bytes

	ret         retention // the delivery state Compact asks; the Store itself
	compactMu   sync.Mutex
	lastCompact time.Time
	ids         atomic.Pointer[idIndex]

	stop chan struct{} // closed by closeLog: ends the refresher
	wg   sync.WaitGroup
}

// logMetrics are the log's Prometheus series, registered with
// Options.Registerer (none when nil) and unregistered by Close, so a store
// reopened on the same registry registers again.
type logMetrics struct {
	reg        prometheus.Registerer
	append     prometheus.Histogram
	commitWait prometheus.Histogram
	pubErrs    *prometheus.CounterVec
	collectors []prometheus.Collector
}

// Causes of a failed publish attempt: the values of the cause label.
const (
	causeNotConnected = "not_connected" // the client is disconnected or reconnecting
	causeNoLeader     = "no_leader"     // no responders: the stream has no leader
	causeTimeout      = "timeout"       // no PubAck in time: likely no quorum
	causeUnavailable  = "unavailable"   // the servers answered 503 (JetStream temporarily unavailable)
	causeInProcess    = "in_process"    // the same id is being stored (10158); retried
	causeWindow       = "window_full"   // Options.PublishWindow appends already wait for their PubAck
	causeDiskFull     = "disk_full"     // max_bytes reached
	causeOther        = "other"
)

// notConnectedPatience is how long Append retries while the client has no
// connection at all, within RequestTimeout.
const notConnectedPatience = time.Second

// appendBuckets span a PubAck on loopback (a fraction of a millisecond) to
// a leader election (seconds).
var appendBuckets = []float64{.00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

func newLogMetrics(reg prometheus.Registerer, s *Store) *logMetrics {
	m := &logMetrics{
		reg: reg,
		append: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_queue_append_duration_seconds",
			Help:    "Duration of one Append: the publish and its PubAck from a quorum of the stream's replicas (and OnCommit, when it waits for it: sluice_jetstream_append_commit_wait_seconds).",
			Buckets: appendBuckets,
		}),
		commitWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_jetstream_append_commit_wait_seconds",
			Help:    "Appends that waited after their PubAck for OnCommit, and how long: only while more than the publish window of appended events (or 64 MiB of them) wait for other nodes' events below theirs to come through this node's stream follower, or for a duplicate whose original OnCommit has not seen yet.",
			Buckets: appendBuckets,
		}),
		pubErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_jetstream_publish_errors_total",
			Help: "Publish attempts of Append that failed, by cause (a retried attempt counts once per failure).",
		}, []string{"cause"}),
	}
	for _, c := range []string{causeNotConnected, causeNoLeader, causeTimeout, causeUnavailable, causeInProcess, causeWindow, causeDiskFull, causeOther} {
		m.pubErrs.WithLabelValues(c)
	}
	// The disk gauges keep the Badger log's names, which dashboards and
	// alerts rely on; here they measure the stream.
	m.collectors = append([]prometheus.Collector{m.append, m.commitWait, m.pubErrs}, queue.DiskGauges(s.DiskUsage,
		"Bytes the event stream holds (all replicas count once), measured every second.",
		"Bytes left under the stream's max_bytes; -1 if unlimited.",
		"1 while ingest answers 507: the event stream is at its max_bytes.")...)
	return m
}

func (m *logMetrics) register() error { return queue.RegisterAll(m.reg, m.collectors) }

func (m *logMetrics) unregister() { queue.UnregisterAll(m.reg, m.collectors) }

// eventSubject is the event's subject: the id in base64url, so any id is one
// valid subject token.
func (s *Store) eventSubject(id string) string {
	// One allocation, not one for the encoding and one for the join.
	var sb strings.Builder
	sb.Grow(len(s.evSubj) + base64.RawURLEncoding.EncodedLen(len(id)))
	sb.WriteString(s.evSubj)
	var buf [96]byte
	sb.Write(base64.RawURLEncoding.AppendEncode(buf[:0], []byte(id)))
	return sb.String()
}

// Append publishes ev with Nats-Msg-Id = ev.ID and returns once a quorum of
// the stream's replicas has it (the PubAck). OnCommit has seen it by then
// unless another node's event before it has not come through this node's
// stream follower yet; it sees both, in seq order, when it has. A
// repeated id within the dedup window returns the original seq with dup
// true: the stream's duplicate window answers that, whichever node
// appended the first.
//
// Concurrent appends overlap: each is published at once and waits for its
// own PubAck, so many share the cluster's round trips (at most
// Options.PublishWindow at a time). A publish that finds no connection, no
// stream leader or no answer is sent again with the same Nats-Msg-Id (so it
// is stored once) until Options.RequestTimeout has passed; then the error
// wraps queue.ErrUnavailable and names the cause. A stream at its max_bytes
// refuses the event: queue.ErrDiskFull. After Close: queue.ErrClosed.
func (s *Store) Append(ev *queue.Event) (seq uint64, dup bool, err error) {
	if s.closed.Load() {
		return 0, false, queue.ErrClosed
	}
	start := time.Now()
	deadline := start.Add(s.opts.RequestTimeout)
	m := newEventMsg(s.eventSubject(ev.ID), ev)
	c := newAppendCall(m, ev)
	defer c.free()
	ack, retried, err := s.publishEvent(c, deadline)
	seq, dup, err = s.appended(ev, ack, retried, err, deadline)
	if err == nil {
		s.lg.m.append.Observe(time.Since(start).Seconds())
	}
	return seq, dup, err
}

// AppendBatch publishes every event of evs before it waits for any
// PubAck: they reach the stream leader back to back, from one
// connection, so they share the cluster's round trips (within
// Options.PublishWindow) and are stored in the order of evs. Each is
// then waited for, retried and answered as Append answers it, so the
// stream's duplicate window (Nats-Msg-Id) recognises a retried batch
// event by event. An event whose first attempt failed is published again
// on its own and stored after the others. An id that repeats within evs
// is published once; its later events answer as duplicates of it.
func (s *Store) AppendBatch(evs []*queue.Event, res []queue.AppendResult) {
	if s.closed.Load() {
		for i := range evs {
			res[i] = queue.AppendResult{Err: queue.ErrClosed}
		}
		return
	}
	start := time.Now()
	deadline := start.Add(s.opts.RequestTimeout)
	calls := make([]*appendCall, len(evs))
	first := make(map[string]int, len(evs)) // id → index of its first event
	early := make([]pubResult, len(evs))    // an attempt over before it was awaited
	over := make([]bool, len(evs))
	for i, ev := range evs {
		if _, ok := first[ev.ID]; ok {
			continue
		}
		first[ev.ID] = i
		c := newAppendCall(newEventMsg(s.eventSubject(ev.ID), ev), ev)
		calls[i] = c
		early[i], over[i] = s.sendAttempt(c, deadline)
	}
	for i, c := range calls {
		if c == nil {
			continue
		}
		r := early[i]
		if !over[i] {
			r = s.awaitAttempt(c)
		}
		ack, retried, err := r.ack, false, r.err
		if err != nil {
			ack, retried, err = s.republish(c, start, deadline, r.ack, r.err)
		}
		seq, dup, err := s.appended(evs[i], ack, retried, err, deadline)
		res[i] = queue.AppendResult{Seq: seq, Dup: dup, Err: err}
		c.free()
		if err == nil {
			s.lg.m.append.Observe(time.Since(start).Seconds())
		}
	}
	for i, ev := range evs {
		if calls[i] == nil {
			r := res[first[ev.ID]]
			res[i] = queue.AppendResult{Seq: r.Seq, Dup: r.Err == nil, Err: r.Err}
		}
	}
}

// appended completes one Append (or one event of AppendBatch) from what
// its publish returned: the seq, whether it is a duplicate, or the error.
func (s *Store) appended(ev *queue.Event, ack *jetstream.PubAck, retried bool, err error, deadline time.Time) (seq uint64, dup bool, _ error) {
	if err == nil && ack.Duplicate && retried && s.ownEarlierAttempt(ack.Sequence, ev, deadline) {
		// An attempt of this very Append that timed out (a stream leader
		// lost mid-publish) was stored after all: the event is new, and
		// its producer must hear 202, not "duplicate" (the crash soak saw
		// a first POST answered 200 duplicate).
		ack.Duplicate = false
		ev.Seq = ack.Sequence
		s.commitAppended(ack.Sequence, ev)
	}
	if err != nil {
		if errors.Is(err, queue.ErrDiskFull) {
			s.lg.diskFull.Store(true)
		}
		return 0, false, fmt.Errorf("append %s: %w", ev.ID, err)
	}
	s.lg.diskFull.Store(false)
	if ack.Duplicate {
		// The original may be an attempt whose PubAck never came (stored
		// after it timed out, once the stream had a quorum again): no
		// PubAck made its seq known, and the follower may be seconds from
		// it. A read up to the seq returned here must still find it.
		s.noteStored(ack.Sequence)
	}
	// onReply has handed the event to the sequencer: OnCommit has seen it,
	// unless a seq below it is another node's event still on its way
	// through the follower. The append does not wait for that (it cost a
	// 3-node fleet's appends 0.15-1.5 ms each, BenchmarkAppend nodes=3):
	// the event is durable in a quorum, the follower fills the gap and
	// OnCommit then gets both in seq order, and a membership joined from
	// now on starts past it (JoinAll reads the stream leader's last seq).
	// Only when more than PublishWindow events (or 64 MiB of bodies)
	// already wait for a gap does it wait, so the memory they hold stays
	// what waiting appends held before. A duplicate waits for the
	// original as before: that is at once, unless the original is an
	// attempt whose PubAck never came (stored after it timed out), which
	// the follower delivers. Either wait is bounded (and ends at Close):
	// past it the lanes read the event from the stream.
	if ack.Duplicate || s.lg.fol.holdsTooMuch(s.opts.PublishWindow) {
		s.awaitCommit(ack.Sequence, max(time.Until(deadline), s.opts.RequestTimeout/2))
	}
	return ack.Sequence, ack.Duplicate, nil
}

// eventMsg is an event's message and the backing of its header values: one
// allocation where a value slice per header was one each (BenchmarkAppend).
type eventMsg struct {
	m    nats.Msg
	vals [9]string
}

// newEventMsg makes ev's message. Every attempt of its Append sends it
// (track sets each one's reply subject), so it lives as long as the
// Append.
func newEventMsg(subject string, ev *queue.Event) *nats.Msg {
	em := &eventMsg{}
	h := make(nats.Header, len(em.vals))
	n := 0
	set := func(k, v string) {
		if v != "" {
			em.vals[n] = v
			h[k] = em.vals[n : n+1 : n+1]
			n++
		}
	}
	set(jetstream.MsgIDHeader, ev.ID)
	set(hdrType, ev.Type)
	set(hdrAcceptedAt, strconv.FormatInt(ev.AcceptedAt.UnixNano(), 10))
	set(hdrContentType, ev.ContentType)
	set(hdrOrderingKey, ev.OrderingKey)
	set(hdrTraceParent, ev.TraceParent)
	set(hdrTraceState, ev.TraceState)
	set(hdrTenant, ev.Tenant)
	set(hdrCloudEvent, ev.CloudEvent)
	em.m = nats.Msg{Subject: subject, Data: ev.Body, Header: h}
	return &em.m
}

// publishEvent sends c's message until a PubAck comes back, it fails for
// good, or deadline passes.
func (s *Store) publishEvent(c *appendCall, deadline time.Time) (ack *jetstream.PubAck, retried bool, err error) {
	start := time.Now()
	ack, err = s.publishAttempt(c, deadline)
	return s.republish(c, start, deadline, ack, err)
}

// republish takes the answer to c's first attempt, begun at start, and
// publishes c again while the answer is a failure worth retrying, until
// one is not or deadline passes.
func (s *Store) republish(c *appendCall, start, deadline time.Time, ack *jetstream.PubAck, err error) (*jetstream.PubAck, bool, error) {
	backoff := 10 * time.Millisecond
	timer := &c.timer
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			ack, err = s.publishAttempt(c, deadline)
		}
		if err == nil {
			return ack, attempt > 0, nil
		}
		if s.closed.Load() {
			return nil, false, queue.ErrClosed
		}
		cause, err := s.classifyPublish(err)
		s.lg.m.pubErrs.WithLabelValues(cause).Inc()
		if !errors.Is(err, queue.ErrUnavailable) || cause == causeTimeout {
			return nil, false, err
		}
		if cause == causeInProcess {
			backoff = min(backoff, 5*time.Millisecond)
		}
		if cause == causeNotConnected && time.Since(start) >= notConnectedPatience {
			// A client that lost its server reconnects to another within
			// milliseconds; one still disconnected after this is cut off,
			// and its producer should hear 503 now, not at the deadline
			// (a severed node held every request for ~5 s).
			return nil, false, err
		}
		if time.Until(deadline) < backoff {
			return nil, false, err
		}
		if !s.sleepOrQuit(backoff, timer) {
			return nil, false, queue.ErrClosed
		}
		backoff = min(backoff*2, 250*time.Millisecond)
	}
}

// ownEarlierAttempt reports whether the event stored at seq is ev as this
// Append published it (same id and accepted-at, which ingest stamps per
// request), rather than an earlier request with the same id. Unsure (the
// read keeps failing until deadline) counts as not: "duplicate" is then
// reported, which loses nothing.
func (s *Store) ownEarlierAttempt(seq uint64, ev *queue.Event, deadline time.Time) bool {
	for {
		stored, err := s.Event(seq)
		if err == nil {
			return stored.ID == ev.ID && stored.AcceptedAt.UnixNano() == ev.AcceptedAt.UnixNano()
		}
		if time.Until(deadline) < 50*time.Millisecond || s.closed.Load() {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Publishing. Append publishes on a reply subscription of its own rather
// than through nats.go's asynchronous publisher: onReply reads the PubAcks
// in the order they arrive (the stream leader's, so this node's events in
// seq order) and hands each event to OnCommit before it wakes the Append,
// and it decodes a PubAck by hand (parsePubAck). With encoding/json alone
// (parsePubAckJSON, as nats.go reads one) the parse took 2-5% of a fleet
// node's CPU profile at 1,000 events/s (sidecar-fleet, six interleaved
// rounds), by hand 0.2-0.6%; BenchmarkPubAck compares the two.

// openPublisher subscribes to the replies of this node's appends.
func (s *Store) openPublisher() error {
	lg := &s.lg
	lg.replyPfx = s.nc.NewInbox() + "."
	lg.window = make(chan struct{}, s.opts.PublishWindow)
	lg.calls = map[uint64]*appendCall{}
	sub, err := s.nc.Subscribe(lg.replyPfx+"*", s.onReply)
	if err != nil {
		return err
	}
	// As many answers may wait as appends are in flight.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	lg.replySub = sub
	return nil
}

// publishAttempt is one attempt: the publish and the wait for its answer,
// until deadline.
func (s *Store) publishAttempt(c *appendCall, deadline time.Time) (*jetstream.PubAck, error) {
	r, over := s.sendAttempt(c, deadline)
	if !over {
		r = s.awaitAttempt(c)
	}
	return r.ack, r.err
}

// sendAttempt starts an attempt: it takes a slot of the window, tracks c
// and publishes its message. over reports that the attempt ended already,
// with r its answer; else awaitAttempt waits for it.
func (s *Store) sendAttempt(c *appendCall, deadline time.Time) (r pubResult, over bool) {
	wait := time.Until(deadline)
	if wait <= 0 {
		return pubResult{err: errPubAckTimeout}, true
	}
	if c.timer == nil {
		c.timer = time.NewTimer(wait)
	} else {
		c.timer.Reset(wait)
	}
	select {
	case s.lg.window <- struct{}{}:
	default:
		select {
		case s.lg.window <- struct{}{}:
		case <-c.timer.C:
			return pubResult{err: jetstream.ErrTooManyStalledMsgs}, true
		case <-s.quit:
			return pubResult{err: queue.ErrClosed}, true
		}
	}
	s.lg.track(c)
	if err := s.nc.PublishMsg(c.msg); err != nil {
		if r, ok := s.lg.untrack(c); ok {
			return r, true
		}
		return pubResult{err: err}, true
	}
	return pubResult{}, false
}

// awaitAttempt waits for the answer to the attempt sendAttempt started,
// until its deadline.
func (s *Store) awaitAttempt(c *appendCall) pubResult {
	var quit error
	select {
	case r := <-c.done:
		return r
	case <-c.timer.C:
		quit = errPubAckTimeout
	case <-s.quit:
		quit = queue.ErrClosed
	}
	// An answer handed over meanwhile wins: an append acknowledged as
	// the store closes returns its seq.
	if r, ok := s.lg.untrack(c); ok {
		return r
	}
	return pubResult{err: quit}
}

// appendCall is one Append as onReply sees it. It is reused (appendCalls):
// done is empty and the call untracked whenever it is freed.
type appendCall struct {
	msg   *nats.Msg
	ev    *queue.Event
	tok   uint64
	done  chan pubResult // one answer per tracked attempt
	timer *time.Timer
}

type pubResult struct {
	ack *jetstream.PubAck
	err error
}

var appendCalls = sync.Pool{New: func() any { return &appendCall{done: make(chan pubResult, 1)} }}

func newAppendCall(m *nats.Msg, ev *queue.Event) *appendCall {
	c := appendCalls.Get().(*appendCall)
	c.msg, c.ev = m, ev
	return c
}

func (c *appendCall) free() {
	if c.timer != nil {
		c.timer.Stop()
	}
	c.msg, c.ev = nil, nil
	appendCalls.Put(c)
}

// track gives c's next attempt a token of its own (never reused: a late
// answer to an earlier attempt finds nothing) and sets its reply subject.
// c holds a slot of the window until it is untracked.
func (lg *logSide) track(c *appendCall) {
	lg.cmu.Lock()
	lg.lastTok++
	c.tok = lg.lastTok
	lg.calls[c.tok] = c
	lg.cmu.Unlock()
	c.msg.Reply = lg.replyPfx + strconv.FormatUint(c.tok, 10)
}

// untrack stops c's answers; an answer onReply had already taken c for is
// waited for (it is being handed over) and returned.
func (lg *logSide) untrack(c *appendCall) (pubResult, bool) {
	if lg.take(c.tok) != nil {
		return pubResult{}, false
	}
	return <-c.done, true
}

// take returns the call of token tok and untracks it, freeing its slot:
// nil when its Append no longer waits.
func (lg *logSide) take(tok uint64) *appendCall {
	lg.cmu.Lock()
	c := lg.calls[tok]
	if c != nil {
		delete(lg.calls, tok)
	}
	lg.cmu.Unlock()
	if c != nil {
		<-lg.window
	}
	return c
}

// failAll answers every call waiting with err: after a disconnect their
// answers may never come, and each Append can publish again at once.
func (s *Store) failAll(err error) {
	lg := &s.lg
	lg.cmu.Lock()
	toks := make([]uint64, 0, len(lg.calls))
	for tok := range lg.calls {
		toks = append(toks, tok)
	}
	lg.cmu.Unlock()
	for _, tok := range toks {
		if c := lg.take(tok); c != nil {
			c.done <- pubResult{err: err}
		}
	}
}

// onReply handles the answer to one publish attempt, on the reply
// subscription's one goroutine. A PubAck of a new event hands the event to
// OnCommit there, before the Append wakes: when the Appends handed their
// events over themselves, one woken before the Append of the seq below it
// found a gap and waited for it (docs/benchmarks.md, Fleet mode); in order,
// only another node's event leaves a gap.
func (s *Store) onReply(m *nats.Msg) {
	tok, err := strconv.ParseUint(strings.TrimPrefix(m.Subject, s.lg.replyPfx), 10, 64)
	if err != nil {
		return
	}
	c := s.lg.take(tok)
	if c == nil {
		return // the Append gave up: the follower hands the event over
	}
	var r pubResult
	if len(m.Data) == 0 && hval(m.Header, "Status") == "503" {
		r.err = nats.ErrNoResponders
	} else {
		r.ack, r.err = parsePubAck(m.Data, s.opts.Stream)
	}
	if r.err == nil && !r.ack.Duplicate {
		c.ev.Seq = r.ack.Sequence
		s.commitAppended(r.ack.Sequence, c.ev)
	}
	c.done <- r
}

// parsePubAck decodes a publish's answer: a PubAck, or the servers' error
// (*jetstream.APIError). The PubAcks sluice's appends get
// ({"stream":…,"seq":…} with "duplicate" and "domain" when set) are read
// by hand; anything else, an error among them, by encoding/json. stream
// is the expected stream's name, which the PubAck then shares.
func parsePubAck(b []byte, stream string) (*jetstream.PubAck, error) {
	if ack, ok := parsePubAckFast(b, stream); ok {
		return ack, nil
	}
	return parsePubAckJSON(b)
}

// parsePubAckJSON is parsePubAck with encoding/json alone.
func parsePubAckJSON(b []byte) (*jetstream.PubAck, error) {
	var resp struct {
		Error *jetstream.APIError `json:"error"`
		jetstream.PubAck
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return nil, fmt.Errorf("%w: %q", jetstream.ErrInvalidJSAck, b)
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	if resp.Stream == "" {
		return nil, fmt.Errorf("%w: %q", jetstream.ErrInvalidJSAck, b)
	}
	return &resp.PubAck, nil
}

// parsePubAckFast reads a flat JSON object of "stream" and "seq" (each
// once), and optionally "duplicate" and "domain", strings of ASCII without
// escapes; false for anything else, which parsePubAck leaves to
// encoding/json.
func parsePubAckFast(b []byte, stream string) (*jetstream.PubAck, bool) {
	i := 0
	space := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
	}
	str := func() ([]byte, bool) {
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		j := i + 1
		for ; j < len(b) && b[j] != '"'; j++ {
			if b[j] == '\\' || b[j] < 0x20 || b[j] >= 0x80 {
				return nil, false
			}
		}
		if j >= len(b) {
			return nil, false
		}
		v := b[i+1 : j]
		i = j + 1
		return v, true
	}
	var (
		ack                                      jetstream.PubAck
		haveStream, haveSeq, haveDup, haveDomain bool
	)
	space()
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	i++
	for {
		space()
		key, ok := str()
		if !ok {
			return nil, false
		}
		space()
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i++
		space()
		switch string(key) {
		case "stream":
			v, ok := str()
			if !ok || haveStream || len(v) == 0 {
				return nil, false
			}
			if string(v) == stream {
				ack.Stream = stream
			} else {
				ack.Stream = string(v)
			}
			haveStream = true
		case "domain":
			v, ok := str()
			if !ok || haveDomain {
				return nil, false
			}
			ack.Domain, haveDomain = string(v), true
		case "seq":
			j := i
			var n uint64
			for ; j < len(b) && b[j] >= '0' && b[j] <= '9'; j++ {
				d := uint64(b[j] - '0')
				if n > (math.MaxUint64-d)/10 {
					return nil, false
				}
				n = n*10 + d
			}
			if j == i || haveSeq || (b[i] == '0' && j-i > 1) {
				return nil, false
			}
			ack.Sequence, haveSeq, i = n, true, j
		case "duplicate":
			switch {
			case haveDup:
				return nil, false
			case bytes.HasPrefix(b[i:], []byte("true")):
				ack.Duplicate, i = true, i+4
			case bytes.HasPrefix(b[i:], []byte("false")):
				i += 5
			default:
				return nil, false
			}
			haveDup = true
		default:
			return nil, false
		}
		space()
		if i >= len(b) {
			return nil, false
		}
		if b[i] == ',' {
			i++
			continue
		}
		if b[i] != '}' {
			return nil, false
		}
		i++
		space()
		if i != len(b) || !haveStream || !haveSeq {
			return nil, false
		}
		return &ack, true
	}
}

// errPubAckTimeout: no PubAck arrived before the append's deadline.
var errPubAckTimeout = errors.New("no PubAck in time")

// sleepOrQuit waits d unless the store closes first.
func (s *Store) sleepOrQuit(d time.Duration, timer **time.Timer) bool {
	if *timer == nil {
		*timer = time.NewTimer(d)
	} else {
		(*timer).Reset(d)
	}
	select {
	case <-(*timer).C:
		return true
	case <-s.quit:
		return false
	}
}

// classifyPublish maps a failed publish attempt to its metric cause and the error
// Append returns: queue.ErrUnavailable (retried until the deadline),
// queue.ErrDiskFull, or the error itself when retrying cannot help.
func (s *Store) classifyPublish(err error) (string, error) {
	switch {
	case errors.Is(err, queue.ErrClosed):
		return causeOther, err
	case errors.Is(err, errPubAckTimeout), errors.Is(err, jetstream.ErrAsyncPublishTimeout),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return causeTimeout, fmt.Errorf("%w: no PubAck within %s (no quorum of the stream's replicas?)", queue.ErrUnavailable, s.opts.RequestTimeout)
	case errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrReconnectBufExceeded),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrConnectionClosed), !s.nc.IsConnected():
		return causeNotConnected, fmt.Errorf("%w: not connected to NATS: %w", queue.ErrUnavailable, err)
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return causeNoLeader, fmt.Errorf("%w: stream %s has no leader (no quorum of its replicas?): %w", queue.ErrUnavailable, s.opts.Stream, err)
	case errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		return causeWindow, fmt.Errorf("%w: %d appends already wait for their PubAck: %w", queue.ErrUnavailable, s.opts.PublishWindow, err)
	}
	if ae := apiError(err); ae != nil {
		switch {
		case ae.ErrorCode == errCodeDupInProcess:
			return causeInProcess, fmt.Errorf("%w: %w", queue.ErrUnavailable, err)
		case ae.ErrorCode == errCodeStoreFailed && (strings.Contains(ae.Description, "maximum bytes") || strings.Contains(ae.Description, "maximum messages")):
			return causeDiskFull, fmt.Errorf("%w: stream %s is at its max_bytes (max_disk_bytes): %s", queue.ErrDiskFull, s.opts.Stream, ae.Description)
		case ae.Code == 503 || ae.ErrorCode == errCodeUnavailable:
			return causeUnavailable, fmt.Errorf("%w: %w", queue.ErrUnavailable, err)
		}
	}
	return causeOther, err
}
