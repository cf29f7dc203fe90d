package jetstream

// The log side's follower: the ordered consumer that reads every event
// any node appends, the head it moves over each seq in order, handing the
// events to OnCommit, and the appends that wait for it to reach their seq.

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
