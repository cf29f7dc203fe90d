package policy

import "time"

// Bounds of the configuration values, shared by the Validate methods. They
// are the bounds sluice's configuration documents (README.md,
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

// checkWindow checks a budget or breaker window.
func checkWindow(field string, d time.Duration) error {
	if d < minWindow || d > maxWindow {
		return fieldError(field, d, "must be between %v and %v", minWindow, maxWindow)
	}
	return nil
}
