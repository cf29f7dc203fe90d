package signing

import "errors"

// Sentinel errors. Functions in this package wrap them with detail (never key
// bytes or payloads); test for them with errors.Is.
var (
	// ErrBadSecret means a secret string is not a usable Standard Webhooks
	// secret: neither the whsec_ nor the whsk_ prefix, the rest is not
	// standard base64, an HMAC key is outside 24..64 bytes, an Ed25519 key
	// is neither 32 nor 64 bytes or its halves disagree, or it is a whpk_
	// public key, which cannot sign.
	ErrBadSecret = errors.New("signing: bad secret")

	// ErrBadPublicKey means a string is not a Standard Webhooks whpk_ public
	// key: the prefix is missing (a whsk_ or whsec_ secret is named as
	// such), the rest is not standard base64, the key is not 32 bytes, or
	// it is not a point of the Ed25519 curve.
	ErrBadPublicKey = errors.New("signing: bad public key")

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

	// ErrSignatureMismatch means no entry of webhook-signature matches any
	// of the keys: no v1 entry an HMAC secret, no v1a entry an Ed25519 key.
	ErrSignatureMismatch = errors.New("signing: signature mismatch")
)
