package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/signing"
)

// TestAPIEd25519: an API subscription signs with a whsk_ key
// beside a whsec_ one. Each delivery carries both entries: the official
// Standard Webhooks library verifies it with the whsec_ secret (skipping
// v1a), and the whpk_ key that GET /v1/subscriptions/{id} shows verifies
// the v1a entry. rotate-secret keeps the scheme: the new secret is a whsk_
// key, answered with its public key, and both public keys are shown and
// sign during the grace.
func TestAPIEd25519(t *testing.T) {
	ed, err := signing.GenerateEd25519Secret()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rec := newSigRecorder(t)
	a := newAPIProc(t, dir, "")
	a.start()
	a.awaitAdmin(t)
	doc := fmt.Sprintf(`{"id": "ed", "url": %q, "types": ["*"], "secrets": [%q, %q]}`, rec.srv.URL, ed.Encode(), e2eSecret)
	if code, body := a.call(t, "POST", "/v1/subscriptions", doc); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	publicKeys := func() []string {
		t.Helper()
		code, body := a.call(t, "GET", "/v1/subscriptions/ed", "")
		if code != 200 || strings.Contains(body, strings.TrimPrefix(ed.Encode(), "whsk_")) {
			t.Fatalf("get: %d, and the whsk_ key must never be shown: %s", code, body)
		}
		var info struct {
			PublicKeys []string `json:"public_keys"`
		}
		if err := json.Unmarshal([]byte(body), &info); err != nil {
			t.Fatal(err)
		}
		return info.PublicKeys
	}
	want, _ := ed.PublicKey()
	if got := publicKeys(); !slices.Equal(got, []string{want.Encode()}) {
		t.Fatalf("public_keys = %q, want [%s]", got, want)
	}
	deliver := func(prefix string) recorded { return rec.deliver(t, a, prefix) }
	verifiesV1a := func(r recorded, keys ...string) bool {
		t.Helper()
		var pks []signing.PublicKey
		for _, k := range keys {
			pk, err := signing.ParsePublicKey(k)
			if err != nil {
				t.Fatal(err)
			}
			pks = append(pks, pk)
		}
		h := r.header
		return signing.Verify(nil, h.Get(signing.HeaderID), h.Get(signing.HeaderTimestamp), h.Get(signing.HeaderSignature), r.body, time.Now(), 0, pks...) == nil
	}

	first := deliver("first")
	if sig := first.header.Get(signing.HeaderSignature); !strings.HasPrefix(sig, "v1a,") || !strings.Contains(sig, " v1,") {
		t.Fatalf("webhook-signature %q: want the v1a entry, then the v1 one", sig)
	}
	if !verifies(t, e2eSecret, first) {
		t.Fatalf("the official library does not verify the v1 entry beside a v1a one: %v", first.header)
	}
	if !verifiesV1a(first, want.Encode()) {
		t.Fatalf("the whpk_ key does not verify the delivery: %v", first.header)
	}

	code, body := a.call(t, "POST", "/v1/subscriptions/ed/rotate-secret", `{"grace": "1h"}`)
	if code != 200 {
		t.Fatalf("rotate: %d %s", code, body)
	}
	var rot struct {
		Secret    string `json:"secret"`
		PublicKey string `json:"public_key"`
	}
	json.Unmarshal([]byte(body), &rot)
	rotated, err := signing.ParseSecret(rot.Secret)
	if err != nil {
		t.Fatalf("rotate answered no usable secret: %v: %s", err, body)
	}
	if pk, ok := rotated.PublicKey(); !ok || pk.Encode() != rot.PublicKey {
		t.Fatalf("rotate of an Ed25519 subscription must give a whsk_ key and its whpk_ key: %s", body)
	}
	if got := publicKeys(); !slices.Equal(got, []string{rot.PublicKey, want.Encode()}) {
		t.Fatalf("public_keys during the grace = %q, want the new key, then the old", got)
	}
	out := mustRun(t, "subscriptions", "get", "ed", "--config", a.config)
	for _, pk := range []string{rot.PublicKey, want.Encode()} {
		if !regexp.MustCompile(`(?m)^public key +` + regexp.QuoteMeta(pk) + `$`).MatchString(out) {
			t.Fatalf("subscriptions get does not show %s:\n%s", pk, out)
		}
	}
	out = mustRun(t, "subscriptions", "rotate-secret", "ed", "--grace", "1h", "--config", a.config)
	if !regexp.MustCompile(`(?m)^new secret of ed: whsk_\S+$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^its public key, for receivers to verify v1a signatures: whpk_\S+$`).MatchString(out) {
		t.Fatalf("subscriptions rotate-secret of an Ed25519 subscription:\n%s", out)
	}
	during := deliver("during")
	if !verifiesV1a(during, rot.PublicKey) || !verifiesV1a(during, want.Encode()) || !verifies(t, e2eSecret, during) {
		t.Fatalf("during the grace the new and old keys must verify: %v", during.header)
	}
}
