package policy

import (
	"math"
	"sync"
	"time"
)

// Defaults for AutoCapConfig, matching `concurrency: {auto: true}` in
// a subscription's configuration. Headroom 4 absorbs the jitter of a lane that exactly
// matches its demand; a one-second interval re-derives the cap often enough
// to follow traffic and rarely enough to average a few hundred completions
// at the rates where a cap matters.
const (
	DefaultAutoCapMin      = 1
	DefaultAutoCapMax      = 64
	DefaultAutoCapHeadroom = 4
	DefaultAutoCapInterval = time.Second
)

// autoCapSamples is the number of recent latencies an AutoCap keeps. With
// 256 samples the P99 (nearest rank) is the third largest, so finding it
// needs no sorting and no scratch memory.
const autoCapSamples = 256

// AutoCapConfig configures an AutoCap. The zero value means every default:
// NewAutoCap and WithDefaults give zero (or negative) fields their defaults
// one by one.
type AutoCapConfig struct {
	// Min and Max bound the limit. Zero means DefaultAutoCapMin and
	// DefaultAutoCapMax. Validate accepts 1 to MaxConcurrency, Min <= Max.
	Min, Max int

	// Headroom is added to λ·P99: the slots kept free for bursts, and the
	// step by which a backlogged lane grows per Interval.
	// Zero means DefaultAutoCapHeadroom. Validate accepts 1 to 1000.
	Headroom int

	// Interval is the shortest time between two derivations of the limit,
	// and between two timeout cuts. Zero means DefaultAutoCapInterval.
	// Validate accepts 1ms to 1h. It has no configuration key.
	Interval time.Duration
}

// Validate reports the first field out of its bounds as a *FieldError
// whose key is in a subscription's "concurrency." block, such as
// "concurrency.min" ("interval" for Interval, which has no key). It checks
// the values as they will be used, so a zero field is an error: call
// c.WithDefaults().Validate() when zero is meant as "the default".
//
// Headroom 0 is refused although λ·P99 alone is a cap: NewAutoCap would
// read it as the default.
func (c AutoCapConfig) Validate() error {
	if err := ValidateCap(c.Max); err != nil {
		return err
	}
	if c.Min < 1 || c.Min > MaxConcurrency {
		return fieldError("concurrency.min", c.Min, "must be between 1 and %d", MaxConcurrency)
	}
	if c.Min > c.Max {
		return fieldError("concurrency.min", c.Min, "must not exceed concurrency.max (%d)", c.Max)
	}
	if c.Headroom < 1 || c.Headroom > maxHeadroom {
		return fieldError("concurrency.headroom", c.Headroom, "must be between 1 and %d", maxHeadroom)
	}
	if c.Interval < minInterval || c.Interval > maxInterval {
		return fieldError("interval", c.Interval, "must be between %v and %v", minInterval, maxInterval)
	}
	return nil
}

// WithDefaults returns c with every zero or negative field replaced by its
// default: the values NewAutoCap runs with (which also raises Max to Min
// when below it).
func (c AutoCapConfig) WithDefaults() AutoCapConfig {
	if c.Min <= 0 {
		c.Min = DefaultAutoCapMin
	}
	if c.Max <= 0 {
		c.Max = DefaultAutoCapMax
	}
	if c.Headroom <= 0 {
		c.Headroom = DefaultAutoCapHeadroom
	}
	if c.Interval <= 0 {
		c.Interval = DefaultAutoCapInterval
	}
	return c
}

// AutoCap derives a lane's concurrency limit from Little's law
// (`concurrency: auto`), so that a tenant whose traffic grew is not
// stuck at a cap sized for the old traffic, looking like a failing
// endpoint: a lane that dispatches λ
// requests per second which take L each holds λ·L of them in flight, so
//
//	C = ceil(λ · P99) + Headroom, clamped to [Min, Max]
//
// where λ is the demand (Dispatched calls per second since the previous
// derivation) and P99 is the 99th percentile (nearest rank) of the last 256
// latencies passed to Completed. Sizing by P99 rather than the mean keeps
// slots for the slow tail. Limit re-derives C at most once per Interval.
//
// Additive increase. A lane that is not backlogged dispatches its true
// demand, and C settles at what that demand needs plus Headroom. A
// backlogged lane keeps all C slots busy, so it dispatches about C / mean
// latency per second and the next derivation gives about
// C · P99/mean + Headroom ≥ C + Headroom: the limit grows by Headroom per
// Interval (faster when the tail is heavy) until the backlog drains, the
// endpoint's latency rises, or Max is reached. That growth is intended: it
// is how a tenant whose traffic tripled gets its cap raised.
//
// Multiplicative decrease. A timeout halves C at once (not below Min),
// because a timeout says the endpoint is past what it can take; at most
// once per Interval, so the timeouts of requests that went out together
// halve it once. The cut also restarts the demand measurement, so that the
// next derivation, an Interval later, measures what the lane dispatched
// under the reduced limit instead of undoing the cut.
//
// Until some request has completed there is no latency to go by, and
// Limit keeps its starting value, Min + Headroom (clamped).
//
// An AutoCap is safe for concurrent use. Dispatched, Completed and Limit
// take a mutex and do not allocate; the latency ring takes 1 KiB.
type AutoCap struct {
	now func() time.Time
	cfg AutoCapConfig // with defaults

	mu         sync.Mutex
	limit      int
	derivedAt  time.Time              // start of the current demand measurement
	dispatched int64                  // since derivedAt
	cutAt      time.Time              // last timeout cut
	cut        bool                   // whether cutAt is set
	n          int                    // samples in lat
	next       int                    // slot for the next sample
	lat        [autoCapSamples]uint32 // latencies in µs, saturated (71 min)
}

// NewAutoCap returns an AutoCap whose limit starts at Min + Headroom,
// clamped to [Min, Max]. Zero and negative fields of cfg take their
// defaults (WithDefaults), and Max is raised to Min if below it; call
// cfg.WithDefaults().Validate() first to reject bad configuration instead.
// now is the clock; nil means time.Now.
func NewAutoCap(cfg AutoCapConfig, now func() time.Time) *AutoCap {
	cfg = cfg.WithDefaults()
	cfg.Max = max(cfg.Max, cfg.Min)
	if now == nil {
		now = time.Now
	}
	return &AutoCap{
		now:       now,
		cfg:       cfg,
		limit:     min(cfg.Min+cfg.Headroom, cfg.Max),
		derivedAt: now(),
	}
}

// Dispatched records that one request started: one unit of demand.
func (a *AutoCap) Dispatched() {
	a.mu.Lock()
	a.dispatched++
	a.mu.Unlock()
}

// Completed records that one request finished after latency. timeout means
// it ran into the request timeout; its latency (the timeout) still counts
// toward the P99, and it halves the limit unless a timeout already did so
// less than Interval ago. A cancelled request should not be reported.
func (a *AutoCap) Completed(latency time.Duration, timeout bool) {
	var now time.Time
	if timeout {
		now = a.now()
	}
	us := min(max(latency/time.Microsecond, 0), math.MaxUint32)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lat[a.next] = uint32(us)
	a.next = (a.next + 1) % len(a.lat)
	a.n = min(a.n+1, len(a.lat))
	if timeout && a.cut && now.Before(a.cutAt) {
		// The clock stepped back: count the step as no time, as Limit
		// does, rather than refuse every cut until the clock has caught up
		// with the last one (an hour for an hour; injected clocks carry no
		// monotonic reading).
		a.cutAt = now
	}
	if timeout && (!a.cut || now.Sub(a.cutAt) >= a.cfg.Interval) {
		a.limit = max(a.limit/2, a.cfg.Min)
		a.cut, a.cutAt = true, now
		a.derivedAt, a.dispatched = now, 0
	}
}

// Limit returns the current concurrency limit C, first re-deriving it when
// Interval has passed since the last derivation (or timeout cut). The lane
// dispatches only while it has fewer than Limit() requests in flight.
func (a *AutoCap) Limit() int {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	elapsed := now.Sub(a.derivedAt)
	if elapsed < 0 {
		// The clock stepped back (or a racing caller read it a moment
		// before the last derivation): count the step as no time and go on
		// measuring from now, keeping what was dispatched. Otherwise the
		// limit would stay frozen until the clock caught up again.
		a.derivedAt = now
		return a.limit
	}
	if elapsed < a.cfg.Interval {
		return a.limit
	}
	if a.n > 0 {
		// λ · P99 = dispatched/elapsed · P99, in requests.
		need := float64(a.dispatched) * float64(a.p99()) / float64(elapsed)
		c := math.Ceil(need-slack) + float64(a.cfg.Headroom)
		a.limit = int(min(max(c, float64(a.cfg.Min)), float64(a.cfg.Max)))
	}
	a.derivedAt, a.dispatched = now, 0
	return a.limit
}

// p99 returns the nearest-rank 99th percentile of the recorded latencies:
// the r-th smallest of n with r = ceil(0.99·n), which is the k-th largest
// with k = n-r+1 = floor(n/100)+1 ≤ 3. a.mu is held and a.n > 0.
func (a *AutoCap) p99() time.Duration {
	k := a.n/100 + 1
	var top [autoCapSamples/100 + 1]uint32 // the k largest, descending
	for _, v := range a.lat[:a.n] {
		for i := range k {
			if v > top[i] {
				copy(top[i+1:k], top[i:k-1])
				top[i] = v
				break
			}
		}
	}
	return time.Duration(top[k-1]) * time.Microsecond
}
