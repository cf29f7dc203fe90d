package delivery

import (
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/policy"
)

// The gates a delivery passes (slot, bulkhead, rate limit, breaker), and
// how far ahead the wake-ups a lane arms may lie.

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

// maxAnnouncedHold bounds how long an endpoint's announced reset holds a
// lane at once: a longer one (a daily quota) is held this long, and the
// next response says again how long is left.
const maxAnnouncedHold = time.Hour

// endpointHold is how an endpoint's announced limit (RateLimit,
// X-RateLimit-*: policy.ParseAnnounced) holds a lane: until when, by
// which header fields, and how many dispatches it held back. Used under
// the lane's mu.
type endpointHold struct {
	until time.Time
	by    string
	count uint64
}

// hold is the lane's endpointHold, nil when its endpoint never said it
// takes no more. l.mu is held.
func (l *lane) hold() *endpointHold {
	if l.memo == nil {
		return nil
	}
	return l.memo.held
}

// holding reports whether the endpoint's announced limit holds the lane at
// now, and if so arms a wake-up: at the hold's end, or within the lane's
// horizon when that is sooner, so that the wake-up never looks like a time
// the clock stepped back from (dueBy would run it at once, and the lane
// would spin). The horizon stays the retries' own: widening it to the
// hour a hold may last would make a clock stepped back an hour stall
// retries for that hour. A hold further ahead than it can be was made
// before the clock stepped back, and ends. l.mu is held.
func (l *lane) holding(now time.Time) bool {
	h := l.hold()
	if h == nil || !now.Before(h.until) {
		return false
	}
	left := h.until.Sub(now)
	if left > maxAnnouncedHold+clockSlack {
		h.until = time.Time{}
		return false
	}
	wake := h.until
	if within := time.Duration(l.horizon.Load()) - clockSlack; within > 0 && left > within {
		wake = now.Add(within)
	}
	l.e.timers.add(l, wake)
	return true
}

// noteAnnounced holds the lane until the reset when a response said the
// endpoint takes no more (any response: an acknowledgement as much as a
// 429). It only ever holds back: it never sends faster than the
// subscription's own rate. l.mu is held.
func (l *lane) noteAnnounced(res result, now time.Time) {
	a := res.announced
	if !res.announcedOK || !a.Exhausted() || a.Reset <= 0 {
		return
	}
	m := l.memoized()
	if m.held == nil {
		m.held = &endpointHold{}
	}
	if until := now.Add(min(a.Reset, maxAnnouncedHold)); until.After(m.held.until) {
		m.held.until, m.held.by = until, a.Source
	}
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

// admit passes one delivery through the gates, in order: the endpoint's
// announced limit (noteAnnounced), the process-wide slot, the rate limit (before a slot is really used), then the breaker
// (last, because a half-open breaker admits exactly one probe). A refusal
// undoes what earlier gates took and wakes the lane when it may pass.
func (l *lane) admit(now time.Time) (probe, ok bool) {
	e := l.e
	if l.holding(now) {
		l.hold().count++
		return false, false
	}
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
	if l.holding(now) {
		return false
	}
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
