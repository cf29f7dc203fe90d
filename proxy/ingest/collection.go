package ingest

import (
	"bytes"
	"strconv"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// Media types POST /v1/events tells apart by its Content-Type.
const (
	mediaCloudEvent      = "application/cloudevents+json"
	mediaCloudEventBatch = "application/cloudevents-batch+json"
	mediaNDJSON          = "application/x-ndjson"
)

// ingestCollection serves POST /v1/events: one CloudEvent in structured
// mode (Content-Type application/cloudevents+json) or binary mode (a
// ce-specversion header), or a batch (NDJSON, or a CloudEvents batch).
func (s *Server) ingestCollection(ctx *fasthttp.RequestCtx, in *ingestState, span trace.Span) {
	ct := mediaType(ctx.Request.Header.ContentType())
	switch {
	case ct == mediaCloudEventBatch:
		s.ingestBatch(ctx, in, span, batchCloudEvents)
	case ct == mediaNDJSON:
		s.ingestBatch(ctx, in, span, batchNDJSON)
	case ct == mediaCloudEvent || len(ctx.Request.Header.Peek(ceSpecVersion)) > 0:
		s.ingestCloudEvent(ctx, in, span, nil)
	default:
		jsonError(ctx, fasthttp.StatusUnsupportedMediaType, "POST /v1/events takes a CloudEvent (ce-* headers, or Content-Type "+mediaCloudEvent+
			") or a batch (Content-Type "+mediaNDJSON+" or "+mediaCloudEventBatch+"), not Content-Type "+quoteHeader(ctx.Request.Header.ContentType())+
			"; POST /v1/events/{type} takes one event of any content type")
	}
}

// mediaType is a Content-Type's media type when it is one that POST
// /v1/events tells apart, "" otherwise; parameters and case are ignored.
// It makes no string: it is on the path of every event.
func mediaType(ct []byte) string {
	if i := bytes.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = bytes.TrimSpace(ct)
	for _, mt := range [...]string{mediaCloudEvent, mediaCloudEventBatch, mediaNDJSON} {
		if len(ct) == len(mt) && bytes.EqualFold(ct, []byte(mt)) {
			return mt
		}
	}
	return ""
}

// quoteHeader quotes a header value for an error message, cut to 80 bytes.
func quoteHeader(v []byte) string { return strconv.QuoteToASCII(string(v[:min(len(v), 80)])) }
