package signing

import "errors"

// Sentinel errors. Functions in this package wrap them with detail (never key
// bytes or payloads); test for them with errors.Is.
var (
	// ErrBadSecret means a secret string is not a usable Standard Webhooks
	// secret: the whsec_ prefix is missing, the rest is not standard base64,
	// or the key is outside 24..64 bytes.
	ErrBadSecret = errors.New("signing: bad secret")

	// ErrMissingHeader means the webhook-id, webhook-timestamp or
	// webhook-signature value is empty.
	ErrMissingHeader = errors.New("signing: missing header")

	// ErrBadTimestamp means webhook-timestamp is not a decimal count of unix
	// seconds.
	ErrBadTimestamp = errors.New("signing: bad timestamp")

	// ErrTimestampTooOld means webhook-timestamp lies further in the past than
	// the tolerance allows (a possible replay).
	ErrTimestampTooOld = errors.New("signing: timestamp too old")

	// ErrTimestampTooNew means webhook-timestamp lies further in the future
	// than the tolerance allows (clock skew or a forged timestamp).
	ErrTimestampTooNew = errors.New("signing: timestamp too new")

	// ErrSignatureMismatch means no v1 entry of webhook-signature matches any
	// of the secrets.
	ErrSignatureMismatch = errors.New("signing: signature mismatch")
)
