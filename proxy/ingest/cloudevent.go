package ingest

import (
	"errors"
	"strconv"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/queue"
)

// ceSpecVersion is the header that makes a request a binary mode
// CloudEvent.
const ceSpecVersion = cloudevents.HeaderPrefix + "specversion"

// ingestCloudEvent serves one CloudEvent: in structured mode when the
// Content-Type says so, else in binary mode. pathType is the type the
// path named (POST /v1/events/{type}), which the event's type attribute
// must then equal; nil for POST /v1/events.
//
// The event's id is its source and id attribute together (cloudevents.Key):
// the spec makes an id unique within its source, so that pair is what a
// retried POST repeats. Its type routes it as any event type; every other
// attribute is kept with it (queue.Event.CloudEvent) for a CloudEvents
// delivery. The partitionkey extension, when present, is its ordering key.
func (s *Server) ingestCloudEvent(ctx *fasthttp.RequestCtx, in *ingestState, span trace.Span, pathType []byte) {
	h := &ctx.Request.Header
	var (
		ce  cloudevents.Event
		err error
	)
	if mediaType(h.ContentType()) == mediaCloudEvent {
		if hasAttrHeader(h) {
			jsonError(ctx, fasthttp.StatusBadRequest, "a structured mode CloudEvent ("+mediaCloudEvent+") carries its attributes in the body: send no ce-* headers")
			return
		}
		ce, err = cloudevents.ParseStructured(ctx.PostBody())
	} else {
		ce, err = cloudevents.ParseBinary(func(fn func(name, value []byte)) {
			for k, v := range h.All() {
				fn(k, v)
			}
		}, string(h.ContentType()), ctx.PostBody())
	}
	if err != nil {
		jsonError(ctx, fasthttp.StatusBadRequest, "invalid CloudEvent: "+err.Error())
		return
	}
	if err := s.checkCloudEvent(&ce, pathType, h); err != nil {
		jsonError(ctx, fasthttp.StatusBadRequest, "invalid CloudEvent: "+err.Error())
		return
	}
	hf, ok := s.headerFields(ctx, in)
	if !ok {
		return
	}
	if ev := cloudEvent(in, &ce, &hf); ev != nil {
		s.appendEvent(ctx, in, span, ev, ce.Data)
	} else {
		jsonError(ctx, fasthttp.StatusBadRequest, "invalid CloudEvent: the Ordering-Key header and the partitionkey attribute differ: send one, or the same")
	}
}

// hasAttrHeader reports whether a request has any ce-* header.
func hasAttrHeader(h *fasthttp.RequestHeader) bool {
	for k := range h.All() {
		if cloudevents.IsAttrHeader(k) {
			return true
		}
	}
	return false
}

// checkCloudEvent holds a parsed CloudEvent to what ingest asks of any
// event: nil, or what is wrong, a *cloudevents.AttrError naming the
// attribute where one is at fault. h is the request's header (nil in a
// batch, whose headers are checked once).
func (s *Server) checkCloudEvent(ce *cloudevents.Event, pathType []byte, h *fasthttp.RequestHeader) error {
	bad := func(attr, problem string) error { return &cloudevents.AttrError{Attr: attr, Problem: problem} }
	typ := []byte(ce.Type)
	if msg := checkName(typ, maxTypeLen, typeChars); msg != "" {
		return bad("type", "an event type, "+msg)
	}
	if s.cfg.Reserved != nil && s.cfg.Reserved(typ) {
		return bad("type", strconv.Quote(ce.Type)+" is reserved for sluice's operational webhook")
	}
	if pathType != nil && string(pathType) != ce.Type {
		return bad("type", strconv.Quote(ce.Type)+" differs from the path's type "+strconv.Quote(string(pathType))+": post to /v1/events, or to /v1/events/"+ce.Type)
	}
	if msg := checkOrderingKey([]byte(ce.PartitionKey)); msg != "" {
		return bad("partitionkey", "an ordering key, "+msg)
	}
	if h != nil && len(h.Peek("Idempotency-Key")) > 0 {
		return errors.New("a CloudEvent is deduplicated by its source and id attributes: send no Idempotency-Key header")
	}
	return nil
}

// cloudEvent makes the log's event of a checked CloudEvent, without its
// body and acceptance time (appendEvent sets them); nil when the
// request's Ordering-Key and the event's partitionkey disagree.
func cloudEvent(in *ingestState, ce *cloudevents.Event, hf *headerFields) *queue.Event {
	key := ce.PartitionKey
	if len(hf.key) > 0 {
		if key != "" && key != string(hf.key) {
			return nil
		}
		key = string(hf.key)
	}
	ct := ce.ContentType
	if ct == "" {
		ct = string(octetStream)
	}
	return &queue.Event{
		ID:          cloudevents.Key(ce.Source, ce.ID),
		Type:        in.types.get([]byte(ce.Type)),
		ContentType: in.contentTypes.get([]byte(ct)),
		OrderingKey: key,
		TraceParent: string(hf.traceParent),
		TraceState:  string(hf.traceState),
		Tenant:      hf.tenant,
		CloudEvent:  ce.Attrs,
	}
}
