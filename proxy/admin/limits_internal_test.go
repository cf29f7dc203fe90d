package admin

// Misbehaving clients of the admin listener over real loopback TCP, as
// ingest_faults_test.go does for ingest: raw bytes on net.Conn. In package
// proxy to lower the admin limits (read when the server opens).

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/rawconn"
	"github.com/sluicehq/sluice/internal/testwait"
)

const adminLimitsToken = "admin-limits-token-0c4e2b"

// setLimit sets one of the package's limits for the test's duration. It
// must be called before the server opens (which reads it once).
func setLimit[T any](t *testing.T, p *T, v T) {
	t.Helper()
	old := *p
	*p = v
	t.Cleanup(func() { *p = old })
}

func startAdminLimitsServer(t *testing.T) *sidecar {
	t.Helper()
	return openTestServer(t, Options{AdminListen: "127.0.0.1:0", AdminToken: adminLimitsToken})
}

func dialAdmin(t *testing.T, s *sidecar) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(s.AdminURL(), "http://"))
	if err != nil {
		t.Fatalf("dial admin: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestAdminLimitsRefuseBeforeTheBody: requests without a valid token are
// answered 401 at once, whatever their body (huge, trickled, chunked and
// never ending), and their connections closed within a second: no body
// of an unauthenticated client is read, and none holds a connection.
func TestAdminLimitsRefuseBeforeTheBody(t *testing.T) {
	s := startAdminLimitsServer(t)
	bodies := []struct{ name, headers, prefix string }{
		{"huge", "Content-Length: 1073741824\r\n", "{"},
		{"trickled", "Content-Length: 100000\r\n", "{"},
		{"chunked", "Transfer-Encoding: chunked\r\n", "1000\r\n{"},
	}
	const perKind = 20
	var (
		wg, started sync.WaitGroup
		writers     sync.WaitGroup
		conns       []net.Conn
	)
	start := time.Now()
	for _, b := range bodies {
		for i := range perKind {
			c := dialAdmin(t, s)
			conns = append(conns, c)
			auth := ""
			if i%2 == 1 {
				auth = "Authorization: Bearer wrong-token-of-some-length\r\n"
			}
			req := "POST /v1/subscriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + auth + b.headers + "\r\n" + b.prefix
			if _, err := io.WriteString(c, req); err != nil {
				t.Fatal(err)
			}
			started.Add(1)
			writers.Go(func() { rawconn.Trickle(c, nil, []byte{'a'}, &started) })
			wg.Go(func() {
				br := bufio.NewReader(c)
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Errorf("%s body: no answer: %v", b.name, err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
					t.Errorf("%s body: %d, want 401 with WWW-Authenticate", b.name, resp.StatusCode)
				}
				n, err := io.Copy(io.Discard, br)
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Errorf("%s body: connection still open 10 s after the 401 (%d more bytes)", b.name, n)
				}
			})
		}
	}
	wg.Wait()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("%d refused connections took %v to be answered and closed, want a few seconds at most", len(bodies)*perKind, took)
	}
	for _, c := range conns {
		c.Close()
	}
	writers.Wait()
}

// TestAdminLimitsSlowBody: an authenticated request whose body trickles is
// cut off when the body deadline passes, although bytes keep arriving.
func TestAdminLimitsSlowBody(t *testing.T) {
	setLimit(t, &adminBodyTimeout, 500*time.Millisecond)
	s := startAdminLimitsServer(t)
	c := dialAdmin(t, s)
	if _, err := io.WriteString(c, "POST /v1/dead-letters/replay HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"+
		"Authorization: Bearer "+adminLimitsToken+"\r\nContent-Length: 100000\r\n\r\n{\"items\":["); err != nil {
		t.Fatal(err)
	}
	var started sync.WaitGroup
	started.Add(1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rawconn.Trickle(c, nil, []byte{' '}, &started)
	}()
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("a trickled body held its connection for 10 s (%d bytes answered)", n)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("closed after %v, want about the body timeout (500ms)", took)
	}
	c.Close()
	<-done
}

// TestAdminLimitsIdleKeepAlive: a keep-alive connection left idle after
// its request is closed once the idle timeout passes.
func TestAdminLimitsIdleKeepAlive(t *testing.T) {
	setLimit(t, &adminIdleTimeout, 300*time.Millisecond)
	s := startAdminLimitsServer(t)
	c := dialAdmin(t, s)
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if a := rawconn.MustAnswer(t, c, br); a.Status != http.StatusOK || a.Close {
		t.Fatalf("healthz: %d, close %v; want 200 on a kept-alive connection", a.Status, a.Close)
	}
	start := time.Now()
	rawconn.AssertClosed(t, c, br)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("idle connection closed after %v, want about 300ms", took)
	}
}

// TestAdminLimitsConnectionCap: past adminMaxConns, a connection is
// answered 503 at once and closed; once one held is closed, a request is
// served again.
func TestAdminLimitsConnectionCap(t *testing.T) {
	const limit = 20
	setLimit(t, &adminMaxConns, limit)
	s := startAdminLimitsServer(t)
	capped := s.adminLn.(*capListener)
	held := make([]net.Conn, 0, limit)
	for range limit {
		held = append(held, dialAdmin(t, s))
	}
	testwait.Await(t, "the server to hold every connection", func() bool { return capped.open.Load() == limit })
	extra := dialAdmin(t, s)
	br := bufio.NewReader(extra)
	if a := rawconn.MustAnswer(t, extra, br); a.Status != http.StatusServiceUnavailable || a.RetryAfter == "" || !strings.Contains(a.Error, "connections") {
		t.Fatalf("connection past the cap: %d %+v, want 503 with Retry-After", a.Status, a)
	}
	rawconn.AssertClosed(t, extra, br)

	held[0].Close()
	testwait.Await(t, "the server to release a slot", func() bool { return capped.open.Load() < limit })
	c := dialAdmin(t, s)
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if a := rawconn.MustAnswer(t, c, bufio.NewReader(c)); a.Status != http.StatusOK {
		t.Fatalf("healthz after a slot was released: %d %+v", a.Status, a)
	}
}

// TestAdminLimitsProfileOutlivesWriteTimeout: a CPU profile samples for
// its seconds, longer than the write timeout, and is answered: the write
// deadline of profiles counts their sampling time.
func TestAdminLimitsProfileOutlivesWriteTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("samples for a second")
	}
	setLimit(t, &adminWriteTimeout, 300*time.Millisecond)
	s := startAdminLimitsServer(t)
	req, _ := http.NewRequest("GET", s.AdminURL()+"/debug/pprof/profile?seconds=1", nil)
	req.Header.Set("Authorization", "Bearer "+adminLimitsToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(b) == 0 {
		t.Fatalf("profile: %d, %d bytes, %v; want 200 with a profile", resp.StatusCode, len(b), err)
	}
}
