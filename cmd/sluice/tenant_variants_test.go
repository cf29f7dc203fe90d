package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
)

// TestVariantBounds: the distinct body variants are bounded per tenant
// (policy.MaxTenantVariants) and in all (policy.MaxVariants). A create or
// patch that would add one more is refused, 409 naming body and the
// bound, whoever asks, and the refusal changes nothing; equal variants
// (the same fields in another order) count once, and swapping a variant
// only one subscription had for a new one adds none.
func TestVariantBounds(t *testing.T) {
	if policy.MaxTenantVariants != 8 || policy.MaxVariants != 64 {
		t.Fatalf("bounds %d per tenant, %d in all: the test builds on 8 and 64", policy.MaxTenantVariants, policy.MaxVariants)
	}
	tb := startReceiver(t)
	k, _ := signing.ParseSecret(e2eSecret)
	// A file subscription of acme's with a variant: it counts too.
	fileVariant, err := policy.ParseVariant(policy.VariantSpec{Fields: []string{"data.acme0"}})
	if err != nil {
		t.Fatal(err)
	}
	s := openAPISidecar(t, proxy.Options{AdminToken: isoOpToken,
		TenantTokens: []admin.TenantToken{{Token: isoAcmeToken, Tenant: "acme"}, {Token: isoOtherToken, Tenant: "other"}},
		Subscriptions: []*delivery.Subscription{{ID: "acme-file", Tenant: "acme", URL: tb.URL() + "/acme-file",
			Secrets: []signing.Secret{k}, Variant: fileVariant}}})
	doc := func(id, tenant string, fields ...string) string {
		m := map[string]any{"id": id, "url": tb.URL() + "/" + id, "secret": e2eSecret}
		if tenant != "" {
			m["tenant"] = tenant
		}
		if fields != nil {
			m["body"] = map[string]any{"fields": fields}
		}
		return jsonOf(m)
	}
	tenantBound := []string{"body", "tenant acme", "at most 8 per tenant"}

	// acme: the file's variant and seven more.
	for i := 1; i < 8; i++ {
		s.mustCall(t, isoAcmeToken, "POST", "/v1/subscriptions", doc(fmt.Sprint("acme-", i), "", fmt.Sprint("data.acme", i)), 201, nil)
	}
	// Equal to one in use, written another way: counts once.
	s.mustCall(t, isoAcmeToken, "POST", "/v1/subscriptions", doc("acme-same", "", "data.acme1.id", "data.acme1"), 201, nil)
	s.mustCall(t, isoAcmeToken, "POST", "/v1/subscriptions", doc("acme-plain", ""), 201, nil)
	s.mustCall(t, "", "POST", "/v1/subscriptions", doc("free", "", "data.free"), 201, nil)
	s.refuses(t, []apiError{
		{name: "a ninth with the tenant's token", token: isoAcmeToken, method: "POST", path: "/v1/subscriptions",
			body: doc("acme-9", "", "data.acme9"), status: 409, want: tenantBound},
		{name: "a ninth with the operator's token", method: "POST", path: "/v1/subscriptions",
			body: doc("acme-9", "acme", "data.acme9"), status: 409, want: tenantBound},
		{name: "a patch giving one a ninth", token: isoAcmeToken, method: "PATCH", path: "/v1/subscriptions/acme-plain",
			body: `{"body": {"fields": ["data.acme9"]}}`, status: 409, want: tenantBound},
		{name: "a patch changing a shared one", token: isoAcmeToken, method: "PATCH", path: "/v1/subscriptions/acme-same",
			body: `{"body": {"envelope": "standard-webhooks"}}`, status: 409, want: tenantBound},
		{name: "a patch moving one with a ninth in", method: "PATCH", path: "/v1/subscriptions/free",
			body: `{"tenant": "acme"}`, status: 409, want: tenantBound},
	})
	// What adds no variant passes at the bound: one in use, a patch that
	// keeps the variant, a swap of a variant only one subscription had.
	s.mustCall(t, isoAcmeToken, "PATCH", "/v1/subscriptions/acme-plain", `{"body": {"fields": ["data.acme2"]}}`, 200, nil)
	s.mustCall(t, isoAcmeToken, "PATCH", "/v1/subscriptions/acme-3", `{"timeout": "3s"}`, 200, nil)
	s.mustCall(t, isoAcmeToken, "PATCH", "/v1/subscriptions/acme-3", `{"body": {"fields": ["data.acme3b"]}}`, 200, nil)

	// Other tenants have their own eight: 1 (the operator's "free") + 8
	// (acme) + 7×8 = 65 would be one past the bound in all.
	for tn := range 6 {
		tenant := fmt.Sprint("t", tn)
		for i := range 8 {
			s.mustCall(t, "", "POST", "/v1/subscriptions", doc(fmt.Sprint(tenant, "-", i), tenant, fmt.Sprint("data.", tenant, "x", i)), 201, nil)
		}
	}
	for i := range 7 {
		s.mustCall(t, isoOtherToken, "POST", "/v1/subscriptions", doc(fmt.Sprint("other-", i), "", fmt.Sprint("data.otherx", i)), 201, nil)
	}
	s.mustCall(t, isoOtherToken, "POST", "/v1/subscriptions", doc("other-plain", ""), 201, nil)
	// 1 + 8 + 48 + 7 = 64 distinct in all.
	allBound := []string{"body", "at most 64 in all"}
	s.refuses(t, []apiError{
		{name: "a 65th with a tenant's token", token: isoOtherToken, method: "POST", path: "/v1/subscriptions",
			body: doc("other-7", "", "data.otherx7"), status: 409, want: allBound, never: []string{"tenant acme", "t0"}},
		{name: "a 65th with the operator's token", method: "POST", path: "/v1/subscriptions",
			body: doc("op-2", "", "data.op2"), status: 409, want: allBound},
		{name: "a 65th by a patch", token: isoOtherToken, method: "PATCH", path: "/v1/subscriptions/other-plain",
			body: `{"body": {"fields": ["data.otherx7"]}}`, status: 409, want: allBound},
	})
	// Swapping a variant only one subscription had adds none, at the
	// bound in all too.
	s.mustCall(t, isoOtherToken, "PATCH", "/v1/subscriptions/other-0", `{"body": {"envelope": "standard-webhooks", "fields": ["data.otherx0"]}}`, 200, nil)
	// A variant in use, whoever uses it, adds none.
	s.mustCall(t, isoOtherToken, "POST", "/v1/subscriptions", doc("other-7", "", "data.acme1"), 201, nil)
	// A deleted subscription takes no new events: its variant stops
	// counting at once.
	s.mustCall(t, "", "DELETE", "/v1/subscriptions/free", "", 202, nil)
	s.mustCall(t, "", "POST", "/v1/subscriptions", doc("op-2", "", "data.op2"), 201, nil)
	if code, body := s.call(t, isoOpToken, "POST", "/v1/subscriptions", doc("op-3", "", "data.op3")); code != 409 || !strings.Contains(body, "body") {
		t.Fatalf("a 65th again: %d %s", code, body)
	}
}
