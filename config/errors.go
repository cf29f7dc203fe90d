package config

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/policy"
)

// Sentinel errors wrapped by ValidationError.Err; test with errors.Is.
var (
	// ErrUnknownKey means a key in the file, the environment or the overrides
	// does not exist in Config (typos must not be ignored silently).
	ErrUnknownKey = errors.New("unknown key")
	// ErrInvalidValue means a value has the wrong type, format or range.
	ErrInvalidValue = errors.New("invalid value")
	// ErrMissingValue means a required value is absent or empty.
	ErrMissingValue = errors.New("missing value")
	// ErrDuplicate means a value that must be unique appears twice.
	ErrDuplicate = errors.New("duplicate value")
	// ErrConflict means keys that exclude each other are set together.
	ErrConflict = errors.New("conflicting keys")
)

// ValidationError reports one bad configuration value. Err wraps one of
// ErrUnknownKey, ErrInvalidValue, ErrMissingValue, ErrDuplicate or
// ErrConflict, and sometimes a cause: signing.ErrBadSecret, fs.ErrNotExist,
// policy.ErrUnknownOutcome, nkeys' error for a bad NATS credentials file,
// crypto/tls's for a certificate and key that do not load, or for the
// bounds policy owns (retry budget, breaker, retry schedule, concurrency
// caps) a *policy.FieldError wrapping policy.ErrInvalidConfig.
type ValidationError struct {
	// Field is the key path, e.g. "durability", "admin.listen",
	// "subscriptions[2].url" or "subscriptions[0].classify[409]".
	Field string
	// Value is the offending value, or nil when there is none to show. It is
	// never a secret or token: those are replaced by "[redacted]", and URLs
	// lose their userinfo and query values.
	Value any
	// Err says what is wrong.
	Err error
	// Source says where the value came from when Load knows it:
	// `file "sluice.yaml"`, "environment variable SLUICE_LISTEN" or "flags".
	// Empty for defaults and for Validate called directly.
	Source string

	// bare drops the "config: " prefix: ParseSubscription's errors go to
	// an API client, for whom the document is no config file.
	bare bool
}

// Error reads like
//
//	config: subscriptions[2].url: "ftp://x": must be http or https
//	config: unknown key "subscriptions[0].colour" (in file "sluice.yaml")
func (e *ValidationError) Error() string {
	var b strings.Builder
	if !e.bare {
		b.WriteString("config: ")
	}
	if errors.Is(e.Err, ErrUnknownKey) {
		fmt.Fprintf(&b, "unknown key %q", e.Field)
	} else {
		if e.Field != "" {
			b.WriteString(e.Field)
			b.WriteString(": ")
		}
		if e.Value != nil {
			b.WriteString(formatValue(e.Field, e.Value))
			b.WriteString(": ")
		}
		if e.Err != nil {
			b.WriteString(e.Err.Error())
		} else {
			b.WriteString("invalid")
		}
	}
	if e.Source != "" {
		switch {
		case strings.HasPrefix(e.Source, "file "):
			b.WriteString(" (in ")
		default:
			b.WriteString(" (from ")
		}
		b.WriteString(e.Source)
		b.WriteString(")")
	}
	return b.String()
}

// Unwrap returns Err.
func (e *ValidationError) Unwrap() error { return e.Err }

// reason is the Err of a ValidationError built here: its text is the
// plain explanation ("must be http or https") while errors.Is still finds the
// sentinel kind and the cause.
type reason struct {
	kind  error
	msg   string
	cause error
	value any // offending value, for errors raised inside the decode hook
}

func (r *reason) Error() string { return r.msg }

func (r *reason) Unwrap() []error {
	if r.cause != nil {
		return []error{r.kind, r.cause}
	}
	return []error{r.kind}
}

func newReason(kind error, format string, args ...any) *reason {
	return &reason{kind: kind, msg: fmt.Sprintf(format, args...)}
}

func invalidf(format string, args ...any) *reason {
	return newReason(ErrInvalidValue, format, args...)
}

func fieldErr(field string, value any, err error) *ValidationError {
	if value != nil && isSensitiveField(field) {
		value = redactedText
	}
	return &ValidationError{Field: field, Value: value, Err: err}
}

// policyErr turns a policy Validate error into a ValidationError: prefix
// (a subscription's path, or "" at the top level) goes before policy's key,
// and the message is policy's, so the bound and its wording live in one
// place. errors.Is finds both ErrInvalidValue and policy.ErrInvalidConfig.
func policyErr(prefix string, err error) error {
	if err == nil {
		return nil
	}
	var fe *policy.FieldError
	if !errors.As(err, &fe) {
		return &ValidationError{Field: prefix, Err: &reason{kind: ErrInvalidValue, msg: err.Error(), cause: err}}
	}
	return fieldErr(joinPath(prefix, fe.Field), fe.Value, &reason{kind: ErrInvalidValue, msg: fe.Reason, cause: err})
}
