package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/queue"
)

var eventsPath = []byte("/v1/events/")

// Limits of the ingest contract. Event types and ids appear in headers and
// in the log's keys, so they are short and plain.
const (
	maxTypeLen = 128
	maxIDLen   = 200
)

func (s *Server) newIngestServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:               s.handleIngest,
		Name:                  "sluice",
		MaxRequestBodySize:    s.opts.MaxBodyBytes,
		ReadTimeout:           30 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           2 * time.Minute,
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		CloseOnShutdown:       true,
		Logger:                fasthttpLogger{s.log},
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			s.d.m.rejected.Inc()
			if errors.Is(err, fasthttp.ErrBodyTooLarge) {
				jsonError(ctx, fasthttp.StatusRequestEntityTooLarge, "body exceeds max_body_bytes ("+strconv.Itoa(s.opts.MaxBodyBytes)+" bytes)")
				return
			}
			jsonError(ctx, fasthttp.StatusBadRequest, "malformed request")
		},
	}
}

// handleIngest implements POST /v1/events/{type} (DESIGN.md §4).
func (s *Server) handleIngest(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	s.ingestEvent(ctx)
	m := s.d.m
	switch code := ctx.Response.StatusCode(); {
	case code == fasthttp.StatusAccepted:
		m.accepted.Inc()
	case code == fasthttp.StatusOK:
		m.duplicate.Inc()
	default:
		m.rejected.Inc()
	}
	m.ingestDur.Observe(time.Since(start).Seconds())
}

func (s *Server) ingestEvent(ctx *fasthttp.RequestCtx) {
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
	if s.draining.Load() {
		ctx.Response.Header.Set("Retry-After", "1")
		jsonError(ctx, fasthttp.StatusServiceUnavailable, "shutting down; retry")
		return
	}
	if msg := checkName(typ, maxTypeLen, typeChars); msg != "" {
		jsonError(ctx, fasthttp.StatusBadRequest, "invalid event type "+strconv.Quote(string(typ))+": "+msg)
		return
	}
	id := ctx.Request.Header.Peek("Idempotency-Key")
	var idStr string
	if len(id) == 0 {
		idStr = ulid.Make().String()
	} else {
		if msg := checkName(id, maxIDLen, idChars); msg != "" {
			jsonError(ctx, fasthttp.StatusBadRequest, "invalid Idempotency-Key "+strconv.QuoteToASCII(string(id[:min(len(id), 64)]))+": "+msg)
			return
		}
		idStr = string(id)
	}
	ct := ctx.Request.Header.ContentType()
	if len(ct) == 0 {
		ct = []byte("application/octet-stream")
	}
	ev := &queue.Event{
		ID:          idStr,
		Type:        string(typ),
		ContentType: string(ct),
		AcceptedAt:  s.opts.Now(),
		// The one copy of the body: fasthttp reuses its buffer, and from
		// here every lane shares this slice.
		Body: bytes.Clone(ctx.PostBody()),
	}
	if ev.Body == nil {
		ev.Body = []byte{}
	}
	seq, dup, err := s.q.Append(ev)
	switch {
	case errors.Is(err, queue.ErrClosed):
		ctx.Response.Header.Set("Retry-After", "1")
		jsonError(ctx, fasthttp.StatusServiceUnavailable, "shutting down; retry")
		return
	case errors.Is(err, syscall.ENOSPC):
		jsonError(ctx, fasthttp.StatusInsufficientStorage, "log is out of disk space; event not accepted")
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

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
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
