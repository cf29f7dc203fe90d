// Package ingest is the producer-facing server: POST /v1/events/{type}
// validated, admitted through a gate sized from the memory budget,
// appended to the log, and answered with the event's id and seq; with its
// metrics (sluice_ingest_*) and its span.
//
// It promises: 202 only once the log has the event (as durable as the
// log's Append makes it), 200 with the original id and seq for a repeated
// Idempotency-Key, a 4xx naming the bad input (and nothing appended) for
// a malformed request, and 503 with Retry-After, never a hang, while the
// log is not open yet, is saturated or is closing. It knows the log only
// as an Appender and nothing of subscriptions or delivery.
package ingest

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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/freshconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

var (
	eventsPath     = []byte("/v1/events/")
	collectionPath = []byte("/v1/events")
	octetStream    = []byte("application/octet-stream")
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

// Limits protect ingest from misbehaving producers: a slow or stuck
// client, oversized headers, connection floods. A zero field takes its
// default (the Default* constants below, explained there).
type Limits struct {
	HeaderTimeout  time.Duration // request line and headers, from the first byte
	BodyTimeout    time.Duration // the body, once the headers are in
	IdleTimeout    time.Duration // a keep-alive connection between requests
	MaxHeaderBytes int           // request line plus headers; 431 past it
	MaxConnections int           // open connections, idle ones included
	MaxBatchEvents int           // events in one batch (batch.go); 413 past it
	MaxBatchBytes  int           // a batch's body; 413 past it
}

// Defaults of Limits.
const (
	DefaultHeaderTimeout  = 10 * time.Second
	DefaultBodyTimeout    = 30 * time.Second
	DefaultIdleTimeout    = 2 * time.Minute
	DefaultMaxHeaderBytes = 16 << 10
	DefaultMaxConnections = 4096
	// A batch of 1,000 events holds all but the largest producers' bursts
	// in one request, and its answer (one line per event) stays small;
	// 4 MiB is fasthttp's default body bound and 4,000 events of 1 KiB.
	DefaultMaxBatchEvents = 1000
	DefaultMaxBatchBytes  = 4 << 20
)

// The limits in force when Limits leaves them zero (tests lower them
// through Limits and Config).
const (
	// ingestHeaderTimeout bounds how long a request's line and headers may
	// take to arrive, from the request's first byte; a new connection that
	// sends nothing is closed after the same time. A client trickling its
	// headers a byte at a time (slowloris) is answered 408 and closed: the
	// deadline does not move as bytes arrive. A local producer sends its
	// headers in one write; 10 s is generous even for a stalled host
	// (nginx's client_header_timeout is 60 s, over the internet).
	ingestHeaderTimeout = DefaultHeaderTimeout
	// ingestBodyTimeout bounds reading the body once the headers are in:
	// 1 MiB (the default max_body_bytes) in 30 s is about 35 KB/s, far
	// below what any live producer manages over loopback.
	ingestBodyTimeout = DefaultBodyTimeout
	// ingestMaxHeaderBytes bounds the request line plus headers (fasthttp's
	// per-connection read buffer). The contract's headers (Content-Type,
	// Idempotency-Key up to 200 bytes, Host) take a few hundred bytes;
	// 16 KiB leaves room for tracing and auth headers that proxies add.
	// Past it the answer is 431 and the connection is closed.
	ingestMaxHeaderBytes = DefaultMaxHeaderBytes
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
	ingestMaxConns = DefaultMaxConnections
	// ingestIdleTimeout closes keep-alive connections idle this long. It is
	// longer than the idle timeout of common producer clients (Go's
	// http.Transport: 90 s), so the client, not the sidecar, usually closes
	// first and never sends on a connection the sidecar just closed.
	ingestIdleTimeout = DefaultIdleTimeout
	// ingestMaxPendingEvents and Config.MaxPendingBytes bound the appends
	// waiting on the group committer, so a burst far above the log's
	// capacity meets backpressure (503 with Retry-After) instead of holding
	// a copy of every body in memory. 4096 matches the committer's request
	// queue (4 batches of 1024): more waiters would only wait longer. The
	// bytes are the memory budget's gate share (8 MiB of the default
	// 64 MiB: 4096 events of 2 KiB, or 8 at the default 1 MiB limit); a single
	// event larger than that is still admitted when nothing else waits, so
	// max_body_bytes above it keeps working.
	ingestMaxPendingEvents = 4096
)

// HeaderTenant is the ingest request header that says which tenant an
// event belongs to (the tenant rule, docs/security.md). An event posted without it is
// a platform event: the operator's subscriptions receive it, a tenant's
// only when the operator shares its type with the tenant
// (a tenant's shared types). The value is a tenant id, as
// policy.ValidTenant checks.
const HeaderTenant = "Sluice-Tenant"

// Appender is what ingest needs of the log.
type Appender interface {
	// Append makes ev durable and returns its seq, or the seq of the
	// event already stored under its id (dup).
	Append(ev *queue.Event) (seq uint64, dup bool, err error)
	// AppendBatch appends a batch's events together, answering each in
	// res (queue.Log.AppendBatch).
	AppendBatch(evs []*queue.Event, res []queue.AppendResult)
}

// Config configures a Server. Zero fields take the defaults above.
type Config struct {
	Limits       Limits
	MaxBodyBytes int
	// MaxPendingEvents and MaxPendingBytes bound the appends admitted at
	// once (the gate); ingestMaxPendingEvents and the memory budget's
	// gate share are the sidecar's.
	MaxPendingEvents int
	MaxPendingBytes  int64
	Now              func() time.Time
	Logger           *slog.Logger
	Registry         prometheus.Registerer
	// Tracer makes the ingest spans; nil makes none.
	Tracer trace.Tracer
	// Reserved reports the event types producers may not post (the
	// operational webhook's); nil reserves none. It takes the request's
	// bytes: a string made of them to call through a func value would be
	// an allocation per event (measured: +1 of about 23).
	Reserved func(typ []byte) bool
}

// Server serves ingest on one listener.
type Server struct {
	cfg   Config
	log   *slog.Logger
	m     *metrics
	in    ingestState
	batch batchLimits // batch.go
	http  *fasthttp.Server
	fresh freshconn.Set // connections that have not sent a request yet

	// store is set once, by Start, before serving is; a request reads it
	// only after seeing serving.
	store    Appender
	serving  atomic.Bool
	draining atomic.Bool
}

// New returns a Server that answers 503 "starting" until Start; its
// metrics are registered with c.Registry.
func New(c Config) *Server {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	s := &Server{cfg: c, log: c.Logger, m: newMetrics(c.Registry)}
	s.in.gate = ingestGate{maxEvents: int64(cmp.Or(c.MaxPendingEvents, ingestMaxPendingEvents)), maxBytes: c.MaxPendingBytes}
	if s.in.gate.maxBytes <= 0 {
		s.in.gate.maxBytes = 1 << 62 // no byte bound: the event count still holds
	}
	lim := c.Limits
	s.batch = batchLimits{events: cmp.Or(lim.MaxBatchEvents, DefaultMaxBatchEvents), bytes: cmp.Or(lim.MaxBatchBytes, DefaultMaxBatchBytes)}
	headerTimeout := cmp.Or(lim.HeaderTimeout, ingestHeaderTimeout)
	bodyTimeout := cmp.Or(lim.BodyTimeout, ingestBodyTimeout)
	maxHeader := cmp.Or(lim.MaxHeaderBytes, ingestMaxHeaderBytes)
	s.http = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if !s.serving.Load() {
				ctx.Response.Header.Set("Retry-After", "1")
				jsonError(ctx, fasthttp.StatusServiceUnavailable, "starting: connecting to the log; retry")
				return
			}
			s.handle(ctx)
		},
		Name:               "sluice",
		MaxRequestBodySize: c.MaxBodyBytes,
		// ReadTimeout covers the request line and headers; HeaderReceived
		// then gives the body its own deadline, and a batch its own bound.
		ReadTimeout: headerTimeout,
		HeaderReceived: func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
			max, _ := s.bodyLimit(h) // batch.go
			return fasthttp.RequestConfig{ReadTimeout: bodyTimeout, MaxRequestBodySize: max}
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
		ConnState:             s.fresh.Track,
		Logger:                fasthttpLogger{s.log},
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			s.m.rejected.Inc()
			// The headers are in whenever the body was too large.
			maxBody, bodyKey := s.bodyLimit(&ctx.Request.Header)
			status, msg := readErrorStatus(err, maxBody, bodyKey, maxHeader, headerTimeout, bodyTimeout)
			s.log.Debug("ingest request rejected", "status", status, "err", err)
			jsonError(ctx, status, msg)
		},
	}
	return s
}

// Serve serves ln until Shutdown; its error after Drain is not reported.
func (s *Server) Serve(ln net.Listener) error {
	err := s.http.Serve(ln)
	if s.draining.Load() {
		return nil
	}
	return err
}

// Start makes requests append to store from now on.
func (s *Server) Start(store Appender) {
	s.store = store
	s.serving.Store(true)
}

// Drain makes every request from now on answer 503 with Retry-After.
func (s *Server) Drain() { s.draining.Store(true) }

// Shutdown drains, stops taking connections, lets the requests inside
// Append finish and closes the connections, those that never sent a
// request at once, within ctx. fasthttp closes only the listeners its
// Serve has registered: the caller closes its listener too.
func (s *Server) Shutdown(ctx context.Context) error {
	s.Drain()
	return freshconn.Shutdown(ctx, s.http.ShutdownWithContext, &s.fresh)
}

// OpenConnections is how many ingest connections are open.
func (s *Server) OpenConnections() int32 { return s.http.GetOpenConnectionsCount() }

// readErrorStatus maps an error fasthttp met while reading a request (the
// answer goes out and the connection is closed) to a status and a message
// naming the problem; maxBody is the request's bound and bodyKey the
// setting it comes from.
func readErrorStatus(err error, maxBody int, bodyKey string, maxHeader int, headerTimeout, bodyTimeout time.Duration) (int, string) {
	var (
		small   *fasthttp.ErrSmallBuffer
		broken  fasthttp.ErrBrokenChunk
		timeout interface{ Timeout() bool }
	)
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return fasthttp.StatusRequestEntityTooLarge, "body exceeds " + bodyKey + " (" + strconv.Itoa(maxBody) + " bytes)"
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

// enter admits the append of k events of n body bytes together, or
// reports false when the gate is full. A batch (or an event) larger than
// either bound is admitted when it is alone: a bound below max_body_bytes
// or ingest.max_batch_events would otherwise refuse it for ever.
func (g *ingestGate) enter(k, n int) bool {
	if e := g.events.Add(int64(k)); e > g.maxEvents && e != int64(k) {
		g.events.Add(-int64(k))
		return false
	}
	if b := g.bytes.Add(int64(n)); b > g.maxBytes && b != int64(n) {
		g.bytes.Add(-int64(n))
		g.events.Add(-int64(k))
		return false
	}
	return true
}

// leave releases what enter(k, n) admitted.
func (g *ingestGate) leave(k, n int) {
	g.bytes.Add(-int64(n))
	g.events.Add(-int64(k))
}

// handle implements POST /v1/events/{type}.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	span := startIngest(s.cfg.Tracer, &ctx.Request.Header) // tracing.go; nil with tracing off
	s.ingestEvent(ctx, &s.in, span)
	m := s.m
	switch code := ctx.Response.StatusCode(); {
	case ctx.UserValue(batchCounted{}) != nil:
		// A batch counted its events itself (batch.go).
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

// admit answers a request that cannot be an event whatever its body (a
// method other than POST, ambiguous framing, a server shutting down) and
// reports whether the request goes on.
func (s *Server) admit(ctx *fasthttp.RequestCtx) bool {
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		jsonError(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed: use POST")
		return false
	}
	if framingConflict(ctx.Request.Header.RawHeaders()) {
		// fasthttp would read the body as chunked and close the
		// connection; a proxy in front may have framed it by
		// Content-Length, and the bytes in between would be a second,
		// smuggled request to one of the two. RFC 9112 §6.3 lets a server
		// refuse such a request; nothing honest sends it.
		ctx.SetConnectionClose()
		jsonError(ctx, fasthttp.StatusBadRequest, "request has both Content-Length and Transfer-Encoding headers: send one (RFC 9112 §6.3)")
		return false
	}
	if s.draining.Load() {
		ctx.Response.Header.Set("Retry-After", "1")
		jsonError(ctx, fasthttp.StatusServiceUnavailable, "shutting down; retry")
		return false
	}
	return true
}

func (s *Server) ingestEvent(ctx *fasthttp.RequestCtx, in *ingestState, span trace.Span) {
	path := ctx.Path()
	collection := bytes.Equal(path, collectionPath)
	typ, ok := bytes.CutPrefix(path, eventsPath)
	if !ok && !collection {
		jsonError(ctx, fasthttp.StatusNotFound, "not found: POST /v1/events/{type}, or POST /v1/events for a CloudEvent or a batch")
		return
	}
	if !s.admit(ctx) {
		return
	}
	if collection {
		s.ingestCollection(ctx, in, span) // collection.go
		return
	}
	if msg := s.typeProblem(typ); msg != "" {
		jsonError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	if len(ctx.Request.Header.Peek(ceSpecVersion)) > 0 {
		s.ingestCloudEvent(ctx, in, span, typ) // a binary mode CloudEvent, of this type
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
	hf, ok := s.headerFields(ctx, in)
	if !ok {
		return
	}
	ct := ctx.Request.Header.ContentType()
	if len(ct) == 0 {
		ct = octetStream
	}
	ev := &queue.Event{
		ID:          idStr,
		Type:        in.types.get(typ),
		ContentType: in.contentTypes.get(ct),
		// string of an empty slice allocates nothing: no cost to an
		// event without them.
		OrderingKey: string(hf.key),
		TraceParent: string(hf.traceParent),
		TraceState:  string(hf.traceState),
		Tenant:      hf.tenant,
	}
	s.appendEvent(ctx, in, span, ev, ctx.PostBody())
}

// headerFields is what an event takes from its request's headers besides
// its id and type.
type headerFields struct {
	key                     []byte // Ordering-Key
	tenant                  string
	traceParent, traceState []byte
}

// headerFields reads and checks the request's Ordering-Key, Sluice-Tenant
// and trace context; on bad input it answers 400 naming the header and
// reports false.
func (s *Server) headerFields(ctx *fasthttp.RequestCtx, in *ingestState) (headerFields, bool) {
	var hf headerFields
	hf.key = ctx.Request.Header.Peek("Ordering-Key")
	if msg := checkOrderingKey(hf.key); msg != "" {
		jsonError(ctx, fasthttp.StatusBadRequest, "invalid Ordering-Key "+strconv.QuoteToASCII(string(hf.key[:min(len(hf.key), 64)]))+": "+msg)
		return hf, false
	}
	// The tenant the event belongs to (tenant isolation): only its
	// subscriptions and the operator's may receive it. Absent: a platform
	// event. Present but empty is a mistake worth a 400, not a platform
	// event, since a producer meant to scope it.
	if raw := ctx.Request.Header.Peek(HeaderTenant); raw != nil {
		if !policy.ValidTenant(string(raw)) {
			jsonError(ctx, fasthttp.StatusBadRequest, "invalid "+HeaderTenant+" header "+strconv.QuoteToASCII(string(raw[:min(len(raw), 80)]))+
				": want a tenant id matching ^[a-z0-9][a-z0-9._-]{0,63}$, or no header for a platform event")
			return hf, false
		}
		hf.tenant = in.tenants.get(raw)
	}
	hf.traceParent, hf.traceState = traceContext(&ctx.Request.Header)
	return hf, true
}

// appendEvent appends ev with a copy of body as its Body, through the
// gate, and answers the request: 202 with the id and seq, 200 for a
// duplicate, or the log's refusal.
func (s *Server) appendEvent(ctx *fasthttp.RequestCtx, in *ingestState, span trace.Span, ev *queue.Event, body []byte) {
	// fasthttp has read the body already; past the gate it would be copied
	// and held until the committer gets to it.
	n := len(body)
	gate := &in.gate
	if !gate.enter(1, n) {
		ctx.Response.Header.Set("Retry-After", "1")
		jsonError(ctx, fasthttp.StatusServiceUnavailable, "ingest is saturated; retry")
		return
	}
	defer gate.leave(1, n)
	ev.AcceptedAt = s.cfg.Now()
	// The one copy of the body: fasthttp reuses its buffer, and from here
	// every lane shares this slice.
	ev.Body = bytes.Clone(body)
	if ev.Body == nil {
		ev.Body = []byte{}
	}
	ingested(span, ev) // tracing.go: the ingest span's context when the producer sent none
	seq, dup, err := s.store.Append(ev)
	if status, msg, retry := appendRefusal(err); status != 0 {
		if err != nil && status == fasthttp.StatusInternalServerError {
			s.log.Error("append", "err", err)
		}
		if retry != "" {
			ctx.Response.Header.Set("Retry-After", retry)
		}
		jsonError(ctx, status, msg)
		return
	}
	status := fasthttp.StatusAccepted
	if dup {
		status = fasthttp.StatusOK
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	// Ids passed checkName, or are a CloudEvent's key: no JSON escaping.
	var buf [320]byte
	b := append(buf[:0], `{"id":"`...)
	b = append(b, ev.ID...)
	b = append(b, `","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	if dup {
		b = append(b, `,"duplicate":true`...)
	}
	b = append(b, "}\n"...)
	ctx.SetBody(b)
}

// typeProblem says what is wrong with an event type a producer posted
// (its characters, its length, a type reserved for the operational
// webhook), or "".
func (s *Server) typeProblem(typ []byte) string {
	if msg := checkName(typ, maxTypeLen, typeChars); msg != "" {
		return "invalid event type " + strconv.Quote(string(typ)) + ": " + msg
	}
	if s.cfg.Reserved != nil && s.cfg.Reserved(typ) {
		// Always, configured or not: the operational webhook's types.
		return "event type " + strconv.Quote(string(typ)) + " is reserved for sluice's operational webhook"
	}
	return ""
}

// appendRefusal maps an Append error to the answer: its status (0 for
// none), message and Retry-After ("" for none).
func appendRefusal(err error) (status int, msg, retryAfter string) {
	switch {
	case err == nil:
		return 0, "", ""
	case errors.Is(err, queue.ErrClosed):
		return fasthttp.StatusServiceUnavailable, "shutting down; retry", "1"
	case errors.Is(err, queue.ErrDiskFull), errors.Is(err, syscall.ENOSPC):
		// Nothing was written: the producer keeps the event. The guard
		// re-measures every 250 ms; a few seconds is a polite retry.
		return fasthttp.StatusInsufficientStorage, "event not accepted: " + err.Error(), "5"
	case errors.Is(err, queue.ErrUnavailable):
		// Fleet mode: no quorum has the event, so it is not accepted (a
		// retry with the same id is deduplicated if it was stored late).
		return fasthttp.StatusServiceUnavailable, "event not accepted: " + err.Error(), "1"
	}
	return fasthttp.StatusInternalServerError, "event not accepted: internal error", ""
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
