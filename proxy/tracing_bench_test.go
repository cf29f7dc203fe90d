package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/testbed"
)

// BenchmarkDeliveryTracing is BenchmarkDelivery's fan-out 10 × 512 B with
// tracing off and on, in the same run (docs/benchmarks.md "Tracing"):
//
//   - off: no TracerProvider, events without a trace context (today's
//     case);
//   - off+traceparent: no TracerProvider, every event posted with a
//     traceparent and a tracestate, which each attempt sends on;
//   - on/noop-export: the SDK's provider with a batch span processor
//     into an exporter that drops the spans: the cost of making them;
//   - on/otlp: the SDK's provider, batch span processor and the
//     OTLP/HTTP exporter, as cmd wires it, posting protobuf to an
//     in-process receiver that reads and drops each body;
//   - on/unsampled: on/otlp with sample_ratio 0 and events without a
//     trace context: spans are made but not recorded (the cost of
//     tracing on for the traces a ratio leaves out).
//
// In the other on cases every event carries a sampled traceparent, so
// every span is recorded and exported. The counts are the
// whole process's (producers, ingest, lanes, receivers, exporter), per
// delivery, CPU from its rusage; each event also makes one ingest span, a
// tenth of one per delivery.
func BenchmarkDeliveryTracing(b *testing.B) {
	body := []byte(strings.Repeat("x", 512))
	const traceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, c := range []struct {
		name   string
		header bool
		tp     func(b *testing.B) *sdktrace.TracerProvider
	}{
		{name: "off"},
		{name: "off+traceparent", header: true},
		{name: "on/noop-export", header: true, tp: func(*testing.B) *sdktrace.TracerProvider {
			return sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		}},
		{name: "on/otlp", header: true, tp: func(b *testing.B) *sdktrace.TracerProvider { return otlpBenchProvider(b, 1) }},
		{name: "on/unsampled", tp: func(b *testing.B) *sdktrace.TracerProvider { return otlpBenchProvider(b, 0) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			var hdr map[string]string
			if c.header {
				hdr = map[string]string{"traceparent": traceParent, "tracestate": "vendor=abc"}
			}
			var opts proxy.Options
			if c.tp != nil {
				opts.TracerProvider = c.tp(b)
			}
			benchDeliveryTraced(b, 10, body, opts, hdr)
		})
	}
}

// otlpBenchProvider is the provider cmd builds (batch span processor,
// OTLP/HTTP exporter, parent-based ratio sampler) exporting to an
// in-process collector that reads and drops each body.
func otlpBenchProvider(b *testing.B, ratio float64) *sdktrace.TracerProvider {
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	b.Cleanup(collector.Close)
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(collector.URL+"/v1/traces"))
	if err != nil {
		b.Fatal(err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))))
}

// benchDeliveryTraced is benchDelivery with server options and headers on
// every posted event.
func benchDeliveryTraced(b *testing.B, fan int, body []byte, opts proxy.Options, hdr map[string]string) {
	tb := testbed.New(testbed.Options{Lean: true})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		b.Fatal(err)
	}
	defer tb.Close()
	for i := range fan {
		sb := sub(fmt.Sprintf("s%d", i), fmt.Sprintf("%s/s%d", tb.URL(), i))
		sb.MaxConcurrency = 32
		opts.Subscriptions = append(opts.Subscriptions, sb)
	}
	opts.AllowPrivateTargets, opts.Listen, opts.AdminListen, opts.DataDir, opts.Sync, opts.Logger = true, "127.0.0.1:0", "-", b.TempDir(), true, quietLogger()
	s := proxy.New(opts)
	if err := s.Open(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
	}()
	want := int64(b.N)
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	cpu0 := processCPU()
	b.ResetTimer()
	start := time.Now()
	produceKeyed(b, s.URL(), 32, b.N, body, 0, hdr)
	deadline := time.Now().Add(5 * time.Minute)
	tick := time.NewTicker(time.Millisecond)
	for tb.Totals().Accepted < want*int64(fan) {
		if time.Now().After(deadline) {
			b.Fatalf("deliveries: %+v of %d", tb.Totals(), want*int64(fan))
		}
		<-tick.C
	}
	tick.Stop()
	el := time.Since(start)
	b.StopTimer()
	cpu := processCPU() - cpu0
	runtime.ReadMemStats(&ms1)
	deliveries := float64(b.N * fan)
	b.ReportMetric(float64(cpu.Microseconds())/deliveries, "cpu-µs/delivery")
	b.ReportMetric(deliveries/el.Seconds(), "deliveries/s")
	b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/deliveries, "B/delivery")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/deliveries, "allocs/delivery")
}
