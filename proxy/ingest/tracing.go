package ingest

import (
	"context"
	"strconv"

	"github.com/sluicehq/sluice/internal/tracectx"
	"github.com/sluicehq/sluice/queue"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Ingest's spans: one per request, a child of the producer's span when
// the request carries a valid traceparent (see the delivery engine's
// tracing for the whole story, attempts included).

var (
	attrEventType    = attribute.Key("sluice.event.type")
	attrEventID      = attribute.Key("sluice.event.id")
	attrIngestResult = attribute.Key("sluice.ingest.result")
	attrBatchEvents  = attribute.Key("sluice.ingest.batch_events")
	attrStatusCode   = attribute.Key("http.response.status_code")
	kindServer       = trace.WithSpanKind(trace.SpanKindServer)
)

const ingestSpanName = "sluice.ingest"

// startIngest starts the span of one ingest request, a child of the
// producer's span when the request carries a valid traceparent; nil when
// tracing is off.
func startIngest(t trace.Tracer, h *fasthttp.RequestHeader) trace.Span {
	if t == nil {
		return nil
	}
	ctx := context.Background()
	if parent, state := traceContext(h); parent != nil {
		if sc, ok := tracectx.Remote(string(parent), string(state)); ok {
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		}
	}
	_, span := t.Start(ctx, ingestSpanName, kindServer)
	return span
}

// ingested names the event on its ingest span and, when the producer sent
// no trace context, gives the event the span's, so that its attempts are
// the span's children. span nil (tracing off) changes nothing.
//
// The event id is kept as an attribute although a producer chose it: it
// is what operators search by (GET /v1/events/{id}, dead letters), it
// passed ingest's checks (at most 200 bytes of a restricted set), and
// every endpoint receives it as webhook-id anyway.
func ingested(span trace.Span, ev *queue.Event) {
	if span == nil {
		return
	}
	if span.IsRecording() {
		span.SetAttributes(attrEventType.String(ev.Type), attrEventID.String(ev.ID))
	}
	if ev.TraceParent == "" {
		ev.TraceParent = spanParent(span)
	}
}

// spanParent is the ingest span's context as a traceparent, for the
// events posted without one of their own.
func spanParent(span trace.Span) string {
	sc := span.SpanContext()
	return string(tracectx.AppendParent(make([]byte, 0, tracectx.ParentLen), sc.TraceID(), sc.SpanID(), sc.TraceFlags()))
}

// endIngest ends an ingest span with its answer: sluice.ingest.result in
// the words of sluice_ingest_events_total's result label, the status, and
// an error status when sluice failed to take the event (5xx: a full disk,
// no quorum, shutting down); a producer's bad request is not sluice's
// error.
func endIngest(span trace.Span, status int) {
	if span == nil {
		return
	}
	if !span.IsRecording() {
		span.End()
		return
	}
	result := "rejected"
	switch status {
	case fasthttp.StatusAccepted:
		result = "accepted"
	case fasthttp.StatusOK:
		result = "duplicate"
	}
	span.SetAttributes(attrIngestResult.String(result), attrStatusCode.Int(status))
	if status >= 500 {
		span.SetStatus(codes.Error, "HTTP "+strconv.Itoa(status))
	}
	span.End()
}
