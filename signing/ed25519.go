package signing

// Asymmetric signatures: the Standard Webhooks "v1a" scheme.
//
// The specification's table of schemes gives, for asymmetric signatures:
// scheme "ed25519", signing secret "standard ed25519 key pair", serialized
// "base64 encoded, prefixed with whsk_ for the secret key, and whpk_ for the
// public key", signature identifier "v1a". It fixes neither the private
// key's length nor the base64 alphabet, so this package takes the
// symmetric scheme's standard padded base64 and both common forms of a
// "standard" private key: the 32-byte seed, which RFC 8032 section 5.1.5
// calls the private key (and which OpenSSL, JWK "d", Python's cryptography
// and Haskell's signet, a Standard Webhooks library, serialize), and the
// 64-byte seed||public key of NaCl, libsodium and Go's crypto/ed25519. A
// 64-byte key whose second half is not its seed's public key is refused,
// since the signatures it made would match no public key. Anything else is
// refused with its length named.
//
// The curve arithmetic is crypto/ed25519's; this file only frames the
// Standard Webhooks message ("id.timestamp.body") and the header entries.

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

const (
	edSecretPrefix = "whsk_"
	edPublicPrefix = "whpk_"
	edRedacted     = "whsk_…redacted"
	edVersion      = "v1a"
	// edEncodedLen is the length of a base64 encoded Ed25519 signature.
	edEncodedLen = (ed25519.SignatureSize + 2) / 3 * 4
	// edEntryLen is the length of one "v1a,<base64>" entry.
	edEntryLen = len(edVersion) + 1 + edEncodedLen
	// maxPooledMsg bounds the staging buffers kept for reuse: a message
	// (id, timestamp and body) larger than this is staged in a buffer that
	// is dropped afterwards, so one large body does not pin its size in
	// every pooled buffer.
	maxPooledMsg = 64 << 10
)

// strictBase64 refuses the non-canonical encodings (stray bits in the last
// character) that StdEncoding accepts, so that a v1a signature, a whsk_ and
// a whpk_ key each have one spelling. (whsec_ secrets keep StdEncoding's
// leniency, as they had before whsk_ keys existed.)
var strictBase64 = base64.StdEncoding.Strict()

// decodeKey decodes a whsk_ or whpk_ key's base64 strictly, refusing also
// the line breaks encoding/base64 skips even when strict: a key with one
// inside parsed, and wrote itself back without it (FuzzParseKey).
func decodeKey(b64 string) ([]byte, error) {
	if i := strings.IndexAny(b64, "\r\n"); i >= 0 {
		return nil, base64.CorruptInputError(i)
	}
	return strictBase64.DecodeString(b64)
}

// msgPool holds buffers for the signed content "id.timestamp.body":
// crypto/ed25519 takes the message in one slice (pure Ed25519 hashes it
// twice, so there is no streaming form). The buffers hold no key material
// and are shared by all keys.
var msgPool = sync.Pool{New: func() any { return new(msgBuf) }}

type msgBuf struct{ b []byte }

// stage returns a pooled buffer holding id + "." + ts + "." + body; give it
// back with release.
func stage(id, ts string, body []byte) *msgBuf {
	m := msgPool.Get().(*msgBuf)
	b := append(m.b[:0], id...)
	b = append(b, '.')
	b = append(b, ts...)
	b = append(b, '.')
	m.b = append(b, body...)
	return m
}

func (m *msgBuf) release() {
	if cap(m.b) > maxPooledMsg {
		m.b = nil
	}
	msgPool.Put(m)
}

// edKey is the Ed25519 half of a key. priv lives in a closure for the
// reason key.raw does; it always returns the same slice, which matters:
// crypto/ed25519 caches the expanded private key per backing array, so a
// stable slice expands once, not on every signature.
type edKey struct {
	priv func() ed25519.PrivateKey // seed || public key, 64 bytes
	pub  PublicKey
}

// parseEd25519Secret parses the base64 part of a whsk_ secret.
func parseEd25519Secret(b64 string) (Secret, error) {
	raw, err := decodeKey(b64)
	if err != nil {
		return Secret{}, fmt.Errorf("parse secret: not standard base64 after %q (%v): %w", edSecretPrefix, err, ErrBadSecret)
	}
	switch len(raw) {
	case ed25519.SeedSize:
		return newEd25519Secret(raw, ed25519.NewKeyFromSeed(raw)), nil
	case ed25519.PrivateKeySize:
		priv := ed25519.NewKeyFromSeed(raw[:ed25519.SeedSize])
		if string(priv[ed25519.SeedSize:]) != string(raw[ed25519.SeedSize:]) {
			return Secret{}, fmt.Errorf("parse secret: %q key of 64 bytes: its last 32 bytes are not the public key of its first 32 (the seed): %w", edSecretPrefix, ErrBadSecret)
		}
		return newEd25519Secret(raw, priv), nil
	}
	return Secret{}, fmt.Errorf("parse secret: %q key is %d bytes, want %d (an Ed25519 seed) or %d (seed and public key): %w",
		edSecretPrefix, len(raw), ed25519.SeedSize, ed25519.PrivateKeySize, ErrBadSecret)
}

// GenerateEd25519Secret returns a new whsk_ Secret: an Ed25519 key pair
// from crypto/rand. Its Encode form is the 32-byte seed.
func GenerateEd25519Secret() (Secret, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return Secret{}, fmt.Errorf("generate Ed25519 secret: %w", err)
	}
	return newEd25519Secret(append([]byte(nil), priv.Seed()...), priv), nil
}

// newEd25519Secret takes ownership of enc (the bytes Encode shows: seed or
// seed||public) and priv (the 64-byte private key).
func newEd25519Secret(enc []byte, priv ed25519.PrivateKey) Secret {
	pub := PublicKey{k: ed25519.PublicKey(append([]byte(nil), priv[ed25519.SeedSize:]...))}
	return Secret{k: &key{
		raw: func() []byte { return enc },
		ed:  &edKey{priv: func() ed25519.PrivateKey { return priv }, pub: pub},
	}}
}

// PublicKey returns the whpk_ public key of an Ed25519 (whsk_) secret, for
// receivers to verify its v1a signatures with. ok is false for an HMAC
// secret, which has no public key, and for the zero Secret.
func (s Secret) PublicKey() (pk PublicKey, ok bool) {
	if s.k == nil || s.k.ed == nil {
		return PublicKey{}, false
	}
	return s.k.ed.pub, true
}

// appendSignature appends the "v1a,<base64>" entry for id, ts and body.
func (e *edKey) appendSignature(dst []byte, id string, ts int64, body []byte) []byte {
	var num [20]byte // the longest int64
	m := stage(id, string(strconv.AppendInt(num[:0], ts, 10)), body)
	dst = e.appendEntry(dst, m.b)
	m.release()
	return dst
}

// appendEntry appends the "v1a,<base64>" entry for the signed content msg.
func (e *edKey) appendEntry(dst, msg []byte) []byte {
	// ed25519.Sign is outlined so that its 64-byte result can stay on
	// this stack frame; it is encoded straight into dst.
	sig := ed25519.Sign(e.priv(), msg)
	dst = append(dst, edVersion...)
	dst = append(dst, ',')
	return base64.StdEncoding.AppendEncode(dst, sig)
}

// PublicKey is an Ed25519 public key in the Standard Webhooks whpk_ form:
// it verifies v1a signatures and cannot make them. It is not secret:
// String and Encode print it in full. The zero PublicKey matches nothing.
// PublicKey values are cheap to copy and safe for concurrent use.
type PublicKey struct {
	k ed25519.PublicKey
}

// ParsePublicKey parses a whpk_ public key: "whpk_" followed by the 32-byte
// key in standard (padded) base64. The key must be a point of the curve.
// Errors wrap ErrBadPublicKey and say what is wrong; a whsk_ or whsec_
// secret given by mistake is named as such, never repeated.
func ParsePublicKey(s string) (PublicKey, error) {
	if s == "" {
		return PublicKey{}, fmt.Errorf("parse public key: empty: %w", ErrBadPublicKey)
	}
	if strings.TrimSpace(s) != s {
		return PublicKey{}, fmt.Errorf("parse public key: leading or trailing whitespace: %w", ErrBadPublicKey)
	}
	b64, ok := strings.CutPrefix(s, edPublicPrefix)
	if !ok {
		switch {
		case strings.HasPrefix(s, edSecretPrefix):
			return PublicKey{}, fmt.Errorf("parse public key: this is a %q secret key, which must stay with the sender; give its %q public key: %w", edSecretPrefix, edPublicPrefix, ErrBadPublicKey)
		case strings.HasPrefix(s, secretPrefix):
			return PublicKey{}, fmt.Errorf("parse public key: this is a %q HMAC secret, which has no public key: %w", secretPrefix, ErrBadPublicKey)
		}
		return PublicKey{}, fmt.Errorf("parse public key: missing %q prefix: %w", edPublicPrefix, ErrBadPublicKey)
	}
	raw, err := decodeKey(b64)
	if err != nil {
		return PublicKey{}, fmt.Errorf("parse public key: not standard base64 after %q (%v): %w", edPublicPrefix, err, ErrBadPublicKey)
	}
	if len(raw) != ed25519.PublicKeySize {
		return PublicKey{}, fmt.Errorf("parse public key: key is %d bytes, want %d: %w", len(raw), ed25519.PublicKeySize, ErrBadPublicKey)
	}
	if !onCurve(raw) {
		return PublicKey{}, fmt.Errorf("parse public key: not an Ed25519 public key (not a point of the curve): %w", ErrBadPublicKey)
	}
	return PublicKey{k: raw}, nil
}

// onCurve reports whether a 32-byte key decodes to a curve point.
// crypto/ed25519 exports no such check, but VerifyWithOptions decodes the
// key before it looks at the signature: for a signature of the wrong
// length it answers a decodable key exactly as it answers a known good
// one, and a key that does not decode differently.
func onCurve(raw []byte) bool {
	err := ed25519.VerifyWithOptions(raw, nil, nil, &ed25519.Options{})
	return err != nil && goodKeyErr != nil && err.Error() == goodKeyErr.Error()
}

// goodKeyErr is VerifyWithOptions's answer for a valid key (RFC 8032
// section 7.1 TEST 1's) and an empty signature.
var goodKeyErr = ed25519.VerifyWithOptions(ed25519.PublicKey{
	0xd7, 0x5a, 0x98, 0x01, 0x82, 0xb1, 0x0a, 0xb7, 0xd5, 0x4b, 0xfe, 0xd3, 0xc9, 0x64, 0x07, 0x3a,
	0x0e, 0xe1, 0x72, 0xf3, 0xda, 0xa6, 0x23, 0x25, 0xaf, 0x02, 0x1a, 0x68, 0xf7, 0x07, 0x51, 0x1a,
}, nil, nil, &ed25519.Options{})

// Encode returns the key as "whpk_<base64>"; the zero PublicKey encodes
// as "".
func (pk PublicKey) Encode() string {
	if pk.k == nil {
		return ""
	}
	return edPublicPrefix + base64.StdEncoding.EncodeToString(pk.k)
}

// String returns Encode's form; a public key is not secret.
func (pk PublicKey) String() string { return pk.Encode() }

// Equal reports whether pk and other are the same key.
func (pk PublicKey) Equal(other PublicKey) bool { return string(pk.k) == string(other.k) }

var _ fmt.Stringer = PublicKey{}

// verifyEntries reports whether one "v1a,<base64>" entry of signature is
// pk's signature over msg.
func (pk PublicKey) verifyEntries(signature string, msg []byte) bool {
	var enc [edEncodedLen]byte
	var sig [ed25519.SignatureSize + 2]byte // Decode may write up to 66 bytes for 88 characters
	for rest := signature; rest != ""; {
		var entry string
		entry, rest, _ = strings.Cut(rest, " ")
		ver, b64, ok := strings.Cut(entry, ",")
		if !ok || ver != edVersion || len(b64) != edEncodedLen {
			continue
		}
		copy(enc[:], b64)
		n, err := strictBase64.Decode(sig[:], enc[:])
		if err != nil || n != ed25519.SignatureSize {
			continue
		}
		if ed25519.Verify(pk.k, msg, sig[:n]) {
			return true
		}
	}
	return false
}
