package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
)

// The engine's tests run it as package proxy wires it, without the admin
// API: a real Badger log in a temporary directory, a Dispatcher over it
// and the real ingest server on loopback, so a test posts its events as a
// producer does. Options and Server keep proxy's names for the parts they
// share, so a test reads the same in either package.

// Options configure a test Server; zero fields take proxy's defaults.
type Options struct {
	Listen, AdminListen string // AdminListen: no admin API here, kept for proxy's spelling
	DataDir             string
	Sync                bool
	AllowPrivateTargets bool
	MaxConnsPerHost     int
	MaxInFlight         int
	CursorInterval      time.Duration
	RetryBudget         policy.BudgetConfig
	Subscriptions       []*Subscription
	Tenants             []Tenant
	TenantDefaults      Tenant
	OperationalWebhook  *Subscription
	Logger              *slog.Logger
	Now                 func() time.Time
	TracerProvider      trace.TracerProvider
	DropTraceContext    bool
	CloudEventsSource   string
	// Registry receives the engine's and the log's metrics; none if nil.
	Registry *prometheus.Registry
}

// Server is a running engine with its log and ingest.
type Server struct {
	opts Options
	q    queue.Store // the store the engine drives (wrapped, when a test asked)
	d    *Dispatcher
	in   *ingest.Server
	ln   net.Listener
	// wrapStore, when set, wraps the store the engine drives, to inject
	// faults the real one cannot be made to have on demand.
	wrapStore func(queue.Store) queue.Store
	closed    atomic.Bool
}

func TestMain(m *testing.M) { testwait.Main(m) }

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newTestServer returns an unopened Server.
func newTestServer(opts Options) *Server {
	opts.Listen = cmp.Or(opts.Listen, "127.0.0.1:0")
	opts.MaxConnsPerHost = cmp.Or(opts.MaxConnsPerHost, egress.DefaultMaxConnsPerHost)
	opts.MaxInFlight = cmp.Or(opts.MaxInFlight, 1024)
	opts.CursorInterval = cmp.Or(opts.CursorInterval, 20*time.Millisecond)
	if opts.Logger == nil {
		opts.Logger = discardLogger()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	opts.TenantDefaults = opts.TenantDefaults.Or(Tenant{MaxSubscriptions: DefaultTenantMaxSubscriptions,
		MaxConcurrency: DefaultTenantMaxConcurrency, MaxSubscriptionConcurrency: DefaultTenantMaxSubscriptionConcurrency})
	tenants := make([]Tenant, len(opts.Tenants))
	for i, t := range opts.Tenants {
		tenants[i] = t.Or(opts.TenantDefaults)
	}
	opts.Tenants = tenants
	return &Server{opts: opts}
}

// Open opens the log, starts the engine over it and serves ingest.
func (s *Server) Open() error {
	var dp atomic.Pointer[Dispatcher]
	var reg prometheus.Registerer
	if s.opts.Registry != nil {
		reg = s.opts.Registry
	}
	q, err := badger.Open(badger.Options{Dir: s.opts.DataDir, Sync: s.opts.Sync, Logger: s.opts.Logger, Registerer: reg,
		OnCommit: func(evs []*queue.Event) {
			if d := dp.Load(); d != nil {
				d.OnCommit(evs)
			}
		}})
	if err != nil {
		return err
	}
	s.q = q
	if s.wrapStore != nil {
		s.q = s.wrapStore(q)
	}
	d := New(Config{
		Store: s.q, Client: egress.NewClient(s.opts.MaxConnsPerHost, s.opts.AllowPrivateTargets),
		Routes: egress.NewRoutes(egress.Config{MaxConnsPerHost: s.opts.MaxConnsPerHost, AllowPrivateTargets: s.opts.AllowPrivateTargets,
			Logger: s.opts.Logger, Now: s.opts.Now}),
		Logger: s.opts.Logger, Now: s.opts.Now, MaxInFlight: s.opts.MaxInFlight,
		CursorInterval: s.opts.CursorInterval, RetryBudget: s.opts.RetryBudget,
		Tracer:         NewTracer(s.opts.TracerProvider, s.opts.DropTraceContext),
		TenantDefaults: s.opts.TenantDefaults, Tenants: s.opts.Tenants, Operational: s.opts.OperationalWebhook,
		Registry: reg, CloudEventsSource: s.opts.CloudEventsSource,
	})
	dp.Store(d)
	if err := d.Start(s.opts.Subscriptions); err != nil {
		q.Close()
		return err
	}
	s.d = d
	s.ln, err = net.Listen("tcp", s.opts.Listen)
	if err != nil {
		s.Close(context.Background())
		return err
	}
	s.in = ingest.New(ingest.Config{Now: s.opts.Now, Logger: s.opts.Logger, Reserved: func(typ []byte) bool { return OperationalType(string(typ)) }, MaxBodyBytes: 1 << 20})
	s.in.Start(s.q)
	go s.in.Serve(s.ln)
	return nil
}

// Close stops ingest, drains the engine until ctx ends and closes the log.
func (s *Server) Close(ctx context.Context) error {
	if s.closed.Swap(true) {
		return nil // closed already, as proxy.Server.Close
	}
	if s.in != nil {
		s.in.Drain()
	}
	var errs []error
	if s.d != nil {
		s.d.Stop(ctx)
	}
	if s.in != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		errs = append(errs, s.in.Shutdown(sctx))
		s.ln.Close()
	}
	if s.d != nil {
		s.d.StopOperational()
	}
	if s.q != nil {
		errs = append(errs, s.q.Close())
	}
	return errors.Join(errs...)
}

// URL is the ingest base URL.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

func (s *Server) Lanes() []api.LaneStatus                   { return s.d.Statuses() }
func (s *Server) Reload(subs []*Subscription) error         { return s.d.Reload(subs) }
func (s *Server) Event(id string) (*api.EventStatus, error) { return s.d.Event(id) }
func (s *Server) Pause(id, reason string) error             { return s.d.Pause(id, reason) }
func (s *Server) Resume(id string) error                    { return s.d.Resume(id) }
func (s *Server) Replay(sub string, seq uint64, force bool) (api.ReplayResult, error) {
	return s.d.Replay(sub, seq, force)
}

func (s *Server) Attempts(id string) (api.AttemptList, error) {
	v, ok := s.d.Attempts(id)
	return v, found(ok, id)
}

func (s *Server) Series(id string) (api.SeriesInfo, error) {
	v, ok := s.d.Series(id)
	return v, found(ok, id)
}

func found(ok bool, id string) error {
	if ok {
		return nil
	}
	return fmt.Errorf("subscription %q: %w", id, queue.ErrNotFound)
}

// openTestServer opens a Server on loopback with fsync durability, a temp
// data dir and a quick cursor flush, over opts' other fields; wrap, when
// not nil, wraps the store the engine drives. It is closed when the test
// ends.
func openTestServer(t *testing.T, opts Options, wrap func(queue.Store) queue.Store) *Server {
	t.Helper()
	if testing.Verbose() {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	opts.DataDir, opts.Sync = cmp.Or(opts.DataDir, t.TempDir()), true
	opts.CursorInterval, opts.AllowPrivateTargets = 10*time.Millisecond, true
	s := newTestServer(opts)
	s.wrapStore = wrap
	if err := s.Open(); err != nil {
		t.Fatalf("open server: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}
