package admin

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
)

// The admin API's tests run it as package proxy wires it, without ingest:
// a real Badger log in a temporary directory, the delivery engine over it,
// and the API on a loopback listener behind its real guard and limits.
// Options keep proxy's names for the fields they share.

// Options configure a test sidecar; zero fields take proxy's defaults.
type Options struct {
	AdminListen    string
	AdminToken     string
	DataDir        string
	TenantTokens   []TenantToken
	Subscriptions  []*delivery.Subscription
	Tenants        []delivery.Tenant
	TenantDefaults delivery.Tenant
	Logger         *slog.Logger
	Now            func() time.Time
}

// sidecar is a running engine with its log and admin API.
type sidecar struct {
	opts     Options
	q        queue.Store
	d        *delivery.Dispatcher
	api      *API
	admin    *Server
	adminLn  net.Listener
	draining atomic.Bool
}

func TestMain(m *testing.M) { testwait.Main(m) }

func newSidecar(opts Options) *sidecar {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	opts.TenantDefaults = opts.TenantDefaults.Or(delivery.Tenant{MaxSubscriptions: delivery.DefaultTenantMaxSubscriptions,
		MaxConcurrency: delivery.DefaultTenantMaxConcurrency, MaxSubscriptionConcurrency: delivery.DefaultTenantMaxSubscriptionConcurrency})
	return &sidecar{opts: opts}
}

// Open opens the log, starts the engine and serves the API when
// AdminListen names an address.
func (s *sidecar) Open() error {
	var dp atomic.Pointer[delivery.Dispatcher]
	q, err := badger.Open(badger.Options{Dir: s.opts.DataDir, Sync: true, Logger: s.opts.Logger,
		OnCommit: func(evs []*queue.Event) {
			if d := dp.Load(); d != nil {
				d.OnCommit(evs)
			}
		}})
	if err != nil {
		return err
	}
	s.q = q
	d := delivery.New(delivery.Config{
		Store: q, Client: egress.NewClient(egress.DefaultMaxConnsPerHost, true),
		Logger: s.opts.Logger, Now: s.opts.Now, MaxInFlight: 64, CursorInterval: 10 * time.Millisecond,
		TenantDefaults: s.opts.TenantDefaults, Tenants: s.opts.Tenants,
		OnMaintain: func(now time.Time) { s.api.RetireExpiredSecrets(now) },
	})
	dp.Store(d)
	s.api = New(Config{Engine: d, Store: q, Logger: s.opts.Logger, Now: s.opts.Now,
		AdminListen: s.opts.AdminListen, AdminToken: s.opts.AdminToken,
		Tenants: s.opts.Tenants, TenantDefaults: s.opts.TenantDefaults, TenantTokens: s.opts.TenantTokens, Draining: &s.draining})
	if err := d.Start(s.opts.Subscriptions); err != nil {
		q.Close()
		return err
	}
	s.d = d
	if s.opts.AdminListen != "" {
		ln, err := net.Listen("tcp", s.opts.AdminListen)
		if err != nil {
			s.Close(context.Background())
			return err
		}
		s.adminLn = Listener(ln)
		s.admin = NewServer()
		s.admin.Ready(s.api)
		go s.admin.Serve(s.adminLn)
	}
	return nil
}

// Close stops the API, drains the engine until ctx ends and closes the
// log; again, it does nothing.
func (s *sidecar) Close(ctx context.Context) error {
	if s.draining.Swap(true) {
		return nil
	}
	var errs []error
	if s.d != nil {
		s.d.Stop(ctx)
	}
	if s.admin != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		errs = append(errs, s.admin.Shutdown(sctx))
	}
	if s.d != nil {
		s.d.StopOperational()
	}
	if s.q != nil {
		errs = append(errs, s.q.Close())
	}
	return errors.Join(errs...)
}

// AdminURL is the admin API's base URL.
func (s *sidecar) AdminURL() string { return "http://" + s.adminLn.Addr().String() }

// SetTenantTokens replaces the config's tenant tokens, as a reload does.
func (s *sidecar) SetTenantTokens(toks []TenantToken) { s.api.SetTenantTokens(toks) }

// openTestServer opens a sidecar in a temp data dir, closed when the test
// ends.
func openTestServer(t *testing.T, opts Options) *sidecar {
	t.Helper()
	opts.DataDir = cmp.Or(opts.DataDir, t.TempDir())
	s := newSidecar(opts)
	if err := s.Open(); err != nil {
		t.Fatalf("open sidecar: %v", err)
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
