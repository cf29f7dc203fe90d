package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadOTel loads a file holding yaml with environ.
func loadOTel(t *testing.T, yaml string, environ ...string) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return Load(path, environ, nil)
}

// TestOTelConfig: which collector the otel key and the standard
// variables name, in their order of precedence, and what turns tracing
// off again.
func TestOTelConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		yaml    string
		environ []string
		url     string // TracesURL; "" is off
		from    string
	}{
		{name: "off by default", yaml: "{}"},
		{name: "key: /v1/traces appended", yaml: "otel: {endpoint: http://collector:4318}", url: "http://collector:4318/v1/traces", from: "otel.endpoint"},
		{name: "key with a base path", yaml: "otel: {endpoint: https://otlp.example.com/otlp/}", url: "https://otlp.example.com/otlp/v1/traces", from: "otel.endpoint"},
		{name: "key naming /v1/traces already", yaml: "otel: {endpoint: http://collector:4318/v1/traces}", url: "http://collector:4318/v1/traces", from: "otel.endpoint"},
		{name: "common variable: a base", yaml: "{}", environ: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318"}, url: "http://c:4318/v1/traces", from: EnvOTLPEndpoint},
		{name: "signal's variable: the full URL, above the common one", yaml: "{}",
			environ: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://t:4318/custom"}, url: "http://t:4318/custom", from: EnvOTLPTracesEndpoint},
		{name: "the key above the variables", yaml: "otel: {endpoint: http://k:4318}",
			environ: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://t:4318/custom"}, url: "http://k:4318/v1/traces", from: "otel.endpoint"},
		{name: "the key from SLUICE_", yaml: "{}", environ: []string{"SLUICE_OTEL__ENDPOINT=http://s:4318"}, url: "http://s:4318/v1/traces", from: "otel.endpoint"},
		{name: "OTEL_SDK_DISABLED", yaml: "otel: {endpoint: http://k:4318}", environ: []string{"OTEL_SDK_DISABLED=true"}},
		{name: "OTEL_TRACES_EXPORTER=none", yaml: "{}", environ: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_TRACES_EXPORTER=none"}},
		{name: "http/protobuf", yaml: "otel: {endpoint: http://k:4318}", environ: []string{"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"}, url: "http://k:4318/v1/traces", from: "otel.endpoint"},
		{name: "the signal's protocol above the common one", yaml: "otel: {endpoint: http://k:4318}",
			environ: []string{"OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf"}, url: "http://k:4318/v1/traces", from: "otel.endpoint"},
		{name: "grpc with tracing off is nobody's business", yaml: "{}", environ: []string{"OTEL_EXPORTER_OTLP_PROTOCOL=grpc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadOTel(t, tc.yaml, tc.environ...)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.OTel.TracesURL != tc.url || cfg.OTel.TracesURLFrom != tc.from {
				t.Errorf("TracesURL %q from %q, want %q from %q", cfg.OTel.TracesURL, cfg.OTel.TracesURLFrom, tc.url, tc.from)
			}
		})
	}

	cfg, err := loadOTel(t, "otel: {endpoint: http://k:4318, service_name: billing-sidecar, sample_ratio: 0.25, propagate: false}")
	if err != nil {
		t.Fatal(err)
	}
	if o := cfg.OTel; o.ServiceName != "billing-sidecar" || o.SampleRatio != 0.25 || o.Propagate {
		t.Errorf("OTel = %+v", o)
	}
	d := Default().OTel
	if d.Endpoint != "" || d.ServiceName != "" || d.SampleRatio != 1 || !d.Propagate {
		t.Errorf("Default().OTel = %+v: want off, sample_ratio 1, propagate true", d)
	}
	if s := Default().String(); !strings.Contains(s, "otel:") {
		t.Errorf("Default().String() lacks otel:\n%s", s)
	}
}

// TestOTelConfigBad: every bad value is refused with its key (or the
// variable) and where it came from.
func TestOTelConfigBad(t *testing.T) {
	for _, tc := range []struct {
		name    string
		yaml    string
		environ []string
		want    string
		is      error
	}{
		{"ftp endpoint", "otel: {endpoint: ftp://c:4318}", nil,
			`config: otel.endpoint: "ftp://c:4318": must be an http:// or https:// URL, like "http://otel-collector:4318" (in file`, ErrInvalidValue},
		{"no scheme", "otel: {endpoint: collector:4318}", nil, `config: otel.endpoint: "collector:4318": must be an http:// or https:// URL`, ErrInvalidValue},
		{"no host", "otel: {endpoint: 'http://'}", nil, `config: otel.endpoint: "http:": must have a host`, ErrInvalidValue},
		{"credentials", "otel: {endpoint: 'http://user:hunter2@c:4318'}", nil, `otel.endpoint: "http://[redacted]@c:4318": must not contain credentials`, ErrInvalidValue},
		{"fragment", "otel: {endpoint: 'http://c:4318/#x'}", nil, `otel.endpoint: "http://c:4318/#x": must not contain a fragment`, ErrInvalidValue},
		{"ratio above 1", "otel: {sample_ratio: 1.5}", nil, `config: otel.sample_ratio: 1.5: must be from 0 to 1`, ErrInvalidValue},
		{"negative ratio", "otel: {sample_ratio: -0.1}", nil, `config: otel.sample_ratio: -0.1: must be from 0 to 1`, ErrInvalidValue},
		{"ratio not a number", "otel: {sample_ratio: half}", nil, `otel.sample_ratio`, ErrInvalidValue},
		{"propagate not a bool", "otel: {propagate: maybe}", nil, `otel.propagate`, ErrInvalidValue},
		{"service name with a newline", "otel: {service_name: \"a\\nb\"}", nil, `config: otel.service_name: "a\nb": must be at most 255 bytes of printable ASCII`, ErrInvalidValue},
		{"service name too long", "otel: {service_name: " + strings.Repeat("s", 256) + "}", nil, `otel.service_name`, ErrInvalidValue},
		{"unknown key", "otel: {endpiont: http://c:4318}", nil, `config: unknown key "otel.endpiont"`, ErrUnknownKey},
		{"bad common variable", "{}", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=c:4318"},
			`config: otel.endpoint: "c:4318": must be an http:// or https:// URL, like "http://otel-collector:4318" (from environment variable OTEL_EXPORTER_OTLP_ENDPOINT)`, ErrInvalidValue},
		{"bad signal variable", "{}", []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://"},
			`(from environment variable OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)`, ErrInvalidValue},
		{"grpc", "otel: {endpoint: http://c:4317}", []string{"OTEL_EXPORTER_OTLP_PROTOCOL=grpc"},
			`config: OTEL_EXPORTER_OTLP_PROTOCOL: "grpc": sluice exports OTLP over HTTP with protobuf only`, ErrInvalidValue},
		{"http/json", "{}", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json"},
			`config: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/json"`, ErrInvalidValue},
		{"traceparent header", "subscriptions: [{id: a, url: 'https://a.example.com/', secret: " + secretA + ", headers: {traceparent: x}}]", nil,
			`config: subscriptions[0].headers[traceparent]: sluice sets this header itself`, ErrInvalidValue},
		{"tracestate header", "subscriptions: [{id: a, url: 'https://a.example.com/', secret: " + secretA + ", headers: {TraceState: x}}]", nil,
			`config: subscriptions[0].headers[TraceState]: sluice sets this header itself`, ErrInvalidValue},
		{"bad SLUICE_ variable", "{}", []string{"SLUICE_OTEL__SAMPLE_RATIO=2"}, `otel.sample_ratio: 2: must be from 0 to 1 (1 exports every trace that starts here) (from environment variable SLUICE_OTEL__SAMPLE_RATIO)`, ErrInvalidValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadOTel(t, tc.yaml, tc.environ...)
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tc.want)
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("error %q is not %v", err, tc.is)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error shows the password: %q", err)
			}
		})
	}
}
