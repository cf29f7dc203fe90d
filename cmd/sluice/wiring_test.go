package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/signing"
)

const (
	wiringSecretB = "whsec_95HV3WjcsNP1TmBWW+BmZF+8Aa9L91ijURIkte4Mxcw="
	opsSecret     = "whsec_5gboqfClPJIcOpFFyCKCMO7MQpWPxyDda+f/AePM6Xo="
)

// wiringDoc is one subscription with the tenant, filter, egress, TLS, auth,
// ordering and body-variant keys, in JSON: the
// API's document, and the same in a config file.
const wiringDoc = `{"id": "billing", "url": "https://billing.example.com/hooks", "secret": "` + e2eSecret + `",
	"types": ["geofence.enter"], "tenant": "acme", "filter": {"data.speed": {"$gt": 30}},
	"body": {"envelope": "standard-webhooks", "fields": ["data.id"]}, "timeout": "5s", "rate": {"per_second": 10}, "concurrency": {"auto": true}, "retry": {"max_attempts": 3},
	"backlog": {"max_events": 100}, "breaker": {"failure_ratio": 1}, "classify": {"409": "ack"},
	"headers": {"Authorization": "Bearer header-secret", "X-Tenant": "acme"}, "paused": true}`

// loadWiringConfig loads a JSON config file with wiringDoc, a second
// subscription sharing its secret and types, tenants, tenant tokens and
// the operational webhook.
func loadWiringConfig(t *testing.T) *config.Config {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.json")
	writeFile(t, path, `{
		"admin": {"token": "operator-token-1", "tokens": [{"token": "acme-token-1-7d3a", "tenant": "acme"}],
			"operational_webhook": {"url": "https://ops.example.com/sluice", "secret": "`+opsSecret+`"}},
		"tenants": [{"id": "acme", "max_subscriptions": 5, "concurrency": {"max": 40}}, {"id": "globex"}],
		"subscriptions": [`+wiringDoc+`,
			{"id": "audit", "url": "https://audit.example.com/in", "secrets": ["`+e2eSecret+`", "`+wiringSecretB+`"], "types": ["geofence.enter"]}]}`)
	cfg, err := config.Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestSubscriptionsWiring: a file subscription carries its tenant, parsed
// filter and body variant, ManagedByFile and its redacted document; identical secrets and
// type lists are still shared.
func TestSubscriptionsWiring(t *testing.T) {
	cfg := loadWiringConfig(t)
	parsed := []*config.SubscriptionConfig{&cfg.Subscriptions[0], &cfg.Subscriptions[1]}
	subs := subscriptions(cfg)
	if len(subs) != 2 {
		t.Fatalf("%d subscriptions", len(subs))
	}
	b := subs[0]
	if b.Tenant != "acme" || b.Filter == nil || b.Filter != parsed[0].ParsedFilter || b.ManagedBy != api.ManagedByFile {
		t.Errorf("billing: tenant %q, filter %p (parsed %p), managed by %q", b.Tenant, b.Filter, parsed[0].ParsedFilter, b.ManagedBy)
	}
	if b.Variant == nil || b.Variant != parsed[0].ParsedVariant || subs[1].Variant != nil {
		t.Errorf("billing: variant %v (parsed %p); audit: %v", b.Variant, parsed[0].ParsedVariant, subs[1].Variant)
	}
	if !bytes.Equal(b.Spec, parsed[0].Spec()) {
		t.Errorf("billing Spec = %s, want config's %s", b.Spec, parsed[0].Spec())
	}
	var spec map[string]any
	if err := json.Unmarshal(b.Spec, &spec); err != nil {
		t.Fatal(err)
	}
	if spec["secrets_count"] != 1.0 || spec["tenant"] != "acme" || spec["secret"] != nil {
		t.Errorf("billing Spec = %s", b.Spec)
	}
	for _, s := range subs {
		for _, leak := range []string{e2eSecret, strings.TrimPrefix(e2eSecret, "whsec_"), wiringSecretB, "header-secret"} {
			if bytes.Contains(s.Spec, []byte(leak)) {
				t.Errorf("%s Spec %s reveals %q", s.ID, s.Spec, leak)
			}
		}
	}
	if &subs[0].Types[0] != &subs[1].Types[0] {
		t.Error("identical type lists are not shared")
	}
	if !reflect.DeepEqual(subs[0].Secrets[0], subs[1].Secrets[0]) {
		t.Error("identical secrets are not shared")
	}
}

// TestSpecParser: the API's documents become subscriptions through the
// same conversion as the file's; only ManagedBy and Spec differ.
func TestSpecParser(t *testing.T) {
	fromFile := subscriptions(loadWiringConfig(t))[0]
	doc := []byte(wiringDoc)
	got, err := specParser{}.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	if got.ManagedBy != api.ManagedByAPI || !bytes.Equal(got.Spec, doc) || &got.Spec[0] == &doc[0] {
		t.Errorf("ManagedBy %q, Spec %s (a copy of the document wanted)", got.ManagedBy, got.Spec)
	}
	g, w := *got, *fromFile
	g.ManagedBy, w.ManagedBy = "", ""
	g.Spec, w.Spec = nil, nil
	if !reflect.DeepEqual(encodeSecrets(g.Secrets), encodeSecrets(w.Secrets)) {
		t.Errorf("secrets differ")
	}
	g.Secrets, w.Secrets = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Errorf("from the API:\n %+v\nfrom the file:\n %+v", g, w)
	}

	// Errors name the key; the SSRF guard follows allow_private_targets.
	for _, tt := range []struct {
		p    specParser
		doc  string
		want string
	}{
		{specParser{}, `{"id": "a", "url": "https://a.example/", "secret_file": "/etc/passwd"}`, "secret_file: not accepted over the API: give the secret inline"},
		{specParser{}, `{"id": "a", "url": "https://a.example/", "secret": "` + e2eSecret + `", "retry": {"max_attempts": 0.5}}`, "retry.max_attempts: 0.5: must be a whole number"},
		{specParser{}, `{"id": "a", "url": "http://10.0.0.7/", "secret": "` + e2eSecret + `"}`, `url: "http://10.0.0.7/": is a private address; set allow_private_targets: true`},
	} {
		if _, err := tt.p.Parse([]byte(tt.doc)); err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("Parse(%s) = %v, want %q", tt.doc, err, tt.want)
		}
	}
	if _, err := (specParser{allowPrivate: true}).Parse([]byte(`{"id": "a", "url": "http://10.0.0.7/", "secret": "` + e2eSecret + `"}`)); err != nil {
		t.Errorf("with allow_private_targets: %v", err)
	}

	red := specParser{}.Redact(doc)
	if red["secrets_count"] != 1 || red["secret"] != nil || red["headers"].(map[string]any)["Authorization"] != "[redacted]" {
		t.Errorf("Redact = %v", red)
	}
}

// TestServerOptionsTenants: tenants, tenant tokens, the operational webhook
// and the document parser reach proxy.Options.
func TestServerOptionsTenants(t *testing.T) {
	cfg := loadWiringConfig(t)
	opts := serverOptions(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if want := []delivery.Tenant{{ID: "acme", MaxSubscriptions: 5, MaxConcurrency: 40}, {ID: "globex"}}; !reflect.DeepEqual(opts.Tenants, want) {
		t.Errorf("Tenants = %+v, want %+v", opts.Tenants, want)
	}
	if want := []admin.TenantToken{{Token: "acme-token-1-7d3a", Tenant: "acme"}}; !slices.Equal(opts.TenantTokens, want) || opts.AdminToken != "operator-token-1" {
		t.Errorf("TenantTokens = %+v, AdminToken %q", opts.TenantTokens, opts.AdminToken)
	}
	ow := opts.OperationalWebhook
	if ow == nil || ow.ID != delivery.OperationalID || ow.URL != "https://ops.example.com/sluice" ||
		!slices.Equal(encodeSecrets(ow.Secrets), []string{opsSecret}) || !slices.Equal(ow.Types, []string{"*"}) {
		t.Errorf("OperationalWebhook = %+v", ow)
	}
	if _, ok := opts.Specs.(specParser); !ok {
		t.Errorf("Specs = %T, want specParser", opts.Specs)
	}

	none, err := config.Load("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts = serverOptions(none, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if opts.OperationalWebhook != nil || opts.Tenants != nil || opts.TenantTokens != nil {
		t.Errorf("defaults: webhook %v, tenants %v, tokens %v", opts.OperationalWebhook, opts.Tenants, opts.TenantTokens)
	}
	if want := (delivery.Tenant{MaxSubscriptions: delivery.DefaultTenantMaxSubscriptions, MaxConcurrency: delivery.DefaultTenantMaxConcurrency,
		MaxSubscriptionConcurrency: delivery.DefaultTenantMaxSubscriptionConcurrency}); !reflect.DeepEqual(opts.TenantDefaults, want) {
		t.Errorf("default TenantDefaults = %+v, want %+v", opts.TenantDefaults, want)
	}

	// A written max_subscriptions: 0 is no limit, which the proxy spells
	// -1 (its 0 is "the default").
	unbounded, err := config.Load("", nil, map[string]any{"tenant_defaults.max_subscriptions": 0,
		"tenants": []any{map[string]any{"id": "acme", "max_subscriptions": 0, "max_subscription_concurrency": 7}, map[string]any{"id": "globex"}}})
	if err != nil {
		t.Fatal(err)
	}
	opts = serverOptions(unbounded, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if want := []delivery.Tenant{{ID: "acme", MaxSubscriptions: -1, MaxSubscriptionConcurrency: 7}, {ID: "globex"}}; !reflect.DeepEqual(opts.Tenants, want) {
		t.Errorf("Tenants = %+v, want %+v", opts.Tenants, want)
	}
	if opts.TenantDefaults.MaxSubscriptions != -1 {
		t.Errorf("tenant_defaults.max_subscriptions 0: TenantDefaults %+v, want MaxSubscriptions -1", opts.TenantDefaults)
	}
}

func encodeSecrets(ss []signing.Secret) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Encode()
	}
	return out
}

// TestOrderingWiring: a subscription's ordering reaches delivery.Subscription
// from the file and from the API; left out, it is none.
func TestOrderingWiring(t *testing.T) {
	for _, mode := range []string{"key", "fifo", "none", ""} {
		doc := `{"id": "a", "url": "https://a.example/", "secret": "` + e2eSecret + `"`
		if mode != "" {
			doc += `, "ordering": "` + mode + `"`
		}
		got, err := specParser{}.Parse([]byte(doc + "}"))
		if err != nil {
			t.Fatalf("ordering %q: %v", mode, err)
		}
		if got.Ordering != mode {
			t.Errorf("ordering %q: delivery.Subscription.Ordering = %q", mode, got.Ordering)
		}
	}
}

// TestFormatWiring: a subscription's format reaches delivery.Subscription
// from the API and the file, and cloudevents.source reaches
// proxy.Options; left out, they are standard-webhooks and the default
// source.
func TestFormatWiring(t *testing.T) {
	for _, format := range []string{"cloudevents-binary", "cloudevents-structured", "standard-webhooks", ""} {
		doc := `{"id": "a", "url": "https://a.example/", "secret": "` + e2eSecret + `"`
		if format != "" {
			doc += `, "format": "` + format + `"`
		}
		got, err := specParser{}.Parse([]byte(doc + "}"))
		if err != nil {
			t.Fatalf("format %q: %v", format, err)
		}
		if got.Format != format {
			t.Errorf("format %q: delivery.Subscription.Format = %q", format, got.Format)
		}
	}
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte("cloudevents: {source: 'https://fleet.example.com/sluice'}\nsubscriptions:\n"+
		"  - {id: a, url: 'https://a.example/', secret: "+e2eSecret+", format: cloudevents-structured}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	subs := subscriptions(cfg)
	opts := serverOptions(cfg, subs, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if opts.CloudEventsSource != "https://fleet.example.com/sluice" || subs[0].Format != "cloudevents-structured" {
		t.Errorf("CloudEventsSource = %q, Format = %q", opts.CloudEventsSource, subs[0].Format)
	}
	if opts := serverOptions(config.Default(), nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil); opts.CloudEventsSource != "/sluice" {
		t.Errorf("default CloudEventsSource = %q", opts.CloudEventsSource)
	}
}

// TestAPIFormat: a tenant's token may create a subscription with a format
// and change it; the subscription's config shows it; an unknown format is
// refused with 400 naming the key and the values, changing nothing.
func TestAPIFormat(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	yaml := "listen: 127.0.0.1:0\ndata_dir: " + filepath.Join(dir, "data") + "\nadmin:\n  listen: 127.0.0.1:0\n  token: operator-token-0123456789\n" +
		"  tokens: [{token: acme-token-0123456789, tenant: acme}]\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := proxy.New(serverOptions(cfg, subscriptions(cfg), slog.New(slog.NewTextHandler(io.Discard, nil)), nil))
	if err := srv.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(t.Context()) })
	call := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.AdminURL()+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer acme-token-0123456789")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	format := func() any {
		t.Helper()
		code, body := call("GET", "/v1/subscriptions/ce", "")
		var got struct {
			Config map[string]any `json:"config"`
		}
		if code != 200 || json.Unmarshal([]byte(body), &got) != nil {
			t.Fatalf("get: %d %s", code, body)
		}
		return got.Config["format"]
	}
	if code, body := call("POST", "/v1/subscriptions", `{"id": "ce", "url": "https://ce.example.com/in", "format": "cloudevents-structured"}`); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	if f := format(); f != "cloudevents-structured" {
		t.Errorf("config.format = %v after the create", f)
	}
	code, body := call("PATCH", "/v1/subscriptions/ce", `{"format": "xml"}`)
	if code != 400 || !strings.Contains(body, `format: \"xml\": must be standard-webhooks, cloudevents-binary or cloudevents-structured`) {
		t.Errorf("bad format: %d %s", code, body)
	}
	if code, body := call("PATCH", "/v1/subscriptions/ce", `{"format": "cloudevents-binary"}`); code != 200 {
		t.Fatalf("patch: %d %s", code, body)
	}
	if f := format(); f != "cloudevents-binary" {
		t.Errorf("config.format = %v after the patch", f)
	}
}

// TestServerOptionsIngestLimits: the ingest block's keys, the batch limits
// among them, reach the ingest server's limits.
func TestServerOptionsIngestLimits(t *testing.T) {
	cfg, err := config.Load("", []string{"SLUICE_INGEST__MAX_BATCH_EVENTS=250", "SLUICE_INGEST__MAX_BATCH_BYTES=2097152", "SLUICE_INGEST__MAX_HEADER_BYTES=8192"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := serverOptions(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil).Ingest
	if got.MaxBatchEvents != 250 || got.MaxBatchBytes != 2<<20 || got.MaxHeaderBytes != 8192 || got.MaxConnections != ingest.DefaultMaxConnections {
		t.Errorf("Ingest = %+v", got)
	}
}
