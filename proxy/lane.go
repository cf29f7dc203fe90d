package proxy

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

// pageSize is how many events a lane that fell behind reads from the log at
// a time. Bodies read from disk are per lane, so this bounds a lagging
// lane's memory (with its cap).
const pageSize = 64

// A lane is everything one subscription consumes: its place in the log, its
// in-flight window (never more than the cap), and its retry schedule. A lane
// is not a goroutine: it is pumped when something changes (a commit, a
// completion, a due retry), so an idle lane costs only its struct and
// 50,000 of them fit in memory.
//
// Cursor rule: every entitled event at or below cursor is resolved (acked,
// scheduled for retry, or dead-lettered, durably written). The cursor is
// the lowest unresolved seq - 1; it moves only forward.
type lane struct {
	e  *engine
	id string

	mu       sync.Mutex
	sub      *Subscription
	match    queue.Match
	fromSeq  uint64 // first entitled seq (membership cutoff)
	until    uint64 // last entitled seq when left
	next     uint64 // next seq to look at
	buf      []*queue.Event
	window   []slot // fresh deliveries in flight, in seq order
	retrying map[uint64]struct{}
	// ahead: seqs above the cursor this process started from that already
	// have a retry record (see queue.RetrySummary.Ahead); nil almost always.
	ahead map[uint64]struct{}
	// unrecorded holds attempts whose outcome could not be written yet;
	// nil almost always.
	unrecorded []unrecorded
	inFlight   int
	cursor     uint64
	nextDue    time.Time // earliest known scheduled retry; zero when none is known
	// timerAt is the unix nanos of the lane's live timer entry (0: none);
	// guarded by the timer heap's mu, not by l.mu.
	timerAt int64
	// memo is what the lane remembers to keep periodic reads small; nil
	// until a quota check or a scrape needs it (most idle lanes never do).
	memo *laneMemo
	// activity is the lane's last attempts and its charts' series
	// (attempts.go); nil until its first attempt.
	activity *activity
	pausedBy string // why deliveries are paused at run time (410 Gone, an operator)
	// The flags sit together so that they pack into one word with leaving:
	// apart, their padding cost 24 bytes, and with 50,000 lanes the struct
	// must stay in the 384-byte size class (docs/benchmarks.md, lanes-50k).
	left    bool        // removed from the config: drains up to until, then retires
	dirty   bool        // in the dirty set: the cursor moved since the last flush
	hungry  bool        // parked in the feed until a commit wakes it
	retired bool        // drained and forgotten
	foreign bool        // fleet mode: another node owns the lane (or none yet); it sends nothing
	leaving atomic.Bool // mirrors left, for lock-free scans
	// releasing is set by Release before it waits for mu, and cleared by
	// takeOver: a lane that holds mu through a slow store write (unrecorded
	// outcomes, retried while the shared log fails over) must not start
	// deliveries once that write returns, after its lease was lost.
	releasing atomic.Bool

	// Per-subscription policies, owned by the lane (used under mu).
	breaker *policy.Breaker // nil until first used: see brk
	limiter *rate.Limiter   // nil: unlimited
	auto    *policy.AutoCap // nil: static MaxConcurrency

	metrics   atomic.Pointer[laneMetrics] // series handles, made on first use
	horizon   atomic.Int64                // a time.Duration; see farAhead
	saved     atomic.Uint64               // the cursor last written to the log
	scheduled atomic.Int64                // retry records in the log

	delivered, retried, deadLettered, attempts atomic.Uint64
	deferred, shortCircuits, rateLimited       atomic.Uint64
	quotaRejections                            atomic.Uint64 // dead letters with reason backlog_quota
	lastStatus                                 atomic.Int64
}

type slot struct {
	seq  uint64
	done bool
}

// job is one delivery attempt.
type job struct {
	lane    *lane
	sub     *Subscription
	ev      *queue.Event
	retry   *queue.Retry // the record this attempt came from; nil for a first attempt
	attempt int          // 1 for the first try
	first   time.Time    // when attempt 1 started
	started time.Time    // when this attempt started
	probe   bool         // the breaker's half-open probe
}

func newLane(e *engine, m queue.Membership, sub *Subscription) *lane {
	l := &lane{
		e: e, id: m.Subscription, sub: sub, match: e.feed.matcherFor(sub),
		fromSeq: m.From, left: m.Left, until: m.Until, next: m.Cursor + 1, cursor: m.Cursor,
	}
	l.saved.Store(m.Cursor)
	l.leaving.Store(m.Left)
	l.pausedBy = m.Paused
	l.foreign = e.fleet != nil // until the lease is gained
	l.setPolicies(sub)
	return l
}

// setPolicies (re)creates the lane's breaker, rate limiter and auto cap for
// sub, keeping each one whose settings did not change (a reload must not
// close an open breaker).
func (l *lane) setPolicies(sub *Subscription) {
	old := l.sub
	now := l.e.now
	if l.breaker != nil && old.Breaker != sub.Breaker {
		l.breaker = nil // made again, with the new settings, when next used
	}
	if l.limiter == nil || old.Rate != sub.Rate {
		l.limiter = nil
		if sub.Rate.PerSecond > 0 {
			l.limiter = rate.NewLimiter(rate.Limit(sub.Rate.PerSecond), max(sub.Rate.Burst, 1))
		}
	}
	switch {
	case sub.Auto == nil:
		l.auto = nil
	case l.auto == nil || old.Auto == nil || *old.Auto != *sub.Auto:
		l.auto = policy.NewAutoCap(*sub.Auto, now)
	}
	l.horizon.Store(int64(horizon(sub)))
	// Written only when it differs, before the lane hands sub to a job: a
	// Subscription handed over again by Reload is being read by the
	// lane's jobs meanwhile (as withDefaults).
	if b := l.e.bulkheadOf(sub.Tenant); sub.bulkhead != b {
		sub.bulkhead = b
	}
	if old != nil && old.Tenant != sub.Tenant {
		// The attempt log names the events of the tenant it was kept
		// for; the new tenant starts with none, so it sees nothing of the
		// old tenant's events.
		l.activity = nil
	}
	// A tenant's subscription waits no longer and no deeper than its
	// tenant's bound allows, retries included: what it set can only be
	// tighter (tenantBound). Written like the bulkhead, only when it
	// differs.
	if bound := l.e.tenantBound(sub.Tenant); bound != (BacklogQuota{}) {
		if q := sub.Backlog.bounded(bound); q != sub.Backlog {
			sub.Backlog = q
		}
		if sub.Retry.MaxAge <= 0 || sub.Retry.MaxAge > bound.MaxAge {
			sub.Retry.MaxAge = bound.MaxAge
		}
	}
	l.e.egress.attach(sub) // its route and token too
	if sub.SecretExpiry != nil {
		l.e.rotating.Store(true)
	}
	if sub.Backlog.MaxEvents > 0 || sub.Backlog.MaxAge > 0 {
		l.e.quotas.Store(true)
	}
	l.sub = sub
}

// clockSlack is how far past its horizon a due time may lie before
// farAhead blames the clock: small steps (a leap second, NTP stepping a few
// seconds) must not pull a retry parked for the full cap forward.
const clockSlack = time.Minute

// horizon is the furthest ahead a lane with sub ever sets a due time: a
// retry (the backoff cap, which also caps Retry-After), the breaker's
// longest cool-down, a rate-limit wait or a 1 s back-off after an error,
// plus clockSlack. It must never be shorter than any of them, or a lane
// would wake itself in a loop; it saturates at neverFar instead of
// overflowing.
func horizon(sub *Subscription) time.Duration {
	h := max(sub.Retry.Backoff.Cap, sub.Breaker.CoolDown, sub.Breaker.MaxCoolDown, time.Second)
	if sub.Retry.Backoff.Cap <= 0 {
		h = max(h, policy.DefaultCap)
	}
	if sub.Breaker.MaxCoolDown <= 0 {
		h = max(h, policy.DefaultBreakerMaxCoolDown)
	}
	if r := sub.Rate.PerSecond; r > 0 {
		h = max(h, tokenWait(rate.Limit(r)))
	}
	return min(h, neverFar-clockSlack) + clockSlack
}

// Bounds of the wake-ups a lane arms for its rate limit. Below minWake a
// lane that cannot pass would wake itself in a tight loop; past maxWake
// a lane simply looks again (the token bucket is still refilling), so no
// computed wait, however odd the rate, parks a lane longer or overflows
// time.Duration into a negative or "for ever" due time, which farAhead
// would read as due now and the lane would spin on (a rate of 1e-300
// pinned a core, and deleting the subscription did not stop it).
const (
	minWake = time.Millisecond
	maxWake = time.Hour
)

// clampWake bounds a wait to [minWake, maxWake].
func clampWake(d time.Duration) time.Duration { return min(max(d, minWake), maxWake) }

// tokenWait is how long a bucket refilling at limit takes to earn one
// token, clamped by clampWake. The division stays in floating point
// until the clamp: converting 1s/1e-300 to a Duration overflows.
func tokenWait(limit rate.Limit) time.Duration {
	w := float64(time.Second) / float64(limit)
	if !(w < float64(maxWake)) { // also NaN, and +Inf from a zero limit
		return maxWake
	}
	return clampWake(time.Duration(w))
}

// neverFar is a horizon no due time exceeds (146 years).
const neverFar = time.Duration(1 << 62)

// farAhead reports whether due lies further ahead of now than this lane
// ever schedules anything: it was computed before the wall clock stepped
// back. The lane treats such a time as due now rather than waiting out the
// step (an hour for an hour; for ever after a clock reset). In-memory due
// times from time.Now carry a monotonic reading and never look far ahead,
// but the retry schedule keeps wall-clock due times, because they must
// survive restarts, and an injected clock (Options.Now) has no monotonic
// reading at all. Safe without l.mu.
func (l *lane) farAhead(due, now time.Time) bool {
	return due.Sub(now) > time.Duration(l.horizon.Load())
}

// dueBy reports whether something this lane scheduled for due should run
// at now: it is due, or it lies implausibly far ahead (farAhead).
func (l *lane) dueBy(due, now time.Time) bool {
	return !due.After(now) || l.farAhead(due, now)
}

// limit is the lane's concurrency cap right now.
func (l *lane) limit() int {
	if l.auto != nil {
		return l.auto.Limit()
	}
	return l.sub.MaxConcurrency
}

// brk returns the lane's breaker, made on first use: a lane that never
// dispatches (most of 50,000 idle ones) carries none, which is 240 of the
// bytes an idle lane would cost (docs/benchmarks.md, lanes-50k). l.mu is held.
func (l *lane) brk() *policy.Breaker {
	if l.breaker == nil {
		l.breaker = policy.NewBreaker(l.sub.Breaker, l.e.now)
	}
	return l.breaker
}

// breakerState is the breaker's state without making one: a lane that
// has none is closed. l.mu is held.
func (l *lane) breakerState() policy.BreakerState {
	if l.breaker == nil {
		return policy.BreakerClosed
	}
	return l.breaker.State()
}

// admit passes one delivery through the gates, in order: the process-wide
// slot, the rate limit (before a slot is really used), then the breaker
// (last, because a half-open breaker admits exactly one probe). A refusal
// undoes what earlier gates took and wakes the lane when it may pass.
func (l *lane) admit(now time.Time) (probe, ok bool) {
	e := l.e
	if !e.slots.acquire(l) {
		return false, false
	}
	b := l.sub.bulkhead
	if b != nil && !b.acquire(l) {
		e.slots.giveBack()
		return false, false
	}
	var res *rate.Reservation
	if l.limiter != nil {
		res = l.limiter.ReserveN(now, 1)
		if wait := res.DelayFrom(now); !res.OK() || wait > 0 {
			res.CancelAt(now)
			if b != nil {
				b.giveBack(e.feed)
			}
			e.slots.giveBack()
			l.rateLimited.Add(1)
			// wait is InfDuration when the reservation cannot be met.
			e.timers.add(l, now.Add(clampWake(wait)))
			return false, false
		}
	}
	ok, probe = l.brk().Allow()
	if !ok {
		if res != nil {
			res.CancelAt(now)
		}
		if b != nil {
			b.giveBack(e.feed)
		}
		e.slots.giveBack()
		l.shortCircuits.Add(1)
		l.laneMetrics(e.m).shorted.Inc()
		e.timers.add(l, l.breaker.RetryAt())
		return false, false
	}
	return probe, true
}

// mayPass reports, without taking anything, whether the breaker and the
// rate limit would let a delivery through now; when not, it arranges a
// wake-up for when they may.
func (l *lane) mayPass(now time.Time) bool {
	switch l.breakerState() {
	case policy.BreakerHalfOpen:
		return false // a probe is out; its outcome decides
	case policy.BreakerOpen:
		if at := l.breaker.RetryAt(); now.Before(at) {
			l.e.timers.add(l, at)
			return false
		}
	}
	if l.limiter != nil && l.limiter.TokensAt(now) < 1 {
		l.e.timers.add(l, now.Add(tokenWait(l.limiter.Limit())))
		return false
	}
	return true
}

// wants reports whether the lane takes events of tenant ("" for a
// platform event) and type typ: its entitlement (feed.entitlement), as the
// log applies it through l.match. It scans the (short) type list instead
// of calling match where it can, whose []byte arguments would cost an
// allocation per event per filtered lane on the hot path.
func (l *lane) wants(tenant, typ string) bool {
	if hidden(l.id, typ) { // operational events are the operational lane's (operational.go)
		return false
	}
	if l.match == nil {
		return true
	}
	if l.sub.Tenant != "" || l.sub.typePatterns() {
		// match does not keep its arguments: views of the strings' bytes
		// are safe and cost no allocation.
		return l.match(unsafe.Slice(unsafe.StringData(tenant), len(tenant)), unsafe.Slice(unsafe.StringData(typ), len(typ)))
	}
	return slices.Contains(l.sub.Types, typ)
}

func (l *lane) paused() bool { return l.sub.Paused || l.pausedBy != "" }

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
					OrderingKey: dl.OrderingKey, TraceParent: dl.TraceParent, TraceState: dl.TraceState, Tenant: dl.Tenant}, nil
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

// limitSeq is the last seq this lane may consume now.
func (l *lane) limitSeq() uint64 {
	h := l.e.feed.head.Load()
	if l.left {
		return min(h, l.until)
	}
	return h
}

// nextFresh returns the next entitled event not yet dispatched. An event
// whose first attempt already failed before a restart is passed over: its
// retry record delivers it (a delivery is in flight in one place at a
// time), and the
// cursor may move past it, since it is resolved.
func (l *lane) nextFresh() *queue.Event {
	for {
		ev := l.nextInLog()
		if ev == nil || l.ahead == nil {
			return ev
		}
		if _, ok := l.ahead[ev.Seq]; !ok {
			return ev
		}
		delete(l.ahead, ev.Seq)
		if len(l.ahead) == 0 {
			l.ahead = nil
		}
	}
}

// nextInLog returns the next entitled event past l.next, from the in-memory
// ring when the lane keeps up, else from the log a page at a time.
func (l *lane) nextInLog() *queue.Event {
	for {
		if len(l.buf) > 0 {
			ev := l.buf[0]
			l.buf[0] = nil
			l.buf = l.buf[1:]
			if l.sub.Tenant != "" && !l.e.feed.entitled(l.sub.Tenant, ev.Tenant, ev.Type) {
				// Read before the subscription moved to this tenant: the
				// cursor passes it, as a filtered event: a tenant's
				// subscription receives only its tenant's events.
				continue
			}
			return ev
		}
		limit := l.limitSeq()
		if l.next > limit {
			return nil
		}
		if l.match != nil && !l.e.feed.seenSince(l.sub.Types, l.next) {
			// None of this lane's types was committed since it last
			// looked: skip to the head without reading a thing.
			l.next = limit + 1
			return nil
		}
		if ev, ok := l.e.feed.ring.get(l.next); ok {
			l.next++
			if l.wants(ev.Tenant, ev.Type) {
				l.took(ev.Seq)
				if l.sub.passes(ev) {
					return ev
				}
				// Filtered out: resolved for this lane, as an event of
				// another type is (the cursor passes it).
			}
			continue
		}
		evs, next, err := l.e.store.Events(l.next, limit, pageSize, l.match)
		if err != nil && l.skipCorrupt(err, limit) {
			continue
		}
		if err != nil {
			l.e.log.Error("read log", "subscription", l.id, "seq", l.next, "err", err)
			l.e.timers.add(l, l.e.now().Add(time.Second))
			return nil
		}
		l.next = max(next, l.next)
		for _, ev := range evs {
			l.took(ev.Seq)
		}
		evs = hideOperational(l.id, evs) // as wants does (operational.go)
		if l.sub.Filter != nil {
			kept := evs[:0]
			for _, ev := range evs {
				if l.sub.passes(ev) {
					kept = append(kept, ev)
				}
			}
			clear(evs[len(kept):])
			evs = kept
		}
		l.buf = evs
		if len(evs) == 0 && l.next > limit {
			return nil
		}
	}
}

// laneMemo is what a lane remembers so that periodic reads cost what
// changed, not the whole backlog.
type laneMemo struct {
	// Of the events in [next, backlogTo], backlogN match a filtered lane's
	// types: the backlog quota counts only what was appended since, not
	// the whole backlog every second.
	backlogTo uint64
	backlogN  int64
	// When the event oldestSeq (the one just past the cursor) was
	// accepted: a scrape reads the log only for lanes whose cursor moved
	// since the last one.
	oldestSeq uint64
	oldestAt  int64
	// ord is the per-key ordering state of an ordered lane (ordering.go);
	// here, not in lane, which is at its 384-byte size class.
	ord *ordering
	// lettersAtTrim is the lane's dead-letter count at its last trim
	// (trimLetters, tenant.go).
	lettersAtTrim uint64
}

// memoized returns l.memo, made on first use. l.mu is held.
func (l *lane) memoized() *laneMemo {
	if l.memo == nil {
		l.memo = &laneMemo{}
	}
	return l.memo
}

// took notes that a matching event left the part of the log past next
// (backlogN counts only that part). l.mu is held.
func (l *lane) took(seq uint64) {
	if m := l.memo; m != nil && seq <= m.backlogTo && m.backlogN > 0 {
		m.backlogN--
	}
}

// waiting counts the entitled events past next, up to limit: arithmetic
// for a lane of all types; for a filtered one, backlogN brought up to date
// by counting only the events appended since it was last brought up to
// date. l.mu is held.
func (l *lane) waiting(limit uint64) (int64, error) {
	if limit < l.next {
		return 0, nil
	}
	if l.match == nil {
		return int64(limit - l.next + 1), nil
	}
	m := l.memoized()
	if m.backlogTo+1 < l.next {
		m.backlogTo, m.backlogN = l.next-1, 0 // nothing counted is past next
	}
	if limit > m.backlogTo {
		n, err := l.e.store.CountEvents(m.backlogTo+1, limit, l.match, math.MaxInt-1)
		if err != nil {
			return 0, err
		}
		m.backlogTo, m.backlogN = limit, m.backlogN+int64(n)
	}
	return m.backlogN, nil
}

// updateCursor moves the cursor over resolved deliveries.
func (l *lane) updateCursor() {
	i := 0
	for i < len(l.window) && l.window[i].done {
		i++
	}
	if i > 0 {
		l.window = append(l.window[:0], l.window[i:]...)
	}
	c := l.next - 1
	if len(l.buf) > 0 {
		c = l.buf[0].Seq - 1
	}
	if len(l.window) > 0 {
		c = min(c, l.window[0].seq-1)
	}
	if f, ok := l.parkedFloor(); ok {
		c = min(c, f-1) // a parked event is unresolved (ordering.go)
	}
	if c > l.cursor {
		l.cursor = c
		if !l.dirty {
			l.dirty = true
			l.e.dirty.mark(l)
		}
	}
}

// enforceQuota dead-letters the oldest waiting events past the backlog
// quota (reason backlog_quota), whatever the breaker or the cap say: a
// black-holed lane must not grow without bound. Events already in flight or
// scheduled for retry are not counted.
func (l *lane) enforceQuota(now time.Time) {
	e := l.e
	l.mu.Lock()
	defer l.mu.Unlock()
	// l.sub is read under mu: Reload replaces it (setPolicies, under mu)
	// while this runs on the maintenance goroutine.
	q := l.sub.Backlog
	if q.MaxEvents <= 0 && q.MaxAge <= 0 {
		return
	}
	if l.foreign {
		return // its owner enforces it
	}
	var excess int64
	if q.MaxEvents > 0 {
		n, err := l.waiting(l.limitSeq())
		if err != nil {
			e.log.Error("count backlog", "subscription", l.id, "err", err)
			return
		}
		excess = n + int64(len(l.buf)) + int64(l.parkedCount()) - q.MaxEvents
	}
	rejected := l.quotaRejections.Load()
	// An ordered lane's parked events are its oldest waiting (ordering.go).
	ok := l.quotaParked(now, q, &excess)
	for ok {
		ev := l.nextFresh()
		if ev == nil {
			break
		}
		old := q.MaxAge > 0 && now.Sub(ev.AcceptedAt) > q.MaxAge
		if excess <= 0 && !old {
			l.unread(ev)
			break
		}
		o := queue.Outcome{Kind: queue.DeadLettered, Subscription: l.id, Seq: ev.Seq, At: now,
			DeadLetter: newDeadLetter(l.id, l.sub.Tenant, ev, policy.ReasonBacklogQuota, 0, policy.Exchange{}, "", now)}
		if err := l.record(o); err != nil {
			e.log.Error("dead-letter over quota", "subscription", l.id, "seq", ev.Seq, "err", err)
			l.unread(ev)
			break
		}
		l.resolved(nil, o)
		l.quotaRejections.Add(1)
		e.m.rejections.WithLabelValues(l.id, policy.ReasonBacklogQuota).Inc()
		excess--
	}
	e.ops.quotaExceeded(l.id, l.quotaRejections.Load()-rejected, q, now)
	l.updateCursor()
}

// drained reports whether a lane that left has resolved everything it was
// entitled to, retries included.
func (l *lane) drainedLocked() bool {
	return l.left && l.cursor >= l.until && l.inFlight == 0 && len(l.retrying) == 0 && len(l.unrecorded) == 0 && l.nextDue.IsZero()
}

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
