package egress

import (
	"cmp"
	"context"
	"iter"
	"log/slog"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/internal/filestamp"
	"github.com/sluicehq/sluice/internal/idletick"
)

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

	use sweepMark // under Routes.mu
	// Under Routes.checkMu.
	stamps []filestamp.Stamp
}

type routeState struct {
	client *fasthttp.Client
	err    error // the files did not load: every request fails with it
}

// Routes owns the routes and the OAuth2 token sources of the lanes: one
// of each per distinct setting, made when a lane first takes a
// subscription that needs it, their files checked at every reload and
// every DefaultEgressCheckInterval, dropped once no lane uses them.
type Routes struct {
	def       *Egress // Config.Default: for subscriptions without their own
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

// Config is what Routes takes of the sidecar's options.
type Config struct {
	// Default routes the subscriptions without an Egress of their own;
	// nil: direct.
	Default *Egress
	// MaxConnsPerHost and AllowPrivateTargets are NewClient's, for the
	// clients of routes.
	MaxConnsPerHost     int
	AllowPrivateTargets bool
	Logger              *slog.Logger
	Now                 func() time.Time
	// CheckInterval is how often the routes' files are looked at;
	// DefaultEgressCheckInterval if 0.
	CheckInterval time.Duration
	// ForbiddenTarget replaces policy.ForbiddenTarget in an egress
	// proxy's SSRF guard (tests, whose every address is loopback); nil:
	// policy's. The direct dialer always keeps policy's.
	ForbiddenTarget func(netip.Addr) string
}

// NewRoutes returns Routes with none made yet.
func NewRoutes(c Config) *Routes {
	g := &Routes{
		def:       c.Default,
		newClient: func() *fasthttp.Client { return NewClient(c.MaxConnsPerHost, c.AllowPrivateTargets) },
		log:       c.Logger,
		now:       c.Now,
		interval:  cmp.Or(c.CheckInterval, DefaultEgressCheckInterval),
		routes:    map[routeKey]*route{},
		tokens:    map[grantKey]*tokenSource{},
		armed:     make(chan struct{}, 1),
	}
	if !c.AllowPrivateTargets {
		r := guardedResolver{forbidden: c.ForbiddenTarget}
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

// Settings are one subscription's egress settings, as it names them.
type Settings struct {
	ID     string // for the log
	URL    string // the endpoint: its host decides a no_proxy bypass
	Egress *Egress
	TLS    *ClientTLS
	Auth   *OAuth2
}

// Binding is what one subscription delivers with: its route (the proxy,
// the endpoint TLS) and its token source (OAuth2). The zero value is the
// defaults: the shared client, no token. Bindings compare with ==.
type Binding struct {
	route *route
	token *tokenSource
}

// Routed reports whether b's requests go through a route's own client
// rather than the shared one.
func (b Binding) Routed() bool { return b.route != nil }

// Attach returns the binding of s, its route and token source made if
// new; cur is the binding s has now. A subscription that needs the
// defaults (no proxy, no TLS settings, no auth) gets the zero Binding and
// delivers with the shared client. A nil Routes attaches nothing.
func (g *Routes) Attach(s Settings, cur Binding) Binding {
	if g == nil {
		return cur // an engine of a test, made without a Server
	}
	eg := s.Egress
	if eg == nil {
		eg = g.def
	}
	if eg == nil && s.TLS == nil && s.Auth == nil && cur == (Binding{}) {
		return cur // the common case: nothing to look up
	}
	var k routeKey
	if eg != nil && eg.Proxy != "" && !eg.bypass(URLHost(s.URL)) {
		k.proxy, k.credentials, k.proxyCA = eg.Proxy, eg.CredentialsFile, eg.CAFile
	}
	if s.TLS != nil {
		k.tls = *s.TLS
	}
	var b Binding
	g.mu.Lock()
	if k != (routeKey{}) {
		b.route = g.routes[k]
		if b.route == nil {
			b.route = g.makeRoute(k, s.ID)
			g.routes[k] = b.route
			g.arm()
		}
		b.route.use.touch(g.epoch)
	}
	if s.Auth != nil {
		tk := newGrantKey(*s.Auth, eg)
		b.token = g.tokens[tk]
		if b.token == nil {
			b.token = newTokenSource(g, *s.Auth, eg)
			g.tokens[tk] = b.token
			g.arm()
		}
		b.token.use.touch(g.epoch)
	}
	g.mu.Unlock()
	return b
}

// Do makes one HTTP exchange with b's route and credentials (an OAuth2
// bearer token), or with shared when b needs neither.
func (b Binding) Do(shared *fasthttp.Client, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error {
	c := shared
	if r := b.route; r != nil {
		st := r.state.Load()
		if st.err != nil {
			return st.err
		}
		c = st.client
	}
	if b.token != nil {
		return b.token.do(c, req, resp, timeout)
	}
	return c.DoTimeout(req, resp, timeout)
}

// URLHost is the host of an endpoint's URL, "" when it does not parse
// (validated before it gets here).
func URLHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// makeRoute builds a route's first state; a route whose files do not load
// fails each delivery (and says why in the log) until they do.
func (g *Routes) makeRoute(k routeKey, sub string) *route {
	r := &route{key: k, stamps: filestamp.Take(k.files()...)}
	st := g.build(k)
	if st.err != nil {
		g.log.Error("egress settings do not load; the subscription's deliveries fail until they do", "subscription", sub, "err", st.err)
	}
	r.state.Store(st)
	return r
}

// build makes the client of k from its files as they are now.
func (g *Routes) build(k routeKey) *routeState {
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

// Check loads again the routes whose files changed since they were last
// loaded. A change that does not load keeps what is in use (a rotation
// caught half-written is complete at the next look) and is logged once.
func (g *Routes) Check() {
	if g == nil {
		return // an engine of a test, made without routes
	}
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

// sweep drops the routes and token sources no binding in inUse has used
// for two sweeps in a row (so one made for a lane that is not listed yet
// is kept).
func (g *Routes) sweep(inUse iter.Seq[Binding]) {
	g.mu.Lock()
	if len(g.routes) == 0 && len(g.tokens) == 0 {
		g.mu.Unlock()
		return
	}
	g.epoch++
	start := g.epoch
	g.mu.Unlock()
	routes, tokens := map[*route]bool{}, map[*tokenSource]bool{}
	for b := range inUse {
		if b.route != nil {
			routes[b.route] = true
		}
		if b.token != nil {
			tokens[b.token] = true
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
// many sweeps in a row found no lane using it. Under Routes.mu.
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

// Run checks the files and sweeps every interval until quit, then ends
// the token requests in flight and closes the idle connections of every
// route and token source. inUse lists the bindings of every lane; it is
// ranged afresh at each sweep.
func (g *Routes) Run(quit <-chan struct{}, inUse iter.Seq[Binding]) {
	t := idletick.New(g.interval)
	defer t.Stop()
	for {
		// Most sidecars need neither a route nor a token source: they
		// sleep here until one is made (or stop) instead of waking every
		// interval to find nothing.
		g.mu.Lock()
		t.RunIf(len(g.routes) > 0 || len(g.tokens) > 0)
		g.mu.Unlock()
		select {
		case <-g.armed:
		case <-t.C:
			g.Check()
			g.sweep(inUse)
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

// arm wakes run, which ticks while a route or token source exists.
func (g *Routes) arm() {
	select {
	case g.armed <- struct{}{}:
	default:
	}
}
