package proxy_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
)

// Helpers of the egress, mTLS, OAuth2 and HTTPS tests: a
// certificate authority made in the test, a forward proxy that counts
// what it carries, and endpoints on a second loopback address.

// guardedAddr is the loopback address the egress tests' endpoints listen
// on when the SSRF guard is on: proxy.SetEgressTestHooks lets the guard of
// the egress proxy allow it, and only it, so that 127.0.0.1 (the proxy's
// own address, and any other loopback target) is still refused.
var guardedAddr = netip.MustParseAddr("127.0.0.2")

// netipLoopback is 127.0.0.1, where the proxy listens.
var netipLoopback = netip.MustParseAddr("127.0.0.1")

// testCA is a certificate authority made in the test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// leaf is what issue makes.
type leaf struct {
	cn        string
	dns       []string
	ips       []net.IP
	client    bool      // a client certificate, else a server one
	notBefore time.Time // zero: an hour ago
	notAfter  time.Time // zero: in a day
}

// issue returns a certificate and its key, both PEM.
func (ca *testCA) issue(t testing.TB, l leaf) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if l.notBefore.IsZero() {
		l.notBefore = time.Now().Add(-time.Hour)
	}
	if l.notAfter.IsZero() {
		l.notAfter = time.Now().Add(24 * time.Hour)
	}
	usage := x509.ExtKeyUsageServerAuth
	if l.client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: l.cn}, DNSNames: l.dns, IPAddresses: l.ips,
		NotBefore: l.notBefore, NotAfter: l.notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// serverCert is a tls.Certificate for an endpoint.
func (ca *testCA) serverCert(t testing.TB, l leaf) tls.Certificate {
	t.Helper()
	c, k := ca.issue(t, l)
	cert, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// writeFile replaces path's content the way a rotation does: a new file
// renamed over the old one.
func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// writeTemp writes b to a new file named name in dir and returns its path.
func writeTemp(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	writeFile(t, p, b)
	return p
}

// listenOn listens on addr's loopback address, any port.
func listenOn(t testing.TB, addr netip.Addr) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	return ln
}

// startEndpoint starts h on addr, with TLS when cfg is not nil (cfg gives
// the certificates and client authentication).
func startEndpoint(t testing.TB, addr netip.Addr, cfg *tls.Config, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = listenOn(t, addr)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake failures the tests cause
	if cfg != nil {
		srv.TLS = cfg
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv
}

// testProxy is a forward proxy: CONNECT tunnels and absolute-form HTTP
// requests, each counted, with a Proxy-Authorization it may require. It
// records the local address of every connection it opens to an
// endpoint, so an endpoint can tell that a request came through it.
type testProxy struct {
	ln   net.Listener
	auth string // the Proxy-Authorization required; "" none
	tr   *http.Transport

	mu       sync.Mutex
	connects []string // CONNECT targets, in order
	forwards []string // absolute-form request targets, in order
	denied   int      // requests refused for their credentials
	upstream map[string]bool
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

// startTestProxy starts a forward proxy on 127.0.0.1; with user set, it
// requires user:password.
func startTestProxy(t testing.TB, user, password string) *testProxy {
	t.Helper()
	return startTestProxyOn(t, netipLoopback, user, password)
}

// startTestProxyOn is startTestProxy listening on addr.
func startTestProxyOn(t testing.TB, addr netip.Addr, user, password string) *testProxy {
	t.Helper()
	p := &testProxy{ln: listenOn(t, addr), upstream: map[string]bool{}, conns: map[net.Conn]struct{}{}}
	if user != "" {
		p.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
	}
	p.tr = &http.Transport{MaxIdleConnsPerHost: 64, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			p.mu.Lock()
			p.upstream[c.LocalAddr().String()] = true
			p.mu.Unlock()
		}
		return c, err
	}}
	p.wg.Go(func() {
		for {
			c, err := p.ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns[c] = struct{}{}
			p.mu.Unlock()
			p.wg.Go(func() {
				defer func() {
					c.Close()
					p.mu.Lock()
					delete(p.conns, c)
					p.mu.Unlock()
				}()
				p.serve(c)
			})
		}
	})
	t.Cleanup(p.close)
	return p
}

func (p *testProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *testProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.tr.CloseIdleConnections()
}

func (p *testProxy) serve(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if p.auth != "" && req.Header.Get("Proxy-Authorization") != p.auth {
			p.mu.Lock()
			p.denied++
			p.mu.Unlock()
			io.Copy(io.Discard, req.Body) // the next request follows it
			io.WriteString(c, "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"test\"\r\nContent-Length: 0\r\n\r\n")
			if req.Method == http.MethodConnect {
				return
			}
			continue
		}
		if req.Method == http.MethodConnect {
			p.tunnel(c, br, req.RequestURI)
			return
		}
		if !strings.HasPrefix(req.RequestURI, "http://") {
			io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
			return
		}
		p.mu.Lock()
		p.forwards = append(p.forwards, req.RequestURI)
		p.mu.Unlock()
		req.RequestURI = ""
		req.Header.Del("Proxy-Authorization")
		resp, err := p.tr.RoundTrip(req)
		if err != nil {
			io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
			return
		}
		err = resp.Write(c)
		resp.Body.Close()
		if err != nil {
			return
		}
	}
}

func (p *testProxy) tunnel(c net.Conn, br *bufio.Reader, target string) {
	p.mu.Lock()
	p.connects = append(p.connects, target)
	p.mu.Unlock()
	up, err := net.Dial("tcp", target)
	if err != nil {
		io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return
	}
	defer up.Close()
	p.mu.Lock()
	p.upstream[up.LocalAddr().String()] = true
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, up)
		p.mu.Unlock()
	}()
	io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	done := make(chan struct{})
	go func() {
		io.Copy(up, br)
		up.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	io.Copy(c, up)
	c.Close()
	<-done
}

// via reports whether a request an endpoint got from remote came through
// the proxy.
func (p *testProxy) via(remote string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.upstream[remote]
}

// counts returns how many tunnels and absolute-form requests it carried
// and how many requests it refused for their credentials.
func (p *testProxy) counts() (connects, forwards, denied int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.connects), len(p.forwards), p.denied
}

func (p *testProxy) targets() (connects, forwards []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.connects...), append([]string(nil), p.forwards...)
}

// endpointLog is an endpoint handler that answers 200 and keeps what each
// request showed: where it came from, its Host, its client certificate's
// name and its Authorization.
type endpointLog struct {
	mu   sync.Mutex
	reqs []seen
}

type seen struct {
	remote, host, path, clientCN, auth, attempt string
}

func (r *endpointLog) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	s := seen{remote: req.RemoteAddr, host: req.Host, path: req.URL.Path, auth: req.Header.Get("Authorization"), attempt: req.Header.Get("X-Attempt")}
	if req.TLS != nil && len(req.TLS.PeerCertificates) > 0 {
		s.clientCN = req.TLS.PeerCertificates[0].Subject.CommonName
	}
	r.mu.Lock()
	r.reqs = append(r.reqs, s)
	r.mu.Unlock()
}

func (r *endpointLog) all() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.reqs...)
}

func (r *endpointLog) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

// startEgressServer opens a sidecar with opts; guard keeps the SSRF guard
// on, with guardedAddr allowed to the egress proxy's guard only. The
// egress files are checked every 50ms.
func startEgressServer(t *testing.T, opts proxy.Options, guard bool) *proxy.Server {
	t.Helper()
	return startEgressServerEvery(t, opts, guard, 50*time.Millisecond)
}

// startEgressServerEvery is startEgressServer checking the egress files
// every check.
func startEgressServerEvery(t *testing.T, opts proxy.Options, guard bool, check time.Duration) *proxy.Server {
	t.Helper()
	opts.DataDir = t.TempDir()
	opts.Listen, opts.AdminListen = "127.0.0.1:0", "-"
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	opts.AllowPrivateTargets = !guard
	opts.CursorInterval = 10 * time.Millisecond
	if opts.RetryBudget == (policy.BudgetConfig{}) {
		opts.RetryBudget = ampleBudget
	}
	proxy.SetEgressTestHooks(&opts, guardedAddr, check)
	s := proxy.New(opts)
	if err := s.Open(); err != nil {
		t.Fatalf("open server: %v", err)
	}
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })
	return s
}
