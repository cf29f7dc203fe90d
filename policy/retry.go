package policy

import (
	"math/rand/v2"
	"time"
)

// Defaults for RetryPolicy and Backoff. They are the values of the
// subscription's retry block (max_attempts: 8, max_age: 24h,
// base: 1s, cap: 1h). With full jitter the wait after failure n is at most
// min(1h, 2^(n-1) s), so the seven retries of the defaults wait about a
// minute in total in expectation and at most 127 s; MaxAge only binds when
// Retry-After stretches the schedule or an operator raises MaxAttempts.
const (
	DefaultMaxAttempts = 8
	DefaultMaxAge      = 24 * time.Hour
	DefaultBase        = time.Second
	DefaultCap         = time.Hour
)

// Backoff is exponential backoff with full jitter: the delay after the
// attempt-th failure is uniform in [0, min(Cap, Base·2^(attempt-1))).
// Full jitter spreads the retries of many deliveries that failed together
// (an endpoint outage) over the whole window instead of bunching them into
// synchronized waves.
//
// A Backoff is a value; it is safe for concurrent use if Rand is.
type Backoff struct {
	// Base is the top of the window after the first failure.
	// Zero or negative means DefaultBase.
	Base time.Duration

	// Cap bounds the window however many attempts were made, and also
	// bounds an honoured Retry-After (RetryPolicy.Next).
	// Zero or negative means DefaultCap.
	Cap time.Duration

	// Rand returns a uniform float64 in [0, 1). Tests inject a fixed value;
	// nil means math/rand/v2's Float64, which is safe for concurrent use.
	// Values below 0 (and NaN) act as 0, values of 1 or more as just
	// below 1, so a bad Rand cannot produce a delay outside the window.
	Rand func() float64
}

// WithDefaults returns b with a zero or negative Base or Cap replaced by
// its default: the values Delay and RetryPolicy.Next use.
func (b Backoff) WithDefaults() Backoff {
	if b.Base <= 0 {
		b.Base = DefaultBase
	}
	if b.Cap <= 0 {
		b.Cap = DefaultCap
	}
	return b
}

// Delay returns how long to wait after attempt attempts have been made (1
// after the first failure). Attempts below 1 count as 1. The window doubles
// per attempt and saturates at Cap without overflowing, for any attempt.
// Delay does not allocate.
func (b Backoff) Delay(attempt int) time.Duration {
	b = b.WithDefaults()
	base, ceil := b.Base, b.Cap
	attempt = max(attempt, 1)
	// base << shift, unless that would exceed ceil. Comparing against
	// ceil >> shift instead of shifting base keeps this overflow-free.
	if shift := attempt - 1; shift < 63 && base <= ceil>>shift {
		ceil = base << shift
	}
	var r float64
	if b.Rand != nil {
		r = b.Rand()
	} else {
		r = rand.Float64()
	}
	switch {
	case !(r > 0): // also catches NaN
		return 0
	case r >= 1:
		return ceil - 1
	}
	// r < 1 keeps the product below 2⁶³ even for ceil = MaxInt64; the clamp
	// covers float64(ceil) rounding up.
	if d := time.Duration(r * float64(ceil)); d < ceil {
		return d
	}
	return ceil - 1
}

// RetryPolicy decides whether and when a failed delivery is tried again.
// The zero value is usable: every zero or negative field means its default
// (DefaultRetryPolicy). A RetryPolicy is a value; it is safe for concurrent
// use if its Backoff.Rand is.
type RetryPolicy struct {
	// MaxAttempts is the total number of attempts, including the first.
	// 1 means no retries. Zero or negative means DefaultMaxAttempts.
	MaxAttempts int

	// MaxAge bounds how long after the first attempt a retry may be due.
	// Zero or negative means DefaultMaxAge.
	MaxAge time.Duration

	// Backoff spaces the retries when the endpoint sends no Retry-After.
	Backoff Backoff
}

// DefaultRetryPolicy returns the policy a subscription gets when its
// configuration says nothing: 8 attempts within 24h, backoff from 1s up
// to 1h, math/rand/v2 jitter.
func DefaultRetryPolicy() RetryPolicy { return RetryPolicy{}.WithDefaults() }

// WithDefaults returns p with every zero or negative field, the Backoff's
// included, replaced by its default: the values Next uses.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.MaxAge <= 0 {
		p.MaxAge = DefaultMaxAge
	}
	p.Backoff = p.Backoff.WithDefaults()
	return p
}

// Validate reports the first field out of its bounds as a *FieldError
// whose key is in a subscription's "retry." block: "retry.max_attempts"
// (1 to 100), "retry.max_age" (1s to 720h), "retry.base" and "retry.cap"
// (1ms to 24h, Base <= Cap). It checks the values as they will be used, so a zero field
// is an error: call p.WithDefaults().Validate() when zero is meant as "the
// default".
func (p RetryPolicy) Validate() error {
	b := p.Backoff
	if p.MaxAttempts < 1 || p.MaxAttempts > maxRetryAttempts {
		return fieldError("retry.max_attempts", p.MaxAttempts, "must be between 1 and %d", maxRetryAttempts)
	}
	if err := checkDuration("retry.max_age", p.MaxAge, minRetryMaxAge, maxRetryMaxAge); err != nil {
		return err
	}
	if err := checkDuration("retry.base", b.Base, minRetryStep, maxRetryCap); err != nil {
		return err
	}
	if err := checkDuration("retry.cap", b.Cap, minRetryStep, maxRetryCap); err != nil {
		return err
	}
	if b.Base > b.Cap {
		return fieldError("retry.base", b.Base, "must not exceed retry.cap (%v)", b.Cap)
	}
	return nil
}

// Next decides what happens after attempt attempts (≥ 1) have failed with a
// retryable outcome. firstAttempt is when attempt 1 started and now is the
// current time, both from the caller's clock; Next reads no clock itself.
//
// retryAfter is the endpoint's Retry-After (see ParseRetryAfter); zero or
// negative means none. When present it replaces the jittered backoff rather
// than adding to it, capped at Backoff.Cap so that one endpoint cannot park
// a delivery for longer than the operator allows. Note that a Retry-After
// date in the past parses to 0 and so falls back to the backoff.
//
// It returns the due time of the next attempt and ok=true, or ok=false and
// the dead-letter reason:
//
//   - ReasonMaxAttempts when attempt >= MaxAttempts;
//   - ReasonMaxAge when the due time would be later than
//     firstAttempt+MaxAge (a due time exactly at the limit is allowed).
//
// The reason is empty when ok is true.
func (p RetryPolicy) Next(attempt int, firstAttempt, now time.Time, retryAfter time.Duration) (due time.Time, reason string, ok bool) {
	p = p.WithDefaults()
	if attempt >= p.MaxAttempts {
		return time.Time{}, ReasonMaxAttempts, false
	}
	var wait time.Duration
	if retryAfter > 0 {
		wait = min(retryAfter, p.Backoff.Cap)
	} else {
		wait = p.Backoff.Delay(attempt)
	}
	due = now.Add(wait)
	if due.After(firstAttempt.Add(p.MaxAge)) {
		return time.Time{}, ReasonMaxAge, false
	}
	return due, "", true
}
