package ingest

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/queue"
)

// Batches: POST /v1/events with many events in one body (docs/batch-ingest.md).
//
// What a batch promises, and why:
//
//   - Its input is checked whole before anything is appended: one
//     malformed event refuses the batch (400 or 413, naming the line or
//     index and the key), so a producer never has to work out which half
//     of a bad batch went in.
//   - Its events go to the log in one AppendBatch: one group commit and one
//     sync with Badger, one publish window of round trips with JetStream.
//     That, not the HTTP request saved, is what makes a batch cheaper than
//     as many single posts: with durability fsync the sync is the cost.
//   - Storage answers per event, so a batch is not atomic once valid: a
//     fleet-mode log losing its quorum mid-batch may store some events and
//     not others. Every event needs an id, so the producer's answer to any
//     failure, a timeout included, is to send the same batch again: what
//     was stored answers "duplicate", what was not is stored now.

// batchLimits are a batch's bounds: events (Limits.MaxBatchEvents) and
// body bytes (Limits.MaxBatchBytes).
type batchLimits struct{ events, bytes int }

// batchCounted is the user value of a request whose events ingestBatch
// counted in sluice_ingest_events_total itself, one per event; handle
// leaves it alone.
type batchCounted struct{}

// maxContentTypeLen bounds a batch event's content_type: it goes out as
// the Content-Type header of every delivery.
const maxContentTypeLen = 256

var mediaJSON = []byte("application/json")

// The settings that bound each kind of body, for 413s.
const (
	keyMaxBody       = "max_body_bytes"
	keyMaxBatchBytes = "ingest.max_batch_bytes"
)

// batchKind is the shape of a batch body.
type batchKind int

const (
	batchNDJSON      batchKind = iota // one JSON object per line
	batchCloudEvents                  // a JSON array of structured CloudEvents
)

// bodyLimit is the most a request's body may hold, and the setting it
// comes from: ingest.max_batch_bytes for a batch, max_body_bytes for
// anything else. fasthttp asks before it reads the body, so a batch bound
// above max_body_bytes lets no single event past max_body_bytes.
func (s *Server) bodyLimit(h *fasthttp.RequestHeader) (int, string) {
	if isBatch(h) {
		return s.batch.bytes, keyMaxBatchBytes
	}
	return s.cfg.MaxBodyBytes, keyMaxBody
}

// isBatch reports whether a request's headers say it posts a batch: to
// POST /v1/events (query aside) with a batch's media type, as
// ingestCollection routes it.
func isBatch(h *fasthttp.RequestHeader) bool {
	uri := h.RequestURI()
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	if !bytes.Equal(uri, collectionPath) {
		return false
	}
	switch mediaType(h.ContentType()) {
	case mediaNDJSON, mediaCloudEventBatch:
		return true
	}
	return false
}

// batchError is a batch refused whole, before anything was appended.
type batchError struct {
	status int
	line   int    // NDJSON: the line at fault, from 1; 0 when none
	index  int    // CloudEvents: the event at fault, from 0; -1 when none
	field  string // the key or attribute at fault; "" when none
	msg    string // the whole message, naming all of the above
}

func (e *batchError) write(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(e.status)
	ctx.SetContentType("application/json")
	b := append(make([]byte, 0, len(e.msg)+64), `{"error":`...)
	b = strconv.AppendQuote(b, e.msg)
	if e.line > 0 {
		b = append(b, `,"line":`...)
		b = strconv.AppendInt(b, int64(e.line), 10)
	}
	if e.index >= 0 {
		b = append(b, `,"index":`...)
		b = strconv.AppendInt(b, int64(e.index), 10)
	}
	if e.field != "" {
		b = append(b, `,"field":`...)
		b = strconv.AppendQuote(b, e.field)
	}
	ctx.Response.SetBodyRaw(append(b, "}\n"...))
}

// lineErr is the batchError of an NDJSON line.
func lineErr(status, line int, field, problem string) *batchError {
	msg := "line " + strconv.Itoa(line) + ": "
	if field != "" {
		msg += strconv.QuoteToASCII(cut(field, 64)) + ": "
	}
	return &batchError{status: status, line: line, index: -1, field: field, msg: msg + problem}
}

func cut(s string, n int) string { return s[:min(len(s), n)] }

// ingestBatch serves a batch posted to POST /v1/events: it reads every
// event, refuses the batch whole if one is malformed, appends them all in
// one AppendBatch, and answers each.
func (s *Server) ingestBatch(ctx *fasthttp.RequestCtx, in *ingestState, span trace.Span, kind batchKind) {
	ctx.SetUserValue(batchCounted{}, true)
	m := s.m
	hf, ok := s.headerFields(ctx, in) // the tenant and the trace context are the whole batch's
	if !ok {
		m.rejected.Inc()
		return
	}
	// Each event of a batch has its own id and ordering key: a header
	// for all of them would be ambiguous (one key for the batch, or a
	// default?), and one that says nothing is better refused than ignored.
	for _, name := range [...]string{"Idempotency-Key", "Ordering-Key"} {
		if len(ctx.Request.Header.Peek(name)) > 0 {
			m.rejected.Inc()
			jsonError(ctx, fasthttp.StatusBadRequest, "a batch's events carry their own ids and ordering keys (id and ordering_key in a line, "+
				"id, source and partitionkey in a CloudEvent): send no "+name+" header")
			return
		}
	}
	b := batch{in: in, tenant: hf.tenant, now: s.cfg.Now(), hf: &hf}
	b.traceContext(hf.traceParent, hf.traceState, span)
	var berr *batchError
	switch kind {
	case batchNDJSON:
		berr = s.readNDJSON(ctx.PostBody(), &b)
	case batchCloudEvents:
		berr = s.readCloudEvents(ctx.PostBody(), &b)
	}
	if berr == nil && len(b.evs) == 0 {
		berr = &batchError{status: fasthttp.StatusBadRequest, index: -1, msg: "the batch has no events"}
	}
	if berr != nil {
		// A batch refused whole counts once: its events were never
		// all read.
		m.rejected.Inc()
		berr.write(ctx)
		return
	}
	n := len(ctx.PostBody())
	if !in.gate.enter(len(b.evs), n) {
		m.rejected.Inc()
		ctx.Response.Header.Set("Retry-After", "1")
		jsonError(ctx, fasthttp.StatusServiceUnavailable, "ingest is saturated; retry")
		return
	}
	defer in.gate.leave(len(b.evs), n)
	// The bodies alias fasthttp's buffer, which it reuses for the next
	// request: each gets the one copy that every lane then shares, made
	// past the gate as a single event's is.
	for _, i := range b.aliased {
		b.evs[i].Body = bytes.Clone(b.evs[i].Body)
	}
	if span != nil && span.IsRecording() {
		span.SetAttributes(attrBatchEvents.Int(len(b.evs)))
	}
	res := make([]queue.AppendResult, len(b.evs))
	s.store.AppendBatch(b.evs, res)
	m.batchEvents.Observe(float64(len(b.evs)))
	s.answerBatch(ctx, b.evs, res)
}

// batch is a batch being read: its events, and what they share.
type batch struct {
	in     *ingestState
	tenant string
	now    time.Time
	hf     *headerFields
	// traceParent and traceState are the request's trace context, or the
	// ingest span's when the producer sent none (ingested, for one
	// event), for every event.
	traceParent, traceState string
	slab                    []queue.Event // backs evs
	evs                     []*queue.Event
	aliased                 []int // events whose Body aliases the request's
}

func (b *batch) traceContext(parent, state []byte, span trace.Span) {
	b.traceParent, b.traceState = string(parent), string(state)
	if b.traceParent == "" && span != nil {
		b.traceParent = spanParent(span)
	}
}

// add appends an event with the batch's shared fields set and returns it.
func (b *batch) add() *queue.Event {
	if len(b.slab) == cap(b.slab) {
		b.slab = make([]queue.Event, 0, max(16, cap(b.slab)))
	}
	b.slab = append(b.slab, queue.Event{AcceptedAt: b.now, Tenant: b.tenant, TraceParent: b.traceParent, TraceState: b.traceState})
	ev := &b.slab[len(b.slab)-1]
	b.evs = append(b.evs, ev)
	return ev
}

// readNDJSON reads an NDJSON batch into b: one event per line, blank
// lines skipped, a line ending in "\n" or "\r\n".
func (s *Server) readNDJSON(body []byte, b *batch) *batchError {
	// Lines bound the events: one allocation for all of them.
	lines := bytes.Count(body, []byte{'\n'}) + 1
	b.slab = make([]queue.Event, 0, min(lines, s.batch.events+1))
	b.evs = make([]*queue.Event, 0, cap(b.slab))
	var l ndjsonLine
	for no := 1; len(body) > 0; no++ {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		if skipSpace(line, 0) == len(line) {
			continue
		}
		if len(b.evs) == s.batch.events {
			return &batchError{status: fasthttp.StatusRequestEntityTooLarge, line: no, index: -1,
				msg: "line " + strconv.Itoa(no) + ": the batch has more than ingest.max_batch_events (" + strconv.Itoa(s.batch.events) + ") events: split it"}
		}
		if e := parseLine(line, &l); e != nil {
			return lineErr(fasthttp.StatusBadRequest, no, e.key, e.problem)
		}
		if e := s.lineEvent(&l, b, no); e != nil {
			return e
		}
	}
	return nil
}

// lineEvent checks the line read into l, with the rules of a single POST
// /v1/events/{type}, and adds its event to b.
func (s *Server) lineEvent(l *ndjsonLine, b *batch, no int) *batchError {
	bad := func(field, problem string) *batchError {
		return lineErr(fasthttp.StatusBadRequest, no, field, problem)
	}
	switch {
	case l.has&keyType == 0:
		return bad("type", "missing: every event needs its event type")
	case l.has&keyID == 0:
		// Required, unlike Idempotency-Key: an id of sluice's making would
		// be new on every retry, and a batch's retry must not store twice.
		return bad("id", "missing: every event of a batch needs an id, so that sending the batch again after a failure or a timeout stores nothing twice")
	case l.has&(keyBody|keyBodyBase64) == 0:
		return bad("body", "missing: give body (a JSON value) or body_base64 (any bytes, base64)")
	case l.has&keyBody != 0 && l.has&keyBodyBase64 != 0:
		return bad("body_base64", "given with body: give one of them")
	}
	if msg := s.typeProblem(l.typ); msg != "" {
		return bad("type", msg)
	}
	if msg := checkName(l.id, maxIDLen, idChars); msg != "" {
		return bad("id", "invalid id "+strconv.QuoteToASCII(string(l.id[:min(len(l.id), 64)]))+": "+msg)
	}
	if msg := checkOrderingKey(l.orderingKey); msg != "" {
		return bad("ordering_key", "invalid ordering key "+strconv.QuoteToASCII(string(l.orderingKey[:min(len(l.orderingKey), 64)]))+": "+msg)
	}
	ct := mediaJSON
	if l.has&keyBodyBase64 != 0 {
		ct = octetStream
	}
	if l.has&keyContentType != 0 {
		switch {
		case len(l.contentType) == 0:
			return bad("content_type", "empty: leave it out for the default")
		case len(l.contentType) > maxContentTypeLen:
			return bad("content_type", "longer than "+strconv.Itoa(maxContentTypeLen)+" bytes")
		case notPrintable(l.contentType) >= 0:
			i := notPrintable(l.contentType)
			return bad("content_type", "character "+strconv.QuoteRuneToASCII(rune(l.contentType[i]))+" at "+strconv.Itoa(i)+" not allowed (printable ASCII only)")
		}
		ct = l.contentType
	}
	body, owned := l.body, false
	if l.has&keyBodyBase64 != 0 {
		dec := make([]byte, base64.StdEncoding.DecodedLen(len(l.bodyBase64)))
		n, err := base64.StdEncoding.Decode(dec, l.bodyBase64)
		if err != nil {
			return bad("body_base64", "not standard base64 (RFC 4648 §4, with padding): "+err.Error())
		}
		body, owned = dec[:n:n], true
	}
	if max := s.cfg.MaxBodyBytes; max > 0 && len(body) > max {
		return lineErr(fasthttp.StatusRequestEntityTooLarge, no, cond(owned, "body_base64", "body"),
			"the body's "+strconv.Itoa(len(body))+" bytes exceed max_body_bytes ("+strconv.Itoa(max)+" bytes)")
	}
	ev := b.add()
	ev.ID = string(l.id)
	ev.Type = b.in.types.get(l.typ)
	ev.ContentType = b.in.contentTypes.get(ct)
	ev.OrderingKey = string(l.orderingKey)
	ev.Body = body
	if !owned {
		b.aliased = append(b.aliased, len(b.evs)-1)
	}
	return nil
}

func cond[T any](c bool, a, b T) T {
	if c {
		return a
	}
	return b
}

// answerBatch answers a batch the log has answered: every event in order,
// with a status that tells the producer whether to send it again.
//
//   - 202: every event is in the log, at least one new; 200: every event
//     was a duplicate (the batch had been stored already). Nothing to
//     send again.
//   - Some events refused by the log: the status and Retry-After of the
//     gravest refusal (507 over 503 over 500), as a single event's would
//     be, with every event's result, so the producer may send the whole
//     batch again: the stored ones answer as duplicates.
func (s *Server) answerBatch(ctx *fasthttp.RequestCtx, evs []*queue.Event, res []queue.AppendResult) {
	var (
		accepted, dups, refused int
		status                  = fasthttp.StatusOK
		retryAfter, firstErr    string
		lastErr, lastMsg        string
	)
	msgs := make([]string, len(res))
	for i, r := range res {
		switch {
		case r.Err != nil:
			refused++
			// The messages of one failure repeat across its events: each
			// is mapped, and an internal one logged, once per batch.
			if e := r.Err.Error(); e != lastErr {
				st, msg, ra := appendRefusal(r.Err)
				if st == fasthttp.StatusInternalServerError {
					s.log.Error("append", "err", r.Err)
				}
				lastErr, lastMsg = e, msg
				if rank(st) > rank(status) {
					status, retryAfter = st, ra
				}
				if firstErr == "" {
					firstErr = msg
				}
			}
			msgs[i] = lastMsg
		case r.Dup:
			dups++
		default:
			accepted++
		}
	}
	switch {
	case refused > 0:
	case accepted > 0:
		status = fasthttp.StatusAccepted
	}
	m := s.m
	m.accepted.Add(float64(accepted))
	m.duplicate.Add(float64(dups))
	m.rejected.Add(float64(refused))

	if retryAfter != "" {
		ctx.Response.Header.Set("Retry-After", retryAfter)
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	b := make([]byte, 0, 96+len(res)*(64+len(firstErr)/8))
	b = append(b, `{"accepted":`...)
	b = strconv.AppendInt(b, int64(accepted), 10)
	b = append(b, `,"duplicates":`...)
	b = strconv.AppendInt(b, int64(dups), 10)
	b = append(b, `,"refused":`...)
	b = strconv.AppendInt(b, int64(refused), 10)
	if refused > 0 {
		b = append(b, `,"error":`...)
		b = strconv.AppendQuote(b, strconv.Itoa(refused)+" of "+strconv.Itoa(len(res))+
			" events not accepted ("+firstErr+"): send the whole batch again; the events stored answer as duplicates")
	}
	b = append(b, `,"results":[`...)
	for i, r := range res {
		if i > 0 {
			b = append(b, ',')
		}
		// An id passed checkName (or is a CloudEvent's key), so it needs no
		// escaping.
		b = append(b, `{"id":"`...)
		b = append(b, evs[i].ID...)
		b = append(b, '"')
		switch {
		case r.Err != nil:
			b = append(b, `,"status":"refused","error":`...)
			b = strconv.AppendQuote(b, msgs[i])
		case r.Dup:
			b = append(b, `,"seq":`...)
			b = strconv.AppendUint(b, r.Seq, 10)
			b = append(b, `,"status":"duplicate"`...)
		default:
			b = append(b, `,"seq":`...)
			b = strconv.AppendUint(b, r.Seq, 10)
			b = append(b, `,"status":"accepted"`...)
		}
		b = append(b, '}')
	}
	ctx.Response.SetBodyRaw(append(b, "]}\n"...))
}

// rank orders the statuses of refusals: the one a producer must act on
// most wins (a full disk over a log that is away over a fault of sluice).
func rank(status int) int {
	switch status {
	case fasthttp.StatusInsufficientStorage:
		return 3
	case fasthttp.StatusServiceUnavailable:
		return 2
	case fasthttp.StatusInternalServerError:
		return 1
	}
	return 0
}

// readCloudEvents reads a CloudEvents batch (a JSON array of structured
// mode events) into b, each held to what a single CloudEvent is
// (checkCloudEvent). An error names the event by its index, from 0, and
// the attribute at fault when there is one.
func (s *Server) readCloudEvents(body []byte, b *batch) *batchError {
	ces, err := cloudevents.ParseBatch(body)
	if err != nil {
		e := &batchError{status: fasthttp.StatusBadRequest, index: -1, msg: err.Error()}
		var be *cloudevents.BatchError
		if errors.As(err, &be) {
			e.index = be.Index
		}
		var ae *cloudevents.AttrError
		if errors.As(err, &ae) {
			e.field = ae.Attr
		}
		return e
	}
	if len(ces) > s.batch.events {
		return &batchError{status: fasthttp.StatusRequestEntityTooLarge, index: s.batch.events,
			msg: "the batch has " + strconv.Itoa(len(ces)) + " events, more than ingest.max_batch_events (" + strconv.Itoa(s.batch.events) + "): split it"}
	}
	b.evs = make([]*queue.Event, 0, len(ces))
	for i := range ces {
		ce := &ces[i]
		bad := func(status int, attr, msg string) *batchError {
			return &batchError{status: status, index: i, field: attr, msg: "event " + strconv.Itoa(i) + " of the batch: " + msg}
		}
		if err := s.checkCloudEvent(ce, nil, nil); err != nil {
			var ae *cloudevents.AttrError
			errors.As(err, &ae) // every error of a batch's event names its attribute
			return bad(fasthttp.StatusBadRequest, ae.Attr, err.Error())
		}
		if max := s.cfg.MaxBodyBytes; max > 0 && len(ce.Data) > max {
			return bad(fasthttp.StatusRequestEntityTooLarge, "data",
				"its data's "+strconv.Itoa(len(ce.Data))+" bytes exceed max_body_bytes ("+strconv.Itoa(max)+" bytes)")
		}
		ev := cloudEvent(b.in, ce, b.hf) // the request has no Ordering-Key: its partitionkey alone counts
		ev.AcceptedAt, ev.TraceParent, ev.TraceState = b.now, b.traceParent, b.traceState
		// ParseBatch's Data may alias the body (as a line's does): it is
		// copied past the gate.
		ev.Body = ce.Data
		b.evs = append(b.evs, ev)
		b.aliased = append(b.aliased, len(b.evs)-1)
	}
	return nil
}
