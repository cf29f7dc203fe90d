package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/internal/filestamp"
	"github.com/sluicehq/sluice/policy"
)

// Egress is how a subscription's requests leave the host:
// directly, or through a forward proxy — the usual way to give webhooks a
// fixed source address (the proxy's, or a NAT's behind it) that receivers
// can allow.
//
// Through a proxy, a request to an https endpoint goes through a CONNECT
// tunnel (TLS runs end to end, the proxy sees only the host and port) and
// one to an http endpoint is sent to the proxy in the absolute form
// ("POST http://host/path HTTP/1.1"). The SSRF guard still judges the
// endpoint: with private targets not allowed, the endpoint's host is
// resolved here and refused as it would be without the proxy, and a
// tunnel is asked for the address judged, not the name, so DNS cannot
// send the proxy elsewhere (an http endpoint's name is resolved again by
// the proxy: see docs/configuration.md, "Egress"). The proxy itself is the operator's and
// is dialled wherever it is, private addresses included.
type Egress struct {
	// Proxy is the forward proxy, "http://host:port" or
	// "https://host:port" (TLS to the proxy as well), without credentials.
	// "" means direct: a subscription whose Egress has no Proxy goes
	// direct whatever Options.Egress says.
	Proxy string `json:"proxy,omitempty"`
	// CredentialsFile holds "user:password" on one line, sent to the proxy
	// as Proxy-Authorization: Basic. It is read when the route is first
	// used and again when it changes on disk; its content is never logged.
	CredentialsFile string `json:"proxy_credentials_file,omitempty"`
	// CAFile holds the PEM certificates that verify an https:// proxy, in
	// place of the system's roots.
	CAFile string `json:"proxy_ca_file,omitempty"`
	// NoProxy lists endpoint hosts reached directly: a name ("hooks.corp",
	// which also covers its subdomains), a name with a leading dot
	// (".corp": subdomains only), an IP address, a CIDR prefix (matched
	// against IP-literal hosts only: nothing is resolved to decide), or
	// "*" for every host. Case does not matter; ports are not compared.
	NoProxy []string `json:"no_proxy,omitempty"`
}

// bypass reports whether host (an endpoint URL's) is in e's NoProxy.
func (e *Egress) bypass(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	ip, ipErr := netip.ParseAddr(strings.Trim(host, "[]"))
	for _, p := range e.NoProxy {
		p = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(p)), ".")
		switch {
		case p == "*":
			return true
		case strings.Contains(p, "/"):
			if pre, err := netip.ParsePrefix(p); err == nil && ipErr == nil && pre.Contains(ip.Unmap()) {
				return true
			}
		case ipErr == nil:
			if a, err := netip.ParseAddr(strings.Trim(p, "[]")); err == nil && a.Unmap() == ip.Unmap() {
				return true
			}
		case strings.HasPrefix(p, "."):
			if strings.HasSuffix(host, p) {
				return true
			}
		case p != "" && (host == p || strings.HasSuffix(host, "."+p)):
			return true
		}
	}
	return false
}

// CheckEgress checks e as a delivery would use it: the proxy URL parses,
// the credentials file holds "user:password" and the CA file
// certificates. File problems are *FileError naming the setting. config
// calls it to refuse a bad value at start-up and reload.
func CheckEgress(e Egress) error {
	if e.Proxy == "" {
		return nil
	}
	_, err := newForwardProxy(e, nil)
	return err
}

// ProxyError is a delivery the forward proxy did not carry: it could not
// be reached (Err), or it answered the tunnel's CONNECT, or an http
// request, with Status (407: it wants credentials). Its text names the
// proxy's address, never the endpoint's URL nor the credentials.
type ProxyError struct {
	Addr   string
	Status int
	Err    error
}

func (e *ProxyError) Error() string {
	if e.Status != 0 {
		return "egress proxy " + e.Addr + " answered " + strconv.Itoa(e.Status)
	}
	return "egress proxy " + e.Addr + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *ProxyError) Unwrap() error { return e.Err }

// egressFailure names a failure of the egress (the proxy, the endpoint's
// or sluice's certificate, the token endpoint), or returns NoFailure.
// failureOf asks it after timeouts, which stay timeouts wherever they
// happen (the breaker counts them apart).
func egressFailure(err error) policy.Failure {
	var pe *ProxyError
	var te *TokenError
	switch {
	case errors.As(err, &te):
		return policy.FailAuthToken
	case errors.As(err, &pe):
		if pe.Status == http.StatusProxyAuthRequired {
			return policy.FailProxyAuth
		}
		return policy.FailProxy
	}
	return tlsFailure(err)
}

// readProxyCredentials reads a credentials file: "user:password" on one
// line, surrounding whitespace ignored.
func readProxyCredentials(path string) (user, password string, err error) {
	b, err := readEgressFile("proxy_credentials_file", path)
	if err != nil {
		return "", "", err
	}
	s := strings.TrimSpace(string(b))
	user, password, ok := strings.Cut(s, ":")
	switch {
	case !ok || user == "":
		return "", "", &FileError{Key: "proxy_credentials_file", Path: path, Err: errors.New(`must hold "user:password" on one line`)}
	case strings.ContainsAny(s, "\r\n"):
		return "", "", &FileError{Key: "proxy_credentials_file", Path: path, Err: errors.New(`must hold one line, "user:password"`)}
	}
	return user, password, nil
}

// proxyAuthorization is the Proxy-Authorization value of a credentials
// file (RFC 7617 Basic).
func proxyAuthorization(path string) (string, error) {
	user, password, err := readProxyCredentials(path)
	if err != nil {
		return "", err
	}
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password)), nil
}

// forwardProxy dials endpoints through a forward proxy: a CONNECT tunnel
// for https endpoints, a plain connection to the proxy for http ones
// (absoluteForm writes their requests).
type forwardProxy struct {
	addr string      // host:port of the proxy
	tls  *tls.Config // for an https:// proxy; nil for http://
	auth string      // Proxy-Authorization value; "" without credentials
	dial *fasthttp.TCPDialer
	// judge returns the address to ask the proxy for, after the SSRF
	// guard approved it; nil when private targets are allowed (the name
	// is sent as it is).
	judge func(host string, timeout time.Duration) (string, error)
}

func newForwardProxy(e Egress, judge func(string, time.Duration) (string, error)) (*forwardProxy, error) {
	u, err := url.Parse(e.Proxy)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
		return nil, errors.New("proxy must be http://host:port or https://host:port, without credentials")
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	// The proxy is the operator's: no guard on its address, and its name
	// is resolved (and cached) like any.
	p := &forwardProxy{addr: net.JoinHostPort(u.Hostname(), port), dial: &fasthttp.TCPDialer{DNSCacheDuration: time.Minute}, judge: judge}
	if u.Scheme == "https" {
		p.tls = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname()}
		if e.CAFile != "" {
			if p.tls.RootCAs, err = loadCAs("proxy_ca_file", e.CAFile); err != nil {
				return nil, err
			}
		}
	}
	if e.CredentialsFile != "" {
		if p.auth, err = proxyAuthorization(e.CredentialsFile); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// connect opens a connection to the proxy itself, with TLS for an
// https:// proxy, within timeout.
func (p *forwardProxy) connect(timeout time.Duration) (net.Conn, time.Time, error) {
	if timeout <= 0 {
		timeout = fasthttp.DefaultDialTimeout
	}
	deadline := time.Now().Add(timeout)
	c, err := p.dial.DialDualStackTimeout(p.addr, timeout) // a proxy on IPv6 too (dial.go, newDialer)
	if err != nil {
		return nil, deadline, &ProxyError{Addr: p.addr, Err: err}
	}
	if p.tls != nil {
		tc := tls.Client(c, p.tls)
		tc.SetDeadline(deadline)
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, deadline, &ProxyError{Addr: p.addr, Err: err}
		}
		c = tc
	}
	return c, deadline, nil
}

// forward is the dial of an http endpoint through the proxy: the guard
// judges the endpoint's host, then the connection goes to the proxy. A
// host client holds connections for one endpoint host only, so every
// request on this connection is for the host judged.
func (p *forwardProxy) forward(addr string, timeout time.Duration) (net.Conn, error) {
	if p.judge != nil {
		host, _, _ := net.SplitHostPort(addr)
		if _, err := p.judge(host, timeout); err != nil {
			return nil, err
		}
	}
	c, _, err := p.connect(timeout)
	if err != nil {
		return nil, err
	}
	return handshakeBoundConn{c}, nil
}

// tunnel is the dial of an https endpoint through the proxy: the guard
// judges the endpoint's host, then the proxy is asked for a tunnel to the
// address judged (or, with private targets allowed, to the name). The
// returned connection carries the endpoint's TLS, which fasthttp starts
// with the endpoint's name (or tls.server_name).
func (p *forwardProxy) tunnel(addr string, timeout time.Duration) (net.Conn, error) {
	target := addr
	if p.judge != nil {
		host, port, _ := net.SplitHostPort(addr)
		ip, err := p.judge(host, timeout)
		if err != nil {
			return nil, err
		}
		target = net.JoinHostPort(ip, port)
	}
	c, deadline, err := p.connect(timeout)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(deadline)
	var b strings.Builder
	b.WriteString("CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\nUser-Agent: sluice\r\n")
	if p.auth != "" {
		b.WriteString("Proxy-Authorization: " + p.auth + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := c.Write([]byte(b.String())); err != nil {
		c.Close()
		return nil, &ProxyError{Addr: p.addr, Err: err}
	}
	br := bufio.NewReaderSize(c, 1024)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, &ProxyError{Addr: p.addr, Err: err}
	}
	resp.Body.Close() // a 2xx to CONNECT has none; another's is not needed
	if resp.StatusCode/100 != 2 {
		c.Close()
		return nil, &ProxyError{Addr: p.addr, Status: resp.StatusCode}
	}
	c.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		// The endpoint spoke before the client's hello: keep what was read.
		c = &bufferedConn{Conn: c, r: br}
	}
	return handshakeBoundConn{c}, nil
}

// bufferedConn reads what the CONNECT's reader buffered first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// absoluteForm sends an http endpoint's requests to the proxy in the
// absolute form ("POST http://host/path HTTP/1.1") with the proxy's
// credentials. fasthttp writes the request line from the URI's path as
// given (the client disables path normalising), so the scheme and the
// authority are put before the path for the write and taken off after.
type absoluteForm struct{ p *forwardProxy }

func (t absoluteForm) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (bool, error) {
	u := req.URI()
	path := append([]byte(nil), u.PathOriginal()...)
	abs := make([]byte, 0, len("http://")+len(u.Host())+len(path)+1)
	abs = append(append(abs, "http://"...), u.Host()...)
	if len(path) == 0 || path[0] != '/' {
		abs = append(abs, '/')
	}
	u.SetPathBytes(append(abs, path...))
	if t.p.auth != "" {
		req.Header.Set(fasthttp.HeaderProxyAuthorization, t.p.auth)
	}
	retry, err := fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
	u.SetPathBytes(path)
	req.Header.Del(fasthttp.HeaderProxyAuthorization)
	if err == nil && resp.StatusCode() == fasthttp.StatusProxyAuthRequired {
		// The proxy's answer, not the endpoint's: retried as a transport
		// failure (proxy_auth), not dead-lettered as a 4xx would be.
		return false, &ProxyError{Addr: t.p.addr, Status: fasthttp.StatusProxyAuthRequired}
	}
	return retry, err
}

// DefaultEgressCheckInterval is how often the files of the routes in use
// (client certificates, CAs, proxy credentials) are looked at for changes.
// Certificates are rotated hours or days ahead of their expiry; a few
// seconds is prompt, and a stat of a handful of files costs nothing.
const DefaultEgressCheckInterval = 5 * time.Second

// routeKey is one distinct transport: the proxy (none for direct) and the
// endpoint TLS. Subscriptions with equal keys share one route and its
// client, so 50,000 subscriptions on the default transport share the
// engine's one client and its per-host cap, and those with a proxy or
// their own certificates share one client per distinct setting.
type routeKey struct {
	proxy, credentials, proxyCA string
	tls                         ClientTLS
}

// files are the files the route reads, which are watched for changes.
func (k routeKey) files() []string {
	var out []string
	for _, f := range []string{k.credentials, k.proxyCA, k.tls.CertFile, k.tls.KeyFile, k.tls.CAFile} {
		if f != "" {
			out = append(out, f)
		}
	}
	return out
}

// route is the client of one routeKey. Its state is replaced whole when
// its files change: new requests use the new client and its new
// connections; the old client's connections finish what they carry.
type route struct {
	key   routeKey
	state atomic.Pointer[routeState]

	use sweepMark // under egress.mu
	// Under egress.checkMu.
	stamps []filestamp.Stamp
}

type routeState struct {
	client *fasthttp.Client
	err    error // the files did not load: every request fails with it
}

// egress owns the routes and the OAuth2 token sources of the lanes: one
// of each per distinct setting, made when a lane first takes a
// subscription that needs it, their files checked at every reload and
// every DefaultEgressCheckInterval, dropped once no lane uses them.
type egress struct {
	def       *Egress // Options.Egress: for subscriptions without their own
	newClient func() *fasthttp.Client
	judge     func(host string, timeout time.Duration) (string, error) // nil: private targets allowed
	log       *slog.Logger
	now       func() time.Time
	interval  time.Duration

	mu     sync.Mutex
	epoch  uint64
	routes map[routeKey]*route
	tokens map[grantKey]*tokenSource

	checkMu sync.Mutex // one check at a time: the loop's and a reload's
	// armed wakes run when a route or token source is made: with none
	// there is nothing to check or sweep, and run does not tick.
	armed chan struct{}

	// ctx ends the token requests in flight at stop; wg waits for them.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newEgress(opts *Options, log *slog.Logger) *egress {
	g := &egress{
		def:       opts.Egress,
		newClient: func() *fasthttp.Client { return newClient(opts.MaxConnsPerHost, opts.AllowPrivateTargets) },
		log:       log,
		now:       opts.Now,
		interval:  DefaultEgressCheckInterval,
		routes:    map[routeKey]*route{},
		tokens:    map[grantKey]*tokenSource{},
		armed:     make(chan struct{}, 1),
	}
	if opts.egressCheckInterval > 0 {
		g.interval = opts.egressCheckInterval
	}
	if !opts.AllowPrivateTargets {
		r := guardedResolver{forbidden: opts.forbiddenTarget}
		g.judge = func(host string, timeout time.Duration) (string, error) {
			if timeout <= 0 {
				timeout = fasthttp.DefaultDialTimeout
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			addrs, err := r.LookupIPAddr(ctx, host)
			if err != nil {
				return "", err
			}
			return addrs[0].IP.String(), nil
		}
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	return g
}

// attach gives sub its route and token source, made if new; sub keeps
// neither when it needs the defaults (no proxy, no TLS settings, no
// auth), and delivers with the engine's shared client. It runs in
// setPolicies, before the lane hands sub to a job, and writes a field
// only when it changes (a Subscription handed over again is being read).
// A nil egress attaches nothing.
func (g *egress) attach(sub *Subscription) {
	if g == nil {
		return // an engine of a test in this package, made without Open
	}
	eg := sub.Egress
	if eg == nil {
		eg = g.def
	}
	if eg == nil && sub.TLS == nil && sub.Auth == nil && sub.route == nil && sub.token == nil {
		return // the common case: nothing to look up
	}
	var k routeKey
	if eg != nil && eg.Proxy != "" && !eg.bypass(urlHost(sub.URL)) {
		k.proxy, k.credentials, k.proxyCA = eg.Proxy, eg.CredentialsFile, eg.CAFile
	}
	if sub.TLS != nil {
		k.tls = *sub.TLS
	}
	var r *route
	var ts *tokenSource
	g.mu.Lock()
	if k != (routeKey{}) {
		r = g.routes[k]
		if r == nil {
			r = g.makeRoute(k, sub.ID)
			g.routes[k] = r
			g.arm()
		}
		r.use.touch(g.epoch)
	}
	if sub.Auth != nil {
		tk := newGrantKey(*sub.Auth, eg)
		ts = g.tokens[tk]
		if ts == nil {
			ts = newTokenSource(g, *sub.Auth, eg)
			g.tokens[tk] = ts
			g.arm()
		}
		ts.use.touch(g.epoch)
	}
	g.mu.Unlock()
	if sub.route != r {
		sub.route = r
	}
	if sub.token != ts {
		sub.token = ts
	}
}

// urlHost is the host of a subscription's URL, "" when it does not parse
// (validated before it gets here).
func urlHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// makeRoute builds a route's first state; a route whose files do not load
// fails each delivery (and says why in the log) until they do.
func (g *egress) makeRoute(k routeKey, sub string) *route {
	r := &route{key: k, stamps: filestamp.Take(k.files()...)}
	st := g.build(k)
	if st.err != nil {
		g.log.Error("egress settings do not load; the subscription's deliveries fail until they do", "subscription", sub, "err", st.err)
	}
	r.state.Store(st)
	return r
}

// build makes the client of k from its files as they are now.
func (g *egress) build(k routeKey) *routeState {
	c := g.newClient()
	if k.tls != (ClientTLS{}) {
		cfg, err := loadClientTLS(k.tls, g.now())
		if err != nil {
			return &routeState{err: err}
		}
		c.TLSConfig = cfg
	}
	if k.proxy != "" {
		p, err := newForwardProxy(Egress{Proxy: k.proxy, CredentialsFile: k.credentials, CAFile: k.proxyCA}, g.judge)
		if err != nil {
			return &routeState{err: err}
		}
		// Each host client (one per endpoint host and scheme, so the
		// per-host cap still holds per endpoint) dials through the proxy.
		c.ConfigureClient = configureHost(p)
	}
	return &routeState{client: c}
}

// check loads again the routes whose files changed since they were last
// loaded. A change that does not load keeps what is in use (a rotation
// caught half-written is complete at the next look) and is logged once.
func (g *egress) check() {
	g.checkMu.Lock()
	defer g.checkMu.Unlock()
	g.mu.Lock()
	routes := make([]*route, 0, len(g.routes))
	for _, r := range g.routes {
		routes = append(routes, r)
	}
	g.mu.Unlock()
	for _, r := range routes {
		files := r.key.files()
		now := filestamp.Take(files...)
		if filestamp.Same(now, r.stamps) {
			continue
		}
		r.stamps = now
		st := g.build(r.key)
		old := r.state.Load()
		if st.err != nil && old.err == nil {
			g.log.Error("egress files changed but do not load; keeping the ones in use", "files", strings.Join(files, ","), "err", st.err)
			continue
		}
		r.state.Store(st)
		if old.client != nil {
			old.client.CloseIdleConnections()
		}
		if st.err == nil {
			g.log.Info("egress files changed; new connections use them", "files", strings.Join(files, ","))
		}
	}
}

// sweep drops the routes and token sources no lane has used for two
// sweeps in a row (so one made for a lane that is not listed yet is
// kept). lanes is the dispatcher's list.
func (g *egress) sweep(lanes []*lane) {
	g.mu.Lock()
	if len(g.routes) == 0 && len(g.tokens) == 0 {
		g.mu.Unlock()
		return
	}
	g.epoch++
	start := g.epoch
	g.mu.Unlock()
	routes, tokens := map[*route]bool{}, map[*tokenSource]bool{}
	for _, l := range lanes {
		l.mu.Lock()
		r, ts := l.sub.route, l.sub.token
		l.mu.Unlock()
		if r != nil {
			routes[r] = true
		}
		if ts != nil {
			tokens[ts] = true
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, r := range g.routes {
		if r.use.unused(routes[r], start) {
			delete(g.routes, k)
			if st := r.state.Load(); st.client != nil {
				st.client.CloseIdleConnections()
			}
		}
	}
	for k, ts := range g.tokens {
		if ts.use.unused(tokens[ts], start) {
			delete(g.tokens, k)
			ts.http.CloseIdleConnections()
		}
	}
}

// sweepMark is when a route or token source was last attached, and how
// many sweeps in a row found no lane using it. Under egress.mu.
type sweepMark struct {
	epoch uint64 // of the last attach
	idle  int
}

func (m *sweepMark) touch(epoch uint64) { m.epoch, m.idle = epoch, 0 }

// unused counts a sweep that began at epoch start and reports whether it
// is the second in a row to find the mark unused: an attach since start
// counts as a use, so one made for a lane not listed yet is kept.
func (m *sweepMark) unused(used bool, start uint64) bool {
	if used || m.epoch >= start {
		m.idle = 0
		return false
	}
	m.idle++
	return m.idle >= 2
}

// run checks the files and sweeps every interval until quit, then ends
// the token requests in flight and closes the idle connections of every
// route and token source.
func (g *egress) run(quit <-chan struct{}, lanes func() []*lane) {
	t := newIdleTicker(g.interval)
	defer t.Stop()
	for {
		// Most sidecars need neither a route nor a token source: they
		// sleep here until one is made (or stop) instead of waking every
		// interval to find nothing.
		g.mu.Lock()
		t.tickIf(len(g.routes) > 0 || len(g.tokens) > 0)
		g.mu.Unlock()
		select {
		case <-g.armed:
		case <-t.C:
			g.check()
			g.sweep(lanes())
		case <-quit:
			g.cancel()
			g.wg.Wait()
			g.mu.Lock()
			defer g.mu.Unlock()
			for _, r := range g.routes {
				if st := r.state.Load(); st.client != nil {
					st.client.CloseIdleConnections()
				}
			}
			for _, ts := range g.tokens {
				ts.http.CloseIdleConnections()
			}
			return
		}
	}
}

// idleTicker is a ticker its loop stops while it has nothing to look at,
// so an idle sidecar sleeps instead of waking every period; what gives it
// work wakes the loop, which starts the ticker again.
type idleTicker struct {
	*time.Ticker
	d       time.Duration
	ticking bool
}

func newIdleTicker(d time.Duration) *idleTicker {
	return &idleTicker{Ticker: time.NewTicker(d), d: d, ticking: true}
}

// tickIf runs the ticker when busy and stops it when not.
func (t *idleTicker) tickIf(busy bool) {
	switch {
	case !busy && t.ticking:
		t.Stop()
		t.ticking = false
	case busy && !t.ticking:
		t.Reset(t.d)
		t.ticking = true
	}
}

// arm wakes run, which ticks while a route or token source exists.
func (g *egress) arm() {
	select {
	case g.armed <- struct{}{}:
	default:
	}
}

// exchange makes deliver's HTTP exchange with sub's route (the proxy, the
// endpoint TLS) and credentials (an OAuth2 bearer token), or with the
// engine's shared client when sub needs neither.
func (e *engine) exchange(sub *Subscription, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error {
	c := e.client
	if r := sub.route; r != nil {
		st := r.state.Load()
		if st.err != nil {
			return st.err
		}
		c = st.client
	}
	if sub.token != nil {
		return sub.token.do(c, req, resp, timeout)
	}
	return c.DoTimeout(req, resp, timeout)
}
