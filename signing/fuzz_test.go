package signing_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
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
