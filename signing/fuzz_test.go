package signing_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/signing"
)

// referenceSign is a deliberately plain implementation of one v1 entry, used
// as an oracle: no pooling, no staging buffers.
func referenceSign(key []byte, id, ts string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// inWindow reports whether ts is a timestamp Verify should accept at now
// (unix seconds, whole-second now) with DefaultTolerance.
func inWindow(ts string, now int64) bool {
	if ts == "" || strings.TrimLeft(ts, "0123456789") != "" {
		return false
	}
	v, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return false
	}
	tol := int64(signing.DefaultTolerance / time.Second)
	return v >= now-tol && v <= now+tol
}

// FuzzVerify checks that signing then verifying always succeeds, that the
// signature equals the plain reference computation, and that arbitrary
// header values never panic and are accepted exactly when the oracle says so.
func FuzzVerify(f *testing.F) {
	if testing.Short() {
		f.Skip("fuzz targets are skipped with -short")
	}
	f.Add("msg_p5jXN8AQM9LWM0D4loKWxJek", int64(1614265330), []byte(`{"test": 2432232314}`), "1614265330", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	f.Add("", int64(0), []byte{}, "", "")
	f.Add("a.b", int64(1), []byte("."), "01", "v1, v1a,x v1,")
	f.Add(strings.Repeat("long-id", 40), int64(1700000000), []byte("body"), "1700000300", "v1,AAAA v2,BBBB")
	f.Add("id", int64(1700000000), []byte(nil), "+1700000000", " v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=  ")
	f.Add("id", int64(1700000000), []byte(nil), "99999999999999999999", "v1")

	key := []byte("fuzz-key-fuzz-key-fuzz-key-0123")
	secrets := []signing.Secret{signing.NewSecret(key)}
	f.Fuzz(func(t *testing.T, id string, ts int64, body []byte, tsHeader, sigHeader string) {
		ts &= 1<<40 - 1 // unix seconds up to year ~36800; negative is never sent
		now := time.Unix(ts, 0)
		tsText := strconv.FormatInt(ts, 10)

		sig := signing.Sign(secrets, id, ts, body)
		if want := referenceSign(key, id, tsText, body); sig != want {
			t.Fatalf("Sign = %q, reference = %q", sig, want)
		}
		err := signing.Verify(secrets, id, tsText, sig, body, now, signing.DefaultTolerance)
		if id == "" {
			if !errors.Is(err, signing.ErrMissingHeader) {
				t.Fatalf("empty id: err = %v, want ErrMissingHeader", err)
			}
		} else if err != nil {
			t.Fatalf("round trip: %v", err)
		}

		// Arbitrary headers: never panic; accept iff the id is present, the
		// timestamp is in the window and one entry is exactly the reference
		// signature over the received timestamp text.
		err = signing.Verify(secrets, id, tsHeader, sigHeader, body, now, signing.DefaultTolerance)
		want := id != "" && sigHeader != "" && inWindow(tsHeader, ts) &&
			slices.Contains(strings.Split(sigHeader, " "), referenceSign(key, id, tsHeader, body))
		if (err == nil) != want {
			t.Fatalf("Verify(ts %q, sig %q) = %v, want ok=%v", tsHeader, sigHeader, err, want)
		}
		if err != nil && !isVerifyError(err) {
			t.Fatalf("Verify error %v wraps no sentinel", err)
		}
	})
}

// FuzzSignatureHeader surrounds a valid entry with arbitrary text and checks
// the header parser: the delivery verifies exactly when the valid entry
// stands alone between spaces (or the header ends), whatever else the header
// holds.
func FuzzSignatureHeader(f *testing.F) {
	if testing.Short() {
		f.Skip("fuzz targets are skipped with -short")
	}
	const valid = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	f.Add("", "")
	f.Add("v1,AAAA ", " v1a,BBBB")
	f.Add("v1a,hnO3f9T8Ytu9HwrXslvumlUpqtNVqkhqw/enGzPCXe5BdqzCInXqYXFymVJaA7AZdpXwVLPo3mNl8EM+m7TBAg== ", "")
	f.Add("v1,", "")
	f.Add("x", "")
	f.Add("", "=")
	f.Add("", ",")
	f.Add("\t", "\n")
	f.Add("  ", "  ")
	f.Add("v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= ", "")

	secrets := []signing.Secret{mustParse(f, specSecret)}
	now := time.Unix(specTimestamp, 0)
	ts := strconv.Itoa(specTimestamp)
	f.Fuzz(func(t *testing.T, prefix, suffix string) {
		header := prefix + valid + suffix
		err := signing.Verify(secrets, specID, ts, header, []byte(specBody), now, 0)
		want := slices.Contains(strings.Split(header, " "), valid)
		if (err == nil) != want {
			t.Fatalf("Verify(%q) = %v, want ok=%v", header, err, want)
		}
		if err != nil && !errors.Is(err, signing.ErrSignatureMismatch) {
			t.Fatalf("Verify(%q) = %v, want ErrSignatureMismatch", header, err)
		}
		// The header alone, without the valid entry, must never verify
		// unless it contains the entry itself.
		err = signing.Verify(secrets, specID, ts, prefix+suffix, []byte(specBody), now, 0)
		want = slices.Contains(strings.Split(prefix+suffix, " "), valid)
		if (err == nil) != want {
			t.Fatalf("Verify(%q) = %v, want ok=%v", prefix+suffix, err, want)
		}
	})
}

func isVerifyError(err error) bool {
	for _, target := range []error{
		signing.ErrMissingHeader, signing.ErrBadTimestamp, signing.ErrTimestampTooOld,
		signing.ErrTimestampTooNew, signing.ErrSignatureMismatch,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// FuzzParseKey feeds arbitrary text to ParseSecret and ParsePublicKey: they
// never panic, errors wrap their sentinel and never echo the key part, and
// what parses encodes back to the same text. A whsk_ secret's public key
// parses as whpk_ and verifies what the secret signs.
func FuzzParseKey(f *testing.F) {
	if testing.Short() {
		f.Skip("fuzz targets are skipped with -short")
	}
	f.Add("whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=")
	f.Add("whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2DXWpgBgrEKt9VL/tPJZAc6DuFy89qmIyWvAhpo9wdRGg==")
	f.Add("whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A9QBfD6EOJWpK3CqdNG368nJgszy7Elozgz1XxKvRmDA==")
	f.Add("whpk_11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo=")
	f.Add("whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=")
	f.Add("whpk_AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
	f.Add("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	f.Add("whsk_")
	f.Add("whpk_")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		_, rest, _ := strings.Cut(s, "_")
		// A long run without spaces cannot occur in an error message by
		// chance; shorter text might ("secret").
		checkNoEcho := func(err error) {
			if len(rest) >= 16 && !strings.ContainsAny(rest, " \t\n") && strings.Contains(err.Error(), rest) {
				t.Fatalf("error %q echoes the input", err)
			}
		}
		sec, err := signing.ParseSecret(s)
		if err != nil {
			if !errors.Is(err, signing.ErrBadSecret) {
				t.Fatalf("ParseSecret error %v does not wrap ErrBadSecret", err)
			}
			checkNoEcho(err)
		} else {
			// whsec_ decoding is lenient (stray bits in the last base64
			// character), so only its re-encoding is fixed; whsk_ has one
			// spelling.
			if enc := sec.Encode(); enc != s && (strings.HasPrefix(s, "whsk_") || mustReparse(t, enc) != enc) {
				t.Fatalf("ParseSecret(%q).Encode() = %q", s, enc)
			}
			if out := fmt.Sprintf("%v %s %+v", sec, sec, sec); len(rest) >= 4 && strings.Contains(out, rest) {
				t.Fatalf("formatting reveals the key: %s", out)
			}
			pk, ok := sec.PublicKey()
			if ok != strings.HasPrefix(s, "whsk_") {
				t.Fatalf("ParseSecret(%q).PublicKey() ok = %v", s, ok)
			}
			if ok {
				parsed, err := signing.ParsePublicKey(pk.Encode())
				if err != nil || !parsed.Equal(pk) {
					t.Fatalf("public key %s does not parse back: %v", pk, err)
				}
				sig := signing.Sign([]signing.Secret{sec}, "id", 1, []byte(s))
				if err := signing.Verify(nil, "id", "1", sig, []byte(s), time.Unix(1, 0), 0, parsed); err != nil {
					t.Fatalf("round trip: %v", err)
				}
			}
		}
		pk, err := signing.ParsePublicKey(s)
		if err != nil {
			if !errors.Is(err, signing.ErrBadPublicKey) {
				t.Fatalf("ParsePublicKey error %v does not wrap ErrBadPublicKey", err)
			}
			checkNoEcho(err)
			return
		}
		if pk.Encode() != s {
			t.Fatalf("ParsePublicKey(%q).Encode() = %q", s, pk.Encode())
		}
		// A public key never verifies a signature it did not make, such as
		// one of the all-zero key's.
		err = signing.Verify(nil, "id", "1", "v1a,"+strings.Repeat("A", 86)+"==", nil, time.Unix(1, 0), 0, pk)
		if !errors.Is(err, signing.ErrSignatureMismatch) {
			t.Fatalf("Verify with %s of a zero signature: %v", pk, err)
		}
	})
}

// FuzzVerifyEd25519 signs with an Ed25519 key from the fuzzer's seed and
// checks the round trip with the secret and with its public key, and that
// an arbitrary header is accepted exactly when it holds the one v1a entry
// the key makes for this content (Ed25519 as signed here is deterministic,
// and no other valid signature can be made without the key).
func FuzzVerifyEd25519(f *testing.F) {
	if testing.Short() {
		f.Skip("fuzz targets are skipped with -short")
	}
	f.Add([]byte("seed"), "msg_p5jXN8AQM9LWM0D4loKWxJek", int64(1614265330), []byte(`{"test": 2432232314}`), "")
	f.Add([]byte{}, "a.b", int64(0), []byte("."), "v1a, v1a,x v1,")
	f.Add([]byte{1, 2, 3}, strings.Repeat("id", 100), int64(1700000000), bytes.Repeat([]byte("b"), 5000), "v1a,"+strings.Repeat("A", 86)+"==")
	f.Fuzz(func(t *testing.T, seed []byte, id string, ts int64, body []byte, sigHeader string) {
		if id == "" {
			return // Verify refuses it before any signature; FuzzVerify covers that
		}
		ts &= 1<<40 - 1
		seed32 := make([]byte, ed25519.SeedSize)
		copy(seed32, seed)
		sec, err := signing.ParseSecret("whsk_" + base64.StdEncoding.EncodeToString(seed32))
		if err != nil {
			t.Fatal(err)
		}
		pk, _ := sec.PublicKey()
		tsText := strconv.FormatInt(ts, 10)
		now := time.Unix(ts, 0)

		sig := signing.Sign([]signing.Secret{sec}, id, ts, body)
		content := append([]byte(id+"."+tsText+"."), body...)
		want := "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(ed25519.NewKeyFromSeed(seed32), content))
		if sig != want {
			t.Fatalf("Sign = %q, reference = %q", sig, want)
		}
		if err := signing.Verify(nil, id, tsText, sig, body, now, 0, pk); err != nil {
			t.Fatalf("round trip with the public key: %v", err)
		}
		if err := signing.Verify([]signing.Secret{sec}, id, tsText, sig, body, now, 0); err != nil {
			t.Fatalf("round trip with the secret: %v", err)
		}
		err = signing.Verify(nil, id, tsText, sigHeader, body, now, 0, pk)
		if ok := slices.Contains(strings.Split(sigHeader, " "), want); (err == nil) != ok {
			t.Fatalf("Verify(%q) = %v, want ok=%v", sigHeader, err, ok)
		}
		if err != nil && !isVerifyError(err) {
			t.Fatalf("Verify error %v wraps no sentinel", err)
		}
	})
}

func mustReparse(t *testing.T, enc string) string {
	sec, err := signing.ParseSecret(enc)
	if err != nil {
		t.Fatalf("Encode output %q does not parse: %v", enc, err)
	}
	return sec.Encode()
}
