package proxy

import (
	"bytes"
	"cmp"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/queue"
)

var (
	eventsPath  = []byte("/v1/events/")
	octetStream = []byte("application/octet-stream")
)

// Limits of the ingest contract. Event types and ids appear in headers and
// in the log's keys, so they are short and plain.
const (
	maxTypeLen = 128
	maxIDLen   = 200
	// maxOrderingKeyLen bounds the Ordering-Key header: a key is
	// an entity id (a vehicle, an account), and lanes keep one per active
	// key in memory.
	maxOrderingKeyLen = 256
	// maxTraceStateLen bounds the tracestate kept with an event. W3C Trace
	// Context asks propagators to carry at least 512 bytes of it, and
	// allows dropping what is past their limit.
	maxTraceStateLen = 512
)

// IngestLimits protect ingest from misbehaving producers: a slow or stuck
// client, oversized headers, connection floods. A zero field takes its
// default (the Default* constants below, explained there).
type IngestLimits struct {
	HeaderTimeout  time.Duration // request line and headers, from the first byte
	BodyTimeout    time.Duration // the body, once the headers are in
	IdleTimeout    time.Duration // a keep-alive connection between requests
	MaxHeaderBytes int           // request line plus headers; 431 past it
	MaxConnections int           // open connections, idle ones included
}

// Defaults of IngestLimits.
const (
	DefaultIngestHeaderTimeout  = 10 * time.Second
	DefaultIngestBodyTimeout    = 30 * time.Second
	DefaultIngestIdleTimeout    = 2 * time.Minute
	DefaultIngestMaxHeaderBytes = 16 << 10
	DefaultIngestMaxConnections = 4096
)

// The limits in force when Options.Ingest leaves them zero. They are
// variables only so tests can lower them; the server reads them once when
// it starts.
var (
	// ingestHeaderTimeout bounds how long a request's line and headers may
	// take to arrive, from the request's first byte; a new connection that
	// sends nothing is closed after the same time. A client trickling its
	// headers a byte at a time (slowloris) is answered 408 and closed: the
	// deadline does not move as bytes arrive. A local producer sends its
	// headers in one write; 10 s is generous even for a stalled host
	// (nginx's client_header_timeout is 60 s, over the internet).
	ingestHeaderTimeout = DefaultIngestHeaderTimeout
	// ingestBodyTimeout bounds reading the body once the headers are in:
	// 1 MiB (the default max_body_bytes) in 30 s is about 35 KB/s, far
	// below what any live producer manages over loopback.
	ingestBodyTimeout = DefaultIngestBodyTimeout
	// ingestMaxHeaderBytes bounds the request line plus headers (fasthttp's
	// per-connection read buffer). The contract's headers (Content-Type,
	// Idempotency-Key up to 200 bytes, Host) take a few hundred bytes;
	// 16 KiB leaves room for tracing and auth headers that proxies add.
	// Past it the answer is 431 and the connection is closed.
	ingestMaxHeaderBytes = DefaultIngestMaxHeaderBytes
	// ingestMaxConns caps open ingest connections, idle ones included
	// (fasthttp's Concurrency; each costs a goroutine). Connections past it
	// are answered 503 and closed at once. A sidecar's producer is local,
	// often one address, so a per-IP cap would hit the real producer
	// first; a total cap plus timeouts bounds a flood instead: a connection
	// that never sends a byte is closed after ingestHeaderTimeout, an idle
	// keep-alive one after ingestIdleTimeout. 4096 is far above what one
	// producer needs (a pool of 64..1024). An idle connection keeps its
	// read buffer (ingestMaxHeaderBytes), a write buffer and a goroutine
	// stack: measured 15 KiB of heap and 7 KiB of stack, counting the
	// test's client ends too (TestIngestFaultIdleConnections), so a full
	// house is at most about 90 MiB. fasthttp's ReduceMemoryUsage would release
	// the buffers between requests (1.7 KiB per idle connection), but
	// costs every request a pool round trip: 8% more CPU per ingest
	// request, measured (BenchmarkIngest/async, 3 alternating runs: 38.0,
	// 41.2, 39.1 µs against 35.1, 37.2, 36.7). The hot path wins; the cap
	// bounds the memory.
	ingestMaxConns = DefaultIngestMaxConnections
	// ingestIdleTimeout closes keep-alive connections idle this long. It is
	// longer than the idle timeout of common producer clients (Go's
	// http.Transport: 90 s), so the client, not the sidecar, usually closes
	// first and never sends on a connection the sidecar just closed.
	ingestIdleTimeout = DefaultIngestIdleTimeout
	// ingestMaxPendingEvents and ingestMaxPendingBytes bound the appends
	// waiting on the group committer, so a burst far above the log's
	// capacity meets backpressure (503 with Retry-After) instead of holding
	// a copy of every body in memory. 4096 matches the committer's request
	// queue (4 batches of 1024): more waiters would only wait longer. The
	// bytes are the memory budget's gate share (8 MiB of the default
	// 64 MiB: 4096 events of 2 KiB, or 8 at the default 1 MiB limit); a single
	// event larger than that is still admitted when nothing else waits, so
	// max_body_bytes above it keeps working.
	ingestMaxPendingEvents = 4096
	ingestMaxPendingBytes  int64 // 0: the memory budget's share (SplitMemory's Gate)
)

func (s *Server) newIngestServer() *fasthttp.Server {
	in := &ingestState{gate: ingestGate{maxEvents: int64(ingestMaxPendingEvents), maxBytes: cmp.Or(ingestMaxPendingBytes, s.mem.Gate)}}
	lim := s.opts.Ingest
	headerTimeout := cmp.Or(lim.HeaderTimeout, ingestHeaderTimeout)
	bodyTimeout := cmp.Or(lim.BodyTimeout, ingestBodyTimeout)
	maxHeader := cmp.Or(lim.MaxHeaderBytes, ingestMaxHeaderBytes)
	return &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if !s.serving.Load() {
				ctx.Response.Header.Set("Retry-After", "1")
				jsonError(ctx, fasthttp.StatusServiceUnavailable, "starting: connecting to the log; retry")
				return
			}
			s.handleIngest(ctx, in)
		},
		Name:               "sluice",
		MaxRequestBodySize: s.opts.MaxBodyBytes,
		// ReadTimeout covers the request line and headers; HeaderReceived
		// then gives the body its own deadline.
		ReadTimeout: headerTimeout,
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: bodyTimeout}
		},
		WriteTimeout:   30 * time.Second,
		IdleTimeout:    cmp.Or(lim.IdleTimeout, ingestIdleTimeout),
		ReadBufferSize: maxHeader,
		Concurrency:    cmp.Or(lim.MaxConnections, ingestMaxConns),
		// Keeps most of the request's bytes (headers may carry tokens) out
		// of fasthttp's errors, which are logged at debug.
		SecureErrorLogMessage: true,
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		CloseOnShutdown:       true,
		ConnState:             s.fresh.track,
		Logger:                fasthttpLogger{s.log},
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			s.im.rejected.Inc()
			status, msg := readErrorStatus(err, s.opts.MaxBodyBytes, maxHeader, headerTimeout, bodyTimeout)
			s.log.Debug("ingest request rejected", "status", status, "err", err)
			jsonError(ctx, status, msg)
		},
	}
}

// readErrorStatus maps an error fasthttp met while reading a request (the
// answer goes out and the connection is closed) to a status and a message
// naming the problem.
func readErrorStatus(err error, maxBody, maxHeader int, headerTimeout, bodyTimeout time.Duration) (int, string) {
	var (
		small   *fasthttp.ErrSmallBuffer
		broken  fasthttp.ErrBrokenChunk
		timeout interface{ Timeout() bool }
	)
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return fasthttp.StatusRequestEntityTooLarge, "body exceeds max_body_bytes (" + strconv.Itoa(maxBody) + " bytes)"
	case errors.As(err, &small):
		return fasthttp.StatusRequestHeaderFieldsTooLarge, "request headers exceed " + strconv.Itoa(maxHeader) + " bytes"
	case errors.As(err, &timeout) && timeout.Timeout():
		return fasthttp.StatusRequestTimeout, "request not received in time (headers within " + headerTimeout.String() + ", body within " + bodyTimeout.String() + ")"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fasthttp.StatusBadRequest, "request incomplete: connection closed before the end of the body"
	case errors.As(err, &broken):
		return fasthttp.StatusBadRequest, "malformed chunked body: " + broken.Error()
	// fasthttp parses hex only for chunk sizes, and exports no sentinel
	// for a bad one: its message is all there is.
	case strings.HasSuffix(err.Error(), "hex number"):
		return fasthttp.StatusBadRequest, "malformed chunked body: invalid chunk size"
	}
	// What is left failed in the request line or headers. fasthttp's
	// description quotes the offending bytes, so it goes to the debug log,
	// not back to the client.
	return fasthttp.StatusBadRequest, "malformed request: invalid request line or headers"
}

// ingestState is what the ingest handler keeps across requests.
type ingestState struct {
	gate ingestGate
	// types and contentTypes intern the event types and content types of
	// accepted events: a producer sends a handful of each, and a string
	// made per event was two of the handler's five allocations per event.
	types, contentTypes internTable
	// tenants interns the Sluice-Tenant values, as types are.
	tenants internTable
	ids     idSource
}

// idSource makes the ids of events posted without an Idempotency-Key:
// ULIDs, monotonic within a millisecond as ulid.Make's are. ulid.Make
// hands its ULID to the entropy reader through an interface, so the ULID
// escapes: two allocations per id with the string. Here the entropy is
// read into the source's own buffer, leaving the string the only one.
type idSource struct {
	mu  sync.Mutex
	ent *ulid.MonotonicEntropy // nil until the first id
	buf [10]byte               // the entropy of the last id, under mu
}

func (g *idSource) next() string {
	ms := ulid.Now()
	var id ulid.ULID
	g.mu.Lock()
	if g.ent == nil {
		var seed [32]byte
		crand.Read(seed[:])
		g.ent = ulid.Monotonic(rand.NewChaCha8(seed), 0)
	}
	err := g.ent.MonotonicRead(ms, g.buf[:])
	copy(id[6:], g.buf[:])
	g.mu.Unlock()
	if err != nil {
		// The entropy overflowed within one millisecond (2^80 ids):
		// ulid.Make's own source still has room.
		return ulid.Make().String()
	}
	_ = id.SetTime(ms) // ulid.Now is always within ulid.MaxTime
	var text [ulid.EncodedSize]byte
	_ = id.MarshalTextTo(text[:]) // text is EncodedSize long
	return string(text[:])
}

// internTable hands out one string per distinct byte sequence, for up to
// maxInterned of them; past that it makes a new string each time. Lookups
// take no lock: the map is replaced whole (copy on write) when a value is
// added, which stops once the table is full, so a producer inventing
// types costs at most maxInterned copies of a small map.
type internTable struct {
	m  atomic.Pointer[map[string]string]
	mu sync.Mutex // serialises additions
}

// maxInterned bounds an internTable. Event types are what subscriptions
// filter on and content types come from a producer's code: hundreds would
// be unusual, and one past the bound only costs its event a string.
const maxInterned = 256

func (t *internTable) get(b []byte) string {
	old := t.m.Load()
	if old != nil {
		if s, ok := (*old)[string(b)]; ok { // the compiler makes no string for the lookup
			return s
		}
		if len(*old) >= maxInterned {
			return string(b) // full: no lock either
		}
	}
	s := string(b)
	t.mu.Lock()
	defer t.mu.Unlock()
	var m map[string]string
	if old = t.m.Load(); old != nil {
		if v, ok := (*old)[s]; ok {
			return v // added meanwhile
		}
		if len(*old) >= maxInterned {
			return s
		}
		m = maps.Clone(*old)
	}
	if m == nil {
		m = map[string]string{}
	}
	m[s] = s
	t.m.Store(&m)
	return s
}

// ingestGate is the admission limit in front of the group committer: a
// bounded number of appends, and bytes of body, may wait on it at once.
// Past either bound a request is turned away at once (503) instead of
// holding its body in memory while it waits. It counts with atomics: the
// check is on every request's path.
type ingestGate struct {
	maxEvents, maxBytes int64
	events, bytes       atomic.Int64
}

// enter admits an append of n body bytes, or reports false when the gate
// is full. An event larger than maxBytes is admitted when it is alone.
func (g *ingestGate) enter(n int) bool {
	if g.events.Add(1) > g.maxEvents {
		g.events.Add(-1)
		return false
	}
	if b := g.bytes.Add(int64(n)); b > g.maxBytes && b != int64(n) {
		g.bytes.Add(-int64(n))
		g.events.Add(-1)
		return false
	}
	return true
}

// leave releases what enter(n) admitted.
func (g *ingestGate) leave(n int) {
	g.bytes.Add(-int64(n))
	g.events.Add(-1)
}

// handleIngest implements POST /v1/events/{type}.
func (s *Server) handleIngest(ctx *fasthttp.RequestCtx, in *ingestState) {
	start := time.Now()
	span := s.trace.startIngest(&ctx.Request.Header) // tracing.go; nil with tracing off
	s.ingestEvent(ctx, in, span)
	m := s.im
	switch code := ctx.Response.StatusCode(); {
	case code == fasthttp.StatusAccepted:
		m.accepted.Inc()
	case code == fasthttp.StatusOK:
		m.duplicate.Inc()
	default:
		m.rejected.Inc()
	}
	m.duration.Observe(time.Since(start).Seconds())
	endIngest(span, ctx.Response.StatusCode())
}

func (s *Server) ingestEvent(ctx *fasthttp.RequestCtx, in *ingestState, span trace.Span) {
	path := ctx.Path()
	typ, ok := bytes.CutPrefix(path, eventsPath)
	if !ok {
		jsonError(ctx, fasthttp.StatusNotFound, "not found: POST /v1/events/{type}")
		return
	}
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		jsonError(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed: use POST")
		return
	}
	if framingConflict(ctx.Request.Header.RawHeaders()) {
		// fasthttp would read the body as chunked and close the
		// connection; a proxy in front may have framed it by
		// Content-Length, and the bytes in between would be a second,
		// smuggled request to one of the two. RFC 9112 §6.3 lets a server
		// refuse such a request; nothing honest sends it.
		ctx.SetConnectionClose()
		jsonError(ctx, fasthttp.StatusBadRequest, "request has both Content-Length and Transfer-Encoding headers: send one (RFC 9112 §6.3)")
		return
	}
	if s.draining.Load() {
		ctx.Response.Header.Set("Retry-After", "1")
		jsonError(ctx, fasthttp.StatusServiceUnavailable, "shutting down; retry")
		return
	}
	if msg := checkName(typ, maxTypeLen, typeChars); msg != "" {
		jsonError(ctx, fasthttp.StatusBadRequest, "invalid event type "+strconv.Quote(string(typ))+": "+msg)
		return
	}
	if operationalType(string(typ)) {
		// Always, configured or not: see operational.go.
		jsonError(ctx, fasthttp.StatusBadRequest, "event type "+strconv.Quote(string(typ))+" is reserved for sluice's operational webhook")
		return
	}
	id := ctx.Request.Header.Peek("Idempotency-Key")
	var idStr string
	if len(id) == 0 {
		idStr = in.ids.next()
	} else {
		if msg := checkName(id, maxIDLen, idChars); msg != "" {
			jsonError(ctx, fasthttp.StatusBadRequest, "invalid Idempotency-Key "+strconv.QuoteToASCII(string(id[:min(len(id), 64)]))+": "+msg)
			return
		}
		idStr = string(id)
	}
	key := ctx.Request.Header.Peek("Ordering-Key")
	if msg := checkOrderingKey(key); msg != "" {
		jsonError(ctx, fasthttp.StatusBadRequest, "invalid Ordering-Key "+strconv.QuoteToASCII(string(key[:min(len(key), 64)]))+": "+msg)
		return
	}
	// The tenant the event belongs to (tenant isolation): only its
	// subscriptions and the operator's may receive it. Absent: a platform
	// event. Present but empty is a mistake worth a 400, not a platform
	// event, since a producer meant to scope it.
	var tenant string
	if raw := ctx.Request.Header.Peek(HeaderTenant); raw != nil {
		if !validTenant(string(raw)) {
			jsonError(ctx, fasthttp.StatusBadRequest, "invalid "+HeaderTenant+" header "+strconv.QuoteToASCII(string(raw[:min(len(raw), 80)]))+
				": want a tenant id matching ^[a-z0-9][a-z0-9._-]{0,63}$, or no header for a platform event")
			return
		}
		tenant = in.tenants.get(raw)
	}
	traceParent, traceState := traceContext(&ctx.Request.Header)
	ct := ctx.Request.Header.ContentType()
	if len(ct) == 0 {
		ct = octetStream
	}
	// fasthttp has read the body already; past the gate it would be copied
	// and held until the committer gets to it.
	n := len(ctx.PostBody())
	gate := &in.gate
	if !gate.enter(n) {
		ctx.Response.Header.Set("Retry-After", "1")
		jsonError(ctx, fasthttp.StatusServiceUnavailable, "ingest is saturated; retry")
		return
	}
	defer gate.leave(n)
	ev := &queue.Event{
		ID:          idStr,
		Type:        in.types.get(typ),
		ContentType: in.contentTypes.get(ct),
		AcceptedAt:  s.opts.Now(),
		// string of an empty slice allocates nothing: no cost to an
		// event without them.
		OrderingKey: string(key),
		TraceParent: string(traceParent),
		TraceState:  string(traceState),
		Tenant:      tenant,
		// The one copy of the body: fasthttp reuses its buffer, and from
		// here every lane shares this slice.
		Body: bytes.Clone(ctx.PostBody()),
	}
	if ev.Body == nil {
		ev.Body = []byte{}
	}
	ingested(span, ev) // tracing.go: the ingest span's context when the producer sent none
	seq, dup, err := s.q.Append(ev)
	switch {
	case errors.Is(err, queue.ErrClosed):
		ctx.Response.Header.Set("Retry-After", "1")
		jsonError(ctx, fasthttp.StatusServiceUnavailable, "shutting down; retry")
		return
	case errors.Is(err, queue.ErrDiskFull), errors.Is(err, syscall.ENOSPC):
		// Nothing was written: the producer keeps the event. The guard
		// re-measures every 250 ms; a few seconds is a polite retry.
		ctx.Response.Header.Set("Retry-After", "5")
		jsonError(ctx, fasthttp.StatusInsufficientStorage, "event not accepted: "+err.Error())
		return
	case errors.Is(err, queue.ErrUnavailable):
		// Fleet mode: no quorum has the event, so it is not accepted (a
		// retry with the same id is deduplicated if it was stored late).
		ctx.Response.Header.Set("Retry-After", "1")
		jsonError(ctx, fasthttp.StatusServiceUnavailable, "event not accepted: "+err.Error())
		return
	case err != nil:
		s.log.Error("append", "err", err)
		jsonError(ctx, fasthttp.StatusInternalServerError, "event not accepted: internal error")
		return
	}
	status := fasthttp.StatusAccepted
	if dup {
		status = fasthttp.StatusOK
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	// id passed checkName, so it needs no JSON escaping.
	var buf [320]byte
	b := append(buf[:0], `{"id":"`...)
	b = append(b, idStr...)
	b = append(b, `","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	if dup {
		b = append(b, `,"duplicate":true`...)
	}
	b = append(b, "}\n"...)
	ctx.SetBody(b)
}

// Characters allowed after the first (a letter or digit). Types are what
// subscriptions filter on, so they match the config's type names; ids may
// also carry the characters of common id formats (emails, base64, paths).
const (
	typeChars = "._:-"
	idChars   = "._:@/+=-"
)

// checkName validates an event type or id: 1..maxLen bytes, a letter or
// digit, then letters, digits and the given punctuation. It returns what is
// wrong, or "".
func checkName(b []byte, maxLen int, punct string) string {
	switch {
	case len(b) == 0:
		return "empty"
	case len(b) > maxLen:
		return "longer than " + strconv.Itoa(maxLen) + " bytes"
	case !isAlnum(b[0]):
		return "must start with a letter or digit"
	}
	for i, c := range b {
		if !isAlnum(c) && strings.IndexByte(punct, c) < 0 {
			return "character " + strconv.QuoteRuneToASCII(rune(c)) + " at " + strconv.Itoa(i) + " not allowed (use letters, digits and " + punct + ")"
		}
	}
	return ""
}

// checkOrderingKey validates an Ordering-Key: at most maxOrderingKeyLen
// bytes of printable ASCII (space through '~'; no control characters, no
// bytes past ASCII). It returns what is wrong, or "". An empty header
// counts as none (as an empty Idempotency-Key does): fasthttp does not
// tell the two apart.
func checkOrderingKey(b []byte) string {
	if len(b) > maxOrderingKeyLen {
		return "longer than " + strconv.Itoa(maxOrderingKeyLen) + " bytes"
	}
	if i := notPrintable(b); i >= 0 {
		return "character " + strconv.QuoteRuneToASCII(rune(b[i])) + " at " + strconv.Itoa(i) + " not allowed (printable ASCII only)"
	}
	return ""
}

// notPrintable returns the index of the first byte of b that is not
// printable ASCII (space through '~'), or -1.
func notPrintable(b []byte) int {
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			return i
		}
	}
	return -1
}

// traceContext returns the request's W3C trace context (traceparent and
// tracestate headers) to keep with the event, or nils.
//
// An invalid traceparent is ignored, never refused: W3C Trace Context
// tells a receiver that cannot parse it to carry on as if there were
// none (and start a new trace), and an event must not be lost over its
// tracing. tracestate is kept only with a valid traceparent (the
// spec: without one it must not be parsed), when printable ASCII of at
// most maxTraceStateLen bytes; several tracestate headers are joined with
// commas, as the spec combines them. The result aliases the request's
// headers (or is a fresh join): the caller copies it.
func traceContext(h *fasthttp.RequestHeader) (parent, state []byte) {
	parent = h.Peek("traceparent")
	if len(parent) == 0 {
		return nil, nil // the common case: nothing, no allocation
	}
	if !validTraceParent(parent) {
		return nil, nil
	}
	state = h.Peek("tracestate")
	if len(state) == 0 {
		return parent, nil
	}
	if all := h.PeekAll("tracestate"); len(all) > 1 {
		state = bytes.Join(all, []byte(","))
	}
	if len(state) > maxTraceStateLen || notPrintable(state) >= 0 {
		return parent, nil
	}
	return parent, state
}

// validTraceParent reports whether b is a traceparent of version 00:
// "00-" 32 lowercase hex (trace id, not all zero) "-" 16 lowercase hex
// (parent id, not all zero) "-" 2 lowercase hex (flags), 55 bytes. Other
// versions are treated as invalid (ignored), which the spec allows of a
// receiver that knows only version 00.
func validTraceParent(b []byte) bool {
	if len(b) != 55 || b[0] != '0' || b[1] != '0' || b[2] != '-' || b[35] != '-' || b[52] != '-' {
		return false
	}
	return lowerHex(b[3:35]) && lowerHex(b[36:52]) && lowerHex(b[53:55]) &&
		!allZero(b[3:35]) && !allZero(b[36:52])
}

func lowerHex(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != '0' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

var (
	contentLengthName    = []byte("Content-Length")
	transferEncodingName = []byte("Transfer-Encoding")
)

// framingConflict reports whether raw, a request's header lines as
// received, has both a Content-Length and a Transfer-Encoding header.
// fasthttp keeps only the framing it chose, so the raw lines are the one
// place both still show.
func framingConflict(raw []byte) bool {
	var cl, te bool
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		name, _, ok := bytes.Cut(line, []byte{':'})
		if !ok {
			continue
		}
		cl = cl || bytes.EqualFold(name, contentLengthName)
		te = te || bytes.EqualFold(name, transferEncodingName)
	}
	return cl && te
}

func jsonError(ctx *fasthttp.RequestCtx, status int, msg string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	var buf [512]byte
	b := append(buf[:0], `{"error":`...)
	b = strconv.AppendQuote(b, msg)
	b = append(b, "}\n"...)
	ctx.SetBody(b)
}

// fasthttpLogger sends fasthttp's per-connection complaints (malformed or
// oversized requests, which the client already got an answer for) to debug.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug("ingest connection", "detail", fmt.Sprintf(format, args...))
}

// freshConns holds the ingest connections that have not sent a request yet.
//
// fasthttp's shutdown closes idle keep-alive connections at once, but a
// connection that never sent anything counts as idle only five seconds
// after it opened (as in net/http). HTTP clients dial spare connections
// they may never use (Go's Transport does when a request finds no idle
// connection at that instant), and one such connection held a drain for
// the whole 2 s bound of the ingest shutdown, which then failed: sluice
// exited 1 after a clean drain. Close shuts them instead. Nothing is lost:
// while draining every request is answered 503, so a connection whose
// first request was on its way gets a reset rather than a 503, and the
// producer retries either way.
type freshConns struct {
	mu sync.RWMutex
	m  map[net.Conn]struct{}
	// n is len(m), kept so that used can see without a lock that no
	// connection is fresh: the common case under load, where a producer's
	// pool was dialled long ago and every request would otherwise take
	// the shared lock, one cache line for every core.
	n atomic.Int64
}

// track is the ingest server's ConnState hook. fasthttp calls it with
// StateActive on every request, not once per connection: a connection
// that is no longer fresh costs an atomic load while no connection is
// fresh, and a shared read lock otherwise, never the write lock.
func (f *freshConns) track(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		f.opened(c)
	case fasthttp.StateIdle:
		// Only a connection that was active goes idle: not in m.
	default:
		f.used(c)
	}
}

// trackHTTP is the same hook for the admin API's net/http server, whose
// Shutdown also waits (5 s) for connections that never sent a request.
func (f *freshConns) trackHTTP(c net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		f.opened(c)
	case http.StateIdle:
	default:
		f.used(c)
	}
}

func (f *freshConns) opened(c net.Conn) {
	f.mu.Lock()
	if f.m == nil {
		f.m = make(map[net.Conn]struct{})
	}
	f.m[c] = struct{}{}
	f.n.Store(int64(len(f.m)))
	f.mu.Unlock()
}

// used forgets c. fasthttp reports a connection's StateNew (opened) before
// serving it, so while c is fresh n is at least 1 here.
func (f *freshConns) used(c net.Conn) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.RLock()
	_, fresh := f.m[c]
	f.mu.RUnlock()
	if fresh {
		f.mu.Lock()
		delete(f.m, c)
		f.n.Store(int64(len(f.m)))
		f.mu.Unlock()
	}
}

// closeAll closes every connection that has not sent a request.
func (f *freshConns) closeAll() {
	f.mu.Lock()
	for c := range f.m {
		c.Close()
		delete(f.m, c)
	}
	f.n.Store(0)
	f.mu.Unlock()
}

// shutdownClosingFresh runs a server's graceful shutdown (it closes the
// listeners, finishes requests in progress and closes idle connections);
// meanwhile the connections that never sent a request are closed here,
// including any accepted just before the listeners closed. A client's
// spare connection must not hold up a drain.
func shutdownClosingFresh(ctx context.Context, shutdown func(context.Context) error, fresh *freshConns) error {
	done := make(chan error, 1)
	go func() { done <- shutdown(ctx) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		fresh.closeAll()
		select {
		case err := <-done:
			return err
		case <-tick.C:
		}
	}
}
