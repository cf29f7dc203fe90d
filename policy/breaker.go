package policy

import (
	"strconv"
	"sync"
	"time"
)

// Defaults for BreakerConfig. The window, volume, ratio and first
// cool-down are Hystrix's defaults (a 10s rolling window in 10 buckets, 20
// requests, 50% errors, a 5s sleep window). The consecutive-timeout trip is
// for the black hole (an endpoint that accepts the connection and never
// answers, the failure that holds a lane's slots longest), whose requests all end at the
// timeout: five in a row are evidence enough, and waiting for twenty would
// first hold twenty slots for a full timeout. The cool-down doubles per
// failed probe up to five minutes, so a dead endpoint costs one request
// every five minutes.
const (
	DefaultBreakerWindow              = 10 * time.Second
	DefaultBreakerMinRequests         = 20
	DefaultBreakerFailureRatio        = 0.5
	DefaultBreakerConsecutiveTimeouts = 5
	DefaultBreakerCoolDown            = 5 * time.Second
	DefaultBreakerMaxCoolDown         = 5 * time.Minute
)

// breakerBuckets is the number of buckets of a Breaker's window.
const breakerBuckets = 10

// BreakerState is the state of a Breaker. Its numeric values are the values
// of the sluice_breaker_state gauge, so they never change.
type BreakerState int

const (
	// BreakerClosed lets every request through.
	BreakerClosed BreakerState = 0
	// BreakerHalfOpen has let one probe through and waits for its outcome.
	BreakerHalfOpen BreakerState = 1
	// BreakerOpen lets nothing through until its cool-down has elapsed.
	BreakerOpen BreakerState = 2
)

// String returns "closed", "half_open" or "open", the names used by the
// admin API. Invalid values print as "BreakerState(N)".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerHalfOpen:
		return "half_open"
	case BreakerOpen:
		return "open"
	}
	return "BreakerState(" + strconv.Itoa(int(s)) + ")"
}

// BreakerConfig configures a Breaker. The zero value means every default:
// NewBreaker and WithDefaults give zero (or negative) fields their defaults
// one by one.
type BreakerConfig struct {
	// Window is how far back outcomes count toward the failure ratio. It is
	// kept as 10 buckets, so outcomes leave it a tenth at a time.
	// Zero means DefaultBreakerWindow. Validate accepts 1s to 10m.
	Window time.Duration

	// MinRequests is the number of outcomes the window must hold before
	// the failure ratio can trip the breaker, so that two failures out of
	// three requests do not. Zero means DefaultBreakerMinRequests.
	// Validate accepts 1 to 1,000,000.
	MinRequests int

	// FailureRatio trips the breaker when failures / outcomes in the window
	// reaches it. Zero means DefaultBreakerFailureRatio. Validate accepts
	// above 0 to 1.
	FailureRatio float64

	// ConsecutiveTimeouts trips the breaker, whatever the ratio and volume,
	// when this many timeouts arrive with no success in between.
	// Zero means DefaultBreakerConsecutiveTimeouts. Validate accepts 1 to
	// 10,000.
	ConsecutiveTimeouts int

	// CoolDown is how long the breaker stays open after tripping from
	// closed. Zero means DefaultBreakerCoolDown. Validate accepts 1ms to
	// 1h, and at most MaxCoolDown.
	CoolDown time.Duration

	// MaxCoolDown caps the cool-down, which doubles each time a half-open
	// probe fails. It also bounds how long a probe may stay unrecorded (see
	// Breaker). Zero means DefaultBreakerMaxCoolDown. Validate accepts 1ms
	// to 24h.
	MaxCoolDown time.Duration
}

// Validate reports the first field out of its bounds as a *FieldError
// whose key is in a subscription's "breaker." block, such as
// "breaker.window". It checks the values as they will be used, so a zero
// field is an error: call c.WithDefaults().Validate() when zero is meant as
// "the default". The comparisons are written so that NaN fails them.
func (c BreakerConfig) Validate() error {
	if !(c.FailureRatio > 0 && c.FailureRatio <= 1) {
		return fieldError("breaker.failure_ratio", c.FailureRatio, "must be greater than 0 and at most 1")
	}
	if err := checkCount("breaker.min_requests", c.MinRequests, maxBreakerMinRequests); err != nil {
		return err
	}
	if err := checkWindow("breaker.window", c.Window); err != nil {
		return err
	}
	if err := checkCount("breaker.consecutive_timeouts", c.ConsecutiveTimeouts, maxBreakerTimeouts); err != nil {
		return err
	}
	if err := checkDuration("breaker.cool_down", c.CoolDown, minCoolDown, maxCoolDown); err != nil {
		return err
	}
	if err := checkDuration("breaker.max_cool_down", c.MaxCoolDown, minCoolDown, maxMaxCoolDown); err != nil {
		return err
	}
	if c.CoolDown > c.MaxCoolDown {
		return fieldError("breaker.cool_down", c.CoolDown, "must not exceed breaker.max_cool_down (%v)", c.MaxCoolDown)
	}
	return nil
}

// WithDefaults returns c with every zero, negative or NaN field replaced
// by its default: the values NewBreaker runs with (which also raises
// MaxCoolDown to CoolDown when below it).
func (c BreakerConfig) WithDefaults() BreakerConfig {
	if c.Window <= 0 {
		c.Window = DefaultBreakerWindow
	}
	if c.MinRequests <= 0 {
		c.MinRequests = DefaultBreakerMinRequests
	}
	if !(c.FailureRatio > 0) { // also NaN
		c.FailureRatio = DefaultBreakerFailureRatio
	}
	if c.ConsecutiveTimeouts <= 0 {
		c.ConsecutiveTimeouts = DefaultBreakerConsecutiveTimeouts
	}
	if c.CoolDown <= 0 {
		c.CoolDown = DefaultBreakerCoolDown
	}
	if c.MaxCoolDown <= 0 {
		c.MaxCoolDown = DefaultBreakerMaxCoolDown
	}
	return c
}

// Breaker is a per-subscription circuit breaker. While it is
// open the lane dispatches nothing and holds no slots; its backlog waits on
// disk.
//
//   - Closed: every request is allowed. It trips (opens) when the failure
//     ratio over the sliding Window reaches FailureRatio with at least
//     MinRequests outcomes in the window, or at once after
//     ConsecutiveTimeouts timeouts with no success in between.
//   - Open: nothing is allowed until the cool-down has elapsed (RetryAt).
//     The first Allow after that turns the breaker half-open and admits a
//     single probe.
//   - Half-open: nothing else is allowed until the probe is Recorded. A
//     successful probe closes the breaker, empties the window and resets
//     the cool-down to CoolDown; a failed probe re-opens it for twice the
//     previous cool-down, up to MaxCoolDown.
//
// The caller must Record the outcome of every probe, whatever happened to
// it. As a safety net against a probe that is never Recorded (a bug, a
// lost goroutine), a half-open breaker admits a new probe once the
// outstanding one is MaxCoolDown old — far longer than any request timeout
// — so a lane cannot stay shut forever.
//
// The state changes only in Allow and Record: State keeps reporting open
// after the cool-down until the next Allow. A Breaker belongs to one
// subscription's dispatcher but is safe for concurrent use; Allow and
// Record take a mutex and do not allocate.
type Breaker struct {
	now func() time.Time
	cfg BreakerConfig // with defaults

	mu          sync.Mutex
	w           window // a = outcomes, b = failures
	state       BreakerState
	consecutive int           // timeouts since the last success
	coolDown    time.Duration // of the current open period, or the next
	retryAt     time.Time     // open: when a probe may start
	probeAt     time.Time     // half-open: when the outstanding probe started
	trips       int64
}

// NewBreaker returns a closed Breaker. Zero, negative and NaN fields of cfg
// take their defaults (WithDefaults), and MaxCoolDown is raised to CoolDown
// if below it; call cfg.WithDefaults().Validate() first to reject bad
// configuration instead. now is the clock; nil means time.Now.
func NewBreaker(cfg BreakerConfig, now func() time.Time) *Breaker {
	cfg = cfg.WithDefaults()
	cfg.MaxCoolDown = max(cfg.MaxCoolDown, cfg.CoolDown)
	if now == nil {
		now = time.Now
	}
	return &Breaker{
		now:      now,
		cfg:      cfg,
		w:        newWindow(now(), cfg.Window, breakerBuckets),
		coolDown: cfg.CoolDown,
	}
}

// Allow asks to start one request. Closed: ok is true. Open: ok is false
// until the cool-down has elapsed; then the breaker becomes half-open and
// Allow returns ok and probe true exactly once. Half-open: ok is false until
// that probe is Recorded (or, if it never is, MaxCoolDown after it
// started). Every allowed request must be Recorded with the probe flag
// Allow returned.
func (b *Breaker) Allow() (ok, probe bool) {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true, false
	case BreakerOpen:
		if now.Before(b.clampedRetryAt(now)) {
			return false, false
		}
	case BreakerHalfOpen:
		if now.Sub(b.clampedProbeAt(now)) < b.cfg.MaxCoolDown {
			return false, false
		}
	}
	b.state = BreakerHalfOpen
	b.probeAt = now
	return true, true
}

// Record reports the outcome of a request that Allow admitted.
//
// failure means the attempt counts against the endpoint: a 5xx, 408, 429,
// transport error or timeout. timeout means it ran into the request
// timeout; it implies failure and also counts toward ConsecutiveTimeouts.
// Any success (failure and timeout both false) resets that count; a
// failure that is not a timeout leaves it as it is, since a mix of errors
// and timeouts is no sign of health. Outcomes the caller does not hold
// against the endpoint (a 4xx other than 408 and 429) are successes here.
// A cancelled request is neither (sluice stopped waiting; the endpoint
// did nothing): leave it unrecorded,
// unless it was a probe, which must be Recorded as a failure so that the
// breaker re-opens and probes again after its cool-down.
//
// probe is the flag Allow returned. A probe's success closes the breaker,
// resets the cool-down and empties the window; a probe's failure re-opens
// it with a doubled cool-down, capped at MaxCoolDown. Outcomes of
// non-probe requests that finish while the breaker is half-open or open
// were in flight before the trip: they are counted but do not change the
// state.
func (b *Breaker) Record(failure, timeout, probe bool) {
	failure = failure || timeout
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()

	cur := b.w.advance(now)
	cur.a++
	b.w.sum.a++
	if failure {
		cur.b++
		b.w.sum.b++
	}
	switch {
	case timeout:
		b.consecutive++
	case !failure:
		b.consecutive = 0
	}

	switch {
	case probe && b.state == BreakerHalfOpen:
		if failure {
			if b.coolDown > b.cfg.MaxCoolDown/2 {
				b.coolDown = b.cfg.MaxCoolDown
			} else {
				b.coolDown *= 2
			}
			b.open(now)
			return
		}
		b.state = BreakerClosed
		b.coolDown = b.cfg.CoolDown
		b.consecutive = 0
		b.w.reset()
	case b.state == BreakerClosed && failure:
		if b.consecutive >= b.cfg.ConsecutiveTimeouts ||
			b.w.sum.a >= int64(b.cfg.MinRequests) &&
				float64(b.w.sum.b) >= b.cfg.FailureRatio*float64(b.w.sum.a)-slack {
			b.open(now)
		}
	}
}

// open trips the breaker for the current cool-down. b.mu is held.
func (b *Breaker) open(now time.Time) {
	b.state = BreakerOpen
	b.retryAt = now.Add(b.coolDown)
	b.trips++
}

// clampedRetryAt returns the end of the open period, first pulling it in
// to now + the cool-down if it lies further ahead than that, which only a
// clock stepped back since the trip can do. Without the clamp a breaker
// opened for 5s would stay open for the length of the step (for ever,
// after a clock reset): an injected clock has no monotonic reading to
// hide the step. b.mu is held.
func (b *Breaker) clampedRetryAt(now time.Time) time.Time {
	if b.retryAt.Sub(now) > b.coolDown {
		b.retryAt = now.Add(b.coolDown)
	}
	return b.retryAt
}

// clampedProbeAt returns when the outstanding probe started, first moving
// it to now if it lies in the future (the clock stepped back), so that the
// lost-probe deadline stays at most MaxCoolDown away. b.mu is held.
func (b *Breaker) clampedProbeAt(now time.Time) time.Time {
	if now.Before(b.probeAt) {
		b.probeAt = now
	}
	return b.probeAt
}

// State returns the current state, for the sluice_breaker_state gauge and
// the admin API.
func (b *Breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// RetryAt returns when the breaker will next admit a probe: the end of the
// cool-down while open, the probe's safety deadline (its start plus
// MaxCoolDown) while half-open, and the zero time while closed. It is
// never further ahead of the clock than the cool-down (MaxCoolDown while
// half-open), even after the clock stepped back. A lane that Allow turned
// away sets its timer to RetryAt.
func (b *Breaker) RetryAt() time.Time {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerOpen:
		return b.clampedRetryAt(now)
	case BreakerHalfOpen:
		return b.clampedProbeAt(now).Add(b.cfg.MaxCoolDown)
	}
	return time.Time{}
}

// Trips returns how many times the breaker has opened since NewBreaker,
// counting re-opens after a failed probe, for metrics.
func (b *Breaker) Trips() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.trips
}
