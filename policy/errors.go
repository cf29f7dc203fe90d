package policy

import (
	"errors"
	"fmt"
	"strings"
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

	// ErrInvalidFilter means ParseFilter refused a filter. It returns it
	// wrapped in a *FilterError.
	ErrInvalidFilter = errors.New("invalid filter")

	// ErrInvalidTypePattern means an entry of a subscription's types is
	// neither "*", an exact event type nor a pattern of whole-segment
	// wildcards. ValidTypePattern returns it wrapped with the reason.
	ErrInvalidTypePattern = errors.New("invalid event type or pattern")
)

// FieldError is what the Validate methods return: one field out of its
// bounds. It wraps ErrInvalidConfig.
//
// Field names the field by its key in sluice's configuration:
// "retry_budget.window" for BudgetConfig, and for the per-subscription
// settings the key inside a subscription, such as "breaker.cool_down",
// "retry.base" or "concurrency.min". The configuration loader puts the
// subscription's path in front and where the value came from after, so
// that policy holds the bounds and their wording once: the package that
// owns a setting owns its defaults and bounds, and config only names the key.
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
// between 1s and 10m0s"; a nil Value is left out.
func (e *FieldError) Error() string {
	if e.Value == nil {
		return fmt.Sprintf("%v: %s: %s", ErrInvalidConfig, e.Field, e.Reason)
	}
	return fmt.Sprintf("%v: %s: %v: %s", ErrInvalidConfig, e.Field, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidConfig.
func (e *FieldError) Unwrap() error { return ErrInvalidConfig }

func fieldError(field string, value any, format string, args ...any) error {
	return &FieldError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
}

// FilterError is what ParseFilter returns: where in the filter it is
// invalid and why. It wraps ErrInvalidFilter.
type FilterError struct {
	// At locates the filter object holding the problem among logical
	// operators, such as "$or[1]" or "$and[0].$not"; "" for the top.
	At string
	// Path is the dotted path whose condition is invalid, as written; ""
	// when the problem is not a path's.
	Path string
	// Op is the operator whose operand is invalid, such as "$gt" or "$or";
	// "" when the problem is not an operand's (an unknown operator is
	// named in Reason).
	Op string
	// Reason states what is wrong: "want a number or a string, got true",
	// `unknown operator "$regex"`.
	Reason string
}

// Error reads like "filter: data.speed: $gt: want a number or a string,
// got true" or `filter: $or[1]: data.x: unknown operator "$regex"`,
// leaving out the parts that are empty. Configuration puts the
// subscription's key in front.
func (e *FilterError) Error() string {
	var b strings.Builder
	b.WriteString("filter: ")
	for _, part := range []string{e.At, e.Path, e.Op} {
		if part != "" {
			b.WriteString(part)
			b.WriteString(": ")
		}
	}
	b.WriteString(e.Reason)
	return b.String()
}

// Unwrap returns ErrInvalidFilter.
func (e *FilterError) Unwrap() error { return ErrInvalidFilter }
