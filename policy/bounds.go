package policy

import "time"

// Bounds of the configuration values, shared by the Validate methods. They
// are the bounds sluice's configuration documents (docs/configuration.md,
// "Configuration reference"); the loader calls Validate rather than keeping
// its own copy.
const (
	// minWindow and maxWindow bound the sliding windows of the retry
	// budget and the breaker. Under a second a window holds too few
	// outcomes to mean anything; over ten minutes it no longer reacts to
	// an incident, which is what both exist for.
	minWindow = time.Second
	maxWindow = 10 * time.Minute

	// maxBudgetMinPerSecond bounds BudgetConfig.MinPerSecond, far above
	// any sensible floor, so that the allowance stays a finite count.
	maxBudgetMinPerSecond = 1e6

	// MaxConcurrency bounds every concurrency cap, static or automatic:
	// ten thousand requests in flight to one endpoint is far past what a
	// webhook receiver takes, and the process-wide max_in_flight bounds
	// the sum anyway.
	MaxConcurrency = 10000

	// maxHeadroom bounds AutoCapConfig.Headroom.
	maxHeadroom = 1000

	// maxRetryAttempts bounds RetryPolicy.MaxAttempts: with the backoff capped,
	// a hundred attempts already span days.
	maxRetryAttempts = 100

	// The retry schedule's durations (the base is bounded by the cap). A
	// base or cap under a millisecond
	// is a bare number read as nanoseconds, or a retry storm; a cap over
	// a day parks a delivery longer than any incident it waits out, and a
	// max_age over 30 days outlives what a sender still wants delivered.
	minRetryStep   = time.Millisecond
	maxRetryCap    = 24 * time.Hour
	minRetryMaxAge = time.Second
	maxRetryMaxAge = 30 * 24 * time.Hour

	// maxBreakerMinRequests and maxBreakerTimeouts bound the breaker's
	// counts: past them the breaker could never open, which is what
	// leaving it at its defaults is for.
	maxBreakerMinRequests = 1_000_000
	maxBreakerTimeouts    = 10_000

	// The breaker's cool-downs, with the retry schedule's reasons: under
	// a millisecond a failing endpoint is probed in a loop, and an open
	// breaker that waits more than a day holds the subscription's events
	// on disk for nothing.
	minCoolDown    = time.Millisecond
	maxCoolDown    = time.Hour
	maxMaxCoolDown = 24 * time.Hour

	// minInterval and maxInterval bound AutoCapConfig.Interval, which has
	// no configuration key. The lower bound catches a bare number read as
	// nanoseconds.
	minInterval = time.Millisecond
	maxInterval = time.Hour
)

// ValidateCap checks a static concurrency cap (concurrency.max without
// auto): 1 to MaxConcurrency. AutoCapConfig.Max has the same bound. The
// error is a *FieldError.
func ValidateCap(n int) error {
	if n < 1 || n > MaxConcurrency {
		return fieldError("concurrency.max", n, "must be between 1 and %d", MaxConcurrency)
	}
	return nil
}

// checkDuration checks a duration that must be positive, at least lo
// and at most hi; the positive check comes first so that its wording
// stays that of every other positive key.
func checkDuration(field string, d, lo, hi time.Duration) error {
	switch {
	case d <= 0:
		return fieldError(field, d, "must be positive")
	case d < lo:
		return fieldError(field, d, "must be at least %v", lo)
	case d > hi:
		return fieldError(field, d, "must be at most %v", hi)
	}
	return nil
}

// checkCount checks a count that must be at least 1 and at most hi.
func checkCount(field string, n, hi int) error {
	switch {
	case n < 1:
		return fieldError(field, n, "must be at least 1")
	case n > hi:
		return fieldError(field, n, "must be at most %d", hi)
	}
	return nil
}

// checkWindow checks a budget or breaker window.
func checkWindow(field string, d time.Duration) error {
	if d < minWindow || d > maxWindow {
		return fieldError(field, d, "must be between %v and %v", minWindow, maxWindow)
	}
	return nil
}
