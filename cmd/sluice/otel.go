package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluicehq/sluice/config"
)

// tracerProvider builds the OpenTelemetry SDK's tracer provider that
// exports sluice's spans to o.TracesURL over OTLP/HTTP (protobuf) through
// a batch span processor, or returns nil when tracing is off (no URL).
// The proxy depends on the OpenTelemetry API only; the SDK and the
// exporter are wired here. The exporter still reads its other standard
// variables (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION,
// _CERTIFICATE and their _TRACES_ forms), and the batch processor
// OTEL_BSP_*; the resource takes OTEL_RESOURCE_ATTRIBUTES. The caller
// hands the provider to the proxy, whose Close shuts it down.
func tracerProvider(o config.OTelConfig, log *slog.Logger) (*sdktrace.TracerProvider, error) {
	if o.TracesURL == "" {
		return nil, nil
	}
	ctx := context.Background()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(o.TracesURL))
	if err != nil {
		return nil, fmt.Errorf("otel exporter: %w", err)
	}
	// Later detectors win: the default name, OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES, then otel.service_name when it is set.
	detectors := []resource.Option{
		resource.WithAttributes(attribute.String("service.name", config.DefaultServiceName)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.version", version)),
	}
	if o.ServiceName != "" {
		detectors = append(detectors, resource.WithAttributes(attribute.String("service.name", o.ServiceName)))
	}
	res, err := resource.New(ctx, detectors...)
	if err != nil {
		// A malformed OTEL_RESOURCE_ATTRIBUTES still leaves a usable
		// resource: its other attributes and ours.
		log.Warn("otel resource", "err", err)
	}
	// Export errors (a collector that is down) reach the global handler,
	// which would print them through the standard log package.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("otel export", "err", err)
	}))
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		// A producer's sampled flag decides for its traces; the ratio
		// decides for traces that start at ingest.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))),
	), nil
}

// serviceName is the service.name tracerProvider gives the spans.
func serviceName(o config.OTelConfig) string {
	return cmp.Or(o.ServiceName, strings.TrimSpace(os.Getenv("OTEL_SERVICE_NAME")), config.DefaultServiceName)
}
