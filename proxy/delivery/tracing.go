package delivery

import (
	"context"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/tracectx"
	"github.com/sluicehq/sluice/policy"
)

// Tracing of attempts (ingest makes its own span: package ingest): the producer's W3C trace context goes out with every
// delivery attempt, and with a TracerProvider (Options.TracerProvider)
// ingest and each attempt make OpenTelemetry spans.
//
// Propagation is on whether or not spans are exported: it costs nothing
// (the stored strings are copied into the request's headers) and is what
// a receiver needs to join its own spans to the producer's trace.
// Options.DropTraceContext turns it off for endpoints that should not see
// the producer's trace ids or tracestate.
//
//   - Tracing off: an attempt of an event that carries a traceparent sends
//     it unchanged (W3C Trace Context lets an intermediary that makes no
//     span of its own pass the parent id through), with its tracestate, so
//     the receiver's span is a child of the producer's. An event without
//     one gets no trace headers. Nothing is allocated for either.
//   - Tracing on: each attempt is a span of kind client whose parent is
//     the event's stored trace context, and its traceparent names that
//     span: the producer's trace id, a new span id per attempt, and the
//     flags of the sampling decision (which follows the parent's: the
//     sampler is parent-based, so a producer's flags are copied). The
//     ingest span is a child of the producer's span too: the attempts are
//     its siblings, not its children, because they outlive it by
//     anything from milliseconds to days, may run after a restart or on
//     another fleet node, and a replayed dead letter's attempts have the
//     same parent as the first ones. An event that arrives without a
//     trace context gets the ingest span's as its traceparent, stored with
//     the event (only while tracing is on, so the stored record of the off
//     case is unchanged): the ingest span starts a new trace, and the
//     attempts are its children. An event accepted with no trace context
//     while tracing was off has none later either: each of its attempts
//     is then the root of a trace of its own.
//
// Span attributes never carry a URL (a subscription's URL may hold a
// tenant's token, and its host names the tenant): an attempt names its
// subscription by id.

// Span names and attribute keys.
const (
	attemptSpanName = "sluice.deliver"

	headerTraceParent = "traceparent"
	headerTraceState  = "tracestate"
)

var (
	attrEventType    = attribute.Key("sluice.event.type")
	attrEventID      = attribute.Key("sluice.event.id")
	attrSubscription = attribute.Key("sluice.subscription")
	attrAttempt      = attribute.Key("sluice.attempt")
	attrOutcome      = attribute.Key("sluice.outcome")
	attrReason       = attribute.Key("sluice.dead_letter.reason")
	attrReplay       = attribute.Key("sluice.replay")
	attrStatusCode   = attribute.Key("http.response.status_code")
	attrErrorType    = attribute.Key("error.type")
	// The same on every span, so made once.
	attrMethodPost = attribute.String("http.request.method", fasthttp.MethodPost)
	kindClient     = trace.WithSpanKind(trace.SpanKindClient)
)

// tracerName is the instrumentation scope of sluice's spans.
const tracerName = "github.com/sluicehq/sluice/proxy"

// tracingShutdownTimeout bounds the flush of the spans still buffered when
// the server closes: an unreachable collector must not hold a shutdown
// (the exporter's own timeout per export is 10 s). A variable for tests.
var tracingShutdownTimeout = 5 * time.Second

// Tracer is what the lanes know of tracing. The zero value is
// tracing off with propagation on. Its methods are safe for concurrent
// use.
type Tracer struct {
	t        trace.Tracer // nil: no spans
	drop     bool         // no trace headers out (proxy.Options.DropTraceContext)
	provider trace.TracerProvider
}

// NewTracer is tracing with provider (nil: no spans); drop sends no
// trace context to endpoints.
func NewTracer(provider trace.TracerProvider, drop bool) Tracer {
	t := Tracer{drop: drop, provider: provider}
	if provider != nil {
		t.t = provider.Tracer(tracerName)
	}
	return t
}

// Spans is the tracer that makes spans, nil when tracing is off: ingest
// makes its own with it.
func (t *Tracer) Spans() trace.Tracer { return t.t }

// Shutdown flushes and stops the provider when it can be (the SDK's can),
// within tracingShutdownTimeout.
func (t *Tracer) Shutdown() error {
	sd, ok := t.provider.(interface{ Shutdown(context.Context) error })
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
	defer cancel()
	return sd.Shutdown(ctx)
}

// attempt writes the trace headers of one delivery attempt into h and,
// with tracing on, starts the attempt's span, which endAttempt ends; nil
// when tracing is off. Called by deliver right before the request is
// sent; w is the worker's scratch space.
func (t *Tracer) attempt(j *job, w *workerState, h *fasthttp.RequestHeader) trace.Span {
	if t.t != nil {
		return t.startAttempt(j, w, h)
	}
	if ev := j.ev; ev.TraceParent != "" && !t.drop {
		h.Set(headerTraceParent, ev.TraceParent)
		if ev.TraceState != "" {
			h.Set(headerTraceState, ev.TraceState)
		}
	}
	return nil
}

func (t *Tracer) startAttempt(j *job, w *workerState, h *fasthttp.RequestHeader) trace.Span {
	ev := j.ev
	ctx := context.Background()
	if sc, ok := tracectx.Remote(ev.TraceParent, ev.TraceState); ok {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	_, span := t.t.Start(ctx, attemptSpanName, kindClient)
	// Attributes only on a span that records them: an unsampled one
	// (sample_ratio, or a producer that did not sample) costs less. The
	// sampler is parent-based and ratio-based, blind to attributes.
	if span.IsRecording() {
		var buf [6]attribute.KeyValue
		attrs := append(buf[:0],
			attrSubscription.String(j.lane.id),
			attrAttempt.Int(j.attempt),
			attrEventType.String(ev.Type),
			attrEventID.String(ev.ID),
			attrMethodPost,
		)
		if j.retry != nil && j.retry.Replay {
			attrs = append(attrs, attrReplay.Bool(true))
		}
		span.SetAttributes(attrs...)
	}
	if !t.drop {
		sc := span.SpanContext()
		w.traceParent = tracectx.AppendParent(w.traceParent[:0], sc.TraceID(), sc.SpanID(), sc.TraceFlags())
		h.SetBytesV(headerTraceParent, w.traceParent)
		if ev.TraceState != "" {
			h.Set(headerTraceState, ev.TraceState)
		}
	}
	return span
}

// endAttempt ends an attempt's span (nil: tracing off) once its outcome is
// decided: sluice.outcome in the words of
// sluice_delivery_attempts_total's outcome label (what became of the
// delivery after this attempt: ack, retry, timeout, dead_letter), the
// status when the endpoint answered, and on failure an error status with
// error.type (the transport failure's word, or the status code).
func endAttempt(span trace.Span, res result, rs policy.Resolution) {
	if span == nil {
		return
	}
	if !span.IsRecording() {
		span.End()
		return
	}
	// One SetAttributes call: each one may grow the span's attributes.
	var buf [4]attribute.KeyValue
	attrs := append(buf[:0], attrOutcome.String(attemptOutcomeWords[attemptOutcomeOf(res, rs)]))
	if res.Status != 0 {
		attrs = append(attrs, attrStatusCode.Int(res.Status))
	}
	var desc string
	if rs.Outcome != policy.Ack {
		errType := res.Failure.String()
		desc = errType
		if errType == "" {
			errType = strconv.Itoa(res.Status)
			desc = "HTTP " + errType
		}
		attrs = append(attrs, attrErrorType.String(errType))
		if rs.Outcome == policy.DeadLetter {
			attrs = append(attrs, attrReason.String(rs.Reason))
		}
	}
	span.SetAttributes(attrs...)
	if desc != "" {
		span.SetStatus(codes.Error, desc)
	}
	span.End()
}

// abandonAttempt ends the span of an attempt whose outcome is not written
// because the server is closing: it runs again after a restart.
func abandonAttempt(span trace.Span, res result) {
	if span == nil {
		return
	}
	if res.Status != 0 {
		span.SetAttributes(attrStatusCode.Int(res.Status))
	}
	span.SetAttributes(attrOutcome.String(outcomeAbandoned))
	span.End()
}

// outcomeAbandoned is an attempt span's sluice.outcome when the server
// closed before its outcome was recorded.
const outcomeAbandoned = "abandoned"
