package jetstream

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// openLog starts the log side: the head is the stream's last seq now; a
// follower (an ordered consumer, which survives reconnects and leader
// changes by recreating itself after the last seq it delivered) reads
// every event appended from here on, by any node, and hands them to
// OnCommit in seq order.
func (s *Store) openLog() error {
	lg := &s.lg
	lg.api = jetstream.DefaultAPIPrefix
	lg.stop = make(chan struct{})
	if lg.ret == nil {
		lg.ret = s
	}
	if err := s.openPublisher(); err != nil {
		return err
	}
	var st streamState
	if err := s.retrySetUp("jetstream.stream "+s.opts.Stream+" state", func() (err error) {
		st, err = s.fetchState()
		if err != nil && !transientErr(err) {
			return &permanentErr{err}
		}
		return err
	}); err != nil {
		return err
	}
	lg.state.Store(&st)
	lg.head.Store(st.lastSeq)
	lg.fol.last = st.lastSeq
	lg.low.Store(max(st.firstSeq, 1))

	lg.m = newLogMetrics(s.opts.Registerer, s)
	if err := lg.m.register(); err != nil {
		return err
	}
	if err := s.retrySetUp("jetstream.stream "+s.opts.Stream+" follower", s.follow); err != nil {
		lg.m.unregister()
		return err
	}
	lg.wg.Add(1)
	go s.refreshLoop()
	return nil
}

// closeLog stops the follower and the refresher; once it returns OnCommit
// is not called again. Appends still waiting end with queue.ErrClosed (they
// watch s.quit).
func (s *Store) closeLog() {
	lg := &s.lg
	if lg.stop == nil {
		return
	}
	select {
	case <-lg.stop:
		return
	default:
	}
	close(lg.stop)
	if lg.replySub != nil {
		_ = lg.replySub.Unsubscribe()
	}
	lg.fol.mu.Lock()
	lg.fol.stopped = true
	cc := lg.fol.cc
	lg.fol.mu.Unlock()
	if cc != nil {
		cc.Stop()
		t := time.NewTimer(s.opts.RequestTimeout)
		select {
		case <-cc.Closed():
		case <-t.C:
		}
		t.Stop()
	}
	lg.wg.Wait()
	if lg.m != nil {
		lg.m.unregister()
	}
}

// Head is the last seq handed to OnCommit; at Open, the stream's last seq.
func (s *Store) Head() uint64 { return s.lg.head.Load() }

// stored is the last seq this node knows the stream holds: the head, or
// past it an append's PubAck whose seqs below OnCommit has not all seen
// (reads must find the event that Append returned).
func (s *Store) stored() uint64 { return max(s.lg.head.Load(), s.lg.fol.known.Load()) }

// follower is the one reader of new events, and the sequencer that hands
// them to OnCommit: the head moves over every seq known, in order, whether
// it became known from a PubAck of this node's own append (which needs no
// round trip more) or from the follower (another node's event, or one of
// ours whose PubAck is still on its way). A seq above head+1 waits in
// pending until the ones before it are known.
type follower struct {
	mu      sync.Mutex // held while the head moves: OnCommit is never concurrent
	cc      jetstream.ConsumeContext
	pending map[uint64]*queue.Event // known seqs above head+1; nil: a message that is no event
	// held and heldBytes are len(pending) and its bodies' bytes, for
	// Append's bound, read without mu (written under it).
	held, heldBytes atomic.Int64
	// known is the highest seq known from a PubAck: the stream holds
	// every seq up to it, though the head may not have passed them yet.
	known   atomic.Uint64
	last    uint64 // the last seq the consumer handed over (the stream's last at Open)
	stopped bool
	recent  recentRing // the headers of recent events, for compaction's id index
}

// follow starts the ordered consumer after the head. (On a connection of
// its own, so that its messages do not share a read loop with the
// PubAcks, BenchmarkAppend measured no difference: it shares s.nc.)
func (s *Store) follow() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RequestTimeout)
	defer cancel()
	cons, err := s.js.OrderedConsumer(ctx, s.opts.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.evSubj + ">"},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    s.lg.head.Load() + 1,
	})
	if err != nil {
		if !transientErr(err) {
			return &permanentErr{err}
		}
		return err
	}
	cc, err := cons.Consume(s.onStreamMsg,
		// Bounded by bytes, not messages: bodies go up to max_body_bytes.
		jetstream.PullMaxBytes(32<<20),
		// A consumer lost with its server is noticed (and recreated)
		// within seconds.
		jetstream.PullExpiry(5*time.Second),
		jetstream.PullHeartbeat(time.Second),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !s.closed.Load() {
				s.log.Debug("stream follower", "stream", s.opts.Stream, "err", err)
			}
		}))
	if err != nil {
		return err
	}
	s.lg.fol.mu.Lock()
	s.lg.fol.cc = cc
	s.lg.fol.mu.Unlock()
	return nil
}

// onStreamMsg handles one message of the follower.
func (s *Store) onStreamMsg(msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		s.log.Error("stream follower: message without metadata", "err", err)
		return
	}
	seq := md.Sequence.Stream
	h := msg.Headers()
	f := &s.lg.fol
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.recent.put(seq, hval(h, jetstream.MsgIDHeader), hval(h, hdrType), hval(h, hdrTenant), md.Timestamp.UnixNano())
	// The consumer is ordered: it hands over every message the stream
	// holds, in order. A seq it passed over is gone (compacted or deleted
	// before it got there, as when this node was cut off while the others
	// delivered and compacted), so nothing will ever make it known and the
	// head must not wait for it.
	if gone := max(f.last, s.lg.head.Load()); seq > gone+1 {
		s.skipGoneLocked(gone+1, seq-1)
	}
	f.last = max(f.last, seq)
	if seq <= s.lg.head.Load() {
		return // known from its PubAck
	}
	ev, err := decodeEvent(seq, msg.Subject(), h, msg.Data())
	if err != nil {
		// Not an event sluice wrote: it takes a seq but is no one's event.
		s.log.Error("stream follower: skipping a message", "stream", s.opts.Stream, "seq", seq, "err", err)
	}
	s.commitSeqLocked(seq, ev)
}

// commitAppended records that seq is ev, known from its PubAck.
func (s *Store) commitAppended(seq uint64, ev *queue.Event) {
	f := &s.lg.fol
	f.mu.Lock()
	defer f.mu.Unlock()
	if seq > f.known.Load() {
		f.known.Store(seq) // f.mu orders the writes
	}
	if !f.stopped {
		s.commitSeqLocked(seq, ev)
	}
}

// commitSeqLocked moves the head over seq and every known seq after it, and
// hands their events to OnCommit; a seq past head+1 waits in pending.
// f.mu is held.
func (s *Store) commitSeqLocked(seq uint64, ev *queue.Event) {
	f := &s.lg.fol
	head := s.lg.head.Load()
	switch {
	case seq <= head:
		return
	case seq > head+1:
		f.hold(seq, ev)
		return
	}
	var group []*queue.Event
	if ev != nil {
		group = append(group, ev)
	}
	for len(f.pending) > 0 {
		next, ok := f.release(seq + 1)
		if !ok {
			break
		}
		seq++
		if next != nil {
			group = append(group, next)
		}
	}
	if len(group) > 0 && s.opts.OnCommit != nil {
		s.opts.OnCommit(group)
	}
	s.lg.head.Store(seq)
	s.wakeAppends(seq)
}

// hold keeps ev (nil: no event) at seq in pending. f.mu is held.
func (f *follower) hold(seq uint64, ev *queue.Event) {
	if f.pending == nil {
		f.pending = map[uint64]*queue.Event{}
	}
	f.heldBytes.Add(bodyBytes(ev) - bodyBytes(f.pending[seq]))
	f.pending[seq] = ev
	f.held.Store(int64(len(f.pending)))
}

// release takes seq's entry out of pending; false if it has none. f.mu is
// held.
func (f *follower) release(seq uint64) (*queue.Event, bool) {
	ev, ok := f.pending[seq]
	if !ok {
		return nil, false
	}
	delete(f.pending, seq)
	f.heldBytes.Add(-bodyBytes(ev))
	f.held.Store(int64(len(f.pending)))
	return ev, true
}

// holdsTooMuch reports whether pending holds more than an append may add
// to without waiting: more than window events, or more body bytes than
// maxHeldBytes.
func (f *follower) holdsTooMuch(window int) bool {
	return f.held.Load() > int64(window) || f.heldBytes.Load() > maxHeldBytes
}

// maxHeldBytes bounds the bodies held in pending before appends wait: what
// the ingest gate in front of Append admits at once (proxy
// ingestMaxPendingBytes), which these events have left.
const maxHeldBytes = 64 << 20

// noteStored records that the stream holds seq, known from the PubAck of
// a duplicate: its event is the original's, which OnCommit gets from the
// original's PubAck or from the follower, not from here.
func (s *Store) noteStored(seq uint64) {
	f := &s.lg.fol
	f.mu.Lock()
	defer f.mu.Unlock()
	if seq > f.known.Load() {
		f.known.Store(seq) // f.mu orders the writes
	}
}

func bodyBytes(ev *queue.Event) int64 {
	if ev == nil {
		return 0
	}
	return int64(len(ev.Body))
}

// skipGoneLocked moves the head from from-1 over to, seqs the stream no
// longer holds, handing OnCommit the events of any of them known from
// their PubAcks (appended, then compacted before the consumer got there).
// from is head+1. f.mu is held.
func (s *Store) skipGoneLocked(from, to uint64) {
	f := &s.lg.fol
	var known []uint64
	for seq := range f.pending {
		if seq >= from && seq <= to {
			known = append(known, seq)
		}
	}
	slices.Sort(known)
	var group []*queue.Event
	for _, seq := range known {
		if ev, _ := f.release(seq); ev != nil {
			group = append(group, ev)
		}
	}
	if len(group) > 0 && s.opts.OnCommit != nil {
		s.opts.OnCommit(group)
	}
	s.lg.head.Store(to)
	s.wakeAppends(to)
}

// decodeEvent makes an event of a stored message; data becomes its body.
// Every read path (the stream follower, direct gets, batched gets) decodes
// through it, so each reads the same headers.
func decodeEvent(seq uint64, subject string, h nats.Header, data []byte) (*queue.Event, error) {
	id := hval(h, jetstream.MsgIDHeader)
	if id == "" {
		return nil, fmt.Errorf("message %d on %s has no Nats-Msg-Id: %w", seq, subject, queue.ErrCorrupt)
	}
	at, err := strconv.ParseInt(hval(h, hdrAcceptedAt), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("message %d (%s): %s: %w", seq, id, hdrAcceptedAt, queue.ErrCorrupt)
	}
	if data == nil {
		data = []byte{}
	}
	return &queue.Event{
		Seq: seq, ID: id, Type: hval(h, hdrType), ContentType: hval(h, hdrContentType),
		OrderingKey: hval(h, hdrOrderingKey), TraceParent: hval(h, hdrTraceParent), TraceState: hval(h, hdrTraceState),
		Tenant:     hval(h, hdrTenant),
		AcceptedAt: time.Unix(0, at),
		// The message's own buffer, capped so no append can reach the
		// bytes next to it.
		Body: data[:len(data):len(data)],
	}, nil
}

func hval(h nats.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// waiter is an append waiting until the head reaches seq.
type waiter struct {
	seq uint64
	ch  chan struct{}
}

type waitHeap []*waiter

func (h waitHeap) Len() int           { return len(h) }
func (h waitHeap) Less(i, j int) bool { return h[i].seq < h[j].seq }
func (h waitHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *waitHeap) Push(x any)        { *h = append(*h, x.(*waiter)) }
func (h *waitHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return w
}

// awaitCommit waits until OnCommit has seen seq, at most d; false if it
// had not (or the store closed).
func (s *Store) awaitCommit(seq uint64, d time.Duration) bool {
	if s.lg.head.Load() >= seq {
		return true
	}
	w := &waiter{seq: seq, ch: make(chan struct{}, 1)}
	s.lg.wmu.Lock()
	if s.lg.head.Load() >= seq {
		s.lg.wmu.Unlock()
		return true
	}
	heap.Push(&s.lg.wq, w)
	s.lg.wmu.Unlock()
	start := time.Now()
	defer func() { s.lg.m.commitWait.Observe(time.Since(start).Seconds()) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.ch:
		return true
	case <-t.C:
		if now := time.Now().UnixNano(); now-s.lg.warnedAt.Load() > int64(10*time.Second) {
			s.lg.warnedAt.Store(now)
			s.log.Warn("append: the stream follower has not reached the event's seq; returning without OnCommit (the lanes read it from the stream)",
				"stream", s.opts.Stream, "seq", seq, "head", s.lg.head.Load())
		}
		return false
	case <-s.quit:
		return false
	}
}

// wakeAppends releases the appends waiting for seqs up to head.
func (s *Store) wakeAppends(head uint64) {
	s.lg.wmu.Lock()
	for len(s.lg.wq) > 0 && s.lg.wq[0].seq <= head {
		w := heap.Pop(&s.lg.wq).(*waiter)
		w.ch <- struct{}{}
	}
	s.lg.wmu.Unlock()
}

// Reads. A direct get is answered by the nearest replica (on loopback, the
// server this node is connected to), which may not yet have applied the
// latest writes of its stream; a read that misses an event the head says
// exists asks the stream leader (STREAM.MSG.GET) before saying not found.

// getMsg is one stored message as a read returns it.
type getMsg struct {
	seq     uint64
	subject string
	ts      int64 // stored at, unix nanos (the server's clock)
	hdr     nats.Header
	data    []byte
}

// errNoMsg: the server has no such message.
var errNoMsg = errors.New("no message")

// directGet asks the nearest replica: by seq, or the last message on subj.
func (s *Store) directGet(stream string, seq uint64, subj string) (*getMsg, error) {
	var (
		m   *nats.Msg
		err error
	)
	if subj != "" {
		m, err = s.nc.Request(s.lg.api+"DIRECT.GET."+stream+"."+subj, nil, s.opts.RequestTimeout)
	} else {
		req := append(strconv.AppendUint([]byte(`{"seq":`), seq, 10), '}')
		m, err = s.nc.Request(s.lg.api+"DIRECT.GET."+stream, req, s.opts.RequestTimeout)
		if err == nil {
			m.Data = m.Data[:len(m.Data):len(m.Data)]
		}
	}
	if err != nil {
		return nil, err
	}
	return directMsg(m)
}

// directMsg decodes one answer of a direct get.
func directMsg(m *nats.Msg) (*getMsg, error) {
	if len(m.Data) == 0 {
		switch st := hval(m.Header, "Status"); st {
		case "":
		case "404":
			return nil, errNoMsg
		default:
			return nil, fmt.Errorf("direct get: status %s %s", st, hval(m.Header, "Description"))
		}
	}
	seq, err := strconv.ParseUint(hval(m.Header, jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("direct get: bad %s header: %w", jetstream.SequenceHeader, queue.ErrCorrupt)
	}
	ts, err := time.Parse(time.RFC3339Nano, hval(m.Header, jetstream.TimeStampHeaer))
	if err != nil {
		return nil, fmt.Errorf("direct get: bad %s header: %w", jetstream.TimeStampHeaer, queue.ErrCorrupt)
	}
	return &getMsg{seq: seq, subject: hval(m.Header, jetstream.SubjectHeader), ts: ts.UnixNano(), hdr: m.Header, data: m.Data}, nil
}

// leaderGet asks the stream leader (not a direct get): the message at
// seq, the first at or after seq when next, or the last on subj.
func (s *Store) leaderGet(stream string, seq uint64, next bool, subj string) (*getMsg, error) {
	req := map[string]any{}
	switch {
	case subj != "":
		req["last_by_subj"] = subj
	case next:
		req["seq"], req["next_by_subj"] = seq, s.evSubj+">"
	default:
		req["seq"] = seq
	}
	body, _ := json.Marshal(req)
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Hdrs    []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	if err := s.apiJSON(s.lg.api+"STREAM.MSG.GET."+stream, body, &resp); err != nil {
		return nil, err
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == errCodeNoMessage || resp.Error.Code == 404 {
			return nil, errNoMsg
		}
		return nil, resp.Error
	}
	if resp.Message == nil {
		return nil, fmt.Errorf("stream %s: a message get answered no message", stream)
	}
	g := &getMsg{seq: resp.Message.Seq, subject: resp.Message.Subject, ts: resp.Message.Time.UnixNano(), data: resp.Message.Data}
	if len(resp.Message.Hdrs) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Hdrs)
		if err != nil {
			return nil, fmt.Errorf("message %d: headers: %w", g.seq, queue.ErrCorrupt)
		}
		g.hdr = h
	}
	return g, nil
}

// readErr wraps a failed read: unavailable when the cluster did not
// answer, closed after Close.
func (s *Store) readErr(what string, err error) error {
	switch {
	case s.closed.Load() || errors.Is(err, nats.ErrConnectionClosed):
		return fmt.Errorf("%s: %w", what, queue.ErrClosed)
	case transientErr(err):
		return fmt.Errorf("%s: %w: %w", what, queue.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Event reads one event by seq; ErrNotFound once it is compacted.
func (s *Store) Event(seq uint64) (*queue.Event, error) {
	if s.closed.Load() {
		return nil, queue.ErrClosed
	}
	what := "event " + strconv.FormatUint(seq, 10)
	if seq == 0 {
		return nil, fmt.Errorf("%s: %w", what, queue.ErrNotFound)
	}
	g, err := s.directGet(s.opts.Stream, seq, "")
	if errors.Is(err, errNoMsg) && seq <= s.stored() {
		g, err = s.leaderGet(s.opts.Stream, seq, false, "")
	}
	if errors.Is(err, errNoMsg) {
		return nil, fmt.Errorf("%s: %w", what, queue.ErrNotFound)
	}
	if err != nil {
		return nil, s.readErr(what, err)
	}
	return decodeEvent(g.seq, g.subject, g.hdr, g.data)
}

// dedupSlack is how much longer than the dedup window Lookup remembers an
// id: the server forgets ids on a timer, so an id Lookup calls gone must
// already be gone for the stream's duplicate check too.
const dedupSlack = time.Second

// Lookup returns the seq and type of the event with this id while the id
// is remembered: the last message on the id's subject, or, once that event
// is compacted, its entry in the id index (compact.go), until the dedup
// window has passed since the event was stored.
func (s *Store) Lookup(id string) (uint64, string, string, error) {
	if s.closed.Load() {
		return 0, "", "", queue.ErrClosed
	}
	what := "lookup " + id
	subj := s.eventSubject(id)
	horizon := time.Now().Add(-s.opts.DedupWindow - dedupSlack).UnixNano()
	g, err := s.directGet(s.opts.Stream, 0, subj)
	if errors.Is(err, errNoMsg) {
		g, err = s.leaderGet(s.opts.Stream, 0, false, subj)
	}
	switch {
	case err == nil:
		if g.ts < horizon {
			return 0, "", "", fmt.Errorf("%s: %w", what, queue.ErrNotFound)
		}
		return g.seq, hval(g.hdr, hdrType), hval(g.hdr, hdrTenant), nil
	case !errors.Is(err, errNoMsg):
		return 0, "", "", s.readErr(what, err)
	}
	seq, typ, tenant, ts, err := s.lookupIndex(id)
	if errors.Is(err, errNoMsg) || err == nil && ts < horizon {
		return 0, "", "", fmt.Errorf("%s: %w", what, queue.ErrNotFound)
	}
	if err != nil {
		return 0, "", "", s.readErr(what, err)
	}
	return seq, typ, tenant, nil
}

// Range reads.
//
// Measured with BenchmarkEvents (bench_test.go; 2 shared cores, 3 nodes on
// loopback, 512 B bodies): a direct get batch ($JS.API.DIRECT.GET.<stream>
// with {"seq","batch"}) is one request answered from the nearest replica's
// store, a consumer made per call costs a create (a meta-layer proposal in
// a cluster) and a delete, about 1.3 ms; but the batch costs the server
// more per message (it writes six headers into each one, ~17 µs a message
// against ~7 µs through a consumer). A page of 64 events, what a lane
// reads, took 1.15 ms by direct batch and 1.9 ms by consumer; 500 took
// ~5 ms and ~4 ms; counting one type in 5,000 (headers only) ~85 ms and
// ~36 ms. So pages are direct batches, with the type filter run here on
// the headers, and CountEvents over a long range uses a headers-only
// consumer.

// maxScan bounds how many events one Events call walks past, as Badger's
// does, so a lane far behind on a type it rarely matches yields between
// pages; maxBatch and maxBatchBytes bound one direct get batch.
const (
	maxScan       = 8192
	maxBatch      = 1024
	maxBatchBytes = 8 << 20
)

// scanEvents walks the stored events with from <= seq <= to in seq order, at
// most n of them, handing each to fn until fn returns false. It returns
// the seq to continue from: one past the last message handed to fn, to+1
// once to is passed, or one past what this node knows exists (stored) once
// the stream has nothing more.
func (s *Store) scanEvents(from, to uint64, n int, fn func(g *getMsg) bool) (next uint64, err error) {
	next = from
	head := s.stored()
	for next <= to && n > 0 {
		batch := int(min(uint64(n), to-next+1, maxBatch))
		got, stopped := 0, false
		pending, err := s.directBatch(next, batch, func(g *getMsg) bool {
			if g.seq > to {
				next, stopped = to+1, true
				return false
			}
			got++
			n--
			next = g.seq + 1
			if !fn(g) {
				stopped = true
			}
			return !stopped
		})
		switch {
		case err != nil:
			return next, err
		case stopped:
			return next, nil
		case got == batch || pending > 0:
			continue // a full batch, or one cut short by max_bytes
		case next > min(to, head):
			return next, nil // nothing more yet
		}
		// The replica has nothing at or after next, though the head says
		// there is: it may be behind its leader. Ask the leader.
		g, err := s.leaderGet(s.opts.Stream, next, true, "")
		if errors.Is(err, errNoMsg) {
			return min(to, head) + 1, nil // deleted (compacted) up to the end
		}
		if err != nil {
			return next, err
		}
		if g.seq > to {
			return to + 1, nil
		}
		n--
		next = g.seq + 1
		if !fn(g) {
			return next, nil
		}
	}
	return min(next, to+1), nil
}

// directBatch asks the nearest replica for up to n messages from seq on
// and hands each to fn until it returns false (the rest of the answer is
// drained). pending is what the server says is left after the batch.
func (s *Store) directBatch(seq uint64, n int, fn func(*getMsg) bool) (pending uint64, err error) {
	inbox := s.nc.NewRespInbox()
	sub, err := s.nc.SubscribeSync(inbox)
	if err != nil {
		return 0, err
	}
	defer sub.Unsubscribe()
	req := fmt.Appendf(nil, `{"seq":%d,"batch":%d,"max_bytes":%d}`, seq, n, maxBatchBytes)
	if err := s.nc.PublishRequest(s.lg.api+"DIRECT.GET."+s.opts.Stream, inbox, req); err != nil {
		return 0, err
	}
	want := true
	for {
		m, err := sub.NextMsg(s.opts.RequestTimeout)
		if err != nil {
			return 0, err
		}
		if len(m.Data) == 0 {
			switch st := hval(m.Header, "Status"); st {
			case "":
			case "204": // end of batch
				pending, _ = strconv.ParseUint(hval(m.Header, "Nats-Num-Pending"), 10, 64)
				return pending, nil
			case "404": // nothing at or after seq
				return 0, nil
			case "503":
				return 0, nats.ErrNoResponders
			default:
				return 0, fmt.Errorf("direct get batch: status %s %s", st, hval(m.Header, "Description"))
			}
		}
		if !want {
			continue
		}
		m.Data = m.Data[:len(m.Data):len(m.Data)]
		g, err := directMsg(m)
		if err != nil {
			return 0, err
		}
		want = fn(g)
	}
}

// Events returns up to limit events with from <= seq <= to whose type
// satisfies match (nil: all), and the seq to continue from. Fewer than
// limit with next <= to means the scan stopped at its bound (maxScan
// events walked, or the end of what this node has seen).
func (s *Store) Events(from, to uint64, limit int, match queue.Match) (evs []*queue.Event, next uint64, err error) {
	if s.closed.Load() {
		return nil, from, queue.ErrClosed
	}
	from = max(from, s.lg.low.Load())
	if from > to || limit <= 0 {
		return nil, from, nil
	}
	n := maxScan
	if match == nil {
		n = min(limit, maxScan)
	}
	var tenant, typ []byte
	var derr error
	next, err = s.scanEvents(from, to, n, func(g *getMsg) bool {
		if match != nil {
			typ = append(typ[:0], hval(g.hdr, hdrType)...)
			tenant = append(tenant[:0], hval(g.hdr, hdrTenant)...)
			if !match(tenant, typ) {
				return true
			}
		}
		ev, err := decodeEvent(g.seq, g.subject, g.hdr, g.data)
		if err != nil {
			derr = err
			return false
		}
		evs = append(evs, ev)
		return len(evs) < limit
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return evs, next, s.readErr("read events", err)
	}
	return evs, next, nil
}

// CountEvents counts the events with from <= seq <= to whose type
// satisfies match (nil: all, by arithmetic, as Badger does), stopping once
// the count passes limit. A long range is counted with a headers-only
// consumer, a short one with direct batches (see Range reads).
func (s *Store) CountEvents(from, to uint64, match queue.Match, limit int) (int, error) {
	if s.closed.Load() {
		return 0, queue.ErrClosed
	}
	from = max(from, s.lg.low.Load())
	if from > to {
		return 0, nil
	}
	if match == nil {
		return int(min(to-from+1, uint64(limit)+1)), nil
	}
	if head := s.stored(); min(to, head) >= from+countByConsumer {
		// The consumer counts what it can; whatever it leaves (it failed,
		// or did not answer in time: a consumer just made may not answer
		// at first) the direct batches count.
		n, next, err := s.countConsumer(from, min(to, head), match, limit)
		if err != nil {
			s.log.Debug("count events: consumer failed; counting the rest by direct gets", "stream", s.opts.Stream, "from", next, "err", err)
		}
		if n > limit || next > to {
			return n, nil
		}
		m, err := s.countDirect(next, to, match, limit-n)
		return n + m, err
	}
	return s.countDirect(from, to, match, limit)
}

// countByConsumer is the range from which counting pays for a consumer.
const countByConsumer = 512

// countDirect counts with direct get batches.
func (s *Store) countDirect(from, to uint64, match queue.Match, limit int) (int, error) {
	count := 0
	var tenant, typ []byte
	for next := from; next <= to && count <= limit; {
		n, err := s.scanEvents(next, to, maxScan, func(g *getMsg) bool {
			typ = append(typ[:0], hval(g.hdr, hdrType)...)
			tenant = append(tenant[:0], hval(g.hdr, hdrTenant)...)
			if match(tenant, typ) {
				count++
			}
			return count <= limit
		})
		if err != nil {
			return count, s.readErr("count events", err)
		}
		if n == next {
			break // nothing more stored
		}
		next = n
	}
	return count, nil
}

// countConsumer counts [from, to] (to <= head: it is stored, unless
// compacted) with a headers-only ordered consumer made for the call, and
// returns the seq it got to (to+1 when it counted the whole range).
func (s *Store) countConsumer(from, to uint64, match queue.Match, limit int) (count int, next uint64, err error) {
	next = from
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RequestTimeout)
	defer cancel()
	cons, err := s.js.OrderedConsumer(ctx, s.opts.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{s.evSubj + ">"},
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       from,
		HeadersOnly:       true,
		InactiveThreshold: 30 * time.Second, // if the delete below is lost
		MaxResetAttempts:  1,
	})
	if err != nil {
		return 0, next, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return 0, next, err
	}
	defer func() {
		it.Stop()
		if info := cons.CachedInfo(); info != nil {
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.RequestTimeout)
			_ = s.js.DeleteConsumer(ctx, s.opts.Stream, info.Name)
			cancel()
		}
	}()
	var tenant, typ []byte
	for count <= limit && next <= to {
		m, err := it.Next(jetstream.NextMaxWait(min(s.opts.RequestTimeout, 2*time.Second)))
		if err != nil {
			return count, next, err
		}
		md, err := m.Metadata()
		if err != nil {
			return count, next, err
		}
		seq := md.Sequence.Stream
		if seq > to {
			return count, to + 1, nil
		}
		next = seq + 1
		typ = append(typ[:0], hval(m.Headers(), hdrType)...)
		tenant = append(tenant[:0], hval(m.Headers(), hdrTenant)...)
		if match(tenant, typ) {
			count++
		}
		if md.NumPending == 0 {
			return count, to + 1, nil // nothing stored after seq
		}
	}
	return count, next, nil
}
