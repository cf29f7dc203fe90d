package signing_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/signing"
)

// The Standard Webhooks test vector, as used by the reference libraries'
// tests (standard-webhooks/standard-webhooks, libraries/go/webhook_test.go
// TestWebhookSign). Its key is 24 bytes, the specification's minimum.
const (
	specSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	specID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	specTimestamp = 1614265330
	specBody      = `{"test": 2432232314}`
	specSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func mustParse(tb testing.TB, s string) signing.Secret {
	tb.Helper()
	sec, err := signing.ParseSecret(s)
	if err != nil {
		tb.Fatalf("ParseSecret: %v", err)
	}
	return sec
}

func mustGenerate(tb testing.TB) signing.Secret {
	tb.Helper()
	sec, err := signing.GenerateSecret()
	if err != nil {
		tb.Fatalf("GenerateSecret: %v", err)
	}
	return sec
}

func TestSign_SpecVector(t *testing.T) {
	sec := mustParse(t, specSecret)
	secrets := []signing.Secret{sec}
	if got := signing.Sign(secrets, specID, specTimestamp, []byte(specBody)); got != specSignature {
		t.Fatalf("Sign = %q, want %q", got, specSignature)
	}
	// Repeated calls reuse pooled HMAC state; the result must not change.
	for range 3 {
		if got := string(signing.AppendSignature(nil, secrets, specID, specTimestamp, []byte(specBody))); got != specSignature {
			t.Fatalf("AppendSignature = %q, want %q", got, specSignature)
		}
	}
	now := time.Unix(specTimestamp, 0)
	if err := signing.Verify(secrets, specID, strconv.Itoa(specTimestamp), specSignature, []byte(specBody), now, signing.DefaultTolerance); err != nil {
		t.Fatalf("Verify spec vector: %v", err)
	}
	if got := sec.Encode(); got != specSecret {
		t.Fatalf("Encode = %q, want the parsed string back", got)
	}
}

func TestAppendSignature_AppendsToDst(t *testing.T) {
	sec := mustParse(t, specSecret)
	dst := []byte("prefix:")
	got := signing.AppendSignature(dst, []signing.Secret{sec}, specID, specTimestamp, []byte(specBody))
	if want := "prefix:" + specSignature; string(got) != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got := signing.AppendSignature(nil, nil, specID, specTimestamp, nil); len(got) != 0 {
		t.Fatalf("no secrets: got %q, want empty", got)
	}
}

func TestAppendSignature_ZeroSecretPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for zero Secret")
		}
	}()
	signing.AppendSignature(nil, []signing.Secret{{}}, "id", 1, nil)
}

func TestSign_LongID(t *testing.T) {
	// Ids longer than the internal staging buffer are fed to the HMAC in
	// chunks, by both Sign and Verify; the result must equal the plain
	// reference computation.
	sec := mustGenerate(t)
	id := strings.Repeat("x", 1000)
	sig := signing.Sign([]signing.Secret{sec}, id, 1700000000, []byte("body"))
	if err := signing.Verify([]signing.Secret{sec}, id, "1700000000", sig, []byte("body"), time.Unix(1700000000, 0), 0); err != nil {
		t.Fatalf("Verify long id: %v", err)
	}
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(sec.Encode(), "whsec_"))
	want := referenceSign(key, id, "1700000000", []byte("body"))
	if sig != want {
		t.Fatalf("long id: got %q, want %q", sig, want)
	}
}

func TestRotation(t *testing.T) {
	oldSec, newSec := mustGenerate(t), mustGenerate(t)
	body := []byte(`{"rotate":true}`)
	const ts = 1700000000
	header := signing.Sign([]signing.Secret{newSec, oldSec}, "msg_1", ts, body)

	entries := strings.Split(header, " ")
	if len(entries) != 2 {
		t.Fatalf("header %q has %d entries, want 2", header, len(entries))
	}
	if entries[0] != signing.Sign([]signing.Secret{newSec}, "msg_1", ts, body) ||
		entries[1] != signing.Sign([]signing.Secret{oldSec}, "msg_1", ts, body) {
		t.Fatalf("entries not one per secret, in order: %q", header)
	}
	now := time.Unix(ts, 0)
	for name, secrets := range map[string][]signing.Secret{
		"old only": {oldSec},
		"new only": {newSec},
		"both":     {oldSec, newSec},
	} {
		if err := signing.Verify(secrets, "msg_1", strconv.Itoa(ts), header, body, now, 0); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	other := mustGenerate(t)
	err := signing.Verify([]signing.Secret{other}, "msg_1", strconv.Itoa(ts), header, body, now, 0)
	if !errors.Is(err, signing.ErrSignatureMismatch) {
		t.Fatalf("unrelated secret: err = %v, want ErrSignatureMismatch", err)
	}
}

func TestVerify_Tolerance(t *testing.T) {
	sec := mustGenerate(t)
	secrets := []signing.Secret{sec}
	const ts = 1700000000
	body := []byte("{}")
	sig := signing.Sign(secrets, "msg_t", ts, body)
	sent := time.Unix(ts, 0)
	tol := signing.DefaultTolerance

	tests := []struct {
		name string
		now  time.Time
		tol  time.Duration
		want error
	}{
		{"same second", sent, tol, nil},
		{"now mid-second", sent.Add(500 * time.Millisecond), tol, nil},
		{"old, exactly at edge", sent.Add(tol), tol, nil},
		{"old, 1ns past edge", sent.Add(tol + time.Nanosecond), tol, signing.ErrTimestampTooOld},
		{"old, 1s past edge", sent.Add(tol + time.Second), tol, signing.ErrTimestampTooOld},
		{"old, a day", sent.Add(24 * time.Hour), tol, signing.ErrTimestampTooOld},
		{"new, exactly at edge", sent.Add(-tol), tol, nil},
		{"new, 1ns past edge", sent.Add(-tol - time.Nanosecond), tol, signing.ErrTimestampTooNew},
		{"new, 1s past edge", sent.Add(-tol - time.Second), tol, signing.ErrTimestampTooNew},
		{"custom tolerance accepts", sent.Add(10 * time.Second), 10 * time.Second, nil},
		{"custom tolerance rejects", sent.Add(11 * time.Second), 10 * time.Second, signing.ErrTimestampTooOld},
		{"zero tolerance means default", sent.Add(tol), 0, nil},
		{"zero tolerance means default, past", sent.Add(tol + time.Second), 0, signing.ErrTimestampTooOld},
		{"negative tolerance means default", sent.Add(-tol), -time.Second, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := signing.Verify(secrets, "msg_t", strconv.Itoa(ts), sig, body, tt.now, tt.tol)
			if tt.want == nil && err != nil {
				t.Fatalf("err = %v, want nil", err)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestVerify_Rejects(t *testing.T) {
	sec := mustParse(t, specSecret)
	secrets := []signing.Secret{sec}
	now := time.Unix(specTimestamp, 0)
	ts := strconv.Itoa(specTimestamp)
	// A signature over the tampered timestamp is also needed, to show that a
	// fresh timestamp cannot be paired with an old signature.
	tamperedTS := strconv.Itoa(specTimestamp + 1)

	tests := []struct {
		name          string
		id, ts, sig   string
		body          string
		want          error
		wantInMessage string
	}{
		{"tampered body", specID, ts, specSignature, `{"test": 2432232315}`, signing.ErrSignatureMismatch, ""},
		{"body with trailing newline", specID, ts, specSignature, specBody + "\n", signing.ErrSignatureMismatch, ""},
		{"tampered id", specID + "x", ts, specSignature, specBody, signing.ErrSignatureMismatch, ""},
		{"tampered timestamp", specID, tamperedTS, specSignature, specBody, signing.ErrSignatureMismatch, ""},
		{"timestamp with leading zero", specID, "0" + ts, specSignature, specBody, signing.ErrSignatureMismatch, ""},
		{"empty id", "", ts, specSignature, specBody, signing.ErrMissingHeader, "webhook-id"},
		{"empty timestamp", specID, "", specSignature, specBody, signing.ErrMissingHeader, "webhook-timestamp"},
		{"empty signature", specID, ts, "", specBody, signing.ErrMissingHeader, "webhook-signature"},
		{"timestamp not a number", specID, "yesterday", specSignature, specBody, signing.ErrBadTimestamp, ""},
		{"timestamp with plus sign", specID, "+" + ts, specSignature, specBody, signing.ErrBadTimestamp, ""},
		{"negative timestamp", specID, "-" + ts, specSignature, specBody, signing.ErrBadTimestamp, ""},
		{"timestamp with space", specID, ts + " ", specSignature, specBody, signing.ErrBadTimestamp, ""},
		{"timestamp in milliseconds", specID, ts + "000", specSignature, specBody, signing.ErrTimestampTooNew, ""},
		{"timestamp overflows int64", specID, "99999999999999999999", specSignature, specBody, signing.ErrBadTimestamp, ""},
		{"huge timestamp", specID, "9223372036854775807", specSignature, specBody, signing.ErrTimestampTooNew, ""},
		{"zero timestamp", specID, "0", specSignature, specBody, signing.ErrTimestampTooOld, ""},
		{"wrong version", specID, ts, "v2" + strings.TrimPrefix(specSignature, "v1"), specBody, signing.ErrSignatureMismatch, ""},
		{"asymmetric entry ignored", specID, ts, "v1a" + strings.TrimPrefix(specSignature, "v1"), specBody, signing.ErrSignatureMismatch, ""},
		{"no version", specID, ts, strings.TrimPrefix(specSignature, "v1,"), specBody, signing.ErrSignatureMismatch, ""},
		{"truncated signature", specID, ts, specSignature[:len(specSignature)-1], specBody, signing.ErrSignatureMismatch, ""},
		{"signature with extra byte", specID, ts, specSignature + "A", specBody, signing.ErrSignatureMismatch, ""},
		{"unpadded signature", specID, ts, strings.TrimSuffix(specSignature, "="), specBody, signing.ErrSignatureMismatch, ""},
		{"comma separated list", specID, ts, "v1,AAAA," + specSignature, specBody, signing.ErrSignatureMismatch, ""},
		{"mismatch counts v1 entries", specID, ts, "v1,AAAA v1a,BBBB v1,CCCC", specBody, signing.ErrSignatureMismatch, "none of 2 v1 signatures"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := signing.Verify(secrets, tt.id, tt.ts, tt.sig, []byte(tt.body), now, 0)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.wantInMessage) {
				t.Fatalf("err = %q, want it to mention %q", err, tt.wantInMessage)
			}
		})
	}
}

func TestVerify_HeaderVariants(t *testing.T) {
	sec := mustParse(t, specSecret)
	secrets := []signing.Secret{sec}
	now := time.Unix(specTimestamp, 0)
	ts := strconv.Itoa(specTimestamp)
	bogus := "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="

	for _, header := range []string{
		specSignature,
		bogus + " " + specSignature,
		specSignature + " " + bogus,
		"v1a,hnO3f9T8Ytu9HwrXslvumlUpqtNVqkhqw/enGzPCXe5BdqzCInXqYXFymVJaA7AZdpXwVLPo3mNl8EM+m7TBAg== " + specSignature,
		"v2," + strings.TrimPrefix(specSignature, "v1,") + " " + specSignature,
		"  " + specSignature + "  ",
		"garbage " + specSignature,
	} {
		if err := signing.Verify(secrets, specID, ts, header, []byte(specBody), now, 0); err != nil {
			t.Errorf("header %q: %v", header, err)
		}
	}
}

func TestVerify_NoSecrets(t *testing.T) {
	now := time.Unix(specTimestamp, 0)
	ts := strconv.Itoa(specTimestamp)
	for name, secrets := range map[string][]signing.Secret{
		"nil":  nil,
		"zero": {{}},
	} {
		err := signing.Verify(secrets, specID, ts, specSignature, []byte(specBody), now, 0)
		if !errors.Is(err, signing.ErrSignatureMismatch) {
			t.Errorf("%s: err = %v, want ErrSignatureMismatch", name, err)
		}
	}
}

func TestParseSecret(t *testing.T) {
	key := func(n int) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xA5}, n)) }
	tests := []struct {
		name    string
		in      string
		wantErr string // "" means valid
	}{
		{"spec secret, 24 bytes", specSecret, ""},
		{"32 bytes", "whsec_" + key(32), ""},
		{"64 bytes", "whsec_" + key(64), ""},
		{"empty", "", "empty"},
		{"missing prefix", key(32), `missing "whsec_" prefix`},
		{"wrong prefix", "whsig_" + key(32), `missing "whsec_" prefix`},
		{"Ed25519 seed", "whsk_" + key(32), ""},
		{"Ed25519 public key", "whpk_" + key(32), `"whpk_" public key verifies signatures but cannot sign`},
		{"upper-case prefix", "WHSEC_" + key(32), `missing "whsec_" prefix`},
		{"prefix only", "whsec_", "key is 0 bytes"},
		{"url-safe base64", "whsec_" + strings.NewReplacer("+", "-", "/", "_").Replace(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xFB, 0xEF}, 16))), "not standard base64"},
		{"not base64", "whsec_not*base64*at*all*but*long*enough", "not standard base64"},
		{"missing padding", "whsec_" + strings.TrimRight(key(32), "="), "not standard base64"},
		{"23 bytes, too short", "whsec_" + key(23), "key is 23 bytes, want 24 to 64"},
		{"16 bytes, too short", "whsec_" + key(16), "key is 16 bytes, want 24 to 64"},
		{"65 bytes, too long", "whsec_" + key(65), "key is 65 bytes, want 24 to 64"},
		{"trailing newline", specSecret + "\n", "whitespace"},
		{"leading space", " " + specSecret, "whitespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sec, err := signing.ParseSecret(tt.in)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				if sec.Encode() != tt.in {
					t.Fatalf("Encode does not round-trip")
				}
				return
			}
			if !errors.Is(err, signing.ErrBadSecret) {
				t.Fatalf("err = %v, want ErrBadSecret", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.wantErr) {
				t.Fatalf("err = %q, want it to say %q", msg, tt.wantErr)
			}
			// The message must not echo the secret or its base64 part.
			if b64 := strings.TrimPrefix(strings.TrimSpace(tt.in), "whsec_"); len(b64) > 4 && strings.Contains(msg, b64) {
				t.Fatalf("err %q echoes the secret", msg)
			}
			if len(tt.in) > 8 && strings.Contains(msg, tt.in[len(tt.in)-8:]) {
				t.Fatalf("err %q echoes the end of the secret", msg)
			}
		})
	}
}

func TestNewSecret(t *testing.T) {
	raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(specSecret, "whsec_"))
	sec := signing.NewSecret(raw)
	for i := range raw {
		raw[i] = 0 // NewSecret must have copied the key
	}
	if got := signing.Sign([]signing.Secret{sec}, specID, specTimestamp, []byte(specBody)); got != specSignature {
		t.Fatalf("Sign with NewSecret = %q, want %q", got, specSignature)
	}
}

func TestGenerateSecret(t *testing.T) {
	a, b := mustGenerate(t), mustGenerate(t)
	if a.Encode() == b.Encode() {
		t.Fatal("two generated secrets are equal")
	}
	parsed, err := signing.ParseSecret(a.Encode())
	if err != nil {
		t.Fatalf("generated secret does not parse: %v", err)
	}
	raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(a.Encode(), "whsec_"))
	if len(raw) != 32 {
		t.Fatalf("generated key is %d bytes, want 32", len(raw))
	}
	sig := signing.Sign([]signing.Secret{a}, "id", 1, nil)
	if got := signing.Sign([]signing.Secret{parsed}, "id", 1, nil); got != sig {
		t.Fatal("parsed Encode output signs differently")
	}
}

func TestSecret_Redacted(t *testing.T) {
	sec := mustParse(t, specSecret)
	b64 := strings.TrimPrefix(specSecret, "whsec_")
	raw, _ := base64.StdEncoding.DecodeString(b64)

	type holder struct {
		Name    string
		Secret  signing.Secret
		secret  signing.Secret
		ptr     *signing.Secret
		Secrets []signing.Secret
	}
	h := holder{Name: "billing", Secret: sec, secret: sec, ptr: &sec, Secrets: []signing.Secret{sec, sec}}

	values := map[string]any{
		"Secret":        sec,
		"*Secret":       &sec,
		"[]Secret":      []signing.Secret{sec},
		"struct":        h,
		"*struct":       &h,
		"map":           map[string]signing.Secret{"k": sec},
		"String method": sec.String(),
	}
	leaks := []string{b64, b64[:12], string(raw), fmt.Sprint(raw), fmt.Sprintf("%x", raw), fmt.Sprintf("%X", raw)}
	for name, v := range values {
		for _, verb := range []string{"%v", "%s", "%+v", "%#v", "%q", "%x", "%X", "%d"} {
			out := fmt.Sprintf(verb, v)
			for _, leak := range leaks {
				if strings.Contains(out, leak) {
					t.Errorf("%s with %s reveals the key: %s", name, verb, out)
				}
			}
		}
	}
	if got := fmt.Sprint(sec); got != "whsec_…redacted" {
		t.Errorf("fmt.Sprint = %q, want whsec_…redacted", got)
	}

	var buf bytes.Buffer
	for _, handler := range []slog.Handler{slog.NewTextHandler(&buf, nil), slog.NewJSONHandler(&buf, nil)} {
		slog.New(handler).Info("configured", "secret", sec, "holder", h)
	}
	for _, leak := range leaks {
		if strings.Contains(buf.String(), leak) {
			t.Errorf("slog output reveals the key: %s", buf.String())
		}
	}
	if !strings.Contains(buf.String(), "whsec_…redacted") {
		t.Errorf("slog output does not show the redacted form: %s", buf.String())
	}
}

func TestAppendSignature_Allocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	one := []signing.Secret{mustGenerate(t)}
	two := []signing.Secret{mustGenerate(t), mustGenerate(t)}
	body := bytes.Repeat([]byte("a"), 512)
	dst := make([]byte, 0, 256)
	for name, secrets := range map[string][]signing.Secret{"one secret": one, "two secrets": two} {
		allocs := testing.AllocsPerRun(100, func() {
			dst = signing.AppendSignature(dst[:0], secrets, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", 1674087231, body)
		})
		if allocs != 0 {
			t.Errorf("%s: AppendSignature allocates %.1f times per call, want 0", name, allocs)
		}
	}
	longID := strings.Repeat("i", 300)
	allocs := testing.AllocsPerRun(100, func() {
		dst = signing.AppendSignature(dst[:0], one, longID, 1674087231, body)
	})
	if allocs != 0 {
		t.Errorf("long id: AppendSignature allocates %.1f times per call, want 0", allocs)
	}
}

func TestVerify_Allocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	secrets := []signing.Secret{mustGenerate(t), mustGenerate(t)}
	body := bytes.Repeat([]byte("a"), 512)
	sig := signing.Sign(secrets[1:], "msg_1", 1674087231, body)
	now := time.Unix(1674087231, 0)
	allocs := testing.AllocsPerRun(100, func() {
		if err := signing.Verify(secrets, "msg_1", "1674087231", sig, body, now, 0); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Verify allocates %.1f times on success, want 0", allocs)
	}
}

func TestConcurrentUse(t *testing.T) {
	sec := mustParse(t, specSecret)
	secrets := []signing.Secret{sec}
	done := make(chan string)
	for range 8 {
		go func() {
			var dst []byte
			for range 200 {
				dst = signing.AppendSignature(dst[:0], secrets, specID, specTimestamp, []byte(specBody))
				if string(dst) != specSignature {
					done <- string(dst)
					return
				}
			}
			done <- ""
		}()
	}
	for range 8 {
		if got := <-done; got != "" {
			t.Errorf("concurrent signature = %q, want %q", got, specSignature)
		}
	}
}

func BenchmarkAppendSignature(b *testing.B) {
	body := bytes.Repeat([]byte(`{"k":"v"}`), 57)[:512]
	for _, n := range []int{1, 2} {
		secrets := make([]signing.Secret, n)
		for i := range secrets {
			secrets[i] = mustGenerate(b)
		}
		b.Run(fmt.Sprintf("secrets=%d", n), func(b *testing.B) {
			dst := make([]byte, 0, 128)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				dst = signing.AppendSignature(dst[:0], secrets, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", 1674087231, body)
			}
		})
	}
}

func BenchmarkVerify(b *testing.B) {
	body := bytes.Repeat([]byte(`{"k":"v"}`), 57)[:512]
	secrets := []signing.Secret{mustGenerate(b)}
	sig := signing.Sign(secrets, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", 1674087231, body)
	now := time.Unix(1674087231, 0)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := signing.Verify(secrets, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", "1674087231", sig, body, now, 0); err != nil {
			b.Fatal(err)
		}
	}
}
