package ingest

import (
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// batchKind is the shape of a batch body.
type batchKind int

const (
	batchNDJSON      batchKind = iota // one JSON object per line
	batchCloudEvents                  // a JSON array of structured CloudEvents
)

// ingestBatch serves a batch posted to POST /v1/events.
func (s *Server) ingestBatch(ctx *fasthttp.RequestCtx, in *ingestState, span trace.Span, kind batchKind) {
	jsonError(ctx, fasthttp.StatusNotImplemented, "batches are not implemented yet")
}
