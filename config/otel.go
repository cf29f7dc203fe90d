package config

// OpenTelemetry tracing: the otel.* keys and the standard
// OTEL_* environment variables that turn it on. The variables are read
// from Load's environ (Config.lookupEnv), not through the SLUICE_ layer:
// they are the OpenTelemetry SDKs' common names, which a platform sets
// for every service of a pod.

import (
	"math"
	"net/url"
	"strings"
)

// Defaults and bounds of the otel keys.
const (
	// DefaultServiceName is the service.name of sluice's spans when
	// neither otel.service_name nor OTEL_SERVICE_NAME sets one.
	DefaultServiceName = "sluice"
	// defaultSampleRatio samples every trace that starts here; traces
	// the producer started follow its decision whatever the ratio.
	defaultSampleRatio = 1.0
	// maxServiceNameLen bounds otel.service_name; a resource attribute,
	// sent with every batch of spans.
	maxServiceNameLen = 255
	// tracesPath is OTLP/HTTP's path for spans, which the specification
	// appends to a base endpoint (OTEL_EXPORTER_OTLP_ENDPOINT).
	tracesPath = "/v1/traces"
)

// The standard OpenTelemetry environment variables Validate reads.
const (
	EnvOTLPEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvOTLPTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envOTLPProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envOTLPTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envSDKDisabled        = "OTEL_SDK_DISABLED"
	envTracesExporter     = "OTEL_TRACES_EXPORTER"
)

// OTelConfig configures tracing: spans of ingest and of each delivery
// attempt, exported over OTLP/HTTP (protobuf). Tracing is on when
// Endpoint, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
// OTEL_EXPORTER_OTLP_ENDPOINT names a collector, in that order of
// precedence, unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none.
// Changing it needs a restart.
type OTelConfig struct {
	// Endpoint is the collector's OTLP/HTTP base URL, like
	// "http://otel-collector:4318": spans are posted to its path plus
	// /v1/traces (as for OTEL_EXPORTER_OTLP_ENDPOINT), or to the URL as
	// written when its path ends in /v1/traces already. http or https,
	// with a host; no user:password@ (it would be printed; credentials go
	// in OTEL_EXPORTER_OTLP_HEADERS, which the exporter reads) and no
	// fragment. Empty (default): the environment decides.
	Endpoint string `koanf:"endpoint"`
	// ServiceName is the service.name resource attribute of the spans.
	// Empty (default): OTEL_SERVICE_NAME, else DefaultServiceName (the
	// SDK's resource reads the variable; cmd puts the key above it).
	ServiceName string `koanf:"service_name"`
	// SampleRatio is the share of traces that start here (events posted
	// without a traceparent) whose spans are exported, 0 to 1; a trace
	// the producer started follows the producer's sampled flag. Default
	// 1.
	SampleRatio float64 `koanf:"sample_ratio"`
	// Propagate sends each event's trace context (traceparent,
	// tracestate) with its deliveries, whether or not tracing is on.
	// Default true; false keeps the producer's trace ids and tracestate
	// from the endpoints.
	Propagate bool `koanf:"propagate"`

	// TracesURL is where spans are posted, filled in by Validate from
	// Endpoint or the environment; empty means tracing is off.
	TracesURL string `koanf:"-"`
	// TracesURLFrom names what set TracesURL: "otel.endpoint" or the
	// environment variable's name.
	TracesURLFrom string `koanf:"-"`
}

func defaultOTel() OTelConfig {
	return OTelConfig{SampleRatio: defaultSampleRatio, Propagate: true}
}

// validate checks the otel keys and the OTEL_* variables that matter to
// sluice, and fills in TracesURL and TracesURLFrom.
func (o *OTelConfig) validate(lookup func(string) (string, bool)) error {
	o.TracesURL, o.TracesURLFrom = "", ""
	env := func(name string) string {
		v, _ := lookup(name)
		return strings.TrimSpace(v)
	}
	if math.IsNaN(o.SampleRatio) || o.SampleRatio < 0 || o.SampleRatio > 1 {
		return fieldErr("otel.sample_ratio", o.SampleRatio, invalidf("must be from 0 to 1 (1 exports every trace that starts here)"))
	}
	if len(o.ServiceName) > maxServiceNameLen || !printable(o.ServiceName) {
		return fieldErr("otel.service_name", o.ServiceName, invalidf("must be at most %d bytes of printable ASCII", maxServiceNameLen))
	}

	// The endpoint: the key, else the variables, each checked as the key.
	var raw, from, source string
	switch {
	case o.Endpoint != "":
		raw, from = o.Endpoint, "otel.endpoint"
	case env(EnvOTLPTracesEndpoint) != "":
		raw, from = env(EnvOTLPTracesEndpoint), EnvOTLPTracesEndpoint
	case env(EnvOTLPEndpoint) != "":
		raw, from = env(EnvOTLPEndpoint), EnvOTLPEndpoint
	}
	if from != "otel.endpoint" && from != "" {
		source = "environment variable " + from
	}
	if raw != "" {
		u, err := checkOTLPEndpoint(raw)
		if err != nil {
			return &ValidationError{Field: "otel.endpoint", Value: safeURL(raw), Err: err, Source: source}
		}
		// The signal's own variable is the full URL; the key and the
		// common variable are a base that /v1/traces is appended to (the
		// key only when its path does not end in it already).
		if from == EnvOTLPEndpoint || from == "otel.endpoint" && !strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), tracesPath) {
			u.Path = strings.TrimSuffix(u.Path, "/") + tracesPath
			u.RawPath = ""
		}
		o.TracesURL, o.TracesURLFrom = u.String(), from
	}
	if o.TracesURL == "" {
		return nil
	}
	// Off after all when the environment says so, as every SDK reads it.
	if strings.EqualFold(env(envSDKDisabled), "true") || strings.EqualFold(env(envTracesExporter), "none") {
		o.TracesURL, o.TracesURLFrom = "", ""
		return nil
	}
	for _, name := range []string{envOTLPTracesProtocol, envOTLPProtocol} {
		if p := env(name); p != "" {
			if p != "http/protobuf" {
				return &ValidationError{Field: name, Value: p, Source: "environment variable " + name,
					Err: invalidf(`sluice exports OTLP over HTTP with protobuf only: set "http/protobuf" (the collector's port 4318), or unset it`)}
			}
			break // the signal's own variable wins
		}
	}
	return nil
}

// checkOTLPEndpoint parses an OTLP/HTTP endpoint: http or https, a host,
// no credentials, no fragment.
func checkOTLPEndpoint(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, invalidf(`not a valid URL; write it like "http://otel-collector:4318"`)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, invalidf(`must be an http:// or https:// URL, like "http://otel-collector:4318"`)
	case u.Opaque != "" || u.Hostname() == "":
		return nil, invalidf("must have a host")
	case u.User != nil:
		return nil, invalidf("must not contain credentials (user:password@): they would be printed; put them in OTEL_EXPORTER_OTLP_HEADERS")
	case strings.Contains(raw, "#"):
		return nil, invalidf("must not contain a fragment (#...)")
	}
	return u, nil
}

// printable reports whether s is printable ASCII (space to '~').
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
