// Package signing implements Standard Webhooks (https://www.standardwebhooks.com)
// signatures: the whsec_, whsk_ and whpk_ key formats, the webhook-id,
// webhook-timestamp and webhook-signature headers, signing and verification.
//
// Both of the specification's schemes sign the content id + "." + timestamp
// + "." + body:
//   - symmetric, a whsec_ secret: HMAC-SHA256, base64 encoded and prefixed
//     with "v1,";
//   - asymmetric, a whsk_ secret: Ed25519 (RFC 8032), base64
//     encoded and prefixed with "v1a,". The receiver verifies with the
//     whpk_ public key (Secret.PublicKey, ParsePublicKey) and cannot sign.
//
// When several secrets are active (rotation, or a move from HMAC to
// Ed25519) the header carries one space-separated entry per secret, so a
// receiver that knows any one of the keys accepts the delivery. Because this
// is the Standard Webhooks scheme, its official verifier libraries accept
// the v1 entries this package signs; they skip v1a entries.
//
// Guarantees:
//   - A Secret never reveals its key through fmt, log/slog or String; only
//     Encode returns it, for showing a generated secret once.
//   - Secret and PublicKey values and all functions are safe for concurrent
//     use.
//   - AppendSignature does not allocate when dst has room for the header (47
//     bytes per HMAC secret, 92 per Ed25519 secret, plus one separator
//     between entries) and, for Ed25519, id, timestamp and body together fit
//     in 64 KiB; per-secret HMAC state and message buffers are pooled.
//   - Verify compares HMAC signatures in constant time (hmac.Equal), checks
//     Ed25519 signatures with crypto/ed25519, and checks the timestamp in
//     both directions to limit replays.
//
// The package imports only the standard library.
package signing

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Header names of the Standard Webhooks scheme. HTTP header names are case
// insensitive; these are the spellings the specification uses.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// DefaultTolerance is how far webhook-timestamp may lie from the receiver's
// clock, in either direction, before Verify rejects it. Five minutes is the
// value the Standard Webhooks reference libraries use.
const DefaultTolerance = 5 * time.Minute

// Key length limits in bytes, from the Standard Webhooks specification
// ("at least 24 bytes (192 bits), 512 bits maximum").
const (
	minKeyLen = 24
	maxKeyLen = 64
)

const (
	secretPrefix = "whsec_"
	redacted     = "whsec_…redacted"
	version      = "v1"
	// encodedLen is the length of a base64 encoded HMAC-SHA256 sum.
	encodedLen = (sha256.Size + 2) / 3 * 4
	// entryLen is the length of one "v1,<base64>" entry.
	entryLen = len(version) + 1 + encodedLen
)

// Secret is one signing key: an HMAC-SHA256 key (whsec_) or an Ed25519
// private key (whsk_). The zero Secret holds no key: Verify never matches it
// and AppendSignature panics on it.
//
// Secret values are cheap to copy and safe for concurrent use; copies share
// the key and a pool of HMAC states. String and every fmt verb print
// "whsec_…redacted" (or "whsk_…redacted"), never the key.
type Secret struct {
	k *key
}

// key is the shared state behind a Secret. Keeping it behind a pointer lets
// Secret be passed by value while the pool stays shared.
//
// The key bytes live only in closures. When a Secret sits in an unexported
// field, fmt cannot call its Format method and falls back to reflection,
// which for some verbs (%s, %q) prints the pointed-to struct in full; a
// []byte field would then print the key, a func prints as an address.
type key struct {
	raw  func() []byte // the key as Encode shows it
	pool sync.Pool     // of *macState; HMAC keys only
	ed   *edKey        // nil for an HMAC key
}

// macState is one reusable HMAC computation. buf stages the id and timestamp
// so that writing them does not convert strings to heap slices; sum and enc
// hold the result.
type macState struct {
	h   hash.Hash
	buf [128]byte
	sum [sha256.Size]byte
	enc [encodedLen]byte
}

// ParseSecret parses a Standard Webhooks secret, either
//   - "whsec_" followed by an HMAC key of 24 to 64 bytes, or
//   - "whsk_" followed by an Ed25519 private key: the 32-byte seed or the
//     64-byte seed||public key (ed25519.go says why both),
//
// in standard (padded) base64. Errors wrap ErrBadSecret and name the problem
// without repeating the secret; a whpk_ public key is refused as one.
func ParseSecret(s string) (Secret, error) {
	if s == "" {
		return Secret{}, fmt.Errorf("parse secret: empty: %w", ErrBadSecret)
	}
	if strings.TrimSpace(s) != s {
		// Secrets read from files often keep a trailing newline; say so
		// rather than report a base64 error at the last byte.
		return Secret{}, fmt.Errorf("parse secret: leading or trailing whitespace: %w", ErrBadSecret)
	}
	if b64, ok := strings.CutPrefix(s, edSecretPrefix); ok {
		return parseEd25519Secret(b64)
	}
	if strings.HasPrefix(s, edPublicPrefix) {
		return Secret{}, fmt.Errorf("parse secret: a %q public key verifies signatures but cannot sign: give the %q secret key: %w", edPublicPrefix, edSecretPrefix, ErrBadSecret)
	}
	b64, ok := strings.CutPrefix(s, secretPrefix)
	if !ok {
		return Secret{}, fmt.Errorf("parse secret: missing %q prefix (or %q for an Ed25519 key): %w", secretPrefix, edSecretPrefix, ErrBadSecret)
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		// CorruptInputError holds only an offset, never input bytes.
		return Secret{}, fmt.Errorf("parse secret: not standard base64 after %q (%v): %w", secretPrefix, err, ErrBadSecret)
	}
	if len(raw) < minKeyLen || len(raw) > maxKeyLen {
		return Secret{}, fmt.Errorf("parse secret: key is %d bytes, want %d to %d: %w", len(raw), minKeyLen, maxKeyLen, ErrBadSecret)
	}
	return newSecret(raw), nil
}

// NewSecret returns an HMAC Secret for key. It copies key and does not check
// its length; use ParseSecret for configured secrets.
func NewSecret(key []byte) Secret {
	return newSecret(append([]byte(nil), key...))
}

// GenerateSecret returns an HMAC Secret with 32 random bytes from
// crypto/rand; GenerateEd25519Secret makes a whsk_ one.
func GenerateSecret() (Secret, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return Secret{}, fmt.Errorf("generate secret: %w", err)
	}
	return newSecret(raw), nil
}

// newSecret takes ownership of raw.
func newSecret(raw []byte) Secret {
	k := &key{raw: func() []byte { return raw }}
	k.pool.New = func() any { return &macState{h: hmac.New(sha256.New, raw)} }
	return Secret{k: k}
}

// Encode returns the secret as "whsec_<base64>" or "whsk_<base64>", in the
// form it was parsed from (a whsk_ key keeps its 32- or 64-byte form). It
// reveals the key: use it only to show a newly generated secret once, never
// in logs. The zero Secret encodes as "".
func (s Secret) Encode() string {
	if s.k == nil {
		return ""
	}
	prefix := secretPrefix
	if s.k.ed != nil {
		prefix = edSecretPrefix
	}
	return prefix + base64.StdEncoding.EncodeToString(s.k.raw())
}

// redacted is what String, Format and LogValue print: the prefix, so that
// logs tell the schemes apart, and never the key.
func (s Secret) redacted() string {
	if s.k != nil && s.k.ed != nil {
		return edRedacted
	}
	return redacted
}

// String returns "whsec_…redacted" (or "whsk_…redacted").
func (s Secret) String() string { return s.redacted() }

// Format prints "whsec_…redacted" (or "whsk_…redacted") for every verb,
// including %#v and %x.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.redacted())) }

// LogValue makes log/slog print "whsec_…redacted" (or "whsk_…redacted")
// with any handler.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.redacted()) }

var (
	_ fmt.Stringer   = Secret{}
	_ fmt.Formatter  = Secret{}
	_ slog.LogValuer = Secret{}
)

// AppendSignature appends the webhook-signature header value for id, ts (unix
// seconds) and body to dst and returns the extended slice: one entry per
// secret, in order, separated by single spaces: "v1,<base64>" for an HMAC
// secret, "v1a,<base64>" for an Ed25519 one. It does not allocate when dst
// has enough spare capacity (47 bytes per HMAC secret, 92 per Ed25519
// secret, plus the separators) and, with an Ed25519 secret, id, timestamp
// and body fit in 64 KiB. It panics on a zero Secret, which is a
// programming error.
func AppendSignature(dst []byte, secrets []Secret, id string, ts int64, body []byte) []byte {
	for i, s := range secrets {
		if s.k == nil {
			panic("signing: AppendSignature with a zero Secret")
		}
		if i > 0 {
			dst = append(dst, ' ')
		}
		if s.k.ed != nil {
			dst = s.k.ed.appendSignature(dst, id, ts, body)
			continue
		}
		st := s.k.get()
		// One Write for "id.ts." when it fits; the 22 bytes are two dots and
		// the longest int64.
		b := st.buf[:0]
		if len(id) <= len(st.buf)-22 {
			b = append(b, id...)
		} else {
			st.writeString(id)
		}
		b = append(b, '.')
		b = strconv.AppendInt(b, ts, 10)
		b = append(b, '.')
		st.h.Write(b)
		st.h.Write(body)
		st.finish()
		dst = append(dst, version...)
		dst = append(dst, ',')
		dst = append(dst, st.enc[:]...)
		s.k.pool.Put(st)
	}
	return dst
}

// Sign returns the webhook-signature header value; see AppendSignature.
func Sign(secrets []Secret, id string, ts int64, body []byte) string {
	n := 0
	for _, s := range secrets {
		if s.k != nil && s.k.ed != nil {
			n += edEntryLen + 1
		} else {
			n += entryLen + 1
		}
	}
	return string(AppendSignature(make([]byte, 0, n), secrets, id, ts, body))
}

// Verify checks a delivery the way a receiver must. id, timestamp and
// signature are the webhook-id, webhook-timestamp and webhook-signature header
// values; body is the exact request body.
//
// The timestamp must be a decimal count of unix seconds no further than
// tolerance from now in either direction (the edge itself is accepted); a
// tolerance of zero or less means DefaultTolerance. At least one entry of
// the space-separated signature must match a key:
//   - a "v1,<base64>" entry one of the HMAC secrets, compared in constant
//     time;
//   - a "v1a,<base64>" entry (a 64-byte Ed25519 signature in canonical
//     standard base64) the public key of one of the Ed25519 secrets, or one
//     of keys, which is how a receiver that holds only whpk_ keys calls it.
//
// Entries of other versions are ignored. The signed content uses the
// timestamp text exactly as received. secrets may be nil when keys are
// given, and a receiver migrating from HMAC to Ed25519 passes both.
//
// Errors wrap ErrMissingHeader, ErrBadTimestamp, ErrTimestampTooOld,
// ErrTimestampTooNew or ErrSignatureMismatch.
func Verify(secrets []Secret, id, timestamp, signature string, body []byte, now time.Time, tolerance time.Duration, keys ...PublicKey) error {
	switch {
	case id == "":
		return fmt.Errorf("verify: empty %s: %w", HeaderID, ErrMissingHeader)
	case timestamp == "":
		return fmt.Errorf("verify: empty %s: %w", HeaderTimestamp, ErrMissingHeader)
	case signature == "":
		return fmt.Errorf("verify: empty %s: %w", HeaderSignature, ErrMissingHeader)
	}
	ts, err := parseTimestamp(timestamp)
	if err != nil {
		return err
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	// Compare in whole seconds so that absurd timestamps cannot overflow
	// time.Time arithmetic. ts is accepted iff now-tolerance <= ts <= now+tolerance.
	if hi := now.Add(tolerance).Unix(); ts > hi {
		return fmt.Errorf("verify: timestamp %d is more than %s after now (%d): %w", ts, tolerance, now.Unix(), ErrTimestampTooNew)
	}
	lo := now.Add(-tolerance)
	loSec := lo.Unix()
	if lo.Nanosecond() != 0 {
		loSec++ // ceil: ts must not be before lo
	}
	if ts < loSec {
		return fmt.Errorf("verify: timestamp %d is more than %s before now (%d): %w", ts, tolerance, now.Unix(), ErrTimestampTooOld)
	}

	var got [encodedLen]byte
	var msg *msgBuf // the signed content for Ed25519, staged on first need
	defer func() {
		if msg != nil {
			msg.release()
		}
	}()
	edMatch := func(pk PublicKey) bool {
		if msg == nil {
			msg = stage(id, timestamp, body)
		}
		return pk.verifyEntries(signature, msg.b)
	}
	nHMAC, nEd := 0, 0
	for _, s := range secrets {
		if s.k == nil {
			continue
		}
		if s.k.ed != nil {
			nEd++
			if edMatch(s.k.ed.pub) {
				return nil
			}
			continue
		}
		nHMAC++
		st := s.k.get()
		if len(id)+len(timestamp)+2 <= len(st.buf) {
			b := append(st.buf[:0], id...)
			b = append(b, '.')
			b = append(b, timestamp...)
			st.h.Write(append(b, '.'))
		} else {
			st.writeString(id)
			st.writeString(".")
			st.writeString(timestamp)
			st.writeString(".")
		}
		st.h.Write(body)
		st.finish()
		matched := false
		for rest := signature; rest != "" && !matched; {
			var entry string
			entry, rest, _ = strings.Cut(rest, " ")
			ver, sig, ok := strings.Cut(entry, ",")
			if !ok || ver != version || len(sig) != encodedLen {
				continue
			}
			copy(got[:], sig)
			matched = hmac.Equal(st.enc[:], got[:])
		}
		s.k.pool.Put(st)
		if matched {
			return nil
		}
	}
	for _, pk := range keys {
		if pk.k == nil {
			continue
		}
		nEd++
		if edMatch(pk) {
			return nil
		}
	}
	switch {
	case len(secrets) == 0 && len(keys) == 0:
		return fmt.Errorf("verify: no secrets or public keys to check against: %w", ErrSignatureMismatch)
	case nEd == 0:
		return fmt.Errorf("verify: none of %d v1 signatures matches %d secrets: %w", countEntries(signature, version), nHMAC, ErrSignatureMismatch)
	case nHMAC == 0:
		return fmt.Errorf("verify: none of %d v1a signatures matches %d Ed25519 keys: %w", countEntries(signature, edVersion), nEd, ErrSignatureMismatch)
	}
	return fmt.Errorf("verify: none of %d v1 and %d v1a signatures matches %d HMAC secrets and %d Ed25519 keys: %w",
		countEntries(signature, version), countEntries(signature, edVersion), nHMAC, nEd, ErrSignatureMismatch)
}

// countEntries counts the entries of one version ("v1", "v1a") in a
// signature header, for error detail.
func countEntries(signature, ver string) int {
	n := 0
	for _, entry := range strings.Split(signature, " ") {
		if strings.HasPrefix(entry, ver+",") {
			n++
		}
	}
	return n
}

// parseTimestamp accepts only ASCII digits, so that "+1", "-1" or " 1" are
// rejected rather than silently reinterpreted.
func parseTimestamp(s string) (int64, error) {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("verify: %s is not unix seconds: %w", HeaderTimestamp, ErrBadTimestamp)
		}
	}
	ts, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("verify: %s out of range: %w", HeaderTimestamp, ErrBadTimestamp)
	}
	return ts, nil
}

// get returns a reset HMAC state; return it with k.pool.Put.
func (k *key) get() *macState {
	st := k.pool.Get().(*macState)
	st.h.Reset()
	return st
}

// writeString feeds s to the HMAC through buf, which avoids the allocation
// that converting s to a []byte for an interface call would cost.
func (st *macState) writeString(s string) {
	for s != "" {
		n := copy(st.buf[:], s)
		st.h.Write(st.buf[:n])
		s = s[n:]
	}
}

// finish computes the sum and its base64 encoding into st.sum and st.enc.
func (st *macState) finish() {
	st.h.Sum(st.sum[:0])
	base64.StdEncoding.Encode(st.enc[:], st.sum[:])
}
