package delivery

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/tracectx"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/signing"
)

const (
	testTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	testParentID    = "00f067aa0ba902b7"
	testTraceParent = "00-" + testTraceID + "-" + testParentID + "-01"
)

func tracingJob(ev *queue.Event) *job {
	return &job{lane: &lane{id: "s1"}, sub: &Subscription{ID: "s1"}, ev: ev, attempt: 1}
}

// TestTracingHeadersNoAllocs: with tracing off the trace headers of an
// attempt cost no allocation, with or without the producer's context,
// and an attempt span's traceparent is formatted into the worker's buffer.
func TestTracingHeadersNoAllocs(t *testing.T) {
	var w workerState
	var h fasthttp.RequestHeader
	off := NewTracer(nil, false)
	for _, tc := range []struct {
		name string
		ev   *queue.Event
		want string
	}{
		{"no trace context", &queue.Event{ID: "e1"}, ""},
		{"producer's context", &queue.Event{ID: "e2", TraceParent: testTraceParent, TraceState: "vendor=abc"}, testTraceParent},
	} {
		j := tracingJob(tc.ev)
		run := func() {
			h.Reset()
			if sp := off.attempt(j, &w, &h); sp != nil {
				t.Fatal("tracing off made a span")
			}
		}
		run() // the header's buffers grow once
		if n := testing.AllocsPerRun(1000, run); n != 0 {
			t.Errorf("%s: %v allocations per attempt with tracing off, want 0", tc.name, n)
		}
		if got := string(h.Peek("traceparent")); got != tc.want {
			t.Errorf("%s: traceparent %q, want %q (unchanged: no span of sluice's to point to)", tc.name, got, tc.want)
		}
		if got, want := string(h.Peek("tracestate")), tc.ev.TraceState; got != want {
			t.Errorf("%s: tracestate %q, want %q", tc.name, got, want)
		}
	}

	tid, _ := trace.TraceIDFromHex(testTraceID)
	sid, _ := trace.SpanIDFromHex(testParentID)
	w.traceParent = make([]byte, 0, tracectx.ParentLen)
	if n := testing.AllocsPerRun(1000, func() {
		w.traceParent = tracectx.AppendParent(w.traceParent[:0], tid, sid, trace.FlagsSampled)
	}); n != 0 {
		t.Errorf("appendTraceParent: %v allocations, want 0", n)
	}
	if got := string(w.traceParent); got != testTraceParent {
		t.Errorf("appendTraceParent = %q, want %q", got, testTraceParent)
	}
}

// TestTracingAttemptSpan: with a provider, an attempt's traceparent
// names its own span (the producer's trace id and flags, a new span id)
// whose parent is the producer's span; DropTraceContext sends none but
// still makes the span. Reports the allocations of an attempt span.
func TestTracingAttemptSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	ev := &queue.Event{ID: "e1", Type: "t.one", TraceParent: testTraceParent, TraceState: "vendor=abc"}
	var w workerState
	var h fasthttp.RequestHeader
	on := NewTracer(tp, false)
	sp := on.attempt(tracingJob(ev), &w, &h)
	endAttempt(sp, result{Exchange: policy.Exchange{Outcome: policy.Retry, Status: 503}}, policy.Resolution{Outcome: policy.Retry})
	ended := rec.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want 1", len(ended))
	}
	s := ended[0]
	sc := s.SpanContext()
	if s.Parent().TraceID().String() != testTraceID || s.Parent().SpanID().String() != testParentID || !s.Parent().IsRemote() {
		t.Errorf("parent %v, want the producer's span %s", s.Parent(), testParentID)
	}
	want := "00-" + testTraceID + "-" + sc.SpanID().String() + "-01"
	if got := string(h.Peek("traceparent")); got != want || sc.SpanID().String() == testParentID {
		t.Errorf("traceparent %q, want %q (the attempt's span)", got, want)
	}
	if got := string(h.Peek("tracestate")); got != "vendor=abc" {
		t.Errorf("tracestate %q", got)
	}
	if s.SpanKind() != trace.SpanKindClient || s.Name() != attemptSpanName {
		t.Errorf("span %q kind %v", s.Name(), s.SpanKind())
	}

	h.Reset()
	drop := NewTracer(tp, true)
	endAttempt(drop.attempt(tracingJob(ev), &w, &h), result{}, policy.Resolution{Outcome: policy.Ack})
	if h.Peek("traceparent") != nil || h.Peek("tracestate") != nil {
		t.Errorf("DropTraceContext sent %q %q", h.Peek("traceparent"), h.Peek("tracestate"))
	}
	if n := len(rec.Ended()); n != 2 {
		t.Errorf("DropTraceContext: %d spans, want 2 (spans are still made)", n)
	}

	// The cost of a span per attempt, beside the zero of the off case.
	j := tracingJob(ev)
	n := testing.AllocsPerRun(200, func() {
		h.Reset()
		endAttempt(on.attempt(j, &w, &h), result{Exchange: policy.Exchange{Outcome: policy.Ack, Status: 200}}, policy.Resolution{Outcome: policy.Ack})
	})
	t.Logf("tracing on: %.0f allocations per attempt span (the SDK, sampled, into a span recorder)", n)

	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSpanProcessor(rec))
	defer never.Shutdown(context.Background())
	unsampled := NewTracer(never, false)
	n = testing.AllocsPerRun(200, func() {
		h.Reset()
		endAttempt(unsampled.attempt(j, &w, &h), result{Exchange: policy.Exchange{Outcome: policy.Ack, Status: 200}}, policy.Resolution{Outcome: policy.Ack})
	})
	t.Logf("tracing on, span not sampled: %.0f allocations per attempt", n)

	noopOn := NewTracer(noop.NewTracerProvider(), false)
	n = testing.AllocsPerRun(200, func() {
		h.Reset()
		endAttempt(noopOn.attempt(j, &w, &h), result{Exchange: policy.Exchange{Outcome: policy.Ack, Status: 200}}, policy.Resolution{Outcome: policy.Ack})
	})
	t.Logf("tracing on with the API's no-op provider: %.0f allocations per attempt", n)
}

// TestTracingRemoteSpanContext: the stored trace context is parsed with
// ingest's rules; anything else is no parent, and a bad tracestate is
// blockingProvider's Shutdown waits for its context, as the SDK's does
// while its exporter waits on a collector that never answers.
type blockingProvider struct{ noop.TracerProvider }

func (blockingProvider) Shutdown(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestTracingShutdownBounded: a collector that hangs holds Close for at
// most tracingShutdownTimeout.
func TestTracingShutdownBounded(t *testing.T) {
	defer func(d time.Duration) { tracingShutdownTimeout = d }(tracingShutdownTimeout)
	tracingShutdownTimeout = 50 * time.Millisecond
	tr := NewTracer(blockingProvider{}, false)
	start := time.Now()
	err := tr.Shutdown()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("shutdown: %v, want the deadline's error", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("shutdown took %v", el)
	}
	off := NewTracer(nil, false)
	if err := off.Shutdown(); err != nil {
		t.Errorf("shutdown with tracing off: %v", err)
	}
}

// TestTracingDeliverAllocs: a whole deliver (headers, signature, the
// exchange with a loopback endpoint, the endpoint itself) with tracing off
// allocates nothing, for an event with the producer's trace context as for
// one without, and sends the context on. The same test on the tree before
// tracing counts 0 too (docs/benchmarks.md, "Tracing"). Checked
// without -race only.
func TestTracingDeliverAllocs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The endpoint checks the traceparent without allocating: the counts
	// are the process's.
	var wantTP atomic.Pointer[[]byte]
	var wrongTP atomic.Int64
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if !bytes.Equal(ctx.Request.Header.Peek("traceparent"), *wantTP.Load()) {
			wrongTP.Add(1)
		}
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()
	client := egress.NewClient(4, true)
	defer client.CloseIdleConnections()
	e := &engine{client: client, now: time.Now}
	s := (&Subscription{ID: "s1", URL: "http://" + ln.Addr().String() + "/s1",
		Secrets: []signing.Secret{mustTestSecret(t)}, Headers: map[string]string{"X-Tenant": "acme"}}).WithDefaults()
	counts := map[string]float64{}
	for _, tc := range []struct {
		name string
		ev   *queue.Event
	}{
		{"no trace context", &queue.Event{ID: "e1", Type: "t.one", Body: []byte(`{"n":1}`), ContentType: "application/json"}},
		{"producer's context", &queue.Event{ID: "e2", Type: "t.one", Body: []byte(`{"n":1}`), ContentType: "application/json",
			TraceParent: testTraceParent, TraceState: "vendor=abc"}},
	} {
		j := &job{lane: &lane{id: s.ID}, sub: s, ev: tc.ev, attempt: 1}
		want := []byte(tc.ev.TraceParent)
		wantTP.Store(&want)
		var w workerState
		run := func() {
			if res := e.deliver(j, &w); res.Status != 200 {
				t.Fatalf("%s: %+v", tc.name, res)
			}
		}
		for range 10 {
			run() // pools, buffers and the connection warm up
		}
		counts[tc.name] = testing.AllocsPerRun(500, run)
		t.Logf("%s: %.2f allocations per deliver, tracing off", tc.name, counts[tc.name])
		if n := wrongTP.Swap(0); n != 0 {
			t.Errorf("%s: %d requests without the traceparent %q", tc.name, n, want)
		}
	}
	if testwait.RaceEnabled() {
		t.Log("allocation counts not checked: the race detector allocates")
		return
	}
	if counts["no trace context"] != 0 || counts["producer's context"] != 0 {
		t.Errorf("deliver allocates with tracing off: %v, want 0 for both", counts)
	}
}

func mustTestSecret(t *testing.T) signing.Secret {
	k, err := signing.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	return k
}
