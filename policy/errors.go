package policy

import "errors"

// Sentinel errors, wrapped with the offending value by the Parse functions
// and the Validate methods. Test for them with errors.Is.
var (
	// ErrUnknownOutcome means a string is not one of "ack", "retry" or
	// "dead_letter".
	ErrUnknownOutcome = errors.New(`unknown outcome (want "ack", "retry" or "dead_letter")`)

	// ErrInvalidStatus means a classify key is not an exact HTTP status
	// code: three digits, 100 to 599.
	ErrInvalidStatus = errors.New("invalid status code (want an exact code 100-599)")

	// ErrInvalidConfig means a BudgetConfig, BreakerConfig or AutoCapConfig
	// field is out of range. The wrapping error names the field (by its
	// configuration key, such as "min_per_second") and the bad value.
	ErrInvalidConfig = errors.New("invalid configuration")
)
