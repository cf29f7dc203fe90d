package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/signing"
)

// TestParseSubscription: a document of the API decodes, defaults and
// validates exactly as the same subscription in the config file.
func TestParseSubscription(t *testing.T) {
	doc := `{"id": "billing", "url": "https://billing.example.com/hooks", "secrets": ["` + secretA + `", "` + secretB + `"],
		"types": ["geofence.enter", "geofence.exit"], "tenant": "acme", "filter": {"data.speed": {"$gt": 30}},
		"body": {"envelope": "standard-webhooks", "fields": ["data.id"]}, "timeout": "5s", "rate": {"per_second": 2.5}, "concurrency": {"auto": true, "headroom": 1},
		"retry": {"max_attempts": 3}, "breaker": {"failure_ratio": 1}, "backlog": {"max_age": "1h"},
		"headers": {"X-Version": "2", "Authorization": "Bearer x"}, "classify": {"409": "ack"}, "paused": true, "ordering": "key",
		"format": "cloudevents-structured"}`
	got, err := ParseSubscription([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	// The same subscription in a JSON config file.
	path := filepath.Join(t.TempDir(), "sluice.json")
	writeFile(t, path, `{"subscriptions": [`+doc+`]}`)
	file, err := Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := &file.Subscriptions[0]

	if !slices.Equal(encodeAll(got.Resolved), []string{secretA, secretB}) || !slices.Equal(encodeAll(want.Resolved), encodeAll(got.Resolved)) {
		t.Errorf("Resolved = %q, want secretA, secretB", encodeAll(got.Resolved))
	}
	if got.Ordering != "key" || got.Format != "cloudevents-structured" {
		t.Errorf("Ordering = %q, Format = %q; want key, cloudevents-structured", got.Ordering, got.Format)
	}
	if got.ParsedFilter == nil || got.ClassifyOverrides == nil || got.ParsedVariant.Key() != want.ParsedVariant.Key() || got.ParsedVariant == nil {
		t.Errorf("ParsedFilter %v, ClassifyOverrides %v, ParsedVariant %v: want them parsed", got.ParsedFilter, got.ClassifyOverrides, got.ParsedVariant)
	}
	g, w := *got, *want
	g.Resolved, w.Resolved = nil, nil
	g.spec, w.spec = nil, nil
	if !reflect.DeepEqual(g, w) {
		t.Errorf("from the API:\n %s\nfrom the file:\n %s", dump([]SubscriptionConfig{g}), dump([]SubscriptionConfig{w}))
	}
	// Defaults are the file's: spot-check a few the document left out.
	if got.Concurrency.Max != 64 || got.Concurrency.Min != 1 || got.Concurrency.Headroom != 1 || got.Breaker.MinRequests != 20 || got.Rate.Burst != 3 {
		t.Errorf("defaults: concurrency %+v, breaker %+v, rate %+v", got.Concurrency, got.Breaker, got.Rate)
	}
}

// TestParseSubscriptionErrors: each bad document is refused with a
// *ValidationError naming the key as the document spells it, without the
// subscriptions[0] prefix or "config: ", and without a secret.
func TestParseSubscriptionErrors(t *testing.T) {
	const ok = `"id": "a", "url": "https://a.example.com/in", "secret": "` + secretA + `"`
	// Lists and strings past their bounds, as an attacker holding a
	// tenant's token sent them.
	quoted := func(n int, f func(i int) string) string {
		l := make([]string, n)
		for i := range l {
			l[i] = `"` + f(i) + `"`
		}
		return strings.Join(l, ", ")
	}
	manyTypes := `[` + quoted(65, func(i int) string { return fmt.Sprintf("t%d", i) }) + `]`
	var headers []string
	for i := range 33 {
		headers = append(headers, fmt.Sprintf(`"X-H%d": "v"`, i))
	}
	manyHeaders := `{` + strings.Join(headers, ", ") + `}`
	manySecrets := `[` + quoted(17, func(int) string { return secretA }) + `]`
	longURL := "https://a.example/" + strings.Repeat("a", 10_000)
	tests := []struct {
		name, doc string
		field     string // ValidationError.Field
		want      string // the error's text starts with it
		is        error
		policy    bool // needs policy's real filter and type patterns
	}{
		{name: "bad url", doc: `{"id": "a", "url": "ftp://x", "secret": "` + secretA + `"}`, field: "url", want: `url: "ftp://x": must be http or https`, is: ErrInvalidValue},
		{name: "url with credentials", doc: `{"id": "a", "url": "https://bob:hunter2@a.example/", "secret": "` + secretA + `"}`, field: "url", want: `url: "https://[redacted]@a.example/": must not contain credentials`},
		{name: "bad secret", doc: `{"id": "a", "url": "https://a.example/", "secret": "whsec_c2hvcnQ="}`, field: "secret", want: `secret: [redacted]: invalid secret: key is 5 bytes`, is: signing.ErrBadSecret},
		{name: "bad secrets entry", doc: `{"id": "a", "url": "https://a.example/", "secrets": ["` + secretA + `", "not-a-secret-value"]}`, field: "secrets[1]", want: `secrets[1]: [redacted]: invalid secret`, is: signing.ErrBadSecret},
		{name: "no secret", doc: `{"id": "a", "url": "https://a.example/"}`, field: "secret", want: `secret: no secret: set secret or secrets`, is: ErrMissingValue},
		{name: "two secret sources", doc: `{` + ok + `, "secrets": ["` + secretB + `"]}`, field: "", want: `several secret sources (secret, secrets): set exactly one`, is: ErrConflict},
		{name: "secret_file", doc: `{"id": "a", "url": "https://a.example/", "secret_file": "/etc/passwd"}`, field: "secret_file", want: `secret_file: not accepted over the API: give the secret inline`, is: ErrInvalidValue},
		{name: "secret_file empty", doc: `{` + ok + `, "secret_file": ""}`, field: "secret_file", want: `secret_file: not accepted over the API`},
		{name: "secret_env", doc: `{"id": "a", "url": "https://a.example/", "secret_env": "HOME"}`, field: "secret_env", want: `secret_env: not accepted over the API: give the secret inline`},
		{name: "unknown key", doc: `{` + ok + `, "colour": "red"}`, field: "colour", want: `unknown key "colour"`, is: ErrUnknownKey},
		{name: "unknown nested key", doc: `{` + ok + `, "retry": {"jitter": true}}`, field: "retry.jitter", want: `unknown key "retry.jitter"`, is: ErrUnknownKey},
		{name: "wrong type", doc: `{` + ok + `, "retry": {"max_attempts": "many"}}`, field: "retry.max_attempts", want: `retry.max_attempts: "many": must be an integer`, is: ErrInvalidValue},
		{name: "wrong type list", doc: `{` + ok + `, "types": "geofence.enter"}`, field: "types", want: `types: expected a list`},
		{name: "wrong type bool", doc: `{` + ok + `, "paused": "yes"}`, field: "paused", want: `paused: "yes": must be true or false`},
		{name: "wrong type mapping", doc: `{` + ok + `, "rate": 10}`, field: "rate", want: `rate: expected a mapping`},
		{name: "bare duration", doc: `{` + ok + `, "timeout": 10}`, field: "timeout", want: `timeout: 10: bare number is not a duration`},
		{name: "out of range", doc: `{` + ok + `, "retry": {"max_attempts": 101}}`, field: "retry.max_attempts", want: `retry.max_attempts: 101: must be between 1 and 100`},
		// A JSON document is taken as its types say, never converted.
		{name: "id a number", doc: `{"id": 5, "url": "https://a.example/", "secret": "` + secretA + `"}`, field: "id", want: `id: 5: must be a string`, is: ErrInvalidValue},
		{name: "max a string", doc: `{` + ok + `, "concurrency": {"max": "10"}}`, field: "concurrency.max", want: `concurrency.max: "10": must be an integer`, is: ErrInvalidValue},
		{name: "rate a string", doc: `{` + ok + `, "rate": {"per_second": "10"}}`, field: "rate.per_second", want: `rate.per_second: "10": must be a number`, is: ErrInvalidValue},
		{name: "paused a number", doc: `{` + ok + `, "paused": 1}`, field: "paused", want: `paused: 1: must be true or false`, is: ErrInvalidValue},
		{name: "header a number", doc: `{` + ok + `, "headers": {"X-Version": 2}}`, field: "headers[X-Version]", want: `headers[X-Version]: 2: must be a string`, is: ErrInvalidValue},
		{name: "type a number", doc: `{` + ok + `, "types": ["a", 7]}`, field: "types[1]", want: `types[1]: 7: must be a string`, is: ErrInvalidValue},
		{name: "classify a boolean", doc: `{` + ok + `, "classify": {"409": true}}`, field: "classify[409]", want: `classify[409]: true: must be a string`, is: ErrInvalidValue},
		{name: "secret a number", doc: `{"id": "a", "url": "https://a.example/", "secret": 12345}`, field: "secret", want: `secret: [redacted]: must be a string`, is: ErrInvalidValue},
		{name: "too many types", doc: `{` + ok + `, "types": ` + manyTypes + `}`, field: "types", want: `types: lists 65 types, more than 64`, is: ErrInvalidValue},
		{name: "type too long", doc: `{` + ok + `, "types": ["a.` + strings.Repeat("b", 200) + `.*"]}`, field: "types[0]", want: `types[0]: is 204 bytes, more than 128`, is: ErrInvalidValue},
		{name: "url too long", doc: `{"id": "a", "url": "` + longURL + `", "secret": "` + secretA + `"}`, field: "url", want: `url: is 10018 bytes, more than 2048`, is: ErrInvalidValue},
		{name: "too many headers", doc: `{` + ok + `, "headers": ` + manyHeaders + `}`, field: "headers", want: `headers: has 33 headers, more than 32`, is: ErrInvalidValue},
		{name: "header value too long", doc: `{` + ok + `, "headers": {"X-Big": "` + strings.Repeat("v", 8193) + `"}}`, field: "headers[X-Big]", want: `headers[X-Big]: value is 8193 bytes, more than 8192`, is: ErrInvalidValue},
		{name: "header name too long", doc: `{` + ok + `, "headers": {"X-` + strings.Repeat("n", 300) + `": "v"}}`, field: "headers", want: `headers: a header name is 302 bytes, more than 256`, is: ErrInvalidValue},
		{name: "too many secrets", doc: `{"id": "a", "url": "https://a.example/", "secrets": ` + manySecrets + `}`, field: "secrets", want: `secrets: lists 17 secrets, more than 16`, is: ErrInvalidValue},
		{name: "tiny rate", doc: `{` + ok + `, "rate": {"per_second": 1e-300}}`, field: "rate.per_second", want: `rate.per_second: 1e-300: must be at least 0.001`, is: ErrInvalidValue},
		{name: "explicit zero timeout", doc: `{` + ok + `, "timeout": "0s"}`, field: "timeout", want: `timeout: 0s: must be between 1ms and 5m0s`, is: ErrInvalidValue},
		{name: "explicit zero", doc: `{` + ok + `, "rate": {"per_second": 0}}`, field: "rate.per_second", want: `rate.per_second: 0: must be greater than 0`},
		{name: "operational id", doc: `{"id": "sluice.operational", "url": "https://a.example/", "secret": "` + secretA + `"}`, field: "id", want: `id: "sluice.operational": is the operational webhook's lane`},
		{name: "missing id", doc: `{"url": "https://a.example/", "secret": "` + secretA + `"}`, field: "id", want: `id: required`, is: ErrMissingValue},
		{name: "bad tenant", doc: `{` + ok + `, "tenant": "Acme"}`, field: "tenant", want: `tenant: "Acme": must match`},
		{name: "bad type", doc: `{` + ok + `, "types": ["geofence enter"]}`, field: "types[0]", want: `types[0]: "geofence enter": must be "*" or an event type`},
		{name: "bad type pattern", doc: `{` + ok + `, "types": ["geo fence.*"]}`, field: "types[0]", want: `types[0]: "geo fence.*": `, is: ErrInvalidValue},
		{name: "star with a pattern", doc: `{` + ok + `, "types": ["*", "geofence.*"]}`, field: "types", want: `types: `, is: ErrConflict, policy: true},
		{name: "bad filter", doc: `{` + ok + `, "filter": {"data.amount": {"$regex": "^1"}}}`, field: "filter", want: `filter: `, is: ErrInvalidValue, policy: true},
		{name: "filter not a mapping", doc: `{` + ok + `, "filter": ["data.amount"]}`, field: "filter", want: `filter: expected a mapping`},
		{name: "unknown envelope", doc: `{` + ok + `, "body": {"envelope": "svix"}}`, field: "body.envelope", want: `body.envelope: "svix": unknown envelope`, is: ErrInvalidValue},
		{name: "empty fields", doc: `{` + ok + `, "body": {"fields": []}}`, field: "body.fields", want: `body.fields: []: must list at least one path`, is: ErrInvalidValue},
		{name: "bad field path", doc: `{` + ok + `, "body": {"fields": ["data.id", ""]}}`, field: "body.fields[1]", want: `body.fields[1]: "": empty path`, is: ErrInvalidValue},
		{name: "empty body", doc: `{` + ok + `, "body": {}}`, field: "body", want: `body: set envelope or fields`, is: ErrInvalidValue},
		{name: "unknown body key", doc: `{` + ok + `, "body": {"template": "x"}}`, field: "body.template", want: `unknown key "body.template"`, is: ErrUnknownKey},
		{name: "reserved header", doc: `{` + ok + `, "headers": {"webhook-id": "x"}}`, field: "headers[webhook-id]", want: `headers[webhook-id]: sluice sets this header itself`},
		{name: "sensitive header", doc: `{` + ok + `, "headers": {"Authorization": "Bearer a\u0001b-header-secret"}}`, field: "headers[Authorization]", want: `headers[Authorization]: [redacted]: header value must not contain control characters`},
		{name: "bad ordering", doc: `{` + ok + `, "ordering": "keys"}`, field: "ordering", want: `ordering: "keys": must be none, key or fifo`, is: ErrInvalidValue},
		{name: "bad format", doc: `{` + ok + `, "format": "CloudEvents"}`, field: "format", want: `format: "CloudEvents": must be standard-webhooks, cloudevents-binary or cloudevents-structured`, is: ErrInvalidValue},
		{name: "format not a string", doc: `{` + ok + `, "format": 1}`, field: "format", want: `format: `},
		{name: "ce header with cloudevents", doc: `{` + ok + `, "format": "cloudevents-binary", "headers": {"ce-id": "x"}}`, field: "headers[ce-id]", want: `headers[ce-id]: a CloudEvents attribute's header`, is: ErrInvalidValue},
		{name: "reserved ordering header", doc: `{` + ok + `, "headers": {"X-Sluice-Replay": "no"}}`, field: "headers[X-Sluice-Replay]", want: `headers[X-Sluice-Replay]: sluice sets this header itself`},
		{name: "bad classify", doc: `{` + ok + `, "classify": {"409": "ignore"}}`, field: "classify[409]", want: `classify[409]: "ignore": must be ack, retry or dead_letter`},
		{name: "not JSON", doc: `id: a`, field: "", want: `not a JSON object: line 1: invalid character`},
		{name: "not an object", doc: `[{` + ok + `}]`, field: "", want: `not a JSON object: line 1: the top level must be an object`},
		{name: "duplicate key", doc: "{" + ok + ",\n\"url\": \"https://b.example/\"}", field: "", want: `not a JSON object: line 2: key "url" appears twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.policy {
				skipPolicyStub(t)
			}
			s, err := ParseSubscription([]byte(tt.doc))
			if err == nil {
				t.Fatalf("ParseSubscription succeeded: %s", s)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, tt.want) {
				t.Errorf("error %q\ndoes not start with %q", msg, tt.want)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != tt.field {
				t.Errorf("error %#v: want a *ValidationError for field %q", err, tt.field)
			}
			if strings.Contains(msg, "subscriptions") || strings.HasPrefix(msg, "config:") {
				t.Errorf("error %q names the file's keys", msg)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.is)
			}
			for _, sec := range []string{secretA, secretB, strings.TrimPrefix(secretA, "whsec_"), "c2hvcnQ", "not-a-secret-value", "hunter2", "header-secret"} {
				if strings.Contains(msg, sec) {
					t.Errorf("error %q reveals %q", msg, sec)
				}
			}
		})
	}
}

// TestCheckPrivateTarget: the SSRF guard's load-time half, for the
// caller of ParseSubscription.
func TestCheckPrivateTarget(t *testing.T) {
	s, err := ParseSubscription([]byte(`{"id": "a", "url": "http://169.254.169.254/latest", "secret": "` + secretA + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	err = s.CheckPrivateTarget()
	const want = `url: "http://169.254.169.254/latest": is a link-local address (cloud metadata lives here); set allow_private_targets: true to deliver there`
	if err == nil || err.Error() != want || !errors.Is(err, ErrInvalidValue) {
		t.Errorf("CheckPrivateTarget = %v, want %s", err, want)
	}
	s.URL = "https://a.example.com/in"
	if err := s.CheckPrivateTarget(); err != nil {
		t.Errorf("public URL: %v", err)
	}
}

// TestRedactSubscriptionDoc: what API clients are shown of a document.
func TestRedactSubscriptionDoc(t *testing.T) {
	doc := `{"id": "a", "url": "https://a.example.com/in?token=query-secret", "secrets": ["` + secretA + `", "` + secretB + `"],
		"headers": {"Authorization": "Bearer header-secret", "X-Api-Key": "key-secret", "X-Tenant": "acme"},
		"types": ["geofence.enter"], "filter": {"data.speed": {"$gt": 30}}, "retry": {"max_attempts": 3}, "tenant": "acme"}`
	got := RedactSubscriptionDoc([]byte(doc))
	want := map[string]any{
		"id": "a", "url": "https://a.example.com/in?token=REDACTED", "secrets_count": 2,
		"headers": map[string]any{"Authorization": "[redacted]", "X-Api-Key": "[redacted]", "X-Tenant": "acme"},
		"types":   []any{"geofence.enter"}, "filter": map[string]any{"data.speed": map[string]any{"$gt": 30}},
		"retry": map[string]any{"max_attempts": 3}, "tenant": "acme",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("RedactSubscriptionDoc =\n %#v\nwant\n %#v", got, want)
	}
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	for _, sec := range []string{secretA, secretB, "query-secret", "header-secret", "key-secret"} {
		if strings.Contains(string(b), sec) {
			t.Errorf("%s reveals %q", b, sec)
		}
	}

	if got := RedactSubscriptionDoc([]byte(`{"id": "a", "secret": "` + secretA + `"}`)); got["secrets_count"] != 1 || got["secret"] != nil {
		t.Errorf("one secret: %v", got)
	}
	if got := RedactSubscriptionDoc([]byte(`{"id": "a"}`)); !reflect.DeepEqual(got, map[string]any{"id": "a"}) {
		t.Errorf("no secret: %v, want no secrets_count", got)
	}
	for _, bad := range []string{``, `[1]`, `{"secret": "` + secretA + `"`, `{"a": 1}{}`} {
		if got := RedactSubscriptionDoc([]byte(bad)); got == nil || len(got) != 0 {
			t.Errorf("RedactSubscriptionDoc(%q) = %v, want an empty map", bad, got)
		}
	}
}

// TestSubscriptionSpec: a file subscription's Spec is what the file wrote,
// without the defaults, redacted as the API's documents are.
func TestSubscriptionSpec(t *testing.T) {
	cfg, err := Load("testdata/full.good.yaml", goodEnviron, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := func(i int) map[string]any {
		t.Helper()
		var m map[string]any
		b := cfg.Subscriptions[i].Spec()
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("subscriptions[%d].Spec() = %s: %v", i, b, err)
		}
		for _, sec := range []string{secretA, secretB, secretC, secretD, headerSecret} {
			if strings.Contains(string(b), sec) {
				t.Errorf("subscriptions[%d].Spec() = %s reveals %q", i, b, sec)
			}
		}
		return m
	}

	billing := spec(0)
	want := map[string]any{
		"id": "billing", "url": "https://billing.example.com/hooks", "secrets_count": 1.0,
		"types": []any{"geofence.enter", "geofence.exit"}, "tenant": "acme",
		"filter": map[string]any{
			"data.speed": map[string]any{"$gt": 30.0},
			"$or":        []any{map[string]any{"data.zone": "depot"}, map[string]any{"data.zone": map[string]any{"$in": []any{"north", "south"}}}},
		},
		"body":    map[string]any{"envelope": "standard-webhooks", "fields": []any{"data.zone", "data.id"}},
		"timeout": "5s", "rate": map[string]any{"per_second": 100.0, "burst": 200.0}, "concurrency": map[string]any{"max": 16.0},
		"retry":    map[string]any{"max_attempts": 8.0, "max_age": "24h", "base": "1s", "cap": "1h"},
		"backlog":  map[string]any{"max_events": 1e6, "max_age": "72h"},
		"breaker":  map[string]any{"failure_ratio": 0.25, "min_requests": 50.0, "window": "30s", "consecutive_timeouts": 3.0, "cool_down": "2s", "max_cool_down": "1m"},
		"classify": map[string]any{"409": "ack", "404": "dead_letter"}, "headers": map[string]any{"X-Tenant": "acme"},
	}
	if !reflect.DeepEqual(billing, want) {
		t.Errorf("billing Spec =\n %v\nwant\n %v", billing, want)
	}

	fleet := spec(1)
	if fleet["secrets_count"] != 2.0 || fleet["secrets"] != nil {
		t.Errorf("fleet.ops-2: secrets_count %v, secrets %v", fleet["secrets_count"], fleet["secrets"])
	}
	if h := fleet["headers"].(map[string]any); h["Authorization"] != "[redacted]" || h["X-Version"] != 2.0 {
		t.Errorf("fleet.ops-2 headers = %v", h)
	}
	// YAML's integer keys (classify: {409: ack}) become JSON's strings.
	if c := fleet["classify"].(map[string]any); c["409"] != "ack" {
		t.Errorf("fleet.ops-2 classify = %v", c)
	}
	if b := fleet["breaker"].(map[string]any); len(b) != 2 {
		t.Errorf("fleet.ops-2 breaker = %v, want only the two keys the file sets", b)
	}
	if fleet["url"] != "http://fleet.internal:8080/webhooks?source=REDACTED" {
		t.Errorf("fleet.ops-2 url = %v", fleet["url"])
	}
	// Secrets from a file or the environment: their number once read.
	if cards := spec(2); cards["secrets_count"] != 2.0 || cards["secret_file"] != "testdata/cards.secrets" || cards["tenant"] != "initech" || cards["format"] != "cloudevents-binary" {
		t.Errorf("cards Spec = %v", cards)
	}
	if audit := spec(3); !reflect.DeepEqual(audit, map[string]any{"id": "audit", "url": "https://audit.example.com/in", "secret_env": "AUDIT_WEBHOOK_SECRETS", "secrets_count": 2.0}) {
		t.Errorf("audit Spec = %v", audit)
	}

	// Built by hand: every setting, as String prints it.
	byHand := cfg.Subscriptions[3]
	byHand.spec = nil
	var m map[string]any
	if err := json.Unmarshal(byHand.Spec(), &m); err != nil {
		t.Fatal(err)
	}
	if m["secrets_count"] != 2.0 || m["retry"] == nil || m["breaker"] == nil || m["secret"] != nil || m["format"] != nil {
		t.Errorf("hand-built Spec = %v", m)
	}
	// The format is shown where it is not the default.
	byHand = cfg.Subscriptions[2]
	byHand.spec = nil
	m = nil
	if err := json.Unmarshal(byHand.Spec(), &m); err != nil || m["format"] != "cloudevents-binary" {
		t.Errorf("hand-built Spec with a format = %v (%v)", m, err)
	}
}

// BenchmarkSpecOf is the work Spec adds to decoding one subscription of
// the lanes-50k bench's shape.
func BenchmarkSpecOf(b *testing.B) {
	raw := map[string]any{"id": "s12345", "url": "http://127.0.0.1:40000/s12345", "secret": secretA,
		"types": []any{"idle.type"}, "concurrency": map[string]any{"max": 8}}
	b.ReportAllocs()
	for b.Loop() {
		specOf(raw)
	}
}
