// Package proxy is the sidecar's Server: it wires its rooms together and
// owns their lifecycle (New, Open, Reload, Close) and the memory budget's
// shares (memory.go); nothing else.
//
// The rooms, each a package under proxy/:
//
//   - ingest: the producer's POST /v1/events/{type}; it knows the log
//     only as an Appender.
//   - delivery: the engine between the log and an HTTP exchange (lanes,
//     dispatcher, outcomes, ordering, variants, fleet ownership, the
//     completion ledger, the operational webhook's events).
//   - egress: one outbound exchange (the client, the SSRF guard,
//     proxies, endpoint TLS, OAuth2).
//   - admin: the admin API, the registry of API subscriptions, tenants'
//     tokens and what each may see, the dashboard; it sees the engine
//     through admin.Engine, in subscription ids.
//   - api: the admin API's wire types, shared with package client.
//
// Imports run one way (TestImportDirection): admin → delivery → egress,
// ingest → queue, and nothing under proxy/ imports proxy.
//
// Guarantees of the whole:
//
//   - Ingest answers 202 only after the event is in the log (fsynced with
//     durability fsync), and a repeated Idempotency-Key within the dedup
//     window answers 200 with the original id and seq, delivering nothing new.
//   - Each subscription gets each event it is entitled to at least once:
//     acknowledged (2xx), or dead-lettered with a reason. After a crash,
//     deliveries that were in flight or acknowledged after the last cursor
//     flush are sent again (receivers deduplicate on webhook-id).
//   - A subscription never has more than its concurrency cap in flight; the
//     rest waits in the log, not in memory.
package proxy

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
)

// Defaults of the sidecar's options; config documents each as its key's
// default.
const (
	DefaultListen         = "127.0.0.1:8700"
	DefaultAdminListen    = "127.0.0.1:8701"
	DefaultMaxBodyBytes   = 1 << 20
	DefaultShutdownGrace  = 10 * time.Second
	DefaultMaxInFlight    = 1024
	DefaultCursorInterval = 20 * time.Millisecond
)

// Options configure a Server. Zero values take the defaults above.
type Options struct {
	// Listen is the ingest address: "host:port" or "unix:///path.sock".
	Listen string
	// SocketMode is the file mode of unix-socket listeners; 0660 if zero.
	SocketMode os.FileMode
	// AdminListen is the admin API address; "-" disables it.
	AdminListen string
	// AdminToken, when set, is required as a bearer token on every admin
	// path but /healthz.
	AdminToken string
	DataDir    string
	// Sync: 202 means fsynced (durability fsync) rather than written to the
	// OS (durability async: survives a process crash, not power loss).
	Sync         bool
	DedupWindow  time.Duration
	MaxBodyBytes int
	// Ingest bounds what producers may hold of the ingest listener.
	Ingest ingest.Limits
	// MaxInFlight caps concurrent outbound requests for the whole process.
	MaxInFlight int
	// MemoryBytes is the memory budget the log's memtables and caches,
	// the ring and the ingest gate are sized from (SplitMemory);
	// DefaultMemoryBytes if 0.
	MemoryBytes     int64
	MaxConnsPerHost int
	// CursorInterval is how often moved cursors are written (together). It
	// bounds the redelivery window after a crash.
	CursorInterval time.Duration
	// RetryBudget is shared by every lane; zero fields take policy's defaults.
	RetryBudget   policy.BudgetConfig
	Subscriptions []*delivery.Subscription
	Logger        *slog.Logger
	// Now is the clock; time.Now if nil.
	Now func() time.Time
	// MaxDiskBytes is the log's disk quota (0: none); MinFreeDiskBytes the
	// free space it leaves on its file system (queue.DefaultMinFreeBytes if
	// 0, none if negative). Past either, ingest answers 507.
	MaxDiskBytes     int64
	MinFreeDiskBytes int64
	// AcceptDataLoss opens a data dir whose logs are damaged in the middle,
	// dropping the records after the damage, where Open would refuse it
	// (badger.Options.AcceptDataLoss). For one start, by an operator.
	AcceptDataLoss bool
	// AllowPrivateTargets lets subscriptions deliver to loopback, private,
	// link-local and metadata addresses. Off by default (SSRF guard); tests,
	// the demo and single-host setups turn it on.
	AllowPrivateTargets bool
	// Egress, when set, routes the deliveries of every subscription
	// without an Egress of its own (the operational webhook's too)
	// through a forward proxy (package egress). Nil: direct.
	Egress *egress.Egress
	// Registry receives the Prometheus metrics and is served at /metrics;
	// a private registry if nil.
	Registry *prometheus.Registry
	// OpenStore, when set, opens the log instead of the Badger one in
	// DataDir (fleet mode: cmd passes JetStream's). It must call onCommit
	// with each group of new events in seq order, never concurrently (from
	// the moment it is called: before it returns too), and register its
	// metrics with reg. A store that is a queue.Fleet makes
	// this node deliver only the lanes it owns.
	OpenStore func(onCommit func([]*queue.Event), reg prometheus.Registerer) (queue.Store, error)

	// Specs parses the subscription documents of the API (POST and PATCH
	// of /v1/subscriptions) with the config file's validation; cmd wires
	// config's. Nil: the API cannot create or change subscriptions.
	Specs admin.SpecParser
	// Tenants are the tenants' own limits, above their subscriptions'.
	// A zero field takes TenantDefaults' value.
	Tenants []delivery.Tenant
	// TenantDefaults are the limits of every tenant Tenants does not
	// list (a subscription or a token may name any tenant), and the
	// base of those it does. A zero field takes its DefaultTenant*
	// constant; ID and SharedTypes are not used.
	TenantDefaults delivery.Tenant
	// TenantTokens are admin tokens scoped to one tenant each (from the
	// config; SetTenantTokens replaces them); tokens issued through the
	// API are kept in the store.
	TenantTokens []admin.TenantToken
	// OperationalWebhook, when set, receives sluice's own events
	// (subscription.paused, breaker changes, dead letters, backlog quota),
	// appended to the log and delivered through a lane like any
	// subscription (operational.go). Open gives it the ID OperationalID,
	// the operational event types, no tenant and no filter, and makes it
	// the file's (the API cannot change it); URL, Secrets and the delivery
	// settings are used as given.
	OperationalWebhook *delivery.Subscription

	// forbiddenTarget replaces policy.ForbiddenTarget in the egress proxy's
	// SSRF guard (tests in this package only: everything they reach is
	// loopback); egressCheckInterval replaces DefaultEgressCheckInterval.
	forbiddenTarget     func(netip.Addr) string
	egressCheckInterval time.Duration
	// ingestGate replaces the ingest gate's bounds (tests in this
	// package only): 0 takes ingest's default and the memory budget's
	// share.
	ingestGate struct {
		events int
		bytes  int64
	}
	// TracerProvider, when set, makes OpenTelemetry spans: one per ingest
	// request and one per delivery attempt (tracing.go, docs/ingest-and-delivery.md,
	// "Tracing"). Nil (the default) makes none. The Server owns it from
	// New: Close shuts it down (flushing its spans, for at most 5 s) when
	// it has a Shutdown(context.Context) error method, as the SDK's has.
	TracerProvider trace.TracerProvider
	// DropTraceContext sends no traceparent or tracestate to endpoints.
	// By default an event's trace context goes out with each attempt,
	// whether or not spans are made.
	DropTraceContext bool
	// CloudEventsSource is the CloudEvents source attribute of events not
	// posted as CloudEvents, on deliveries to subscriptions in a
	// CloudEvents format; cloudevents.DefaultSource if "". The caller
	// checks it (cloudevents.CheckSource).
	CloudEventsSource string
}

// Server is a running sidecar: ingest, lanes and admin API.
type Server struct {
	opts     Options
	mem      MemoryShares // opts.MemoryBytes, split
	log      *slog.Logger
	q        queue.Store
	d        *delivery.Dispatcher
	ingest   *ingest.Server
	ingestLn net.Listener
	// admin serves the admin API on adminLn (nil: disabled), api's once
	// the log is open.
	admin    *admin.Server
	adminLn  net.Listener
	api      *admin.API
	draining atomic.Bool
	// ingestServing: the ingest server's Serve has been started.
	ingestServing bool
	trace         delivery.Tracer
	// wrapStore, when set (by tests in this package only), wraps the
	// store the engine drives, to inject faults the real one cannot be
	// made to have on demand.
	wrapStore func(queue.Store) queue.Store
}

// New returns an unstarted Server.
func New(opts Options) *Server {
	if opts.Listen == "" {
		opts.Listen = DefaultListen
	}
	if opts.AdminListen == "" {
		opts.AdminListen = DefaultAdminListen
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.MaxConnsPerHost <= 0 {
		opts.MaxConnsPerHost = egress.DefaultMaxConnsPerHost
	}
	if opts.MemoryBytes <= 0 {
		opts.MemoryBytes = DefaultMemoryBytes
	}
	if opts.CursorInterval <= 0 {
		opts.CursorInterval = DefaultCursorInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	opts.TenantDefaults = opts.TenantDefaults.Or(delivery.Tenant{MaxSubscriptions: delivery.DefaultTenantMaxSubscriptions,
		MaxConcurrency: delivery.DefaultTenantMaxConcurrency, MaxSubscriptionConcurrency: delivery.DefaultTenantMaxSubscriptionConcurrency})
	tenants := make([]delivery.Tenant, len(opts.Tenants))
	for i, t := range opts.Tenants { // copies: the caller's stay as given
		tenants[i] = t.Or(opts.TenantDefaults)
	}
	opts.Tenants = tenants
	s := &Server{opts: opts, mem: SplitMemory(opts.MemoryBytes), log: opts.Logger, trace: delivery.NewTracer(opts.TracerProvider, opts.DropTraceContext)}
	return s
}

// Open binds the listeners (bind errors surface here), opens the log,
// recovers the lanes and starts serving.
func (s *Server) Open() (err error) {
	s.ingestLn, err = listen(s.opts.Listen, s.opts.SocketMode)
	if err != nil {
		return fmt.Errorf("ingest listen %s: %w", s.opts.Listen, err)
	}
	var adminDone chan struct{}
	defer func() {
		if err != nil {
			s.ingestLn.Close()
			if s.adminLn != nil {
				s.adminLn.Close()
			}
			if s.admin != nil {
				s.admin.Close()
				<-adminDone
				s.admin = nil
			}
			if s.ingest != nil {
				s.ingest.Shutdown(context.Background())
				s.ingest, s.ingestServing = nil, false
			}
		}
	}()
	if s.opts.AdminListen != "-" {
		if s.adminLn, err = listen(s.opts.AdminListen, s.opts.SocketMode); err != nil {
			return fmt.Errorf("admin listen %s: %w", s.opts.AdminListen, err)
		}
		s.adminLn = admin.Listener(s.adminLn)
	}
	if s.opts.OpenStore != nil {
		// Producers of a sidecar whose shared log is away (NATS still
		// starting, or down) hear 503 with Retry-After, as they do when it
		// goes away later, rather than hanging on a listener nobody reads
		// or, when the open gives up, a refused connection.
		s.newIngest()
		s.serveIngest()
	}
	if s.adminLn != nil && s.opts.OpenStore != nil {
		// A shared log may take a while to reach (NATS still starting,
		// retried with backoff): serve /healthz and a 503 /readyz that
		// says so meanwhile, rather than refusing connections.
		s.serveAdmin(&adminDone, nil)
	}
	subs := s.opts.Subscriptions
	s.opts.Subscriptions = nil // the lanes own them now
	// A shared log's follower may commit other nodes' events while the
	// store is still opening, before the dispatcher exists (a nil d here
	// crashed a node joining a busy fleet). Those commits only move the
	// head: the lanes read from their cursors in the store, up to the
	// feed's head, which starts at the last seq committed meanwhile.
	var (
		dp        atomic.Pointer[delivery.Dispatcher]
		earlyMu   sync.Mutex
		earlyHead uint64
	)
	onCommit := func(evs []*queue.Event) {
		if d := dp.Load(); d != nil {
			d.OnCommit(evs)
			return
		}
		earlyMu.Lock()
		d := dp.Load()
		if d == nil {
			earlyHead = max(earlyHead, evs[len(evs)-1].Seq)
		}
		earlyMu.Unlock()
		if d != nil {
			d.OnCommit(evs)
		}
	}
	// A local first: a failed open must leave s.q nil (an interface
	// holding a nil pointer would not be), so Close skips it.
	var q queue.Store
	if s.opts.OpenStore != nil {
		q, err = s.opts.OpenStore(onCommit, s.opts.Registry)
	} else {
		q, err = openBadger(s.opts, s.log, onCommit)
	}
	if err != nil {
		return err
	}
	s.q = q
	if s.wrapStore != nil {
		s.q = s.wrapStore(q)
	}
	d := delivery.New(delivery.Config{
		Store: s.q, Client: egress.NewClient(s.opts.MaxConnsPerHost, s.opts.AllowPrivateTargets),
		Routes: egress.NewRoutes(egress.Config{
			Default: s.opts.Egress, MaxConnsPerHost: s.opts.MaxConnsPerHost, AllowPrivateTargets: s.opts.AllowPrivateTargets,
			Logger: s.log, Now: s.opts.Now, CheckInterval: s.opts.egressCheckInterval, ForbiddenTarget: s.opts.forbiddenTarget,
		}),
		Logger: s.log, Now: s.opts.Now, MaxInFlight: s.opts.MaxInFlight, RingBytes: s.mem.Ring,
		CursorInterval: s.opts.CursorInterval, RetryBudget: s.opts.RetryBudget, Tracer: s.trace,
		TenantDefaults: s.opts.TenantDefaults, Tenants: s.opts.Tenants, Operational: s.opts.OperationalWebhook,
		Registry: s.opts.Registry, OnMaintain: func(now time.Time) { s.api.RetireExpiredSecrets(now) },
		CloudEventsSource: s.opts.CloudEventsSource,
	})
	// The admin API before the engine starts: its maintenance retires
	// the API's rotated secrets through it.
	s.api = admin.New(admin.Config{
		Engine: d, Store: s.q, Logger: s.log, Now: s.opts.Now, AdminListen: s.opts.AdminListen, AdminToken: s.opts.AdminToken,
		Registry: s.opts.Registry, Specs: s.opts.Specs, Tenants: s.opts.Tenants, TenantDefaults: s.opts.TenantDefaults,
		TenantTokens: s.opts.TenantTokens, Draining: &s.draining,
	})
	earlyMu.Lock()
	d.RaiseHead(earlyHead)
	dp.Store(d)
	earlyMu.Unlock()
	s.d = d
	if err := d.Start(subs); err != nil {
		s.q.Close()
		s.q, s.d = nil, nil // Close closes only what is open
		return err
	}
	// Serving before the ingest server starts (when the store was not
	// opened through OpenStore it starts only here): a request it took
	// in between would be answered 503 "starting" by a ready sidecar.
	if s.ingest == nil {
		s.newIngest()
	}
	s.ingest.Start(s.q)
	if !s.ingestServing {
		s.serveIngest()
	}
	if s.admin != nil {
		s.admin.Ready(s.api)
	} else if s.adminLn != nil {
		s.serveAdmin(&adminDone, s.api)
	}
	return nil
}

// serveAdmin serves the admin listener: a's API, or the starting handler
// until Ready when a is nil; done is closed when it stops serving.
func (s *Server) serveAdmin(done *chan struct{}, a *admin.API) {
	s.admin = admin.NewServer()
	if a != nil {
		s.admin.Ready(a)
	}
	*done = make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		if err := s.admin.Serve(s.adminLn); err != nil {
			s.log.Error("admin server", "err", err)
		}
	}(*done)
}

// newIngest makes the ingest server; it answers 503 until Start.
func (s *Server) newIngest() {
	s.ingest = ingest.New(ingest.Config{
		Limits: s.opts.Ingest, MaxBodyBytes: s.opts.MaxBodyBytes,
		MaxPendingEvents: s.opts.ingestGate.events, MaxPendingBytes: cmp.Or(s.opts.ingestGate.bytes, s.mem.Gate),
		Now: s.opts.Now, Logger: s.log, Registry: s.opts.Registry, Tracer: s.trace.Spans(), Reserved: reservedType,
	})
}

// reservedType is ingest's Reserved: the operational webhook's types.
// OperationalType compares string(typ) in place once inlined here.
func reservedType(typ []byte) bool { return delivery.OperationalType(string(typ)) }

// serveIngest serves the ingest listener.
func (s *Server) serveIngest() {
	s.ingestServing = true
	go func() {
		if err := s.ingest.Serve(s.ingestLn); err != nil {
			s.log.Error("ingest server", "err", err)
		}
	}()
}

// openBadger opens the embedded log; a nil *badger.Log must not become a
// non-nil queue.Store, so the error path returns a nil interface.
func openBadger(o Options, log *slog.Logger, onCommit func([]*queue.Event)) (queue.Store, error) {
	q, err := badger.Open(badger.Options{
		Dir: o.DataDir, Sync: o.Sync, DedupWindow: o.DedupWindow, Logger: log,
		MaxDiskBytes: o.MaxDiskBytes, MinFreeBytes: o.MinFreeDiskBytes, AcceptDataLoss: o.AcceptDataLoss,
		OnCommit: onCommit, Registerer: o.Registry, Memory: SplitMemory(o.MemoryBytes).Log,
	})
	if err != nil {
		return nil, err
	}
	return q, nil
}

func listen(addr string, mode os.FileMode) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix://")
	if !ok {
		return net.Listen("tcp", addr)
	}
	// A stale socket from a killed process would make the bind fail.
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if mode == 0 {
		mode = 0o660
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("set socket mode: %w", err)
	}
	return ln, nil
}

// URL is the ingest base URL, e.g. "http://127.0.0.1:8700".
func (s *Server) URL() string { return baseURL(s.ingestLn) }

// AdminURL is the admin API base URL ("" when disabled).
func (s *Server) AdminURL() string {
	if s.adminLn == nil {
		return ""
	}
	return baseURL(s.adminLn)
}

func baseURL(ln net.Listener) string {
	if ln.Addr().Network() == "unix" {
		return "unix://" + ln.Addr().String()
	}
	return "http://" + ln.Addr().String()
}

// Reload applies a new set of subscriptions without a restart (the server
// owns them from here): new ones are
// entitled to events accepted from now on, removed ones drain what they
// were entitled to, changed ones deliver with their new settings. The
// operational webhook stays whatever subs hold; a subscription with its
// id (OperationalID) is refused.
func (s *Server) Reload(subs []*delivery.Subscription) error { return s.d.Reload(subs) }

// Lanes returns a status line per subscription, sorted by id.
func (s *Server) Lanes() []api.LaneStatus { return s.d.Statuses() }

// RetryBudget returns the shared retry budget's state over its window.
func (s *Server) RetryBudget() policy.BudgetStats { return s.d.RetryBudget() }

// DeadLetters lists the dead letters of sub ("" for all), at most limit.
func (s *Server) DeadLetters(sub string, limit int) ([]*queue.DeadLetter, error) {
	return s.q.DeadLetters(sub, "", 0, limit)
}

// Close drains: ingest answers 503 with Retry-After while deliveries in
// flight get until ctx ends to finish; then cursors are written and the log
// is closed. What did not finish is delivered again after a restart. It
// closes only what Open opened (nothing after a failed Open) and returns
// the first error, each naming its part. Calling Close again does nothing.
func (s *Server) Close(ctx context.Context) error {
	if s.draining.Swap(true) {
		return nil
	}
	if s.ingest != nil {
		s.ingest.Drain() // producers hear 503 from now on
	}
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	if s.d != nil {
		if n := s.d.Stop(ctx); n > 0 {
			s.log.Warn("deliveries abandoned at shutdown; they run again after restart", "count", n)
		}
	}
	// Producers saw 503 during the drain; now stop taking connections.
	// Requests already inside Append finish before the log closes.
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if s.ingest != nil {
		if err := s.ingest.Shutdown(sctx); err != nil {
			keep(fmt.Errorf("ingest shutdown: %w", err))
		}
		// fasthttp closes only the listeners its Serve has registered: a
		// Close right after Open can come first, and Serve would then
		// accept for ever (goleak found it). Closing it again is harmless.
		s.ingestLn.Close()
	}
	if s.admin != nil {
		if err := s.admin.Shutdown(sctx); err != nil {
			keep(fmt.Errorf("admin shutdown: %w", err))
		}
	}
	if s.d != nil {
		s.d.StopOperational() // it appends: before the log closes
	}
	if s.q != nil {
		if err := s.q.Close(); err != nil {
			keep(fmt.Errorf("close log: %w", err))
		}
	}
	if err := s.trace.Shutdown(); err != nil {
		keep(fmt.Errorf("tracing shutdown: %w", err))
	}
	return first
}
