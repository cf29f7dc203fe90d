package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/signing"
)

// TestAPIDocumentsAreStrict: what an attacker holding one tenant's token
// sent through POST and PATCH is refused with a 400 naming the key, and
// changes nothing: a document read more loosely than the config file
// (a number for a string, a string for a number, a key given twice, a set
// key replaced by its default), values that pinned a core, and lists and
// strings without a bound.
func TestAPIDocumentsAreStrict(t *testing.T) {
	tb := startDeliveryTestbed(t, newDeliveryLog())
	s := openAPISidecar(t, proxy.Options{AdminToken: apiOpToken,
		TenantTokens: []admin.TenantToken{{Token: apiAcmeToken, Tenant: "acme"}}})
	u := tb.URL() + "/x"
	s.mustCall(t, apiAcmeToken, "POST", "/v1/subscriptions", `{"id": "mine", "url": "`+u+`"}`, 201, nil)

	// body wraps fields into a document of a new subscription "x".
	body := func(fields string) string { return `{"id": "x", "url": "` + u + `", ` + fields + `}` }
	list := func(n int, f func(i int) string) string {
		l := make([]string, n)
		for i := range l {
			l[i] = f(i)
		}
		return strings.Join(l, ", ")
	}
	manyTypes := `"types": [` + list(6000, func(i int) string { return fmt.Sprintf(`"t%d"`, i) }) + `]`
	manyHeaders := `"headers": {` + list(2000, func(i int) string { return fmt.Sprintf(`"X-H%d": "v"`, i) }) + `}`
	longURL := "https://a.example/" + strings.Repeat("a", 10_000)

	var cases []apiError
	for _, tc := range []struct {
		name, fields string
		want         []string
	}{
		{"id a number", `"id": 5, "url": "` + u + `"`, []string{"id", "must be a string"}},
		{"max a string", `"concurrency": {"max": "10"}`, []string{"concurrency.max", "integer"}},
		{"duplicate key", `"timeout": "5s", "timeout": "6s"`, []string{"timeout", "twice"}},
		{"duplicate nested key", `"rate": {"per_second": 1, "per_second": 2}`, []string{"per_second", "twice"}},
		{"zero timeout", `"timeout": "0s"`, []string{"timeout", "0s"}},
		{"tiny rate", `"rate": {"per_second": 1e-300}`, []string{"rate.per_second", "at least 0.001"}},
		{"6,000 types", manyTypes, []string{"types", "more than 64"}},
		{"2,000 headers", manyHeaders, []string{"headers", "more than 32"}},
		{"10,000-byte url", `"url": "` + longURL + `"`, []string{"url", "more than 2048"}},
	} {
		doc := body(tc.fields)
		switch {
		case strings.HasPrefix(tc.fields, `"id"`):
			doc = `{` + tc.fields + `}`
		case strings.HasPrefix(tc.fields, `"url"`):
			doc = `{"id": "x", ` + tc.fields + `}`
		}
		cases = append(cases, apiError{name: "POST " + tc.name, token: apiAcmeToken, method: "POST", path: "/v1/subscriptions", body: doc, status: 400, want: tc.want})
		patch := `{` + tc.fields + `}`
		if strings.HasPrefix(tc.fields, `"id"`) {
			patch = `{"id": 5}` // the id of a PATCH is the path's; a number for it is refused too
			tc.want = []string{"id"}
		}
		cases = append(cases, apiError{name: "PATCH " + tc.name, token: apiAcmeToken, method: "PATCH", path: "/v1/subscriptions/mine", body: patch, status: 400, want: tc.want})
	}
	s.refuses(t, cases)
}

// TestAPIPatchSecretsReplacesGeneratedSecret: a subscription made with a
// generated secret takes a list of secrets by PATCH, as the docs' move
// from HMAC to Ed25519 says, and signs with the list from then on; a
// patch of secret alone goes back to one.
func TestAPIPatchSecretsReplacesGeneratedSecret(t *testing.T) {
	tb := startDeliveryTestbed(t, newDeliveryLog())
	s := openAPISidecar(t, proxy.Options{AdminToken: apiOpToken,
		TenantTokens: []admin.TenantToken{{Token: apiAcmeToken, Tenant: "acme"}}})
	var info api.SubscriptionInfo
	s.mustCall(t, apiAcmeToken, "POST", "/v1/subscriptions", `{"id": "mine", "url": "`+tb.URL()+`/mine"}`, 201, &info)
	if info.Secret == "" {
		t.Fatal("no secret was generated")
	}
	ed, err := signing.GenerateEd25519Secret()
	if err != nil {
		t.Fatal(err)
	}
	patch := `{"secrets": ["` + ed.Encode() + `", "` + info.Secret + `"]}`
	info = api.SubscriptionInfo{}
	body := s.mustCall(t, apiAcmeToken, "PATCH", "/v1/subscriptions/mine", patch, 200, &info)
	if info.Config["secrets_count"] != float64(2) || len(info.PublicKeys) != 1 {
		t.Fatalf("after the patch: secrets_count %v, public keys %v; want 2 and the whsk_ key's", info.Config["secrets_count"], info.PublicKeys)
	}
	if pk, _ := ed.PublicKey(); info.PublicKeys[0] != pk.Encode() {
		t.Errorf("public key %q, want %q", info.PublicKeys[0], pk.Encode())
	}
	if strings.Contains(body, ed.Encode()) {
		t.Errorf("the answer shows the secret: %s", body)
	}
	// And back to one secret.
	info = api.SubscriptionInfo{}
	s.mustCall(t, apiAcmeToken, "PATCH", "/v1/subscriptions/mine", `{"secret": "`+e2eSecret+`"}`, 200, &info)
	if info.Config["secrets_count"] != float64(1) || len(info.PublicKeys) != 0 {
		t.Fatalf("after patching secret: secrets_count %v, public keys %v; want 1 and none", info.Config["secrets_count"], info.PublicKeys)
	}
	// Both at once are judged as written.
	s.refuses(t, []apiError{{name: "both", token: apiAcmeToken, method: "PATCH", path: "/v1/subscriptions/mine",
		body: `{"secret": "` + e2eSecret + `", "secrets": ["` + info.Secret + e2eSecret + `"]}`, status: 400, want: []string{"secret"}, never: []string{e2eSecret}}})
}
