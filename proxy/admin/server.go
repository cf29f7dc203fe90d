// Package admin is the admin API: its HTTP handlers and their limits
// (before and after a client shows a token), the registry of
// subscriptions made through the API (create, update, delete, rotate a
// secret), who may see what (the operator's token, tenants' tokens issued
// through the API or from the config, each seeing only its tenant's
// subscriptions, dead letters, attempts and events), dead-letter replay,
// recovery and the undelivered list, and the dashboard.
//
// It promises: without a token configured it answers only requests for
// a loopback or IP address or its own host name; a tenant's token sees
// nothing of another tenant, not even whether an id exists (the same 404
// as for an unknown one); every bad request is a 4xx that names the bad
// input and changes nothing. It speaks to the delivery engine only
// through Engine, in subscription ids and views of them, and never sees
// a lane.
package admin

import (
	"context"
	"iter"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/freshconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/queue"
)

// Engine is what the admin API needs of the delivery engine
// (delivery.Dispatcher): views of the lanes by subscription id, changes
// to the set of subscriptions under its lock, and the answers it keeps.
type Engine interface {
	View(id string) (delivery.View, bool)
	Views() iter.Seq[delivery.View]
	Status(id string) (api.LaneStatus, bool)
	Statuses() []api.LaneStatus
	StatusesOfTenant(tenant string) []api.LaneStatus
	Head() uint64
	LoggedEvent(seq uint64) (*queue.Event, error)
	Fleet() queue.Fleet
	LockSet()
	UnlockSet()
	Join(sub *delivery.Subscription, create bool) error
	Leave(id string) error
	TakeRotating() bool
	MarkRotating()
	Pause(id, reason string) error
	Resume(id string) error
	Event(id string) (*api.EventStatus, error)
	Replay(sub string, seq uint64, force bool) (api.ReplayResult, error)
	Attempts(id string) (api.AttemptList, bool)
	Series(id string) (api.SeriesInfo, bool)
	RetryBudget() policy.BudgetStats
}

// Config is what an API is made of; the field names are proxy.Options'.
type Config struct {
	Engine Engine
	Store  queue.Store
	Logger *slog.Logger
	Now    func() time.Time
	// AdminListen is the listener's address: without AdminToken, a
	// request must name it, loopback or an IP address as its Host.
	AdminListen string
	AdminToken  string
	Registry    *prometheus.Registry
	// Specs parses the API's subscription documents; nil: the API cannot
	// create or change subscriptions.
	Specs          SpecParser
	Tenants        []delivery.Tenant
	TenantDefaults delivery.Tenant
	TenantTokens   []TenantToken
	// Draining is set once the sidecar shuts down: /readyz answers 503.
	Draining *atomic.Bool
}

// API serves the admin API over one engine and its store.
type API struct {
	opts     Config
	d        Engine
	q        queue.Store
	log      *slog.Logger
	draining *atomic.Bool
	tokens   tokenCache // tenant tokens by tokenKey
}

// New returns the API of c.
func New(c Config) *API {
	if c.Draining == nil {
		c.Draining = new(atomic.Bool)
	}
	s := &API{opts: c, d: c.Engine, q: c.Store, log: c.Logger, draining: c.Draining}
	s.tokens.setConfig(c.TenantTokens)
	return s
}

// Handler is the admin API, behind its guard and tokens.
func (s *API) Handler() http.Handler { return s.adminHandler() }

// ErrNotFound is returned for an unknown subscription, event or dead
// letter. It is queue.ErrNotFound itself, so one errors.Is serves whether
// the engine or the store found nothing.
var ErrNotFound = queue.ErrNotFound

// SpecParser turns subscription documents (JSON in the config file's
// keys) into Subscriptions.
type SpecParser interface {
	// Parse validates doc as the config file validates a subscription;
	// its error names the key. Secrets must be inline (secret, secrets):
	// an API client may not make the sidecar read its files or its
	// environment.
	Parse(doc []byte) (*delivery.Subscription, error)
	// Check reads a request's body, a document or a merge patch, as the
	// config file's JSON is read, before the registry decodes, merges or
	// re-encodes it: a key given twice in one object is refused there,
	// and decoding would quietly keep the last one. Its error names the
	// key and the line.
	Check(body []byte) error
	// Redact returns doc as shown to API clients: no secret, no
	// credential-like header value.
	Redact(doc []byte) map[string]any
}

// TenantToken is an admin token scoped to Tenant.
type TenantToken struct {
	Token  string
	Tenant string
}

// handlerSwitch is an http.Handler that can be replaced while it serves.
type handlerSwitch struct{ h atomic.Pointer[http.Handler] }

func (h *handlerSwitch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*h.h.Load()).ServeHTTP(w, r)
}

func (h *handlerSwitch) Store(x *http.Handler) { h.h.Store(x) }

// startingHandler answers while the log is being opened.
var startingHandler http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		writeJSON(w, http.StatusOK, api.HealthAnswer{Status: "ok"})
		return
	}
	w.Header().Set("Retry-After", "1")
	writeJSON(w, http.StatusServiceUnavailable, api.HealthAnswer{Status: "starting: connecting to the log"})
})

// Server serves the admin API on one listener: the starting handler
// (/healthz, and 503 with Retry-After elsewhere) until Ready gives it an
// API, for a sidecar whose shared log takes a while to reach.
type Server struct {
	http  *http.Server
	sw    handlerSwitch
	fresh freshconn.Set // connections that have not sent a request yet
}

// NewServer returns a Server answering with the starting handler.
func NewServer() *Server {
	s := &Server{}
	s.sw.Store(&startingHandler)
	s.http = newAdminServer(&s.sw, &s.fresh)
	return s
}

// Ready serves a from now on.
func (s *Server) Ready(a *API) {
	h := a.Handler()
	s.sw.Store(&h)
}

// Serve serves ln until Shutdown or Close.
func (s *Server) Serve(ln net.Listener) error {
	err := s.http.Serve(ln)
	if err == http.ErrServerClosed {
		return nil
	}
	return err
}

// Shutdown stops taking connections and lets the requests in progress
// finish within ctx; the connections that never sent a request are
// closed at once.
func (s *Server) Shutdown(ctx context.Context) error {
	return freshconn.Shutdown(ctx, s.http.Shutdown, &s.fresh)
}

// Close closes the listener and every connection at once.
func (s *Server) Close() error { return s.http.Close() }

// Listener caps ln's open connections at the admin listener's limit;
// past it a connection is answered 503 and closed at once.
func Listener(ln net.Listener) net.Listener {
	return &capListener{Listener: ln, max: int64(adminMaxConns)}
}
