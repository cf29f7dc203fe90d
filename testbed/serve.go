package testbed

// The request path: webhook requests by mode and hook, black holes, the
// control endpoints, and the listener that lets Close abort held
// connections.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/signing"
)

// path returns the state of path, the mode it is in, and what releases its
// black holes now.
func (s *Server) path(path []byte) (*pathState, Mode, context.Context) {
	s.mu.RLock()
	ps := s.paths[string(path)]
	mode, ok := s.modes[string(path)]
	if !ok {
		mode = s.modes[""]
	}
	release := s.release
	s.mu.RUnlock()
	if ps == nil {
		s.mu.Lock()
		if ps = s.paths[string(path)]; ps == nil {
			ps = &pathState{}
			s.paths[string(path)] = ps
		}
		s.mu.Unlock()
	}
	return ps, mode, release
}

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	switch p := ctx.Path(); string(p) {
	case "/_stats":
		s.serveStats(ctx)
	case "/_ids":
		s.serveIDs(ctx)
	case "/_mode":
		s.serveMode(ctx)
	default:
		s.serveWebhook(ctx, p)
	}
}

var (
	bodyOK           = []byte("ok\n")
	bodyFail         = []byte("fail\n")
	bodyRateLimited  = []byte("rate limited\n")
	bodyUnsigned     = []byte("missing webhook-signature\n")
	bodyBadSignature = []byte("bad signature\n")
	bodyClosing      = []byte("shutting down\n")
	bodyUnknownMode  = []byte("unknown mode\n")
)

func (s *Server) serveWebhook(ctx *fasthttp.RequestCtx, path []byte) {
	var at time.Time
	if s.opts.Hook != nil {
		at = time.Now()
	}
	h := &ctx.Request.Header
	id := h.Peek(signing.HeaderID)
	sig := h.Peek(signing.HeaderSignature)

	// Verify first: it is the only CPU-heavy step.
	unsigned, badSig := len(sig) == 0, false
	var verifyErr error
	if !unsigned && len(s.opts.Secrets) > 0 {
		verifyErr = signing.Verify(s.opts.Secrets, string(id), string(h.Peek(signing.HeaderTimestamp)),
			string(sig), ctx.PostBody(), time.Now(), signing.DefaultTolerance)
		badSig = verifyErr != nil
	}

	ps, mode, release := s.path(path)
	ps.settle()
	n := ps.requests.Add(1)
	s.requests.Add(1)
	for in := ps.inFlight.Add(1); ; {
		m := ps.maxInFlight.Load()
		if in <= m || ps.maxInFlight.CompareAndSwap(m, in) {
			break
		}
	}
	if unsigned {
		ps.unsigned.Add(1)
	}
	if badSig {
		ps.badSignatures.Add(1)
	}
	if a := h.Peek("X-Attempt"); len(a) > 0 {
		ps.mu.Lock()
		if ps.attempts == nil {
			ps.attempts = make(map[string]int64)
		}
		ps.attempts[string(a)]++
		ps.mu.Unlock()
	}
	s.notify()

	if log := s.log; log.Enabled(context.Background(), slog.LevelDebug) {
		log.Debug("testbed request", "path", string(path), "webhook_id", string(id), "mode", string(mode), "n", n)
	}

	var status int
	var body []byte
	switch {
	case badSig:
		s.log.Warn("testbed bad signature", "path", string(path), "webhook_id", string(id), "err", verifyErr)
		status, body = fasthttp.StatusUnauthorized, bodyBadSignature
	case unsigned && len(s.opts.Secrets) > 0:
		status, body = fasthttp.StatusUnauthorized, bodyUnsigned
	default:
		switch mode {
		case ModeOK:
			status, body = fasthttp.StatusOK, bodyOK
		case ModeFail:
			status, body = fasthttp.StatusInternalServerError, bodyFail
		case ModeFlaky:
			if n%2 == 1 {
				status, body = fasthttp.StatusInternalServerError, bodyFail
			} else {
				status, body = fasthttp.StatusOK, bodyOK
			}
		case ModeRateLimit:
			status, body = fasthttp.StatusTooManyRequests, bodyRateLimited
		case ModeSlow:
			t := time.NewTimer(s.opts.Delay)
			select {
			case <-t.C:
				status, body = fasthttp.StatusOK, bodyOK
			case <-s.closing.Done():
				t.Stop()
				status, body = fasthttp.StatusServiceUnavailable, bodyClosing
			}
		case ModeBlackhole:
			status = 0
		default:
			status, body = fasthttp.StatusInternalServerError, bodyUnknownMode
		}
	}
	if s.opts.Hook != nil {
		if got := s.opts.Hook(Request{ctx: ctx, path: path, n: n, at: at}, status); got != status {
			status, body = got, nil
		}
	}
	if status == 0 {
		// Counted here rather than when the hijack handler starts, and
		// Wait callers woken again: InFlight was counted before the
		// answer was known, so one who saw it may not yet see Holding.
		s.held.Add(1)
		s.holding.Add(1)
		s.notify()
		// Take the connection from fasthttp without answering; the
		// hijack handler runs in its own goroutine after this returns.
		ctx.HijackSetNoResponse(true)
		var held string
		if s.opts.HangUp != nil {
			held = string(path) // path aliases the request, which fasthttp reuses
		}
		h := &heldConn{conn: ctx.Conn()} // the socket itself: the hijacked conn may wrap it in a buffered reader
		ps.mu.Lock()
		if ps.held == nil {
			ps.held = make(map[*heldConn]struct{})
		}
		ps.held[h] = struct{}{}
		ps.nheld.Store(int64(len(ps.held)))
		ps.mu.Unlock()
		ctx.Hijack(func(c net.Conn) {
			s.blackhole(c, release)
			if late := holderLate.Load(); late != nil {
				(*late)()
			}
			if s.opts.HangUp != nil {
				s.opts.HangUp(held, n, time.Now())
			}
			ps.mu.Lock()
			delete(ps.held, h)
			ps.nheld.Store(int64(len(ps.held)))
			ps.mu.Unlock()
			s.finishHeld(ps, h)
		})
		return
	}
	if status == fasthttp.StatusTooManyRequests {
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, s.opts.RetryAfter)
	}
	ctx.SetStatusCode(status)
	if !s.opts.Lean {
		ctx.SetBody(body)
	}
	s.finish(ps, status, id)
}

// blackhole holds c until the client disconnects (or sends something that
// fails to read), release ends, or MaxHold passes, discarding anything the
// client sends.
func (s *Server) blackhole(c net.Conn, release context.Context) {
	defer s.holding.Add(-1)
	if s.opts.MaxHold > 0 {
		_ = c.SetReadDeadline(time.Now().Add(s.opts.MaxHold))
	}
	released := make(chan struct{})
	stop := context.AfterFunc(release, func() {
		defer close(released)
		// fasthttp's hijacked conn ignores Close (it closes the conn
		// itself after we return); a past deadline unblocks the read.
		_ = c.SetReadDeadline(time.Unix(1, 0))
	})
	_, err := io.Copy(io.Discard, c)
	if !stop() {
		// Release raced with the client's disconnect: c must stay valid
		// until the deadline call is done, fasthttp recycles it after we
		// return.
		<-released
	}
	// A deadline (ours) reads as a timeout; the client closing, as EOF
	// (nil here) or a reset.
	var ne net.Error
	if err == nil || !(errors.As(err, &ne) && ne.Timeout()) {
		s.hangUps.Add(1)
	}
}

// holderLate, when a test sets it, runs in the goroutine holding a
// black-holed request once the hold is over and before it is counted
// over: a holder that runs late, as on a busy machine.
var holderLate atomic.Pointer[func()]

// finishHeld records the end of a black-holed request.
func (s *Server) finishHeld(ps *pathState, h *heldConn) {
	ps.end(h)
	s.notify()
}

// finish records the answer to one request.
func (s *Server) finish(ps *pathState, status int, id []byte) {
	ok := status >= 200 && status < 300
	ps.mu.Lock()
	if ps.statuses == nil {
		ps.statuses = make(map[int]int64)
	}
	ps.statuses[status]++
	if ok {
		ps.accepted.Add(1)
		if len(id) > 0 && !s.opts.Lean {
			if _, dup := ps.seen[string(id)]; dup {
				ps.duplicates++
			} else {
				if ps.seen == nil {
					ps.seen = make(map[string]struct{})
				}
				k := string(id)
				ps.seen[k] = struct{}{}
				ps.ids = append(ps.ids, k)
				ps.unique++
			}
		}
	}
	ps.mu.Unlock()
	switch {
	case ok:
		s.accepted.Add(1)
	case status >= 500:
		s.failed.Add(1)
	}
	ps.inFlight.Add(-1)
	s.notify()
}

func (s *Server) serveStats(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		methodNotAllowed(ctx, "GET, HEAD")
		return
	}
	b, err := json.Marshal(s.Stats())
	if err != nil {
		ctx.Error("encode stats: "+err.Error(), fasthttp.StatusInternalServerError)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '\n'))
}

func (s *Server) serveIDs(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		methodNotAllowed(ctx, "GET, HEAD")
		return
	}
	args := ctx.QueryArgs()
	if !args.Has("path") {
		ctx.Error("missing query parameter path\n", fasthttp.StatusBadRequest)
		return
	}
	ctx.SetContentType("text/plain; charset=utf-8")
	var b []byte
	for _, id := range s.IDs(string(args.Peek("path"))) {
		b = append(append(b, id...), '\n')
	}
	ctx.SetBody(b)
}

func (s *Server) serveMode(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	args := ctx.QueryArgs()
	m, err := ParseMode(string(args.Peek("mode")))
	if err != nil {
		ctx.Error(err.Error()+"\n", fasthttp.StatusBadRequest)
		return
	}
	path := string(args.Peek("path"))
	s.SetMode(path, m)
	ctx.SetContentType("text/plain; charset=utf-8")
	if path == "" {
		path = "default"
	}
	ctx.SetBodyString(path + ": " + string(m) + "\n")
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set(fasthttp.HeaderAllow, allow)
	ctx.Error("method not allowed\n", fasthttp.StatusMethodNotAllowed)
}

// trackingListener records every accepted connection until fasthttp closes
// it, so that Close can force connections shut and then wait for fasthttp
// (and hijack handlers) to be done with all of them. fasthttp's own
// Shutdown neither waits for hijacked connections nor closes busy ones.
type trackingListener struct {
	net.Listener
	wg    sync.WaitGroup // one per connection not yet closed by fasthttp
	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	l.wg.Add(1)
	return tc, nil
}

// abort closes the sockets of all connections fasthttp still holds; fasthttp
// then sees errors, finishes and calls Close on each.
func (l *trackingListener) abort() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		_ = c.Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	l    *trackingListener
	once sync.Once
}

// NetConn is the connection accepted, for closedByPeer.
func (c *trackedConn) NetConn() net.Conn { return c.Conn }

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		c.l.wg.Done()
	})
	return err
}

// fasthttpLogger sends fasthttp's own messages (mostly connection errors) to
// slog at debug level.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	if f.l.Enabled(context.Background(), slog.LevelDebug) {
		f.l.Debug("fasthttp: " + fmt.Sprintf(format, args...))
	}
}

var _ fasthttp.Logger = fasthttpLogger{}
