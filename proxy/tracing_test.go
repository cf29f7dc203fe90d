package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/sluicehq/sluice/internal/otlptest"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
)

const (
	producerTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	producerSpanID  = "00f067aa0ba902b7"
	producerParent  = "00-" + producerTraceID + "-" + producerSpanID + "-01"
	producerState   = "vendor=abc,other=1"
)

// seenRequest is what an endpoint saw of one delivery attempt.
type seenRequest struct {
	path, id, traceParent, traceState string
	attempt                           int
}

// traceEndpoint is a subscriber that records each attempt's trace headers
// and answers by path: /retry 500 twice then 200, /reject 400, /slow
// holds its first attempt past the subscription's timeout then 200, and
// anything else 200.
type traceEndpoint struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seenRequest
}

func newTraceEndpoint(t *testing.T) *traceEndpoint {
	e := &traceEndpoint{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempt, _ := strconv.Atoi(r.Header.Get("X-Attempt"))
		e.mu.Lock()
		e.seen = append(e.seen, seenRequest{path: r.URL.Path, id: r.Header.Get("webhook-id"), attempt: attempt,
			traceParent: r.Header.Get("traceparent"), traceState: r.Header.Get("tracestate")})
		e.mu.Unlock()
		switch {
		case r.URL.Path == "/retry" && attempt < 3:
			w.WriteHeader(http.StatusInternalServerError)
		case r.URL.Path == "/reject":
			w.WriteHeader(http.StatusBadRequest)
		case r.URL.Path == "/slow" && attempt == 1:
			select {
			case <-time.After(time.Second):
			case <-r.Context().Done():
			}
		default:
			w.WriteHeader(http.StatusOK)
		}
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *traceEndpoint) requests() []seenRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.seen)
}

// waitSeen waits until the endpoint saw n requests.
func (e *traceEndpoint) waitSeen(t *testing.T, n int) []seenRequest {
	t.Helper()
	eventually(t, fmt.Sprintf("%d requests at the endpoint", n), func() bool { return len(e.requests()) >= n })
	return e.requests()
}

// newOTLPProvider is the SDK's provider with the OTLP/HTTP exporter and a
// batch span processor, as cmd wires it, exporting to r. Its batches wait
// an hour: what r receives, Close flushed.
func newOTLPProvider(t *testing.T, r *otlptest.Receiver) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(r.URL()+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(time.Hour)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
}

func startTracingServer(t *testing.T, tp trace.TracerProvider, drop bool, subs ...*delivery.Subscription) *proxy.Server {
	t.Helper()
	s := proxy.New(proxy.Options{AllowPrivateTargets: true,
		Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(), Sync: true,
		Subscriptions: subs, Logger: quietLogger(), CursorInterval: 10 * time.Millisecond,
		TracerProvider: tp, DropTraceContext: drop,
	})
	if err := s.Open(); err != nil {
		t.Fatalf("open server: %v", err)
	}
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })
	return s
}

// postTraced posts one event with the given trace headers.
func postTraced(t *testing.T, s *proxy.Server, typ, id, traceParent, traceState string) (int, ingestAnswer) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/"+typ, strings.NewReader(`{"n":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", id)
	if traceParent != "" {
		req.Header.Set("traceparent", traceParent)
	}
	if traceState != "" {
		req.Header.Set("tracestate", traceState)
	}
	return do(t, req)
}

// TestTracingSpansOverOTLP runs deliveries with tracing on against a real
// OTLP/HTTP receiver that decodes the protobuf spans, and checks the links
// from the producer to each attempt:
//   - the ingest span is a child of the producer's span (its trace id,
//     its span as parent);
//   - each attempt is a span of kind client whose parent is the
//     producer's span, and the endpoint got a traceparent naming that
//     attempt's span (same trace id, the span's id, the flags), with the
//     producer's tracestate;
//   - retries make one span per attempt, sluice.attempt 1, 2, 3, with
//     their status codes and outcomes (retry, retry, ack), and failures
//     have an error status; a 400 is dead_letter (reason rejected), a
//     timeout is timeout;
//   - an event posted without a trace context starts a trace at its
//     ingest span, and its attempts are that span's children;
//   - no attribute holds the endpoint's URL;
//   - every span arrives although batches wait an hour: Close flushes.
func TestTracingSpansOverOTLP(t *testing.T) {
	rcv := otlptest.New(t)
	ep := newTraceEndpoint(t)
	retry := sub("retry", ep.URL+"/retry")
	reject := sub("reject", ep.URL+"/reject")
	slow := sub("slow", ep.URL+"/slow", "t.traced")
	slow.Timeout = 200 * time.Millisecond
	s := startTracingServer(t, newOTLPProvider(t, rcv), false, retry, reject, slow)

	if code, a := postTraced(t, s, "t.traced", "ev-traced", producerParent, producerState); code != http.StatusAccepted {
		t.Fatalf("post: %d %+v", code, a)
	}
	if code, a := postTraced(t, s, "t.root", "ev-root", "", ""); code != http.StatusAccepted {
		t.Fatalf("post: %d %+v", code, a)
	}
	if code, _ := postTraced(t, s, "t.traced", "ev-traced", producerParent, ""); code != http.StatusOK {
		t.Fatalf("duplicate post: %d", code)
	}
	if code, _ := postTraced(t, s, "t.traced", "bad id!", producerParent, ""); code != http.StatusBadRequest {
		t.Fatalf("bad post: %d", code)
	}
	// ev-traced: 3 to /retry, 1 to /reject, 2 to /slow; ev-root: 3 + 1.
	seen := ep.waitSeen(t, 10)
	eventually(t, "the dead letters", func() bool {
		dls, err := s.DeadLetters("reject", 10)
		return err == nil && len(dls) == 2
	})
	closeServer(t, s, 5*time.Second)
	spans := rcv.Wait(t, "14 spans flushed at Close", 10*time.Second, func(ss []otlptest.Span) bool { return len(ss) >= 14 })
	if len(spans) != 14 {
		t.Errorf("%d spans, want 14 (4 ingest, 10 attempts)", len(spans))
	}

	var ingests []otlptest.Span
	attempts := map[string][]otlptest.Span{} // event id/subscription → by attempt
	for _, sp := range spans {
		for k, v := range sp.Attrs() {
			if strings.Contains(v, ep.URL) || strings.Contains(v, strings.TrimPrefix(ep.URL, "http://")) || strings.Contains(v, "://") {
				t.Errorf("span %s: attribute %s = %q holds the URL", sp.Name, k, v)
			}
		}
		switch sp.Name {
		case "sluice.ingest":
			ingests = append(ingests, sp)
		case "sluice.deliver":
			key := sp.Attr("sluice.event.id") + "/" + sp.Attr("sluice.subscription")
			attempts[key] = append(attempts[key], sp)
		default:
			t.Errorf("unexpected span %q", sp.Name)
		}
	}
	ingest := func(id, result string) otlptest.Span {
		for _, sp := range ingests {
			if sp.Attr("sluice.ingest.result") == result && sp.Attr("sluice.event.id") == id {
				return sp
			}
		}
		t.Fatalf("no ingest span of %q with result %s among %d", id, result, len(ingests))
		return otlptest.Span{}
	}

	// The producer's trace: ingest and attempts are children of its span.
	in := ingest("ev-traced", "accepted")
	if in.TraceID() != producerTraceID || in.ParentSpanID() != producerSpanID || in.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("ingest span: trace %s parent %s kind %v, want trace %s parent %s (the producer's span), server",
			in.TraceID(), in.ParentSpanID(), in.Kind, producerTraceID, producerSpanID)
	}
	if in.Attr("sluice.event.type") != "t.traced" || in.Attr("http.response.status_code") != "202" {
		t.Errorf("ingest span attributes %v", in.Attrs())
	}
	if d := ingest("ev-traced", "duplicate"); d.Attr("http.response.status_code") != "200" || d.TraceID() != producerTraceID {
		t.Errorf("duplicate's ingest span %v", d.Attrs())
	}
	for _, sp := range ingests {
		if sp.Attr("sluice.ingest.result") == "rejected" {
			if sp.Attr("http.response.status_code") != "400" || sp.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR || sp.Attr("sluice.event.id") != "" {
				t.Errorf("rejected ingest span: %v %v (a producer's bad request is no error of sluice's)", sp.Attrs(), sp.Status)
			}
		}
	}

	type want struct {
		attempt, status, outcome, errType string
	}
	check := func(key, traceID, parent, traceState string, wants []want) {
		t.Helper()
		got := attempts[key]
		slices.SortFunc(got, func(a, b otlptest.Span) int {
			return strings.Compare(a.Attr("sluice.attempt"), b.Attr("sluice.attempt"))
		})
		if len(got) != len(wants) {
			t.Errorf("%s: %d attempt spans, want %d", key, len(got), len(wants))
			return
		}
		for i, w := range wants {
			sp := got[i]
			if sp.TraceID() != traceID || sp.ParentSpanID() != parent || sp.Kind != tracepb.Span_SPAN_KIND_CLIENT {
				t.Errorf("%s attempt %s: trace %s parent %s kind %v, want trace %s parent %s, client", key, w.attempt, sp.TraceID(), sp.ParentSpanID(), sp.Kind, traceID, parent)
			}
			if a := sp.Attrs(); a["sluice.attempt"] != w.attempt || a["http.response.status_code"] != w.status || a["sluice.outcome"] != w.outcome || a["error.type"] != w.errType {
				t.Errorf("%s attempt %d: attributes %v, want %+v", key, i+1, a, w)
			}
			if isErr := sp.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR; isErr != (w.outcome != "ack") {
				t.Errorf("%s attempt %s: status %v for outcome %s", key, w.attempt, sp.Status, w.outcome)
			}
			// The endpoint saw this attempt's span as its parent.
			path, id := "/"+sp.Attr("sluice.subscription"), sp.Attr("sluice.event.id")
			wantTP := "00-" + traceID + "-" + sp.SpanID() + "-01"
			found := false
			for _, r := range seen {
				if r.path == path && r.id == id && strconv.Itoa(r.attempt) == w.attempt {
					found = true
					if r.traceParent != wantTP || r.traceState != traceState {
						t.Errorf("%s attempt %s: endpoint saw traceparent %q tracestate %q, want %q %q", key, w.attempt, r.traceParent, r.traceState, wantTP, traceState)
					}
				}
			}
			if !found {
				t.Errorf("%s attempt %s: the endpoint saw no such request", key, w.attempt)
			}
		}
	}
	check("ev-traced/retry", producerTraceID, producerSpanID, producerState, []want{
		{"1", "500", "retry", "500"}, {"2", "500", "retry", "500"}, {"3", "200", "ack", ""}})
	check("ev-traced/reject", producerTraceID, producerSpanID, producerState, []want{{"1", "400", "dead_letter", "400"}})
	check("ev-traced/slow", producerTraceID, producerSpanID, producerState, []want{{"1", "", "timeout", "timeout"}, {"2", "200", "ack", ""}})
	if sp := attempts["ev-traced/reject"]; len(sp) == 1 && sp[0].Attr("sluice.dead_letter.reason") != "rejected" {
		t.Errorf("dead letter's span: %v", sp[0].Attrs())
	}

	// No trace context from the producer: the ingest span is a root,
	// stored as the event's traceparent, and the attempts its children.
	root := ingest("ev-root", "accepted")
	if root.ParentSpanID() != "" || root.TraceID() == producerTraceID {
		t.Errorf("ingest span of ev-root: parent %q trace %s, want a new trace", root.ParentSpanID(), root.TraceID())
	}
	check("ev-root/retry", root.TraceID(), root.SpanID(), "", []want{
		{"1", "500", "retry", "500"}, {"2", "500", "retry", "500"}, {"3", "200", "ack", ""}})
	check("ev-root/reject", root.TraceID(), root.SpanID(), "", []want{{"1", "400", "dead_letter", "400"}})
}

// TestTracingOffPropagates: with tracing off (the default) an attempt of
// an event posted with a traceparent sends it unchanged, with its
// tracestate, on every attempt; an event without one gets no trace
// headers; and DropTraceContext sends none at all.
func TestTracingOffPropagates(t *testing.T) {
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprintf("drop=%v", drop), func(t *testing.T) {
			ep := newTraceEndpoint(t)
			s := startTracingServer(t, nil, drop, sub("retry", ep.URL+"/retry"))
			postTraced(t, s, "t.one", "ev-traced", producerParent, producerState)
			postTraced(t, s, "t.one", "ev-plain", "", "")
			postTraced(t, s, "t.one", "ev-invalid", "00-"+strings.ToUpper(producerTraceID)+"-"+producerSpanID+"-01", producerState)
			seen := ep.waitSeen(t, 9)
			for _, r := range seen {
				wantTP, wantTS := "", ""
				if r.id == "ev-traced" && !drop {
					wantTP, wantTS = producerParent, producerState
				}
				if r.traceParent != wantTP || r.traceState != wantTS {
					t.Errorf("%s attempt %d: traceparent %q tracestate %q, want %q %q", r.id, r.attempt, r.traceParent, r.traceState, wantTP, wantTS)
				}
			}
		})
	}
}

// TestTracingExportFailureKeepsDelivering: a collector that never answers
// delays nothing: deliveries go on, and Close returns within its bound.
func TestTracingExportFailureKeepsDelivering(t *testing.T) {
	rcv := otlptest.New(t)
	rcv.SetBlock(true)
	ep := newTraceEndpoint(t)
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(rcv.URL()+"/v1/traces"), otlptracehttp.WithTimeout(500*time.Millisecond),
		otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(10*time.Millisecond)))
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(), Sync: true,
		Subscriptions: []*delivery.Subscription{sub("ok", ep.URL+"/ok")}, Logger: quietLogger(), TracerProvider: tp})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	publish(t, s, "t.one", "k", 20)
	ep.waitSeen(t, 20)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.Close(ctx) // may report the export's failure
	if el := time.Since(start); el > 7*time.Second {
		t.Errorf("Close took %v with a hung collector", el)
	}
}
