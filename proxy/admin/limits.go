package admin

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/freshconn"
)

// Limits of the admin listener, which anyone who can reach its address can
// hold open before showing a token. They are variables only so tests can
// lower them; the server reads them once when it opens.
var (
	// adminHeaderTimeout bounds the request line and headers, from the
	// request's first byte (a new connection that sends nothing is closed
	// after the same time). As for ingest: one write from any real client.
	adminHeaderTimeout = 10 * time.Second
	// adminBodyTimeout bounds reading an authenticated request's body,
	// and with it the whole of a request that has one: the largest admin
	// body (a subscription document, 1 MiB at most) takes milliseconds.
	adminBodyTimeout = 30 * time.Second
	// adminWriteTimeout bounds writing one answer, so a client that stops
	// reading cannot hold its connection. Profiles that sample for a
	// given time get that time on top (adminDeadlines).
	adminWriteTimeout = 30 * time.Second
	// adminIdleTimeout closes keep-alive connections idle this long;
	// longer than Go's http.Transport's 90 s, like ingest's, so that the
	// client usually closes first.
	adminIdleTimeout = 2 * time.Minute
	// adminMaxHeaderBytes bounds the request line plus headers. Larger
	// than ingest's 16 KiB: browsers send the dashboard every cookie set
	// for the host name, and other local tools set cookies on localhost.
	adminMaxHeaderBytes = 64 << 10
	// adminMaxConns caps open admin connections, idle ones included; past
	// it a connection is answered 503 and closed at once. The admin API's
	// clients are an operator's CLI, a dashboard tab (six connections at
	// most per browser), Prometheus and probes: 256 is far above them and
	// bounds what a flood of idle connections costs.
	adminMaxConns = 256
	// adminRefuseGrace is how long a refused (401) request's body is
	// drained before its connection is closed: time for the client to
	// read the answer before a close with unread bytes resets the
	// connection, and no more, so a trickled body holds nothing.
	adminRefuseGrace = 500 * time.Millisecond
)

// newAdminServer returns the admin API's http.Server over h.
//
// Its ReadTimeout and WriteTimeout stay zero on purpose; adminDeadlines
// sets both per request instead. net/http/pprof refuses any profile
// longer than the server's WriteTimeout, and a ReadTimeout also expires
// the read net/http keeps pending while a handler runs, which cancels
// the request's context: a 30 s CPU profile would stop early.
func newAdminServer(h http.Handler, fresh *freshconn.Set) *http.Server {
	return &http.Server{
		Handler:           adminDeadlines(h),
		ReadHeaderTimeout: adminHeaderTimeout,
		IdleTimeout:       adminIdleTimeout,
		MaxHeaderBytes:    adminMaxHeaderBytes,
		ConnState:         fresh.TrackHTTP,
	}
}

// adminDeadlines gives each request its write deadline and, when it has a
// body, its read deadline, before anything else sees it.
func adminDeadlines(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		now := time.Now()
		rc.SetWriteDeadline(now.Add(adminWriteTimeout + samplingTime(r)))
		if r.ContentLength != 0 { // -1: chunked
			rc.SetReadDeadline(now.Add(adminBodyTimeout))
		}
		h.ServeHTTP(w, r)
	})
}

// samplingTime is how long a profile or trace request samples before it
// answers (pprof's seconds parameter, and its defaults); zero for every
// other request.
func samplingTime(r *http.Request) time.Duration {
	p, ok := strings.CutPrefix(r.URL.Path, "/debug/pprof/")
	if !ok {
		return 0
	}
	q := r.URL.Query().Get("seconds")
	def := 0.0 // the other profiles sample only when given seconds
	switch p {
	case "profile":
		def = 30
	case "trace":
		def = 1
	}
	sec, err := strconv.ParseFloat(q, 64)
	if err != nil || sec <= 0 {
		sec = def
	}
	return time.Duration(min(sec, 24*3600) * float64(time.Second))
}

// refuseUnauthenticated answers 401 (refuseUnread).
func refuseUnauthenticated(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
	refuseUnread(w, r, http.StatusUnauthorized, "missing or wrong admin token")
}

// refuseUnread answers status with msg without reading the request's body
// and, when it has one, closes the connection after the answer: the body
// of a refused request is never read, and a trickled one cannot hold the
// connection.
func refuseUnread(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if r.ContentLength != 0 {
		// net/http drains up to 256 KiB of an unread body before it
		// answers (to reuse the connection) unless the answer closes it,
		// and again after the handler; the deadline cuts that short.
		w.Header().Set("Connection", "close")
		http.NewResponseController(w).SetReadDeadline(time.Now().Add(adminRefuseGrace))
	}
	writeError(w, status, msg)
}

// capListener accepts at most max connections at a time; past it a
// connection is answered 503 and closed at once, as ingest answers past
// its own cap, rather than left waiting in the kernel's backlog where a
// probe cannot tell a busy sidecar from a dead one.
type capListener struct {
	net.Listener
	max  int64
	open atomic.Int64
}

// refusedAnswer is what a connection past the cap gets.
var refusedAnswer = func() []byte {
	body := `{"error":"too many admin connections; retry in a moment"}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			// A new socket's send buffer is empty: this write does not
			// wait on the client, the deadline only makes sure of it.
			c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			c.Write(refusedAnswer)
			c.Close()
			continue
		}
		return &cappedConn{Conn: c, l: l}, nil
	}
}

// cappedConn gives its slot back when it is closed, once.
type cappedConn struct {
	net.Conn
	l    *capListener
	once sync.Once
}

func (c *cappedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

// CloseWrite keeps net/http's graceful close (it half-closes, then waits
// for the client to read the answer) working through the wrapper.
func (c *cappedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
