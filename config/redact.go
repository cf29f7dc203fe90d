package config

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/sluicehq/sluice/proxy/delivery"
)

// redactedText replaces secrets, tokens and sensitive header values wherever
// a Config or an error is printed.
const redactedText = "[redacted]"

// sensitiveHeader reports header names whose values are likely credentials.
func sensitiveHeader(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "authorization", "proxy-authorization", "cookie":
		return true
	}
	for _, w := range []string{"token", "secret", "key", "auth", "signature", "password", "passwd", "session", "credential"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// isSensitiveField reports whether the value at field path must never be
// printed: secrets, the admin token and credential-like header values.
func isSensitiveField(field string) bool {
	if i := strings.LastIndex(field, "headers["); i >= 0 && strings.HasSuffix(field, "]") {
		return sensitiveHeader(field[i+len("headers[") : len(field)-1])
	}
	last := field
	if i := strings.LastIndexByte(last, '.'); i >= 0 {
		last = last[i+1:]
	}
	if i := strings.IndexByte(last, '['); i >= 0 {
		last = last[:i]
	}
	switch last {
	case "secret", "secrets", "token":
		return true
	}
	return false
}

// formatValue prints a value for an error message.
func formatValue(field string, v any) string {
	if isSensitiveField(field) {
		return redactedText
	}
	var s string
	switch x := v.(type) {
	case string:
		if x == redactedText {
			return x
		}
		s = strconv.Quote(secretText(x))
	case time.Duration:
		s = x.String()
	case float64:
		s = strconv.FormatFloat(x, 'g', -1, 64)
		if a := math.Abs(x); a >= 1e-6 && a < 1e21 {
			s = strconv.FormatFloat(x, 'f', -1, 64) // 2000000, not 2e+06
		}
	case []string:
		s = fmt.Sprintf("%q", x)
	default:
		s = fmt.Sprint(x)
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// secretText is s with anything from a "whsec_" on redacted: a secret
// pasted where another value goes (a url, a key, an id) is still a secret,
// and an error that names the value is logged (found by the config fuzzers).
func secretText(s string) string {
	if i := strings.Index(s, "whsec_"); i >= 0 {
		return s[:i] + "whsec_" + redactedText
	}
	return s
}

// safeURL hides userinfo and query values, which often carry credentials.
// A URL that does not parse is shown only if it cannot hold either.
func safeURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if strings.ContainsAny(raw, "@?") {
			return redactedText
		}
		return raw
	}
	hadUser := u.User != nil
	u.User = nil
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			q[k] = []string{"REDACTED"}
		}
		u.RawQuery = q.Encode()
	}
	out := u.String()
	if hadUser {
		if scheme, rest, ok := strings.Cut(out, "://"); ok {
			out = scheme + "://" + redactedText + "@" + rest
		}
	}
	return out
}

// redacted returns a deep copy of c that is safe to print: secrets, the admin
// token and credential-like header values are "[redacted]", URLs lose
// userinfo and query values, and Resolved and ResolvedToken are empty. The
// copy does not pass Validate.
func (c Config) redacted() *Config {
	r := c
	r.lookupEnv = nil
	r.Admin = c.Admin.redacted()
	r.jetstreamKeys = nil
	if c.JetStream.URLs != nil {
		r.JetStream.URLs = make([]string, len(c.JetStream.URLs))
		for i, u := range c.JetStream.URLs {
			r.JetStream.URLs[i] = safeURL(u)
		}
	}
	if c.Subscriptions != nil {
		r.Subscriptions = make([]SubscriptionConfig, len(c.Subscriptions))
		for i, s := range c.Subscriptions {
			r.Subscriptions[i] = s.redacted()
		}
	}
	return &r
}

func (a AdminConfig) redacted() AdminConfig {
	if a.Token != "" {
		a.Token = redactedText
	}
	a.ResolvedToken = ""
	if a.Tokens != nil {
		tokens := make([]TenantTokenConfig, len(a.Tokens))
		for i, t := range a.Tokens {
			tokens[i] = t.redacted()
		}
		a.Tokens = tokens
	}
	a.ResolvedTenantTokens = nil
	a.OperationalWebhook = a.OperationalWebhook.redacted()
	return a
}

func (t TenantTokenConfig) redacted() TenantTokenConfig {
	if t.Token != "" {
		t.Token = redactedText
	}
	return t
}

func (w WebhookConfig) redacted() WebhookConfig {
	w.URL = safeURL(w.URL)
	if w.Secret != "" {
		w.Secret = redactedText
	}
	if w.Secrets != nil {
		w.Secrets = slices.Repeat([]string{redactedText}, len(w.Secrets))
	}
	w.Resolved = nil
	return w
}

func (s SubscriptionConfig) redacted() SubscriptionConfig {
	s.URL = safeURL(s.URL)
	if s.Secret != "" {
		s.Secret = redactedText
	}
	if s.Secrets != nil {
		s.Secrets = slices.Repeat([]string{redactedText}, len(s.Secrets))
	}
	s.Types = slices.Clone(s.Types)
	if s.Headers != nil {
		h := make(map[string]string, len(s.Headers))
		for k, v := range s.Headers {
			if sensitiveHeader(k) {
				v = redactedText
			}
			h[k] = v
		}
		s.Headers = h
	}
	if s.Classify != nil {
		s.Classify = maps.Clone(s.Classify)
	}
	if s.ClassifyOverrides != nil {
		s.ClassifyOverrides = maps.Clone(s.ClassifyOverrides)
	}
	s.Resolved = nil
	s.spec = nil
	return s
}

// String returns c as YAML in the config file's shape, with secrets, the
// admin token, credential-like header values and URL credentials
// redacted.
func (c Config) String() string {
	b, err := yaml.Parser().Marshal(c.redacted().toMap())
	if err != nil {
		return "config: " + err.Error()
	}
	return string(b)
}

// GoString makes %#v print the redacted String form.
func (c Config) GoString() string { return c.String() }

// LogValue makes log/slog print the redacted form on one line.
func (c Config) LogValue() slog.Value { return slog.StringValue(oneLine(c.redacted().toMap())) }

// MarshalJSON encodes the redacted form, so encoding/json cannot leak a
// secret either.
func (c Config) MarshalJSON() ([]byte, error) { return json.Marshal(c.redacted().toMap()) }

// String returns a redacted one-line form.
func (a AdminConfig) String() string { return oneLine(a.redacted().toMap()) }

// GoString makes %#v print the redacted form.
func (a AdminConfig) GoString() string { return a.String() }

// LogValue makes log/slog print the redacted form.
func (a AdminConfig) LogValue() slog.Value { return slog.StringValue(a.String()) }

// MarshalJSON encodes the redacted form.
func (a AdminConfig) MarshalJSON() ([]byte, error) { return json.Marshal(a.redacted().toMap()) }

// String returns a redacted one-line form.
func (s SubscriptionConfig) String() string { return oneLine(s.redacted().toMap()) }

// GoString makes %#v print the redacted form.
func (s SubscriptionConfig) GoString() string { return s.String() }

// LogValue makes log/slog print the redacted form.
func (s SubscriptionConfig) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON encodes the redacted form.
func (s SubscriptionConfig) MarshalJSON() ([]byte, error) { return json.Marshal(s.redacted().toMap()) }

// String returns a redacted one-line form.
func (t TenantTokenConfig) String() string { return oneLine(t.redacted().toMap()) }

// GoString makes %#v print the redacted form.
func (t TenantTokenConfig) GoString() string { return t.String() }

// LogValue makes log/slog print the redacted form.
func (t TenantTokenConfig) LogValue() slog.Value { return slog.StringValue(t.String()) }

// MarshalJSON encodes the redacted form.
func (t TenantTokenConfig) MarshalJSON() ([]byte, error) { return json.Marshal(t.redacted().toMap()) }

// String returns a redacted one-line form: the tenant, never the token.
func (t TenantToken) String() string {
	return oneLine(map[string]any{"tenant": t.Tenant, "token": redactedText})
}

// GoString makes %#v print the redacted form.
func (t TenantToken) GoString() string { return t.String() }

// LogValue makes log/slog print the redacted form.
func (t TenantToken) LogValue() slog.Value { return slog.StringValue(t.String()) }

// MarshalJSON encodes the redacted form.
func (t TenantToken) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"tenant": t.Tenant, "token": redactedText})
}

// String returns a redacted one-line form.
func (w WebhookConfig) String() string { return oneLine(w.redacted().toMap()) }

// GoString makes %#v print the redacted form.
func (w WebhookConfig) GoString() string { return w.String() }

// LogValue makes log/slog print the redacted form.
func (w WebhookConfig) LogValue() slog.Value { return slog.StringValue(w.String()) }

// MarshalJSON encodes the redacted form.
func (w WebhookConfig) MarshalJSON() ([]byte, error) { return json.Marshal(w.redacted().toMap()) }

// toMap expects a redacted Config.
func (c *Config) toMap() map[string]any {
	subs := make([]any, len(c.Subscriptions))
	for i, s := range c.Subscriptions {
		subs[i] = s.toMap()
	}
	m := map[string]any{
		"listen":                c.Listen,
		"admin":                 c.Admin.toMap(),
		"data_dir":              c.DataDir,
		"durability":            c.Durability,
		"max_body_bytes":        c.MaxBodyBytes,
		"dedup_window":          c.DedupWindow.String(),
		"shutdown_grace":        c.ShutdownGrace.String(),
		"max_conns_per_host":    c.MaxConnsPerHost,
		"max_in_flight":         c.MaxInFlight,
		"max_disk_bytes":        c.MaxDiskBytes,
		"min_free_disk_bytes":   c.MinFreeDiskBytes,
		"memory_bytes":          c.MemoryBytes,
		"allow_private_targets": c.AllowPrivateTargets,
		"log_level":             c.LogLevel,
		"log_format":            c.LogFormat,
		"ingest": map[string]any{
			"header_timeout":   c.Ingest.HeaderTimeout.String(),
			"body_timeout":     c.Ingest.BodyTimeout.String(),
			"idle_timeout":     c.Ingest.IdleTimeout.String(),
			"max_header_bytes": c.Ingest.MaxHeaderBytes,
			"max_connections":  c.Ingest.MaxConnections,
			"max_batch_events": c.Ingest.MaxBatchEvents,
			"max_batch_bytes":  c.Ingest.MaxBatchBytes,
		},
		"retry_budget": map[string]any{
			"ratio":          c.RetryBudget.Ratio,
			"min_per_second": c.RetryBudget.MinPerSecond,
			"window":         c.RetryBudget.Window.String(),
		},
		"subscriptions": subs,
	}
	if len(c.Tenants) > 0 {
		tenants := make([]any, len(c.Tenants))
		for i, t := range c.Tenants {
			tm := map[string]any{"id": t.ID}
			if t.SubscriptionsLimit() != 0 { // a written 0 is no limit: it must load back as one
				tm["max_subscriptions"] = t.MaxSubscriptions
			}
			if t.Concurrency.Max != 0 {
				tm["concurrency"] = map[string]any{"max": t.Concurrency.Max}
			}
			if t.MaxSubscriptionConcurrency != 0 {
				tm["max_subscription_concurrency"] = t.MaxSubscriptionConcurrency
			}
			tenants[i] = tm
		}
		m["tenants"] = tenants
	}
	m["tenant_defaults"] = map[string]any{
		"max_subscriptions":            c.TenantDefaults.MaxSubscriptions,
		"concurrency":                  map[string]any{"max": c.TenantDefaults.Concurrency.Max},
		"max_subscription_concurrency": c.TenantDefaults.MaxSubscriptionConcurrency,
	}
	m["log"] = map[string]any{"backend": c.Log.Backend}
	m["cloudevents"] = map[string]any{"source": c.CloudEvents.Source}
	m["otel"] = map[string]any{
		"endpoint":     safeURL(c.OTel.Endpoint),
		"service_name": c.OTel.ServiceName,
		"sample_ratio": c.OTel.SampleRatio,
		"propagate":    c.OTel.Propagate,
	}
	// Fleet keys only where they mean something: with badger they are
	// refused, so printing their defaults would not load back.
	if c.Log.Backend == BackendJetStream {
		js := map[string]any{
			"urls":      c.JetStream.URLs,
			"stream":    c.JetStream.Stream,
			"replicas":  c.JetStream.Replicas,
			"lease_ttl": c.JetStream.LeaseTTL.String(),
		}
		if c.JetStream.CredentialsFile != "" {
			js["credentials_file"] = c.JetStream.CredentialsFile // a path; the file's content is never read into the Config
		}
		tlsm := map[string]any{}
		for k, v := range map[string]string{"ca_file": c.JetStream.TLS.CAFile, "cert_file": c.JetStream.TLS.CertFile, "key_file": c.JetStream.TLS.KeyFile} {
			if v != "" {
				tlsm[k] = v
			}
		}
		if len(tlsm) > 0 {
			js["tls"] = tlsm
		}
		m["jetstream"] = js
	}
	if c.NodeID != "" {
		m["node_id"] = c.NodeID
	}
	if e := c.Egress.egressMap(); e != nil {
		m["egress"] = e
	}
	return m
}

// toMap expects a redacted AdminConfig.
func (a AdminConfig) toMap() map[string]any {
	m := map[string]any{"listen": a.Listen}
	if a.Token != "" {
		m["token"] = a.Token
	}
	if a.TokenFile != "" {
		m["token_file"] = a.TokenFile
	}
	if a.InsecureNoToken {
		m["insecure_no_token"] = true
	}
	if len(a.Tokens) > 0 {
		tokens := make([]any, len(a.Tokens))
		for i, t := range a.Tokens {
			tokens[i] = t.toMap()
		}
		m["tokens"] = tokens
	}
	if w := a.OperationalWebhook.toMap(); len(w) > 0 {
		m["operational_webhook"] = w
	}
	return m
}

// toMap expects a redacted TenantTokenConfig.
func (t TenantTokenConfig) toMap() map[string]any {
	m := map[string]any{"tenant": t.Tenant}
	if t.Token != "" {
		m["token"] = t.Token
	}
	if t.TokenFile != "" {
		m["token_file"] = t.TokenFile
	}
	return m
}

// toMap expects a redacted WebhookConfig; it leaves out what is not set.
func (w WebhookConfig) toMap() map[string]any {
	m := map[string]any{}
	for k, v := range map[string]string{"url": w.URL, "secret": w.Secret, "secret_file": w.SecretFile, "secret_env": w.SecretEnv} {
		if v != "" {
			m[k] = v
		}
	}
	if w.Secrets != nil {
		m["secrets"] = w.Secrets
	}
	return m
}

// toMap expects a redacted SubscriptionConfig.
func (s SubscriptionConfig) toMap() map[string]any {
	m := map[string]any{
		"id":          s.ID,
		"url":         s.URL,
		"types":       s.Types,
		"timeout":     s.Timeout.String(),
		"concurrency": map[string]any{"max": s.Concurrency.Max},
		"retry": map[string]any{
			"max_attempts": s.Retry.MaxAttempts,
			"max_age":      s.Retry.MaxAge.String(),
			"base":         s.Retry.Base.String(),
			"cap":          s.Retry.Cap.String(),
		},
		"breaker": map[string]any{
			"failure_ratio":        s.Breaker.FailureRatio,
			"min_requests":         s.Breaker.MinRequests,
			"window":               s.Breaker.Window.String(),
			"consecutive_timeouts": s.Breaker.ConsecutiveTimeouts,
			"cool_down":            s.Breaker.CoolDown.String(),
			"max_cool_down":        s.Breaker.MaxCoolDown.String(),
		},
		"paused": s.Paused,
	}
	if c := s.Concurrency; c.Auto {
		m["concurrency"] = map[string]any{"auto": true, "min": c.Min, "max": c.Max, "headroom": c.Headroom}
	}
	if s.Rate != (RateConfig{}) {
		m["rate"] = map[string]any{"per_second": s.Rate.PerSecond, "burst": s.Rate.Burst}
	}
	if s.Backlog != (BacklogConfig{}) {
		m["backlog"] = map[string]any{"max_events": s.Backlog.MaxEvents, "max_age": s.Backlog.MaxAge.String()}
	}
	if s.Secret != "" {
		m["secret"] = s.Secret
	}
	if s.Secrets != nil {
		m["secrets"] = s.Secrets
	}
	if s.SecretFile != "" {
		m["secret_file"] = s.SecretFile
	}
	if s.SecretEnv != "" {
		m["secret_env"] = s.SecretEnv
	}
	if len(s.Headers) > 0 {
		m["headers"] = s.Headers
	}
	if len(s.Classify) > 0 {
		m["classify"] = s.Classify
	}
	if len(s.Filter) > 0 {
		m["filter"] = jsonable(s.Filter)
	}
	if b := s.Body; b.Envelope != "" || b.Fields != nil {
		body := map[string]any{}
		if b.Envelope != "" {
			body["envelope"] = b.Envelope
		}
		if b.Fields != nil {
			body["fields"] = b.Fields
		}
		m["body"] = body
	}
	if s.Tenant != "" {
		m["tenant"] = s.Tenant
	}
	s.endpointToMap(m) // egress.go
	if s.Ordering != "" && s.Ordering != "none" {
		m["ordering"] = s.Ordering
	}
	if s.Format != "" && s.Format != delivery.FormatStandardWebhooks {
		m["format"] = s.Format
	}
	return m
}

func oneLine(m map[string]any) string {
	b, err := json.Marshal(m)
	if err != nil {
		return "config: " + err.Error()
	}
	return string(b)
}

// quotedInYAMLError matches what a YAML parser quotes from the document in
// its messages (anchor names, scalars), which could be a secret.
var quotedInYAMLError = regexp.MustCompile("'[^']*'|`[^`]*`|\"[^\"]*\"")

// redactYAMLError keeps a parse error's position and kind but drops any
// text it quotes from the file: the file holds secrets, and the error is
// logged (found by FuzzLoadConfig). What the parser quotes of its own
// grammar stays: "did not find expected '-' indicator" says what to add,
// and the token it names is one punctuation character ('-', ',', ']',
// ':'), which no secret is.
func redactYAMLError(err error) string {
	return quotedInYAMLError.ReplaceAllStringFunc(err.Error(), func(q string) string {
		if inner := []rune(q[1 : len(q)-1]); len(inner) == 1 && (unicode.IsPunct(inner[0]) || unicode.IsSymbol(inner[0])) {
			return q
		}
		return "[…]"
	})
}
