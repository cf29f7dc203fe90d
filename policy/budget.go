package policy

import (
	"math"
	"sync"
	"time"
)

// Defaults for BudgetConfig: the retry_budget block of the configuration
// ({ratio: 0.1, min_per_second: 10, window: 10s}). The floor and the window
// are Finagle's RetryBudget defaults (minRetriesPerSec 10, ttl 10s), which
// Linkerd kept; the ratio is half of their 20% because sluice sizes
// the budget so that a fleet-wide outage adds about 10% to the offered
// load.
const (
	DefaultBudgetRatio        = 0.1
	DefaultBudgetMinPerSecond = 10
	DefaultBudgetWindow       = 10 * time.Second
)

// maxBudgetBuckets bounds the buckets of a Budget's window: one per second
// up to an hour. Validate allows far less (maxWindow); this only keeps an
// unvalidated window from costing unbounded memory.
const maxBudgetBuckets = int(time.Hour / time.Second)

// slack absorbs float64 rounding when a count is compared with a product
// of a configured ratio, such as 0.29 × 100 = 28.999999999999996.
const slack = 1e-9

// BudgetConfig configures a Budget. The zero value means every default:
// NewBudget and WithDefaults give zero (or negative) fields their defaults
// one by one.
type BudgetConfig struct {
	// Ratio is how many retries each success earns: retries in the window
	// may reach Ratio × successes in the window, plus the floor.
	// Zero means DefaultBudgetRatio. Validate accepts above 0 to 1.
	Ratio float64

	// MinPerSecond is the floor: retries allowed even without a single
	// success, MinPerSecond × Window seconds per window, so that a cold or
	// fully failing system can still probe its endpoints.
	// Zero means DefaultBudgetMinPerSecond. Validate accepts above 0 to
	// 1,000,000.
	MinPerSecond float64

	// Window is how far back successes and retries count. It is kept as 10
	// buckets, or one bucket per second when longer than 10s, so events
	// leave the window one bucket at a time as the clock moves.
	// Zero means DefaultBudgetWindow. Validate accepts 1s to 10m.
	Window time.Duration
}

// Validate reports the first field out of its bounds as a *FieldError
// (keys "retry_budget.ratio", "retry_budget.min_per_second",
// "retry_budget.window"). It checks the values as they will be used, so a
// zero field is an error: call c.WithDefaults().Validate() when zero is
// meant as "the default". The comparisons are written so that NaN fails
// them.
//
// Zero is refused rather than read as none: with a ratio or a floor of 0
// a full outage (no successes) would defer every retry until new traffic
// succeeds, and NewBudget would read the zero as its default anyway.
func (c BudgetConfig) Validate() error {
	if !(c.Ratio > 0 && c.Ratio <= 1) {
		return fieldError("retry_budget.ratio", c.Ratio, "must be above 0 and at most 1")
	}
	if !(c.MinPerSecond > 0 && c.MinPerSecond <= maxBudgetMinPerSecond) {
		return fieldError("retry_budget.min_per_second", c.MinPerSecond, "must be above 0 and at most %d", int(maxBudgetMinPerSecond))
	}
	return checkWindow("retry_budget.window", c.Window)
}

// WithDefaults returns c with every zero, negative or NaN field replaced
// by its default, and MinPerSecond capped at 1,000,000: the values NewBudget
// runs with.
func (c BudgetConfig) WithDefaults() BudgetConfig {
	// The negated comparisons also replace NaN.
	if !(c.Ratio > 0) || math.IsInf(c.Ratio, 1) {
		c.Ratio = DefaultBudgetRatio
	}
	if !(c.MinPerSecond > 0) {
		c.MinPerSecond = DefaultBudgetMinPerSecond
	}
	c.MinPerSecond = min(c.MinPerSecond, maxBudgetMinPerSecond)
	if c.Window <= 0 {
		c.Window = DefaultBudgetWindow
	}
	return c
}

// Budget is the retry budget shared by every lane, after the Finagle and
// Linkerd retry budgets: over a sliding window, retries may spend at most
//
//	Ratio × successes + MinPerSecond × Window seconds
//
// so that retries add a bounded fraction to the load the endpoints already
// take, instead of multiplying it exactly when they are down ("retry 3 times"
// would offer four times the load to an endpoint that is down). The floor lets a system with no successes at all (cold start, every
// endpoint failing) still retry a little.
//
// Only retries spend the budget: a first attempt is never refused. When
// TryRetry says no, the caller defers the retry (reschedules it) and never
// drops it; the delivery's own RetryPolicy still decides when it dies. An
// empty budget is the system working (it is why retries stopped in an
// incident, not a fault to work around): Available is the
// gauge sluice_retry_budget_available_ratio.
//
// A Budget is safe for concurrent use. Success and TryRetry take a mutex
// for a few counter updates and do not allocate.
type Budget struct {
	now   func() time.Time
	ratio float64
	floor float64 // MinPerSecond × Window seconds

	mu sync.Mutex
	w  window // a = successes, b = retries

	// The pace: retries taken in the current pace slot. Slots are
	// paceWidth wide, finer than the window's buckets, so a refilled
	// allowance is not spent in one instant either.
	window    time.Duration
	paceWidth time.Duration
	paceSlot  int64
	paceCount int64
}

// paceWidth is the finest grain of TryRetryPaced: a quarter of a second.
const paceWidth = 250 * time.Millisecond

// NewBudget returns an empty Budget: nothing spent, Available() == 1.
// Zero, negative and NaN fields of cfg take their defaults (WithDefaults);
// values beyond Validate's ranges are used as far as they make sense
// (MinPerSecond is capped at 1e6, a window over an hour gets buckets wider
// than a second). Call cfg.WithDefaults().Validate() first to reject bad
// configuration instead. now is the clock; nil means time.Now.
func NewBudget(cfg BudgetConfig, now func() time.Time) *Budget {
	cfg = cfg.WithDefaults()
	if now == nil {
		now = time.Now
	}
	n := 10
	if cfg.Window > 10*time.Second {
		// One bucket per second, rounded up; more than an hour's worth
		// (an unvalidated config) gets wider buckets instead.
		n = min(int((cfg.Window+time.Second-1)/time.Second), maxBudgetBuckets)
	}
	return &Budget{
		now:       now,
		ratio:     cfg.Ratio,
		floor:     cfg.MinPerSecond * cfg.Window.Seconds(),
		w:         newWindow(now(), cfg.Window, n),
		window:    cfg.Window,
		paceWidth: min(paceWidth, cfg.Window),
	}
}

// Success records an attempt that got an answer that is not a reason to
// retry: a 2xx, and also a 4xx other than 408 and 429, because the
// endpoint answered. Each success earns Ratio retries for
// the length of the window.
func (b *Budget) Success() {
	now := b.now()
	b.mu.Lock()
	b.w.advance(now).a++
	b.w.sum.a++
	b.mu.Unlock()
}

// TryRetry takes one retry from the budget and reports whether it could.
// false means the window's allowance is spent: the caller defers the retry
// (tries it again later) and must not drop it.
func (b *Budget) TryRetry() bool { return b.try(false) }

// TryRetryPaced is TryRetry with a pace as well: within each 250 ms slot,
// at most that slot's share of the window's allowance (rounded up).
// Without the pace a full outage spends a whole window's allowance, earned
// by the successes before it, in its first moment: a burst several times
// the base rate. Paced, retries add about ratio × the recent success rate,
// plus the floor. The delivery engine uses this one.
func (b *Budget) TryRetryPaced() bool { return b.try(true) }

func (b *Budget) try(paced bool) bool {
	now := b.now()
	b.mu.Lock()
	cur := b.w.advance(now)
	allowed := b.allowed()
	ok := float64(b.w.sum.b+1) <= allowed+slack
	if ok && paced {
		if slot := int64(now.Sub(b.w.origin) / b.paceWidth); slot != b.paceSlot {
			b.paceSlot, b.paceCount = slot, 0
		}
		share := allowed * float64(b.paceWidth) / float64(b.window)
		ok = float64(b.paceCount+1) <= math.Ceil(share-slack)
		if ok {
			b.paceCount++
		}
	}
	if ok {
		cur.b++
		b.w.sum.b++
	}
	b.mu.Unlock()
	return ok
}

// Pace is the width of one pace slot: after TryRetryPaced refuses, the
// next slot's share opens no later than this.
func (b *Budget) Pace() time.Duration { return b.paceWidth }

// Available returns the budget's fill level in the current window, from
// 1 (nothing spent) to 0 (spent): remaining retries / allowed retries.
// It can drop to 0 without a retry when the successes that paid for
// earlier retries leave the window.
func (b *Budget) Available() float64 {
	now := b.now()
	b.mu.Lock()
	b.w.advance(now)
	avail := b.available()
	b.mu.Unlock()
	return avail
}

// BudgetStats is a snapshot of a Budget over its current window, as served
// by the admin API (GET /v1/retry-budget).
type BudgetStats struct {
	// Successes and Retries are the counts in the window.
	Successes int64 `json:"successes"`
	Retries   int64 `json:"retries"`
	// Allowed is how many retries the window allows in total, spent or
	// not: Ratio × Successes + the floor, rounded down.
	Allowed int64 `json:"allowed"`
	// Available is the fill level, as returned by Budget.Available.
	Available float64 `json:"available"`
}

// Stats returns a consistent snapshot of the current window.
func (b *Budget) Stats() BudgetStats {
	now := b.now()
	b.mu.Lock()
	b.w.advance(now)
	s := BudgetStats{
		Successes: b.w.sum.a,
		Retries:   b.w.sum.b,
		Allowed:   floorInt64(b.allowed() + slack),
		Available: b.available(),
	}
	b.mu.Unlock()
	return s
}

// allowed returns the retries the current window allows. b.mu is held.
func (b *Budget) allowed() float64 {
	return b.ratio*float64(b.w.sum.a) + b.floor
}

// floorInt64 rounds x down, saturating at math.MaxInt64.
func floorInt64(x float64) int64 {
	if x >= math.MaxInt64 { // float64(MaxInt64) is 2⁶³, which int64 cannot hold
		return math.MaxInt64
	}
	return int64(math.Floor(x))
}

// available returns the fill level. b.mu is held.
func (b *Budget) available() float64 {
	spent := float64(b.w.sum.b)
	if spent == 0 {
		return 1
	}
	allowed := b.allowed()
	return min(max((allowed-spent)/allowed, 0), 1)
}

// pair is one bucket of a window: two event counts whose meaning is up to
// the owner.
type pair struct{ a, b int64 }

// window counts two kinds of events over a sliding window kept as a ring
// of buckets that rotates with the clock: bucket number k (counted from
// origin) covers [origin + k·width, origin + (k+1)·width), and the window is
// the newest len(buckets) of them. Events thus leave the window one bucket
// at a time, and the window spans between n-1 and n bucket widths.
//
// Keeping the sum beside the buckets makes every operation O(1), amortized
// over the buckets the clock passes. A window is not safe for concurrent
// use; its owner locks.
type window struct {
	origin  time.Time
	width   time.Duration
	head    int64  // number of the newest bucket
	n       int    // number of buckets
	buckets []pair // nil until the first advance
	sum     pair   // of buckets
}

// newWindow returns an empty window of n buckets covering length from
// origin on. Buckets are at least 1ns wide. They are allocated on first
// use: every lane has a breaker, and most of 50,000 idle lanes never
// record an outcome (docs/benchmarks.md, lanes-50k: heap per idle lane).
func newWindow(origin time.Time, length time.Duration, n int) window {
	return window{
		origin: origin,
		width:  max(length/time.Duration(n), 1),
		n:      n,
	}
}

// advance moves the window to now, emptying the buckets that fell out of
// it, and returns the current bucket. A clock that goes backwards (a wall
// clock stepped back, or callers racing between reading the clock and
// locking) counts into the newest bucket rather than rewriting the past.
//
// A step back of more than a bucket also re-anchors the window at now, so
// the step counts as no time at all: the counts stay (nothing is freed or
// minted) and the buckets age from now on. Without that the window would
// stand still until the clock caught up, keeping spent retries or a
// breaker's failures for as long as the step (an hour for an hour, for
// ever after a clock reset). time.Now's monotonic reading hides wall-clock
// steps from Sub, but an injected clock need not carry one.
func (w *window) advance(now time.Time) *pair {
	if w.buckets == nil {
		w.buckets = make([]pair, w.n)
	}
	n := int64(len(w.buckets))
	k := int64(now.Sub(w.origin) / w.width)
	switch steps := k - w.head; {
	case steps < -1: // a race never lags a whole bucket: the clock stepped back
		w.origin = now.Add(-time.Duration(w.head) * w.width)
	case steps <= 0:
	case steps >= n:
		w.reset()
		w.head = k
	default:
		for i := w.head + 1; i <= k; i++ {
			p := &w.buckets[i%n]
			w.sum.a -= p.a
			w.sum.b -= p.b
			*p = pair{}
		}
		w.head = k
	}
	return &w.buckets[w.head%n]
}

// reset empties every bucket.
func (w *window) reset() {
	clear(w.buckets)
	w.sum = pair{}
}
