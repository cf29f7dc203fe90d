package signing_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/signing"
)

// rfc8032 holds RFC 8032 section 7.1's Ed25519 test vectors TEST 1, 2 and
// 3, in the RFC's hex: SECRET KEY (the 32-byte seed), PUBLIC KEY, MESSAGE
// and SIGNATURE.
var rfc8032 = []struct {
	name, seed, public, message, signature string
}{
	{
		name:      "TEST 1",
		seed:      "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
		public:    "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
		message:   "",
		signature: "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
	},
	{
		name:      "TEST 2",
		seed:      "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
		public:    "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
		message:   "72",
		signature: "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
	},
	{
		name:      "TEST 3",
		seed:      "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
		public:    "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
		message:   "af82",
		signature: "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
	},
}

func unhex(tb testing.TB, s string) []byte {
	tb.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func mustParsePublic(tb testing.TB, s string) signing.PublicKey {
	tb.Helper()
	pk, err := signing.ParsePublicKey(s)
	if err != nil {
		tb.Fatalf("ParsePublicKey: %v", err)
	}
	return pk
}

func mustGenerateEd25519(tb testing.TB) signing.Secret {
	tb.Helper()
	sec, err := signing.GenerateEd25519Secret()
	if err != nil {
		tb.Fatalf("GenerateEd25519Secret: %v", err)
	}
	return sec
}

func publicOf(tb testing.TB, sec signing.Secret) signing.PublicKey {
	tb.Helper()
	pk, ok := sec.PublicKey()
	if !ok {
		tb.Fatal("Secret.PublicKey: not an Ed25519 secret")
	}
	return pk
}

// TestEd25519_RFC8032Keys checks RFC 8032's TEST 1 to 3 through the
// exported API: the whsk_ seed and seed||public forms give the RFC public
// key as whpk_. (The signatures are checked in ed25519_internal_test.go:
// the exported API always frames the message as id.timestamp.body, which
// no RFC message is.)
func TestEd25519_RFC8032Keys(t *testing.T) {
	for _, v := range rfc8032 {
		t.Run(v.name, func(t *testing.T) {
			seed, public := unhex(t, v.seed), unhex(t, v.public)
			wantPK := "whpk_" + b64(public)
			for form, enc := range map[string]string{
				"seed":        "whsk_" + b64(seed),
				"seed+public": "whsk_" + b64(append(append([]byte(nil), seed...), public...)),
			} {
				sec := mustParse(t, enc)
				pk := publicOf(t, sec)
				if pk.Encode() != wantPK || pk.String() != wantPK {
					t.Errorf("%s: public key %s, want %s", form, pk.Encode(), wantPK)
				}
				if sec.Encode() != enc {
					t.Errorf("%s: Encode does not give back the parsed form", form)
				}
				if !pk.Equal(mustParsePublic(t, wantPK)) {
					t.Errorf("%s: public key does not equal the parsed whpk_", form)
				}
			}
		})
	}
}

// TestEd25519_RFC8032Framed checks the package's own signing end to end
// with an RFC key: its v1a entry is the base64 of Ed25519 over exactly
// "id.timestamp.body", as computed by crypto/ed25519 directly, and verifies
// with the RFC public key.
func TestEd25519_RFC8032Framed(t *testing.T) {
	for _, v := range rfc8032 {
		t.Run(v.name, func(t *testing.T) {
			seed := unhex(t, v.seed)
			sec := mustParse(t, "whsk_"+b64(seed))
			pk := mustParsePublic(t, "whpk_"+b64(unhex(t, v.public)))
			body := unhex(t, v.message)
			const id, ts = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330
			got := signing.Sign([]signing.Secret{sec}, id, ts, body)
			content := append([]byte(id+"."+strconv.Itoa(ts)+"."), body...)
			want := "v1a," + b64(ed25519.Sign(ed25519.NewKeyFromSeed(seed), content))
			if got != want {
				t.Fatalf("Sign = %q, want %q", got, want)
			}
			now := time.Unix(ts, 0)
			if err := signing.Verify(nil, id, strconv.Itoa(ts), got, body, now, 0, pk); err != nil {
				t.Fatalf("Verify with the RFC public key: %v", err)
			}
			if err := signing.Verify([]signing.Secret{sec}, id, strconv.Itoa(ts), got, body, now, 0); err != nil {
				t.Fatalf("Verify with the secret: %v", err)
			}
		})
	}
}

func TestEd25519_RoundTrip(t *testing.T) {
	sec := mustGenerateEd25519(t)
	pk := publicOf(t, sec)
	if !strings.HasPrefix(sec.Encode(), "whsk_") || len(sec.Encode()) != len("whsk_")+44 {
		t.Fatalf("generated secret is not a whsk_ seed: %d characters", len(sec.Encode()))
	}
	reparsed := mustParse(t, sec.Encode())
	if !publicOf(t, reparsed).Equal(pk) {
		t.Fatal("a generated secret's Encode parses to another key")
	}
	pk2 := mustParsePublic(t, pk.Encode())
	body := []byte(`{"type":"order.paid"}`)
	const ts = 1700000000
	sig := signing.Sign([]signing.Secret{sec}, "msg_1", ts, body)
	if !strings.HasPrefix(sig, "v1a,") || len(sig) != 92 {
		t.Fatalf("signature %q is not one v1a entry of 92 bytes", sig)
	}
	if sig != signing.Sign([]signing.Secret{reparsed}, "msg_1", ts, body) {
		t.Fatal("Ed25519 signatures are deterministic; a reparsed key signs differently")
	}
	now := time.Unix(ts, 0)
	for name, err := range map[string]error{
		"public key":          signing.Verify(nil, "msg_1", strconv.Itoa(ts), sig, body, now, 0, pk2),
		"secret":              signing.Verify([]signing.Secret{sec}, "msg_1", strconv.Itoa(ts), sig, body, now, 0),
		"wrong key, then pk":  signing.Verify(nil, "msg_1", strconv.Itoa(ts), sig, body, now, 0, publicOf(t, mustGenerateEd25519(t)), pk),
		"zero key, then pk":   signing.Verify(nil, "msg_1", strconv.Itoa(ts), sig, body, now, 0, signing.PublicKey{}, pk),
		"hmac secret, and pk": signing.Verify([]signing.Secret{mustGenerate(t)}, "msg_1", strconv.Itoa(ts), sig, body, now, 0, pk),
	} {
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}

	other := publicOf(t, mustGenerateEd25519(t))
	tests := []struct {
		name           string
		id, ts, sig    string
		body           string
		keys           []signing.PublicKey
		want           error
		wantInMessage  string
		secretsPresent []signing.Secret
	}{
		{"tampered body", "msg_1", strconv.Itoa(ts), sig, `{"type":"order.PAID"}`, []signing.PublicKey{pk}, signing.ErrSignatureMismatch, "none of 1 v1a signatures matches 1 Ed25519 keys", nil},
		{"tampered id", "msg_2", strconv.Itoa(ts), sig, string(body), []signing.PublicKey{pk}, signing.ErrSignatureMismatch, "", nil},
		{"tampered timestamp", "msg_1", strconv.Itoa(ts + 1), sig, string(body), []signing.PublicKey{pk}, signing.ErrSignatureMismatch, "", nil},
		{"other key", "msg_1", strconv.Itoa(ts), sig, string(body), []signing.PublicKey{other}, signing.ErrSignatureMismatch, "", nil},
		{"zero key only", "msg_1", strconv.Itoa(ts), sig, string(body), []signing.PublicKey{{}}, signing.ErrSignatureMismatch, "", nil},
		{"v1 entry is not v1a", "msg_1", strconv.Itoa(ts), "v1," + strings.TrimPrefix(sig, "v1a,"), string(body), []signing.PublicKey{pk}, signing.ErrSignatureMismatch, "", nil},
		{"v2 entry", "msg_1", strconv.Itoa(ts), "v2," + strings.TrimPrefix(sig, "v1a,"), string(body), []signing.PublicKey{pk}, signing.ErrSignatureMismatch, "", nil},
		{"unpadded", "msg_1", strconv.Itoa(ts), strings.TrimRight(sig, "="), string(body), []signing.PublicKey{pk}, signing.ErrSignatureMismatch, "", nil},
		{"truncated", "msg_1", strconv.Itoa(ts), sig[:len(sig)-4], string(body), []signing.PublicKey{pk}, signing.ErrSignatureMismatch, "", nil},
		{"extra character", "msg_1", strconv.Itoa(ts), sig + "A", string(body), []signing.PublicKey{pk}, signing.ErrSignatureMismatch, "", nil},
		{"not base64", "msg_1", strconv.Itoa(ts), "v1a," + strings.Repeat("*", 86) + "==", string(body), []signing.PublicKey{pk}, signing.ErrSignatureMismatch, "", nil},
		{"an HMAC secret cannot check v1a", "msg_1", strconv.Itoa(ts), sig, string(body), nil, signing.ErrSignatureMismatch, "none of 0 v1 signatures matches 1 secrets", []signing.Secret{mustGenerate(t)}},
		{"mixed keys name both", "msg_1", strconv.Itoa(ts), sig, "x", []signing.PublicKey{pk}, signing.ErrSignatureMismatch, "none of 0 v1 and 1 v1a signatures matches 1 HMAC secrets and 1 Ed25519 keys", []signing.Secret{mustGenerate(t)}},
		{"nothing to check", "msg_1", strconv.Itoa(ts), sig, string(body), nil, signing.ErrSignatureMismatch, "no secrets or public keys", nil},
		{"stale, checked first", "msg_1", strconv.Itoa(ts - 3600), sig, string(body), []signing.PublicKey{pk}, signing.ErrTimestampTooOld, "", nil},
		{"empty id", "", strconv.Itoa(ts), sig, string(body), []signing.PublicKey{pk}, signing.ErrMissingHeader, "webhook-id", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := signing.Verify(tt.secretsPresent, tt.id, tt.ts, tt.sig, []byte(tt.body), now, 0, tt.keys...)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.wantInMessage) {
				t.Fatalf("err = %q, want it to mention %q", err, tt.wantInMessage)
			}
		})
	}
}

// noncanonical flips an unused low bit of the last base64 character
// before the padding of a 32- or 64-byte value's encoding: the lenient
// decoder reads the same bytes, the strict one refuses it.
func noncanonical(tb testing.TB, enc string) string {
	tb.Helper()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	i := strings.IndexByte(enc, '=') - 1
	out := enc[:i] + string(alphabet[strings.IndexByte(alphabet, enc[i])^1]) + enc[i+1:]
	if !bytes.Equal(mustDecode(tb, out), mustDecode(tb, enc)) {
		tb.Fatal("test setup: the altered encoding decodes to other bytes")
	}
	return out
}

// TestEd25519_NonCanonicalBase64 refuses a v1a entry whose base64 has
// stray bits: it decodes to the right signature, but a signature has one
// spelling.
func TestEd25519_NonCanonicalBase64(t *testing.T) {
	sec := mustGenerateEd25519(t)
	sig := signing.Sign([]signing.Secret{sec}, "id", 1, nil)
	err := signing.Verify([]signing.Secret{sec}, "id", "1", "v1a,"+noncanonical(t, strings.TrimPrefix(sig, "v1a,")), nil, time.Unix(1, 0), 0)
	if !errors.Is(err, signing.ErrSignatureMismatch) {
		t.Fatalf("non-canonical base64: err = %v, want ErrSignatureMismatch", err)
	}
}

// TestSign_MixedSchemes signs with an HMAC and an Ed25519 secret at once,
// as during a move from one to the other: one header, both entries in the
// secrets' order, and a receiver holding either key accepts it.
func TestSign_MixedSchemes(t *testing.T) {
	hmacSec := mustParse(t, specSecret)
	edSec := mustParse(t, "whsk_"+b64(unhex(t, rfc8032[0].seed)))
	pk := publicOf(t, edSec)
	body := []byte(specBody)
	ts := strconv.Itoa(specTimestamp)
	now := time.Unix(specTimestamp, 0)

	header := signing.Sign([]signing.Secret{hmacSec, edSec}, specID, specTimestamp, body)
	entries := strings.Split(header, " ")
	if len(entries) != 2 || entries[0] != specSignature || !strings.HasPrefix(entries[1], "v1a,") {
		t.Fatalf("header %q: want the spec's v1 entry, then one v1a entry", header)
	}
	if rev := signing.Sign([]signing.Secret{edSec, hmacSec}, specID, specTimestamp, body); rev != entries[1]+" "+entries[0] {
		t.Fatalf("entries do not follow the secrets' order: %q", rev)
	}
	dst := make([]byte, 0, 200)
	if got := string(signing.AppendSignature(dst, []signing.Secret{hmacSec, edSec}, specID, specTimestamp, body)); got != header {
		t.Fatalf("AppendSignature = %q, Sign = %q", got, header)
	}

	for name, tc := range map[string]struct {
		secrets []signing.Secret
		keys    []signing.PublicKey
	}{
		"HMAC receiver":      {secrets: []signing.Secret{hmacSec}},
		"whpk_ receiver":     {keys: []signing.PublicKey{pk}},
		"migrating receiver": {secrets: []signing.Secret{hmacSec}, keys: []signing.PublicKey{pk}},
		"sender's own check": {secrets: []signing.Secret{edSec}},
		"old HMAC key gone":  {secrets: []signing.Secret{mustGenerate(t)}, keys: []signing.PublicKey{pk}},
		"other Ed25519 key":  {secrets: []signing.Secret{hmacSec}, keys: []signing.PublicKey{publicOf(t, mustGenerateEd25519(t))}},
	} {
		if err := signing.Verify(tc.secrets, specID, ts, header, body, now, 0, tc.keys...); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The v1a entry alone does not satisfy an HMAC-only receiver, and the
	// v1 entry alone does not satisfy a whpk_-only one.
	if err := signing.Verify([]signing.Secret{hmacSec}, specID, ts, entries[1], body, now, 0); !errors.Is(err, signing.ErrSignatureMismatch) {
		t.Errorf("v1a entry, HMAC receiver: err = %v, want ErrSignatureMismatch", err)
	}
	if err := signing.Verify(nil, specID, ts, entries[0], body, now, 0, pk); !errors.Is(err, signing.ErrSignatureMismatch) {
		t.Errorf("v1 entry, whpk_ receiver: err = %v, want ErrSignatureMismatch", err)
	}
}

func TestParseSecret_Ed25519(t *testing.T) {
	seed := unhex(t, rfc8032[0].seed)
	public := unhex(t, rfc8032[0].public)
	otherPublic := unhex(t, rfc8032[1].public)
	join := func(a, b []byte) []byte { return append(append([]byte(nil), a...), b...) }
	tests := []struct {
		name    string
		in      string
		wantErr string // "" means valid
	}{
		{"32-byte seed", "whsk_" + b64(seed), ""},
		{"64-byte seed and public key", "whsk_" + b64(join(seed, public)), ""},
		{"prefix only", "whsk_", `"whsk_" key is 0 bytes, want 32 (an Ed25519 seed) or 64 (seed and public key)`},
		{"31 bytes", "whsk_" + b64(seed[:31]), "key is 31 bytes, want 32"},
		{"33 bytes", "whsk_" + b64(join(seed, []byte{1})), "key is 33 bytes, want 32"},
		{"48 bytes", "whsk_" + b64(join(seed, public[:16])), "key is 48 bytes"},
		{"63 bytes", "whsk_" + b64(join(seed, public[:31])), "key is 63 bytes"},
		{"65 bytes", "whsk_" + b64(join(join(seed, public), []byte{1})), "key is 65 bytes"},
		{"public half of another key", "whsk_" + b64(join(seed, otherPublic)), "last 32 bytes are not the public key of its first 32"},
		{"not base64", "whsk_" + strings.Repeat("*", 44), `not standard base64 after "whsk_"`},
		{"line break inside", "whsk_" + b64(seed)[:20] + "\r\n" + b64(seed)[20:], `not standard base64 after "whsk_"`},
		{"missing padding", "whsk_" + strings.TrimRight(b64(seed), "="), `not standard base64 after "whsk_"`},
		{"non-canonical base64, seed", "whsk_" + noncanonical(t, b64(seed)), `not standard base64 after "whsk_"`},
		{"non-canonical base64, seed and public key", "whsk_" + noncanonical(t, b64(join(seed, public))), `not standard base64 after "whsk_"`},
		{"url-safe base64", "whsk_" + strings.NewReplacer("+", "-", "/", "_").Replace(b64(bytes.Repeat([]byte{0xFB, 0xEF}, 16))), "not standard base64"},
		{"upper-case prefix", "WHSK_" + b64(seed), `missing "whsec_" prefix (or "whsk_" for an Ed25519 key)`},
		{"whpk_ public key", "whpk_" + b64(public), `a "whpk_" public key verifies signatures but cannot sign`},
		{"trailing newline", "whsk_" + b64(seed) + "\n", "whitespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sec, err := signing.ParseSecret(tt.in)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				if sec.Encode() != tt.in {
					t.Fatal("Encode does not round-trip")
				}
				if pk := publicOf(t, sec); pk.Encode() != "whpk_"+b64(public) {
					t.Fatalf("public key %s, want the RFC's", pk)
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
			rest := strings.TrimSpace(tt.in)
			rest = rest[strings.IndexByte(rest, '_')+1:]
			if len(rest) > 4 && strings.Contains(msg, rest) {
				t.Fatalf("err %q echoes the key", msg)
			}
		})
	}
	if _, ok := mustParse(t, specSecret).PublicKey(); ok {
		t.Error("an HMAC secret reports a public key")
	}
	if _, ok := (signing.Secret{}).PublicKey(); ok {
		t.Error("the zero Secret reports a public key")
	}
}

func TestParsePublicKey(t *testing.T) {
	public := unhex(t, rfc8032[0].public)
	// y = 2 is not the y coordinate of any curve point: x² = (y²-1)/(dy²+1)
	// has no root. (Found by trying small y; crypto/ed25519 refuses it.)
	notOnCurve := make([]byte, 32)
	notOnCurve[0] = 2
	tests := []struct {
		name    string
		in      string
		wantErr string
	}{
		{"RFC TEST 1", "whpk_" + b64(public), ""},
		{"empty", "", "empty"},
		{"missing prefix", b64(public), `missing "whpk_" prefix`},
		{"whsk_ secret given", "whsk_" + b64(unhex(t, rfc8032[0].seed)), `a "whsk_" secret key, which must stay with the sender`},
		{"whsec_ secret given", specSecret, `a "whsec_" HMAC secret, which has no public key`},
		{"prefix only", "whpk_", "key is 0 bytes, want 32"},
		{"31 bytes", "whpk_" + b64(public[:31]), "key is 31 bytes, want 32"},
		{"64 bytes", "whpk_" + b64(append(append([]byte(nil), public...), public...)), "key is 64 bytes, want 32"},
		{"not base64", "whpk_" + strings.Repeat("!", 44), `not standard base64 after "whpk_"`},
		{"missing padding", "whpk_" + strings.TrimRight(b64(public), "="), "not standard base64"},
		{"non-canonical base64", "whpk_" + noncanonical(t, b64(public)), "not standard base64"},
		{"not a curve point", "whpk_" + b64(notOnCurve), "not a point of the curve"},
		{"leading space", " whpk_" + b64(public), "whitespace"},
		{"line break inside", "whpk_" + b64(public)[:20] + "\n" + b64(public)[20:], "not standard base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pk, err := signing.ParsePublicKey(tt.in)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				if pk.Encode() != tt.in || fmt.Sprint(pk) != tt.in {
					t.Fatal("Encode/String do not round-trip")
				}
				return
			}
			if !errors.Is(err, signing.ErrBadPublicKey) {
				t.Fatalf("err = %v, want ErrBadPublicKey", err)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %q, want it to say %q", err, tt.wantErr)
			}
			if rest := tt.in[strings.IndexByte(tt.in, '_')+1:]; len(rest) > 4 && strings.Contains(err.Error(), rest) {
				t.Fatalf("err %q echoes the input", err)
			}
		})
	}
	if (signing.PublicKey{}).Encode() != "" {
		t.Error("the zero PublicKey encodes as non-empty")
	}
}

func TestSecret_Ed25519Redacted(t *testing.T) {
	seed := unhex(t, rfc8032[0].seed)
	full := append(append([]byte(nil), seed...), unhex(t, rfc8032[0].public)...)
	for form, raw := range map[string][]byte{"seed": seed, "seed+public": full} {
		enc := b64(raw)
		sec := mustParse(t, "whsk_"+enc)
		type holder struct {
			Secret  signing.Secret
			secret  signing.Secret
			Secrets []signing.Secret
		}
		h := holder{Secret: sec, secret: sec, Secrets: []signing.Secret{sec}}
		leaks := []string{enc, enc[:12], b64(seed)[:12], string(seed), fmt.Sprint(seed), fmt.Sprintf("%x", seed), fmt.Sprintf("%X", seed)}
		for name, v := range map[string]any{"Secret": sec, "*Secret": &sec, "struct": h, "*struct": &h} {
			for _, verb := range []string{"%v", "%s", "%+v", "%#v", "%q", "%x", "%X", "%d"} {
				out := fmt.Sprintf(verb, v)
				for _, leak := range leaks {
					if strings.Contains(out, leak) {
						t.Errorf("%s: %s with %s reveals the key: %s", form, name, verb, out)
					}
				}
			}
		}
		if got := fmt.Sprint(sec); got != "whsk_…redacted" {
			t.Errorf("%s: fmt.Sprint = %q, want whsk_…redacted", form, got)
		}
		var buf bytes.Buffer
		for _, handler := range []slog.Handler{slog.NewTextHandler(&buf, nil), slog.NewJSONHandler(&buf, nil)} {
			slog.New(handler).Info("configured", "secret", sec, "holder", h)
		}
		for _, leak := range leaks {
			if strings.Contains(buf.String(), leak) {
				t.Errorf("%s: slog output reveals the key: %s", form, buf.String())
			}
		}
		if !strings.Contains(buf.String(), "whsk_…redacted") {
			t.Errorf("%s: slog output does not show the redacted form: %s", form, buf.String())
		}
	}
}

func TestAppendSignature_Ed25519Allocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	ed := mustGenerateEd25519(t)
	body := bytes.Repeat([]byte("a"), 512)
	dst := make([]byte, 0, 256)
	for name, secrets := range map[string][]signing.Secret{
		"Ed25519":        {ed},
		"HMAC + Ed25519": {mustGenerate(t), ed},
	} {
		allocs := testing.AllocsPerRun(100, func() {
			dst = signing.AppendSignature(dst[:0], secrets, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", 1674087231, body)
		})
		if allocs != 0 {
			t.Errorf("%s: AppendSignature allocates %.1f times per call, want 0", name, allocs)
		}
	}
	pk := publicOf(t, ed)
	sig := signing.Sign([]signing.Secret{ed}, "msg_1", 1674087231, body)
	now := time.Unix(1674087231, 0)
	allocs := testing.AllocsPerRun(100, func() {
		if err := signing.Verify(nil, "msg_1", "1674087231", sig, body, now, 0, pk); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Verify with a public key allocates %.1f times on success, want 0", allocs)
	}
}

func TestConcurrentUse_Ed25519(t *testing.T) {
	sec := mustParse(t, "whsk_"+b64(unhex(t, rfc8032[2].seed)))
	secrets := []signing.Secret{sec}
	want := signing.Sign(secrets, specID, specTimestamp, []byte(specBody))
	pk := publicOf(t, sec)
	done := make(chan string)
	for g := range 4 {
		go func() {
			var dst []byte
			body := bytes.Repeat([]byte{byte(g)}, 100*g) // buffers of several sizes cross the pool
			for range 50 {
				dst = signing.AppendSignature(dst[:0], secrets, specID, specTimestamp, []byte(specBody))
				if string(dst) != want {
					done <- string(dst)
					return
				}
				sig := signing.Sign(secrets, "x", 1, body)
				if err := signing.Verify(nil, "x", "1", sig, body, time.Unix(1, 0), 0, pk); err != nil {
					done <- err.Error()
					return
				}
			}
			done <- ""
		}()
	}
	for range 4 {
		if got := <-done; got != "" {
			t.Errorf("concurrent use: %s", got)
		}
	}
}

// TestSign_Ed25519LargeBody signs a body beyond the pooled buffer bound:
// the signature is still right (the staging buffer is dropped, not kept).
func TestSign_Ed25519LargeBody(t *testing.T) {
	sec := mustGenerateEd25519(t)
	pk := publicOf(t, sec)
	body := bytes.Repeat([]byte("z"), 200<<10)
	for range 2 {
		sig := signing.Sign([]signing.Secret{sec}, "big", 5, body)
		if err := signing.Verify(nil, "big", "5", sig, body, time.Unix(5, 0), 0, pk); err != nil {
			t.Fatal(err)
		}
		small := signing.Sign([]signing.Secret{sec}, "small", 5, []byte("s"))
		if err := signing.Verify(nil, "small", "5", small, []byte("s"), time.Unix(5, 0), 0, pk); err != nil {
			t.Fatal(err)
		}
	}
}

func BenchmarkAppendSignatureEd25519(b *testing.B) {
	body := bytes.Repeat([]byte(`{"k":"v"}`), 57)[:512]
	for _, mix := range []string{"ed25519", "hmac+ed25519"} {
		secrets := []signing.Secret{mustGenerateEd25519(b)}
		if mix == "hmac+ed25519" {
			secrets = []signing.Secret{mustGenerate(b), secrets[0]}
		}
		b.Run("secrets="+mix, func(b *testing.B) {
			dst := make([]byte, 0, 256)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				dst = signing.AppendSignature(dst[:0], secrets, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", 1674087231, body)
			}
		})
	}
}

func BenchmarkVerifyEd25519(b *testing.B) {
	body := bytes.Repeat([]byte(`{"k":"v"}`), 57)[:512]
	sec := mustGenerateEd25519(b)
	pk := publicOf(b, sec)
	sig := signing.Sign([]signing.Secret{sec}, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", 1674087231, body)
	now := time.Unix(1674087231, 0)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := signing.Verify(nil, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", "1674087231", sig, body, now, 0, pk); err != nil {
			b.Fatal(err)
		}
	}
}

func mustDecode(tb testing.TB, s string) []byte {
	tb.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
