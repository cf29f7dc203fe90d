// Package testbed is the local webhook receiver of the project: tests, the
// benchmark harness (bench), the soak test, the `sluice testbed` subcommand
// and `sluice demo` all use it. It answers each webhook path according to a
// Mode (healthy, failing, slow, black hole, rate limited, flaky),
// optionally verifies Standard Webhooks signatures, and counts what it saw
// per path: requests, accepted deliveries, distinct and duplicate
// webhook-id values, bad and missing signatures, concurrency and statuses.
// A Hook sees every request and may choose its answer, for receivers that
// check bodies or script answers per delivery, or that measure latency
// from stamps in the body.
//
// Guarantees:
//   - Counters are updated before the response is written, so a client that
//     has read a response sees it reflected in Stats.
//   - Black-holed and slow requests are held without any lock and count in
//     InFlight until released. A black-holed request is released when its
//     client disconnects, on Release, after Options.MaxHold, or on Close;
//     Close returns promptly while requests are held and waits for every
//     handler goroutine.
//   - Duplicates are counted per path by webhook-id among accepted (2xx)
//     requests only: a retry after a failure is not a duplicate.
//   - All methods are safe for concurrent use.
//
// Besides webhook paths the server answers three control endpoints:
//
//	GET  /_stats               JSON of Stats()
//	GET  /_ids?path=/p         accepted webhook-id values of /p, one per line
//	POST /_mode?path=/p&mode=m set the mode of /p (no path: the default mode)
//
// The server uses fasthttp because it also serves as the benchmarks' peer,
// whose speed bounds what they can measure: the request path takes no lock
// shared by all paths, parses no body, and allocates nothing per request
// but the webhook-id it keeps for duplicate counting (Options.Lean keeps
// none, for load tests with millions of deliveries).
package testbed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/signing"
)

// Mode says how the server answers a webhook request.
type Mode string

// Modes.
const (
	// ModeOK answers 200.
	ModeOK Mode = "ok"
	// ModeFail answers 500.
	ModeFail Mode = "fail"
	// ModeSlow waits Options.Delay, then answers 200.
	ModeSlow Mode = "slow"
	// ModeBlackhole reads the request and never answers, until the client
	// disconnects, Release or Options.MaxHold ends it, or the server closes;
	// then the connection is closed without a word.
	ModeBlackhole Mode = "blackhole"
	// ModeRateLimit answers 429 with Retry-After: Options.RetryAfter.
	ModeRateLimit Mode = "ratelimit"
	// ModeFlaky fails every other request to a path with 500: the 1st, 3rd,
	// 5th… request to the path fails, the 2nd, 4th… are answered 200. The
	// count includes every request to the path, whatever the mode was then.
	ModeFlaky Mode = "flaky"
)

var allModes = []Mode{ModeOK, ModeFail, ModeSlow, ModeBlackhole, ModeRateLimit, ModeFlaky}

// ParseMode returns the Mode named s. Errors wrap ErrUnknownMode.
func ParseMode(s string) (Mode, error) {
	for _, m := range allModes {
		if string(m) == s {
			return m, nil
		}
	}
	names := make([]string, len(allModes))
	for i, m := range allModes {
		names[i] = string(m)
	}
	return "", fmt.Errorf("parse mode %q: want one of %s: %w", s, strings.Join(names, ", "), ErrUnknownMode)
}

// Defaults for Options.
const (
	// DefaultDelay is how long ModeSlow waits before answering.
	DefaultDelay = 200 * time.Millisecond
	// DefaultRetryAfter is the Retry-After value (seconds) of ModeRateLimit.
	DefaultRetryAfter = "1"
)

// Options configures a Server. The zero value is a receiver that answers 200
// to everything and verifies nothing.
type Options struct {
	// Mode is the default mode for paths without their own; "" means ModeOK.
	Mode Mode
	// Delay is how long ModeSlow waits; zero means DefaultDelay.
	Delay time.Duration
	// RetryAfter is the Retry-After header of ModeRateLimit, in seconds or
	// as an HTTP date; "" means DefaultRetryAfter.
	RetryAfter string
	// Secrets, when set, make the server verify webhook-signature with
	// signing.Verify and signing.DefaultTolerance: unsigned requests and
	// bad signatures are answered 401 and are never accepted.
	Secrets []signing.Secret
	// Logger receives mode changes and bad signatures (warn) and per-request
	// detail (debug). Nil discards.
	Logger *slog.Logger
	// Hook, when set, sees every webhook request and chooses its answer;
	// see Hook.
	Hook Hook
	// MaxHold, when positive, bounds how long a black hole holds one
	// request, whatever its client does.
	MaxHold time.Duration
	// HangUp, when set, is called when a black-holed request ends (the
	// client hung up, Release, MaxHold or Close), with the request's path
	// and number (Request.N) and when it ended: for a receiver that
	// tracks which client's requests overlapped, which InFlight alone
	// cannot tell.
	HangUp func(path string, n int64, ended time.Time)
	// Lean makes the server a load-test peer: answers carry no body and no
	// Server, Date or Content-Type header, and no webhook-id is kept
	// (Unique and Duplicates stay 0, IDs returns nil), so that memory does
	// not grow with the deliveries. A Hook can still look at every id.
	Lean bool
}

// Hook sees a webhook request after its signature was checked and the
// path's mode chose an answer, and returns the status to answer instead.
// status is what the mode chose: 401 for an unsigned or badly signed
// request when Options.Secrets is set, 0 for a black hole (and a slow
// request is seen after its delay). Returning status keeps that answer;
// another status replaces it (without a body, with Retry-After on a 429);
// 0 black-holes the request. The answer is counted after the Hook returns.
//
// A Hook runs on the request's goroutine, concurrently with others and
// without any lock of the server held; it must be quick, as the client
// waits for it.
type Hook func(r Request, status int) int

// Request is a webhook request as a Hook sees it. Its byte slices belong to
// the server and are valid only during the call: copy what you keep.
type Request struct {
	ctx  *fasthttp.RequestCtx
	path []byte
	n    int64
	at   time.Time
}

// Path is the request's path ("/billing").
func (r Request) Path() []byte { return r.path }

// N is the request's number on its path, from 1; every request counts,
// whatever the mode was then (as for ModeFlaky).
func (r Request) N() int64 { return r.n }

// Received is when the server began to handle the request.
func (r Request) Received() time.Time { return r.at }

// Header returns the value of the named request header, or nil.
func (r Request) Header(name string) []byte { return r.ctx.Request.Header.Peek(name) }

// Body returns the request's body.
func (r Request) Body() []byte { return r.ctx.PostBody() }

// Totals are counts over every path since the server was created, read
// without copying any path's state: cheap enough to poll in a hot loop.
type Totals struct {
	// Requests counts every webhook request, answered or not.
	Requests int64
	// Accepted counts requests answered 2xx.
	Accepted int64
	// Failed counts requests answered 5xx.
	Failed int64
	// Holding is the number of black-holed requests held now.
	Holding int64
	// Held counts the requests ever black-holed.
	Held int64
	// HangUps counts black-holed requests whose client gave up and closed
	// the connection (rather than Release, MaxHold or Close ending them).
	HangUps int64
}

// PathStats counts the requests to one path. Counts are totals since the
// server was created.
type PathStats struct {
	// Requests counts every request to the path, answered or not.
	Requests int64 `json:"requests"`
	// Accepted counts requests answered 2xx.
	Accepted int64 `json:"accepted"`
	// Unique counts distinct webhook-id values among accepted requests.
	Unique int64 `json:"unique"`
	// Duplicates counts accepted requests whose webhook-id had already been
	// accepted on this path. Accepted requests without a webhook-id count in
	// neither Unique nor Duplicates.
	Duplicates int64 `json:"duplicates"`
	// BadSignatures counts signed requests that failed verification (only
	// when Options.Secrets is set).
	BadSignatures int64 `json:"bad_signatures"`
	// Unsigned counts requests without a webhook-signature header.
	Unsigned int64 `json:"unsigned"`
	// InFlight is the number of requests being handled now, including
	// black-holed and slow ones.
	InFlight int64 `json:"in_flight"`
	// MaxInFlight is the highest InFlight seen. A black-holed request whose
	// client has closed its connection is no longer in flight, even before
	// the goroutine holding it has noticed: each request that arrives on
	// the path first asks the kernel which held connections their clients
	// closed (closedByPeer), so a client that gives up on one request and
	// then sends the next is never counted twice, however late the holder
	// runs on a busy machine.
	MaxInFlight int64 `json:"max_in_flight"`
	// Attempts counts requests by their X-Attempt header value; requests
	// without one are not counted here.
	Attempts map[string]int64 `json:"attempts"`
	// Statuses counts answers by HTTP status code. Black-holed requests are
	// never answered and do not appear.
	Statuses map[int]int64 `json:"statuses"`
}

// pathState is everything the server keeps about one path. It is never
// removed, so handlers may keep a pointer to it. Counters read on every
// request are atomic; the rest is guarded by mu, which no other path
// shares.
type pathState struct {
	requests, inFlight, maxInFlight atomic.Int64
	nheld                           atomic.Int64 // len(held), read without mu on every request
	unsigned, badSignatures         atomic.Int64
	accepted                        atomic.Int64 // written under mu, with the statuses

	mu         sync.Mutex
	held       map[*heldConn]struct{} // black-holed requests not yet over; nheld counts them
	attempts   map[string]int64
	statuses   map[int]int64
	seen       map[string]struct{} // accepted webhook-id values
	ids        []string            // the same, in order of first acceptance
	unique     int64
	duplicates int64
}

// heldConn is one black-holed request's connection. over is set by whoever
// first learns the request is over (the holder, or settle), which takes it
// out of InFlight.
type heldConn struct {
	conn net.Conn
	over atomic.Bool
}

// end takes h out of InFlight unless that was done already.
func (ps *pathState) end(h *heldConn) {
	if h.over.CompareAndSwap(false, true) {
		ps.inFlight.Add(-1)
	}
}

// settle ends the held requests whose clients have closed their
// connections, as the kernel knows it now: a request that arrives after
// its client's previous one gave up finds that one over.
func (ps *pathState) settle() {
	if ps.nheld.Load() == 0 {
		return // the common case: nothing held, no lock
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for h := range ps.held {
		if !h.over.Load() && closedByPeer(h.conn) {
			ps.end(h)
		}
	}
}

func (ps *pathState) stats() PathStats {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	st := PathStats{
		Requests: ps.requests.Load(), Accepted: ps.accepted.Load(), Unique: ps.unique, Duplicates: ps.duplicates,
		BadSignatures: ps.badSignatures.Load(), Unsigned: ps.unsigned.Load(),
		InFlight: ps.inFlight.Load(), MaxInFlight: ps.maxInFlight.Load(),
		Attempts: make(map[string]int64, len(ps.attempts)), Statuses: make(map[int]int64, len(ps.statuses)),
	}
	maps.Copy(st.Attempts, ps.attempts)
	maps.Copy(st.Statuses, ps.statuses)
	return st
}

// Server is a webhook receiver on a loopback (or any) address. Create it with
// New, start it with Open and stop it with Close. A Server cannot be reopened.
type Server struct {
	opts Options
	log  *slog.Logger
	srv  *fasthttp.Server
	ln   *trackingListener

	// closing is cancelled by Close; it releases slow and black-holed
	// requests.
	closing   context.Context
	stop      context.CancelFunc
	serveDone chan struct{}
	serveErr  error // written before serveDone is closed

	// mu guards the fields below; handlers take it for reading only, once
	// per request (and for writing on a path's first request).
	mu    sync.RWMutex
	state int // stateNew, stateOpen, stateClosed
	modes map[string]Mode
	paths map[string]*pathState
	// release ends the black holes of now: Release cancels it and puts a
	// new one in its place. A child of closing.
	release    context.Context
	releaseAll context.CancelFunc

	// Wait callers: handlers wake them only while there are some, so the
	// request path takes no shared lock otherwise.
	waiters atomic.Int64
	waitMu  sync.Mutex
	changed chan struct{} // closed on the next change

	requests, accepted, failed, holding, held, hangUps atomic.Int64
}

const (
	stateNew = iota
	stateOpen
	stateClosed
)

// shutdownGrace bounds how long Close waits for connections to finish their
// current exchange before closing them.
const shutdownGrace = time.Second

// New returns an unstarted Server; call Open to listen.
func New(opts Options) *Server {
	if opts.Mode == "" {
		opts.Mode = ModeOK
	}
	if opts.Delay <= 0 {
		opts.Delay = DefaultDelay
	}
	if opts.RetryAfter == "" {
		opts.RetryAfter = DefaultRetryAfter
	}
	opts.Secrets = append([]signing.Secret(nil), opts.Secrets...)
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	closing, stop := context.WithCancel(context.Background())
	release, releaseAll := context.WithCancel(closing)
	s := &Server{
		opts:       opts,
		log:        log,
		closing:    closing,
		stop:       stop,
		serveDone:  make(chan struct{}),
		modes:      map[string]Mode{"": opts.Mode},
		paths:      make(map[string]*pathState),
		release:    release,
		releaseAll: releaseAll,
	}
	name := "sluice-testbed"
	if opts.Lean {
		name = "" // fasthttp sends a Name even with NoDefaultServerHeader
	}
	s.srv = &fasthttp.Server{
		Handler:               s.handle,
		Name:                  name,
		CloseOnShutdown:       true,
		Logger:                fasthttpLogger{log},
		NoDefaultServerHeader: opts.Lean,
		NoDefaultDate:         opts.Lean,
		NoDefaultContentType:  opts.Lean,
	}
	return s
}

// Open listens on addr (for example "127.0.0.1:0") and serves in a
// goroutine. Bind errors are returned here.
func (s *Server) Open(addr string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case stateOpen:
		return fmt.Errorf("open testbed: already open on %s", s.ln.Addr())
	case stateClosed:
		return fmt.Errorf("open testbed: %w", ErrServerClosed)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("open testbed: %w", err)
	}
	s.ln = &trackingListener{Listener: ln, conns: make(map[*trackedConn]struct{})}
	s.state = stateOpen
	go func() {
		defer close(s.serveDone)
		s.serveErr = s.srv.Serve(s.ln)
	}()
	s.log.Info("testbed listening", "addr", ln.Addr().String(), "mode", string(s.opts.Mode), "verify_signatures", len(s.opts.Secrets) > 0)
	return nil
}

// Addr returns the listening address ("127.0.0.1:PORT"), or "" before Open.
func (s *Server) Addr() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// URL returns "http://" + Addr(), or "" before Open.
func (s *Server) URL() string {
	if a := s.Addr(); a != "" {
		return "http://" + a
	}
	return ""
}

// Close releases black-holed and slow requests, stops serving, closes every
// connection and waits for the server's goroutines. It returns the first
// error. Calling Close again, or before Open, does nothing.
func (s *Server) Close() error {
	s.mu.Lock()
	prev := s.state
	s.state = stateClosed
	s.mu.Unlock()
	s.stop()
	if prev != stateOpen {
		return nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	err := s.srv.ShutdownWithContext(ctx)
	cancel()
	if errors.Is(err, context.DeadlineExceeded) {
		err = nil // connections still busy are closed below
	}
	// Closing the listener ourselves also stops a Serve goroutine that had
	// not yet registered it with fasthttp when Shutdown ran.
	if cerr := s.ln.Listener.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) && err == nil {
		err = cerr
	}
	<-s.serveDone
	if s.serveErr != nil && !errors.Is(s.serveErr, net.ErrClosed) && err == nil {
		err = s.serveErr
	}
	// After Serve returns no connection is accepted any more: close what
	// remains and wait until fasthttp has let go of every connection, which
	// also means every handler and hijack handler has returned.
	s.ln.abort()
	s.ln.wg.Wait()
	if err != nil {
		return fmt.Errorf("close testbed: %w", err)
	}
	return nil
}

// SetMode sets the mode of path; path "" sets the default for paths without
// their own. An empty m removes the path's own mode (for path "", resets the
// default to ModeOK). Validate names with ParseMode first: a path in an
// unknown mode is answered 500.
func (s *Server) SetMode(path string, m Mode) {
	s.mu.Lock()
	switch {
	case m != "":
		s.modes[path] = m
	case path == "":
		s.modes[""] = ModeOK
	default:
		delete(s.modes, path)
	}
	s.mu.Unlock()
	s.log.Info("testbed mode set", "path", path, "mode", string(m))
}

// ResetModes removes every path's own mode and sets the default back to
// Options.Mode. Requests already held stay held; see Release.
func (s *Server) ResetModes() {
	s.mu.Lock()
	s.modes = map[string]Mode{"": s.opts.Mode}
	s.mu.Unlock()
	s.log.Info("testbed modes reset", "mode", string(s.opts.Mode))
}

// Release ends every black-holed request held now, closing its connection
// without an answer, as a dying endpoint would. Requests black-holed later
// are held again.
func (s *Server) Release() {
	s.mu.Lock()
	old := s.releaseAll
	s.release, s.releaseAll = context.WithCancel(s.closing)
	s.mu.Unlock()
	old()
}

// Stats returns a copy of the counters of every path that has received a
// request, keyed by request path.
func (s *Server) Stats() map[string]PathStats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]PathStats, len(s.paths))
	for p, ps := range s.paths {
		out[p] = ps.stats()
	}
	return out
}

// Accepted returns how many requests to path were answered 2xx; unlike
// Stats it copies nothing, for polling many paths.
func (s *Server) Accepted(path string) int64 {
	s.mu.RLock()
	ps := s.paths[path]
	s.mu.RUnlock()
	if ps == nil {
		return 0
	}
	return ps.accepted.Load()
}

// Totals returns the counts over every path.
func (s *Server) Totals() Totals {
	return Totals{
		Requests: s.requests.Load(), Accepted: s.accepted.Load(), Failed: s.failed.Load(),
		Holding: s.holding.Load(), Held: s.held.Load(), HangUps: s.hangUps.Load(),
	}
}

// IDs returns the distinct webhook-id values accepted (answered 2xx) on path,
// in the order they were first accepted.
func (s *Server) IDs(path string) []string {
	s.mu.RLock()
	ps := s.paths[path]
	s.mu.RUnlock()
	if ps == nil {
		return nil
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.ids == nil {
		return nil
	}
	return append([]string(nil), ps.ids...)
}

// Wait blocks until cond, called with a fresh copy of Stats, returns true. It
// re-checks cond each time the counters change and returns ctx.Err() when ctx
// ends first. cond runs without the server's lock held.
func (s *Server) Wait(ctx context.Context, cond func(map[string]PathStats) bool) error {
	s.waiters.Add(1)
	defer s.waiters.Add(-1)
	for {
		// Take the channel before reading the counters: a change after
		// the read closes it (or a later one, after this one was closed).
		s.waitMu.Lock()
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		changed := s.changed
		s.waitMu.Unlock()

		if cond(s.Stats()) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// notify wakes Wait callers, if there are any.
func (s *Server) notify() {
	if s.waiters.Load() == 0 {
		return
	}
	s.waitMu.Lock()
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	s.waitMu.Unlock()
}
