package policy

import (
	"errors"
	"fmt"
)

// Sentinel errors, wrapped with the offending value by the Parse functions
// and the Validate methods. Test for them with errors.Is.
var (
	// ErrUnknownOutcome means a string is not one of "ack", "retry" or
	// "dead_letter".
	ErrUnknownOutcome = errors.New(`unknown outcome (want "ack", "retry" or "dead_letter")`)

	// ErrInvalidStatus means a classify key is not an exact HTTP status
	// code: three digits, 100 to 599.
	ErrInvalidStatus = errors.New("invalid status code (want an exact code 100-599)")

	// ErrInvalidConfig means a BudgetConfig, BreakerConfig, RetryPolicy or
	// AutoCapConfig field is out of range. The Validate methods return it
	// wrapped in a *FieldError.
	ErrInvalidConfig = errors.New("invalid configuration")

	// ErrInvalidTypePattern means an entry of a subscription's types is
	// neither "*", an exact event type nor a pattern of whole-segment
	// wildcards. ValidTypePattern returns it wrapped with the reason.
	ErrInvalidTypePattern = errors.New("invalid event type or pattern")
)

// FieldError is what the Validate methods return: one field out of its
// bounds. It wraps ErrInvalidConfig.
//
// Field names the field by its key in sluice's configuration (DESIGN.md
// §4): "retry_budget.window" for BudgetConfig, and for the per-subscription
// settings the key inside a subscription, such as "breaker.cool_down",
// "retry.base" or "concurrency.min". The configuration loader puts the
// subscription's path in front and where the value came from after, so
// that policy holds the bounds and their wording once (STYLE.md §4).
type FieldError struct {
	// Field is the configuration key, as above.
	Field string
	// Value is the offending value, with the field's Go type
	// (time.Duration, float64, int).
	Value any
	// Reason states the bound, such as "must be between 1s and 10m0s". A
	// bound set by another field names it by its key the same way:
	// "must not exceed retry.cap (1h0m0s)".
	Reason string
}

// Error reads like "invalid configuration: breaker.window: 1h0m0s: must be
// between 1s and 10m0s".
func (e *FieldError) Error() string {
	return fmt.Sprintf("%v: %s: %v: %s", ErrInvalidConfig, e.Field, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidConfig.
func (e *FieldError) Unwrap() error { return ErrInvalidConfig }

func fieldError(field string, value any, format string, args ...any) error {
	return &FieldError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
}
