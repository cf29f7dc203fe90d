// Package otlptest is an OTLP/HTTP trace receiver for tests: an
// httptest server at /v1/traces that decodes each protobuf
// ExportTraceServiceRequest, as a collector would, and keeps its spans.
// Safe for concurrent use.
package otlptest

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span with its resource's attributes.
type Span struct {
	*tracepb.Span
	// Resource holds the resource's string attributes (service.name, ...).
	Resource map[string]string
}

// TraceID, SpanID and ParentSpanID are the span's ids in lowercase hex,
// as a traceparent writes them; ParentSpanID is "" for a root.
func (s Span) TraceID() string      { return hex.EncodeToString(s.Span.TraceId) }
func (s Span) SpanID() string       { return hex.EncodeToString(s.Span.SpanId) }
func (s Span) ParentSpanID() string { return hex.EncodeToString(s.Span.ParentSpanId) }

// Attr returns the attribute key's value as a string ("" if absent), ints
// in decimal and bools as true/false.
func (s Span) Attr(key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return value(kv.Value)
		}
	}
	return ""
}

// Attrs returns every attribute as Attr would print it.
func (s Span) Attrs() map[string]string {
	m := make(map[string]string, len(s.Attributes))
	for _, kv := range s.Attributes {
		m[kv.Key] = value(kv.Value)
	}
	return m
}

func value(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	}
	return v.String()
}

// Receiver collects the spans posted to it.
type Receiver struct {
	srv *httptest.Server

	mu      sync.Mutex
	spans   []Span
	changed chan struct{} // closed at the next export
	block   bool          // SetBlock
	done    chan struct{}
}

// New starts a receiver, closed when tb's test ends.
func New(tb testing.TB) *Receiver {
	r := &Receiver{changed: make(chan struct{}), done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.export)
	r.srv = httptest.NewServer(mux)
	tb.Cleanup(func() {
		close(r.done)
		r.srv.Close()
	})
	return r
}

// URL is the base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it.
func (r *Receiver) URL() string { return r.srv.URL }

func (r *Receiver) export(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	block := r.block
	r.mu.Unlock()
	if block {
		select {
		case <-r.done:
		case <-req.Context().Done():
		}
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "content type "+ct, http.StatusUnsupportedMediaType)
		return
	}
	var ex coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &ex); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []Span
	for _, rs := range ex.ResourceSpans {
		res := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			res[kv.Key] = value(kv.Value)
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				got = append(got, Span{Span: s, Resource: res})
			}
		}
	}
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)

	r.mu.Lock()
	r.spans = append(r.spans, got...)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// SetBlock makes the receiver hold every export request until the test
// ends (a collector that hangs), or answer again.
func (r *Receiver) SetBlock(b bool) {
	r.mu.Lock()
	r.block = b
	r.mu.Unlock()
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Wait waits until cond holds for the spans received, or fails the test
// after timeout.
func (r *Receiver) Wait(tb testing.TB, what string, timeout time.Duration, cond func([]Span) bool) []Span {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		r.mu.Lock()
		spans, ch := append([]Span(nil), r.spans...), r.changed
		r.mu.Unlock()
		if cond(spans) {
			return spans
		}
		select {
		case <-ch:
		case <-ctx.Done():
			tb.Fatalf("otlp receiver: waiting for %s: %d spans received", what, len(spans))
			return nil
		}
	}
}
