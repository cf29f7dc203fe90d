package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/testbed"
)

// Endpoint fault tests: each endpoint misbehaves in one way, over a real
// loopback socket, and the sidecar must bound the damage, classify it as
// documented (policy.Classify: transport errors, timeouts, 408, 429 and 5xx
// retried, other 4xx dead-lettered), and lose nothing.

// noBreaker never opens, and ampleBudget never defers a retry: these tests
// count attempts, which isolation by the breaker and the budget (tested in
// isolation_test.go) would otherwise postpone.
var (
	noBreaker   = policy.BreakerConfig{MinRequests: 1 << 30, ConsecutiveTimeouts: 1 << 30}
	ampleBudget = policy.BudgetConfig{MinPerSecond: 1000}
)

// rawServer is a loopback TCP server whose connections are handled by a
// test's own code, for misbehaviour net/http will not produce. Cleanup
// closes the listener and every connection, then waits for the handlers.
type rawServer struct {
	ln       net.Listener
	done     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	accepted atomic.Int64
}

// startRaw serves each accepted connection with serve(n, conn, done), n
// counting connections from 0. serve should return once done is closed or
// the connection fails; the connection is closed after it returns.
func startRaw(t *testing.T, serve func(n int, c net.Conn, done <-chan struct{})) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln, done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(s.accepted.Add(1) - 1)
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				serve(n, c, s.done)
				c.Close()
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		close(s.done)
		ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *rawServer) URL() string { return "http://" + s.ln.Addr().String() }

// open returns how many connections are being served.
func (s *rawServer) open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// readRequest reads one request's head from c; the body is left unread.
func readRequest(c net.Conn) (*http.Request, error) {
	return http.ReadRequest(bufio.NewReader(c))
}

// deadLettered waits until lane id has dead-lettered n deliveries and
// returns its dead letters.
func deadLettered(t *testing.T, s *proxy.Server, id string, n int) []*queue.DeadLetter {
	t.Helper()
	eventually(t, fmt.Sprintf("%d dead letters on %s", n, id), func() bool { return lane(s, id).DeadLettered >= uint64(n) })
	dls, err := s.DeadLetters(id, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != n {
		t.Fatalf("%s: %d dead letters, want %d: %+v", id, len(dls), n, dls)
	}
	return dls
}

// checkDeadLetters asserts every dead letter is a transport failure of kind
// errKind that was retried until max_attempts: there was no usable status.
func checkDeadLetters(t *testing.T, dls []*queue.DeadLetter, errKind string, attempts int) {
	t.Helper()
	for _, d := range dls {
		if d.Reason != "max_attempts" || d.Attempts != attempts || d.LastError != errKind || d.LastStatus != 0 {
			t.Errorf("dead letter %s: reason %q attempts %d last_error %q last_status %d; want max_attempts after %d attempts, last_error %q, no status",
				d.EventID, d.Reason, d.Attempts, d.LastError, d.LastStatus, attempts, errKind)
		}
	}
}

// TestEndpointBlackHoleTimesOut: an endpoint that never answers costs one
// subscription timeout per attempt, whether it accepts the connection and
// never reads a byte (plain or TLS) or drops the SYNs so the connection
// never opens; the attempts are retried, then dead-lettered with last_error
// "timeout", while a healthy subscription on the same sidecar gets every
// event. (Slot isolation under a black hole and delivery of its backlog
// after recovery are covered by TestBlackHoleAmongNineHealthy and
// TestInvariant6_CapHoldsAgainstABlackHole, with the testbed's black hole,
// which reads the request.)
func TestEndpointBlackHoleTimesOut(t *testing.T) {
	silent := func(t *testing.T) string {
		return startRaw(t, func(n int, c net.Conn, done <-chan struct{}) { <-done }).ln.Addr().String()
	}
	for _, c := range []struct {
		name, scheme string
		addr         func(t *testing.T) string
	}{
		{"accepts, never reads", "http", silent},
		{"accepts, never handshakes", "https", silent},
		{"drops SYNs", "http", synBlackHole},
	} {
		t.Run(c.name, func(t *testing.T) {
			tb := startTestbed(t, testbed.ModeOK)
			bh := sub("hole", c.scheme+"://"+c.addr(t)+"/hook")
			bh.Timeout, bh.Retry, bh.Breaker = 200*time.Millisecond, fastRetry(2), noBreaker
			s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{bh, sub("healthy", tb.URL()+"/ok")}, RetryBudget: ampleBudget})
			publish(t, s, "t", "e", 3)
			waitFor(t, tb, "healthy subscription got every event", uniqueAt("/ok", 3))
			checkDeadLetters(t, deadLettered(t, s, "hole", 3), "timeout", 2)
			if l := lane(s, "hole"); l.Retried != 3 || l.Delivered != 0 || l.InFlight != 0 {
				t.Fatalf("black hole lane %+v: want 3 retries, nothing delivered, nothing stuck in flight", l)
			}
		})
	}
}

// synBlackHole returns the address of a loopback listener that drops SYNs:
// its backlog is cut to 0 and one connection, never accepted, fills it, so
// the kernel ignores further connection attempts, as a firewall that drops
// packets would.
func synBlackHole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	rc, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var listenErr error
	if err := rc.Control(func(fd uintptr) { listenErr = syscall.Listen(int(fd), 0) }); err != nil || listenErr != nil {
		t.Fatalf("cut the backlog: %v %v", err, listenErr)
	}
	addr := ln.Addr().String()
	filler, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { filler.Close() })
	if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
		c.Close()
		t.Skip("this kernel completes connections past a full backlog: no SYN black hole")
	}
	return addr
}

// TestEndpointSlowDripIsBoundedByTimeout: an endpoint that answers one byte
// at a time, forever, faster than the subscription timeout (so a deadline
// renewed per read would never fire), is cut off at the timeout: a timeout,
// retried, then dead-lettered with no status even when its status line said
// 200. Nothing piles up: the sidecar hangs up on every drip, and a second
// round of timed-out exchanges leaves the goroutine count where it was.
func TestEndpointSlowDripIsBoundedByTimeout(t *testing.T) {
	for _, c := range []struct{ name, head string }{
		{"headers", "HTTP/1.1 200 OK\r\nX-Drip: "},
		{"body", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			drip := startRaw(t, func(n int, conn net.Conn, done <-chan struct{}) {
				req, err := readRequest(conn)
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				if _, err := io.WriteString(conn, c.head); err != nil {
					return
				}
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-done:
						return
					case <-tick.C:
					}
					if _, err := conn.Write([]byte{'a'}); err != nil {
						return // the sidecar hung up
					}
				}
			})
			sb := sub("drip", drip.URL()+"/hook")
			sb.Timeout, sb.Retry, sb.MaxConcurrency, sb.Breaker = 200*time.Millisecond, fastRetry(3), 4, noBreaker
			s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb}, RetryBudget: ampleBudget})
			hungUp := func() bool { return drip.open() == 0 }

			// A first round starts what is kept for good: the lane's
			// workers, the outbound client's cleaners, the producer's
			// keep-alive connection.
			publish(t, s, "t", "a", 4)
			deadLettered(t, s, "drip", 4)
			eventually(t, "the sidecar hung up on every drip", hungUp)
			before := runtime.NumGoroutine()

			publish(t, s, "t", "b", 4)
			checkDeadLetters(t, deadLettered(t, s, "drip", 8), "timeout", 3)
			if n := drip.accepted.Load(); n < 24 {
				t.Fatalf("%d connections for 8 events × 3 attempts", n)
			}
			// A drip handler only returns when its write fails: the
			// sidecar closed the connection.
			eventually(t, "the sidecar hung up on every drip", hungUp)
			// 12 more timed-out exchanges: a goroutine left behind by
			// each would be far past the slack.
			const slack = 3
			eventually(t, "goroutines back to where the second round started", func() bool { return runtime.NumGoroutine() <= before+slack })
		})
	}
}

// TestEndpointHugeResponseBodyIsBounded: an endpoint that answers 200 with a
// 100 MiB or endless body gets its delivery ACKed by its status, while
// sluice reads at most the client's 64 KiB limit: neither the live heap nor
// the bytes allocated grow with the body.
func TestEndpointHugeResponseBodyIsBounded(t *testing.T) {
	chunk := []byte(strings.Repeat("x", 32<<10))
	// writeUntilError writes chunks until limit bytes (0: forever) or a
	// failed write: the sidecar hanging up.
	writeUntilError := func(w io.Writer, limit int64, done <-chan struct{}) {
		for sent := int64(0); limit == 0 || sent < limit; sent += int64(len(chunk)) {
			select {
			case <-done:
				return
			default:
			}
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}
	httpEndpoint := func(t *testing.T, contentLength int64) string {
		stop := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			if contentLength > 0 {
				w.Header().Set("Content-Length", strconv.FormatInt(contentLength, 10))
			}
			w.WriteHeader(http.StatusOK)
			writeUntilError(w, contentLength, stop)
		}))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		t.Cleanup(func() { close(stop); srv.Close() })
		return srv.URL
	}
	for _, c := range []struct {
		name     string
		endpoint func(t *testing.T) string
	}{
		{"content-length 100 MiB", func(t *testing.T) string { return httpEndpoint(t, 100<<20) }},
		{"endless chunked", func(t *testing.T) string { return httpEndpoint(t, 0) }},
		{"endless until close", func(t *testing.T) string {
			return startRaw(t, func(n int, conn net.Conn, done <-chan struct{}) {
				req, err := readRequest(conn)
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				if _, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"); err != nil {
					return
				}
				writeUntilError(conn, 0, done)
			}).URL()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sb := sub("huge", c.endpoint(t)+"/hook")
			sb.MaxConcurrency = 2
			s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb}})
			publish(t, s, "warm", "w", 1) // lazily built state is not what is measured
			eventually(t, "warm-up delivered", func() bool { return lane(s, "huge").Delivered == 1 })
			heap0, alloc0 := memStats()

			const n = 5
			publish(t, s, "t", "e", n)
			eventually(t, "every event ACKed", func() bool { return lane(s, "huge").Delivered == n+1 })
			heap1, alloc1 := memStats()
			if l := lane(s, "huge"); l.Retried != 0 || l.DeadLettered != 0 || l.LastStatus != 200 {
				t.Errorf("lane %+v: a 200 with a huge body is an ACK, first time", l)
			}
			const bound = 32 << 20
			t.Logf("%d deliveries: heap in use %+d KiB, allocated %d KiB", n, (int64(heap1)-int64(heap0))>>10, (alloc1-alloc0)>>10)
			if heap1 > heap0 && heap1-heap0 > bound {
				t.Errorf("heap in use grew by %d MiB over %d deliveries", (heap1-heap0)>>20, n)
			}
			if alloc1-alloc0 > bound {
				t.Errorf("%d MiB allocated over %d deliveries: the body was read past the limit", (alloc1-alloc0)>>20, n)
			}
		})
	}
}

// memStats returns the heap in use after a collection, and the bytes
// allocated so far.
func memStats() (heapInUse, totalAlloc uint64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse, m.TotalAlloc
}

// TestEndpointRedirectIsNotFollowed: a 3xx is not followed (the Location
// receiver gets nothing: a signed payload never goes where nobody
// configured) and, as policy.Classify says for every 3xx, the delivery is
// dead-lettered as rejected on the first attempt, with the 3xx recorded.
func TestEndpointRedirectIsNotFollowed(t *testing.T) {
	var landed atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		landed.Add(1)
		io.Copy(io.Discard, r.Body)
	}))
	t.Cleanup(target.Close)
	var asked atomic.Int64
	from := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		io.Copy(io.Discard, r.Body)
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		w.Header().Set("Location", target.URL+"/landing")
		w.WriteHeader(code)
		io.WriteString(w, "moved")
	}))
	t.Cleanup(from.Close)
	codes := []int{301, 302, 303, 307, 308}
	var subs []*delivery.Subscription
	for _, code := range codes {
		sb := sub(fmt.Sprintf("r%d", code), fmt.Sprintf("%s/%d", from.URL, code))
		sb.Retry = fastRetry(3)
		subs = append(subs, sb)
	}
	s := startServerWith(t, proxy.Options{Subscriptions: subs})
	publish(t, s, "t", "e", 2)
	eventually(t, "every delivery resolved", func() bool {
		for _, sb := range subs {
			if l := lane(s, sb.ID); l.Delivered+l.DeadLettered != 2 {
				return false
			}
		}
		return true
	})
	if n := landed.Load(); n != 0 {
		t.Fatalf("the redirect target got %d requests: redirects were followed", n)
	}
	if n := asked.Load(); n != int64(2*len(codes)) {
		t.Errorf("redirecting endpoint got %d requests, want %d: one per delivery", n, 2*len(codes))
	}
	for _, code := range codes {
		id := fmt.Sprintf("r%d", code)
		for _, d := range deadLettered(t, s, id, 2) {
			if d.Reason != "rejected" || d.LastStatus != code || d.Attempts != 1 || d.LastError != "" || d.Response != "moved" {
				t.Errorf("%s: dead letter %+v; want rejected after 1 attempt with last_status %d", id, d, code)
			}
		}
		if l := lane(s, id); l.Retried != 0 || l.Delivered != 0 {
			t.Errorf("lane %+v: a redirect is neither retried nor delivered", l)
		}
	}
}

// firstBytes records the first byte each accepted connection sends.
type firstBytes struct {
	net.Listener
	mu    sync.Mutex
	first []byte
}

func (l *firstBytes) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &firstByteConn{Conn: c, l: l}, nil
}

func (l *firstBytes) seen() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.first...)
}

type firstByteConn struct {
	net.Conn
	l    *firstBytes
	once sync.Once
}

func (c *firstByteConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.once.Do(func() {
			c.l.mu.Lock()
			c.l.first = append(c.l.first, p[0])
			c.l.mu.Unlock()
		})
	}
	return n, err
}

// TestEndpointUntrustedTLSCertificate: an https endpoint whose certificate
// the client does not trust gets no request: every connection opens with a
// TLS handshake record, never plaintext, and the handler never runs. The
// failure is retryable (an operator may fix the certificate) and the dead
// letter says "tls_unknown_authority", in the admin API too.
func TestEndpointUntrustedTLSCertificate(t *testing.T) {
	var handled atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled.Add(1)
	}))
	rec := &firstBytes{Listener: srv.Listener}
	srv.Listener = rec
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // "TLS handshake error: bad certificate"
	srv.StartTLS()
	t.Cleanup(srv.Close)

	sb := sub("tls", srv.URL+"/hook")
	sb.Retry, sb.Breaker = fastRetry(3), noBreaker
	s := startServer(t, "", sb)
	publish(t, s, "t", "e", 2)
	checkDeadLetters(t, deadLettered(t, s, "tls", 2), "tls_unknown_authority", 3)
	if l := lane(s, "tls"); l.Retried != 4 {
		t.Fatalf("lane %+v: want 2 retries per event", l)
	}
	if n := handled.Load(); n != 0 {
		t.Fatalf("the handler ran %d times behind an untrusted certificate", n)
	}
	first := rec.seen()
	if len(first) < 6 {
		t.Fatalf("%d connections carried data, want one per attempt (6)", len(first))
	}
	for i, b := range first {
		if b != 0x16 { // TLS record type 22: handshake
			t.Fatalf("connection %d opened with %q, not a TLS handshake: plaintext was sent", i, b)
		}
	}
	page, err := apiClient(t, s).DeadLetters(context.Background(), client.DeadLetterQuery{Subscription: "tls"})
	if err != nil || len(page.DeadLetters) != 2 {
		t.Fatalf("admin dead letters: %+v %v", page, err)
	}
	for _, d := range page.DeadLetters {
		if d.LastError != "tls_unknown_authority" || d.Reason != "max_attempts" {
			t.Fatalf("admin dead letter %+v: want last_error tls_unknown_authority, reason max_attempts", d)
		}
	}
}

// TestEndpointDNSFailure: a host that does not resolve (.invalid, RFC 6761)
// is a retryable failure of kind "dns", dead-lettered after max attempts.
func TestEndpointDNSFailure(t *testing.T) {
	const host = "sluice-test.invalid"
	if addrs, err := net.LookupHost(host); err == nil {
		t.Skipf("this resolver answers %s with %v: no DNS failure to test", host, addrs)
	}
	sb := sub("nxdomain", "http://"+host+"/hook")
	sb.Retry, sb.Breaker = fastRetry(3), noBreaker
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb}, RetryBudget: ampleBudget})
	publish(t, s, "t", "e", 2)
	checkDeadLetters(t, deadLettered(t, s, "nxdomain", 2), "dns", 3)
	if l := lane(s, "nxdomain"); l.Retried != 4 || l.Delivered != 0 {
		t.Fatalf("lane %+v: want 2 retries per event", l)
	}
}

// TestEndpointResetMidBody: an endpoint that reads the headers and part of
// the body, then resets the connection (SO_LINGER 0: RST, not FIN), fails
// the attempt with kind "connection_reset"; it is retried, and once the
// endpoint behaves the event arrives whole, under the same webhook-id.
func TestEndpointResetMidBody(t *testing.T) {
	type got struct {
		id, attempt string
		body        []byte
	}
	var mu sync.Mutex
	var received []got
	// resets answers the first resets connections (-1: all) with an RST
	// after 1 KiB of body, the rest with 200 after reading everything.
	server := func(resets int) *rawServer {
		return startRaw(t, func(n int, c net.Conn, done <-chan struct{}) {
			req, err := readRequest(c)
			if err != nil {
				return
			}
			if resets < 0 || n < resets {
				io.CopyN(io.Discard, req.Body, 1<<10)
				c.(*net.TCPConn).SetLinger(0)
				return // closed by startRaw: RST
			}
			body, err := io.ReadAll(req.Body)
			if err != nil {
				return
			}
			mu.Lock()
			received = append(received, got{req.Header.Get("Webhook-Id"), req.Header.Get("X-Attempt"), body})
			mu.Unlock()
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		})
	}
	flaky, broken := server(2), server(-1)
	recovers := sub("recovers", flaky.URL()+"/hook")
	recovers.Retry, recovers.Breaker = fastRetry(5), noBreaker
	never := sub("never", broken.URL()+"/hook")
	never.Retry, never.Breaker = fastRetry(2), noBreaker
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{recovers, never}, RetryBudget: ampleBudget})

	body := `{"pad":"` + strings.Repeat("p", 256<<10) + `"}` // far more than the endpoint reads before the reset
	if code, a := post(t, s, "t", "big-0", body); code != http.StatusAccepted {
		t.Fatalf("publish: %d %+v", code, a)
	}
	eventually(t, "delivered after the resets", func() bool { return lane(s, "recovers").Delivered == 1 })
	checkDeadLetters(t, deadLettered(t, s, "never", 1), "connection_reset", 2)
	mu.Lock()
	defer mu.Unlock()
	if len(received) != 1 || received[0].id != "big-0" || received[0].attempt != "3" || string(received[0].body) != body {
		var summary []string
		for _, r := range received {
			summary = append(summary, fmt.Sprintf("{id %s attempt %s body %d bytes}", r.id, r.attempt, len(r.body)))
		}
		t.Fatalf("received %v; want big-0 whole, once, on attempt 3", summary)
	}
	if l := lane(s, "recovers"); l.Retried != 2 || l.DeadLettered != 0 {
		t.Fatalf("lane %+v: want 2 retries, no dead letter", l)
	}
}
