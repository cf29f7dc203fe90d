package delivery

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// Per-key ordering.
//
// A subscription with `ordering: key` receives the events that share an
// ordering key (the producer's Ordering-Key header, queue.Event.OrderingKey)
// strictly in acceptance order: the event after k is not sent before k is
// acknowledged or dead-lettered, and a retry of k holds back the rest of
// its key until it resolves. Different keys run in parallel, up to the
// cap. Events without a key are not ordered: they go as if the
// subscription had no ordering. `ordering: fifo` is one key for the whole
// subscription, keyed or not: one delivery in flight at a time, in seq
// order.
//
// The state lives in the lane, under its mu, and costs what is active,
// not every key ever seen:
//
//   - keys maps each active key to the event that holds it (in flight,
//     scheduled for retry, or ready to go) and the seqs of its events the
//     lane read past while it was held. A key leaves the map when its last
//     such event resolves.
//   - parked holds those read-past events by seq (with the key and the
//     acceptance time, never the body): at most maxParked per lane. The
//     event stays in the log; when its key's turn comes it is read again
//     (from the ring, else one point read) and goes out as a first attempt.
//   - ready is the parked events whose turn came, waiting for a slot; they
//     go before anything the lane has not read yet.
//
// The cursor rule holds as it is: a parked event is unresolved, so the
// cursor stays below the oldest one (updateCursor), and nothing about
// parking is written. After a crash or a restart the lane reads the log
// again from its cursor, and rebuilds which keys are held from the retry
// schedule (rebuildOrder): each retry record but a replay's holds its
// event's key. Events above the cursor with a retry record are passed over
// as fresh attempts, as before (queue.RetrySummary.Ahead); the rest go
// through the key gate again. The price: a key held for long (a retry
// backing off) pins the lane's cursor at its first parked event, so a crash
// resends everything the lane acknowledged since (at-least-once; the
// receiver deduplicates on webhook-id), and compaction waits for it as for
// any backlog. Such a copy waits behind whatever holds its key after the
// restart, which may be the retry of a later event of the key: the copy
// then arrives after it. No event is ever sent before the one ahead of it
// in its key was resolved; only copies of resolved ones come late. (Not
// resending them at all would need to know that ordering was on, in the
// same mode, when the later event went out: a reload may have switched it,
// and skipping an event that was in fact unresolved would lose it.)
//
// Bounds (head-of-line blocking beyond them, by design): when the next
// event belongs to a held key and maxParked events are parked already, or
// belongs to a new key while maxOrderKeys keys are held, the lane stops
// reading the log until a key resolves; until then events of free keys
// wait behind it. The events past that point wait on disk, never in
// memory queues:
// the lane holds at most one page of them in memory.
//
// Interactions:
//   - the breaker: an open breaker holds every key (nothing is sent; the
//     retries and the parked events wait);
//   - the retry budget: a deferred retry holds its key for longer, and the
//     key's later events wait with it;
//   - the backlog quota: parked events count as waiting, and the oldest
//     waiting events are dead-lettered first, parked ones included; a
//     dead-lettered event counts as resolved, so the next event of its key
//     may go;
//   - replays: a replayed dead letter goes out on its own, outside its
//     key's order, and says so (HeaderReplay); its retry records hold no
//     key;
//   - reloads: a reload that keeps the mode keeps the state. One that
//     changes it takes effect once the deliveries in flight finish: the
//     lane starts nothing meanwhile, then rebuilds the held keys from the
//     retry schedule. Turning ordering off sends the parked events at once.
//     Retries scheduled before ordering was turned on keep their own due
//     times: order holds among the events sent after.

// Ordering modes (Subscription.Ordering).
const (
	OrderingNone = "none" // the default ("" means it too): no ordering
	OrderingKey  = "key"  // per Ordering-Key; events without one are not ordered
	OrderingFIFO = "fifo" // one key for the whole subscription
)

// Headers of deliveries to an ordered subscription.
const (
	// HeaderOrderingKey carries the event's ordering key, on deliveries to
	// an ordered subscription of an event that has one.
	HeaderOrderingKey = "Ordering-Key"
	// HeaderReplay is "true" on a delivery of a replayed dead letter
	// (every subscription): it goes out on its own, outside its key's
	// order.
	HeaderReplay = "X-Sluice-Replay"
)

// Bounds of one ordered lane's state (see above).
const (
	// maxParked is how many events a lane reads past while their key is
	// held, and remembers by seq (about 40 bytes each).
	maxParked = 1024
	// maxOrderKeys is how many keys a lane holds at once (about 100 bytes
	// each): keys with an event in flight, scheduled for retry or ready.
	maxOrderKeys = 16384
)

// orderingMode is s's mode: OrderingKey, OrderingFIFO, or "" for none
// (config refuses any other value).
func (s *Subscription) orderingMode() string {
	switch s.Ordering {
	case OrderingKey, OrderingFIFO:
		return s.Ordering
	}
	return ""
}

// ordering is one lane's per-key ordering state. l.mu guards it.
type ordering struct {
	// mode is OrderingKey or OrderingFIFO; "" once a reload turned
	// ordering off, until the parked events are sent.
	mode string
	// stale: the held keys must be rebuilt from the retry schedule before
	// the lane starts anything (a new lane, a takeover, a mode change).
	stale bool
	// blocked: the lane stopped reading at a bound, and has read nothing
	// past it since (for the status and the gauge).
	blocked bool
	keys    map[string]*orderKey
	parked  []parkedEvent // seq order
	ready   []uint64      // seq order; each is also in parked
}

// orderKey is one held key.
type orderKey struct {
	// seq is the event holding the key (in flight, scheduled for retry, or
	// ready); 0 when only more hold it.
	seq uint64
	// more are further holders: retries scheduled before ordering was on
	// (rebuildOrder); nil otherwise.
	more []uint64
	// queue is the key's parked events after the holder, in seq order.
	queue []uint64
}

// parkedEvent is an event read past while its key was held.
type parkedEvent struct {
	seq uint64
	at  int64  // accepted at, unix nanos: the backlog quota's age
	key string // the event's OrderingKey; its gate key follows the mode
}

// gate returns the key an event with ordering key raw waits on, and
// whether it waits on one at all.
func (o *ordering) gate(raw string) (string, bool) {
	switch o.mode {
	case OrderingFIFO:
		return "", true
	case OrderingKey:
		return raw, raw != ""
	}
	return "", false
}

// drop removes seq from the key's holders; false if it held nothing.
func (h *orderKey) drop(seq uint64) bool {
	switch i := slices.Index(h.more, seq); {
	case h.seq == seq && seq != 0:
		h.seq = 0
	case i >= 0:
		h.more = slices.Delete(h.more, i, i+1)
	default:
		return false
	}
	if h.seq == 0 && len(h.more) > 0 {
		h.seq, h.more = h.more[0], h.more[1:]
	}
	if len(h.more) == 0 {
		h.more = nil
	}
	return true
}

// hold adds seq as a holder of key k.
func (o *ordering) hold(k string, seq uint64) {
	h := o.keys[k]
	switch {
	case h == nil:
		o.keys[k] = &orderKey{seq: seq}
	case h.seq == 0:
		h.seq = seq
	default:
		h.more = append(h.more, seq)
	}
}

// release lets go of key k held by seq, which resolved: the key's next
// parked event becomes ready, or the key is forgotten. It reports whether
// an event became ready.
func (o *ordering) release(k string, seq uint64) bool {
	h := o.keys[k]
	if h == nil || !h.drop(seq) || h.seq != 0 {
		return false
	}
	if len(h.queue) == 0 {
		delete(o.keys, k)
		return false
	}
	h.seq = h.queue[0]
	h.queue = h.queue[1:]
	if len(h.queue) == 0 {
		h.queue = nil
	}
	o.ready = insertSeq(o.ready, h.seq)
	o.blocked = false
	return true
}

// park remembers ev, read past while its key (held by h) is busy.
func (o *ordering) park(h *orderKey, ev *queue.Event) {
	h.queue = append(h.queue, ev.Seq)
	o.parked = append(o.parked, parkedEvent{seq: ev.Seq, at: ev.AcceptedAt.UnixNano(), key: ev.OrderingKey})
}

// unpark forgets the parked event seq.
func (o *ordering) unpark(seq uint64) {
	if i, ok := slices.BinarySearchFunc(o.parked, seq, func(p parkedEvent, s uint64) int { return cmp.Compare(p.seq, s) }); ok {
		o.parked[i] = parkedEvent{}
		o.parked = slices.Delete(o.parked, i, i+1)
	}
}

// insertSeq inserts seq into the sorted s.
func insertSeq(s []uint64, seq uint64) []uint64 {
	i, _ := slices.BinarySearch(s, seq)
	return slices.Insert(s, i, seq)
}

// insertSlot adds a fresh delivery to the window, which stays in seq order:
// a parked event's turn comes after later events went out.
func insertSlot(w []slot, seq uint64) []slot {
	i := len(w)
	for i > 0 && w[i-1].seq > seq {
		i--
	}
	return slices.Insert(w, i, slot{seq: seq})
}

// keyHeldBy finds the key seq holds (for a retry whose event is gone, so
// its key cannot be read): a scan, on a path that should never run.
func (o *ordering) keyHeldBy(seq uint64) (string, bool) {
	for k, h := range o.keys {
		if h.seq == seq || slices.Contains(h.more, seq) {
			return k, true
		}
	}
	return "", false
}

// order returns the lane's ordering state, made when its subscription is
// ordered and it has none (stale, to be rebuilt), and following a reload
// that changed the mode; nil for an unordered lane. l.mu is held.
func (l *lane) order() *ordering {
	want := l.sub.orderingMode()
	o := l.ordState()
	switch {
	case o == nil && want == "":
		return nil
	case o == nil:
		o = &ordering{mode: want, stale: true}
		l.memoized().ord = o
	case o.mode != want && want == "":
		// Turned off: what was parked goes as soon as slots allow, in seq
		// order, and nothing waits on a key any more.
		o.mode, o.stale, o.blocked, o.keys = "", false, false, nil
		o.ready = o.ready[:0]
		for _, p := range o.parked {
			o.ready = append(o.ready, p.seq)
		}
	case o.mode != want:
		o.mode, o.stale = want, true // regated by rebuildOrder
	}
	if o.mode == "" && len(o.parked) == 0 {
		l.memo.ord = nil
		return nil
	}
	return o
}

// ordState is the lane's ordering state as it is, nil if none. l.mu is held.
func (l *lane) ordState() *ordering {
	if l.memo == nil {
		return nil
	}
	return l.memo.ord
}

// rebuildOrder makes o's held keys again from the retry schedule, once
// nothing is in flight: every retry record but a replay's holds its
// event's key, and the parked events are gated again in seq order (a mode
// change may have changed their keys). It reports false while it must
// wait: deliveries in flight (their finish pumps the lane again) or a
// store error (a wake-up is armed). l.mu is held.
func (l *lane) rebuildOrder(o *ordering, now time.Time) bool {
	if l.inFlight > 0 || len(l.unrecorded) > 0 {
		return false
	}
	e := l.e
	// Not math.MaxInt: a backend may size a read by limit+1.
	rs, err := e.store.Retries(l.id, 1<<30)
	if err != nil {
		e.log.Error("read retry schedule for ordering", "subscription", l.id, "err", err)
		e.timers.add(l, now.Add(time.Second))
		return false
	}
	o.keys = make(map[string]*orderKey, len(rs))
	for i := range rs {
		r := &rs[i]
		if r.Replay {
			continue // outside its key's order
		}
		ev, err := e.feed.event(r.Seq)
		if errors.Is(err, queue.ErrNotFound) {
			continue // the retry dead-letters it (event_missing); it holds nothing
		}
		if err != nil {
			e.log.Error("read event for ordering", "subscription", l.id, "seq", r.Seq, "err", err)
			e.timers.add(l, now.Add(time.Second))
			return false
		}
		if k, gated := o.gate(ev.OrderingKey); gated {
			o.hold(k, r.Seq)
		}
	}
	parked := o.parked
	o.parked, o.ready, o.blocked = nil, nil, false
	for _, p := range parked {
		o.parked = append(o.parked, p)
		k, gated := o.gate(p.key)
		if h := o.keys[k]; gated && h != nil {
			h.queue = append(h.queue, p.seq)
			continue
		}
		o.ready = append(o.ready, p.seq)
		if gated {
			o.hold(k, p.seq)
		}
	}
	o.stale = false
	return true
}

// pumpOrdered is pumpLocked's loop over new work for an ordered lane:
// ready parked events first (they are older than anything unread), then
// the log in order, each event through its key's gate. l.mu is held.
func (l *lane) pumpOrdered(o *ordering, now time.Time, limit int) {
	rechecked := false
	for l.inFlight < limit {
		if len(o.ready) > 0 {
			if !l.startReady(o, now) {
				return
			}
			continue
		}
		ev := l.nextFresh()
		if ev == nil {
			if l.parkHungry(&rechecked) {
				continue
			}
			return
		}
		k, gated := o.gate(ev.OrderingKey)
		if gated {
			if h := o.keys[k]; h != nil {
				if len(o.parked) >= maxParked {
					// Head-of-line from here: the event waits in buf (and
					// what follows it, on disk) until a key resolves; the
					// resolution pumps the lane.
					l.unread(ev)
					o.blocked = true
					return
				}
				o.park(h, ev)
				o.blocked = false // read past it: not at a bound
				continue
			}
			if len(o.keys) >= maxOrderKeys {
				l.unread(ev)
				o.blocked = true
				return
			}
		}
		probe, ok := l.admit(now)
		if !ok {
			l.unread(ev)
			return
		}
		if gated {
			o.hold(k, ev.Seq)
		}
		o.blocked = false
		l.window = append(l.window, slot{seq: ev.Seq})
		l.start(&job{lane: l, sub: l.sub, ev: ev, attempt: 1, first: now, started: now, probe: probe})
	}
}

// unread puts ev back in front of what the lane reads next.
func (l *lane) unread(ev *queue.Event) {
	l.buf = append([]*queue.Event{ev}, l.buf...)
}

// startReady starts the oldest ready parked event, as a first attempt;
// false when it cannot now (a gate refused, or the log failed and a
// wake-up is armed). l.mu is held.
func (l *lane) startReady(o *ordering, now time.Time) bool {
	e := l.e
	seq := o.ready[0]
	ev, err := e.feed.event(seq)
	if err != nil {
		// Above the cursor, so not compacted: a store error. Try again.
		e.log.Error("read parked event", "subscription", l.id, "seq", seq, "err", err)
		e.timers.add(l, now.Add(time.Second))
		return false
	}
	probe, ok := l.admit(now)
	if !ok {
		return false
	}
	o.ready = slices.Delete(o.ready, 0, 1)
	o.unpark(seq)
	l.window = insertSlot(l.window, seq)
	l.start(&job{lane: l, sub: l.sub, ev: ev, attempt: 1, first: now, started: now, probe: probe})
	return true
}

// orderResolved lets go of the key a resolved delivery held, once its
// outcome o is durable: an ACK or a dead letter frees the key's next
// event; a retry keeps the key held; a replay held nothing. j is nil for
// an outcome without an attempt (a retry whose event is gone, or the
// backlog quota's dead letter of an unread event, which held nothing).
// l.mu is held.
func (l *lane) orderResolved(j *job, o queue.Outcome) {
	ord := l.ordState()
	if ord == nil || ord.mode == "" || o.Kind == queue.RetryScheduled || (o.From != nil && o.From.Replay) {
		return
	}
	var k string
	switch {
	case j != nil:
		var gated bool
		if k, gated = ord.gate(j.ev.OrderingKey); !gated {
			return
		}
	case o.From != nil:
		var held bool
		if k, held = ord.keyHeldBy(o.Seq); !held {
			return
		}
	default:
		return
	}
	ord.release(k, o.Seq)
}

// parkedFloor is the oldest parked seq, which the cursor stays below;
// false when none is parked. l.mu is held.
func (l *lane) parkedFloor() (uint64, bool) {
	if o := l.ordState(); o != nil && len(o.parked) > 0 {
		return o.parked[0].seq, true
	}
	return 0, false
}

// parkedCount is how many events the lane holds back parked. l.mu is held.
func (l *lane) parkedCount() int {
	if o := l.ordState(); o != nil {
		return len(o.parked)
	}
	return 0
}

// quotaParked is enforceQuota's first step for an ordered lane: the
// parked events are the oldest waiting, so they are dead-lettered first
// while *excess > 0 or they are older than the quota's age. A parked event
// that was ready frees its key's next. It reports false when a write
// failed (enforceQuota stops there too). l.mu is held.
func (l *lane) quotaParked(now time.Time, q BacklogQuota, excess *int64) bool {
	e := l.e
	o := l.ordState()
	if o == nil {
		return true
	}
	freed := false
	defer func() {
		if freed {
			e.timers.add(l, now) // a key's next event is ready: pump soon
		}
	}()
	for len(o.parked) > 0 {
		p := o.parked[0]
		old := q.MaxAge > 0 && now.Sub(time.Unix(0, p.at)) > q.MaxAge
		if *excess <= 0 && !old {
			return true
		}
		ev, err := e.feed.event(p.seq)
		if err != nil {
			e.log.Error("read parked event over quota", "subscription", l.id, "seq", p.seq, "err", err)
			return false
		}
		out := queue.Outcome{Kind: queue.DeadLettered, Subscription: l.id, Seq: p.seq, At: now,
			DeadLetter: newDeadLetter(l.id, l.sub.Tenant, ev, policy.ReasonBacklogQuota, 0, policy.Exchange{}, "", now)}
		if err := l.record(out); err != nil {
			e.log.Error("dead-letter over quota", "subscription", l.id, "seq", p.seq, "err", err)
			return false
		}
		freed = o.dropParked(p) || freed
		l.resolved(nil, out)
		l.quotaRejections.Add(1)
		e.m.rejections.WithLabelValues(l.id, policy.ReasonBacklogQuota).Inc()
		*excess--
	}
	return true
}

// dropParked forgets p, resolved without being sent: a ready event lets
// go of its key (true if that made the next one ready), any other leaves
// its key's queue.
func (o *ordering) dropParked(p parkedEvent) bool {
	o.unpark(p.seq)
	if i, ok := slices.BinarySearch(o.ready, p.seq); ok {
		o.ready = slices.Delete(o.ready, i, i+1)
		if k, gated := o.gate(p.key); gated {
			return o.release(k, p.seq)
		}
		return false
	}
	if k, gated := o.gate(p.key); gated {
		if h := o.keys[k]; h != nil {
			if i := slices.Index(h.queue, p.seq); i >= 0 {
				h.queue = slices.Delete(h.queue, i, i+1)
			}
		}
	}
	return false
}

// orderingStatus is the lane's ordering state for LaneStatus; nil for an
// unordered lane. l.mu is held.
func (l *lane) orderingStatus() *api.OrderingStatus {
	mode := l.sub.orderingMode()
	o := l.ordState()
	if mode == "" && o == nil {
		return nil
	}
	st := &api.OrderingStatus{Mode: mode}
	if o != nil {
		st.ActiveKeys, st.Parked, st.Ready, st.Blocked, st.Rebuilding = len(o.keys), len(o.parked), len(o.ready), o.blocked, o.stale
	}
	return st
}

// The ordering gauges, exported for ordered lanes only (laneCollector).
var (
	descOrderKeys    = prometheus.NewDesc("sluice_lane_ordering_active_keys", "Ordering keys an ordered lane holds now: an event of each is in flight, scheduled for retry or ready.", []string{"subscription"}, nil)
	descOrderParked  = prometheus.NewDesc("sluice_lane_ordering_parked_events", "Events an ordered lane read past because their key was held (at most 1,024).", []string{"subscription"}, nil)
	descOrderBlocked = prometheus.NewDesc("sluice_lane_ordering_blocked", "1 while an ordered lane stopped reading at its parked or key bound (head-of-line blocking).", []string{"subscription"}, nil)
)

func describeOrdering(ch chan<- *prometheus.Desc) {
	ch <- descOrderKeys
	ch <- descOrderParked
	ch <- descOrderBlocked
}

// collectOrdering exports st's ordering gauges, if it is ordered.
func collectOrdering(ch chan<- prometheus.Metric, st api.LaneStatus) {
	o := st.Ordering
	if o == nil {
		return
	}
	blocked := 0.0
	if o.Blocked {
		blocked = 1
	}
	ch <- prometheus.MustNewConstMetric(descOrderKeys, prometheus.GaugeValue, float64(o.ActiveKeys), st.Subscription)
	ch <- prometheus.MustNewConstMetric(descOrderParked, prometheus.GaugeValue, float64(o.Parked), st.Subscription)
	ch <- prometheus.MustNewConstMetric(descOrderBlocked, prometheus.GaugeValue, blocked, st.Subscription)
}

// orderingHeaders adds the ordering headers to one delivery's request.
func orderingHeaders(h *fasthttp.RequestHeader, j *job) {
	if j.retry != nil && j.retry.Replay {
		h.Set(HeaderReplay, "true")
	}
	if j.ev.OrderingKey != "" && j.sub.orderingMode() != "" {
		h.Set(HeaderOrderingKey, j.ev.OrderingKey)
	}
}
