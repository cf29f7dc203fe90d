// Package delivery is the engine between the log and an HTTP exchange:
// the lanes (one per subscription: what it is owed, its cap, rate,
// breaker, retries, ordering and backlog bound), the dispatcher that owns
// them (recovery, reconciliation with the configured subscriptions,
// cursor flushes, retirement, compaction, fleet ownership), what the
// lanes share (the feed of commits and its ring, the in-flight slots and
// workers, the retry timer, the retry budget), the outcome of each
// attempt (acks, retry records, dead letters, the attempts and series the
// admin API shows), body variants and delivery formats (CloudEvents),
// the operational webhook's events, and the attempts' trace context and
// spans. One exchange itself is package egress's.
//
// It promises what the sidecar promises of delivery: each subscription
// gets each event it is entitled to at least once, acknowledged or
// dead-lettered with a reason; never more than its cap in flight; the
// rest waits in the log, not in memory; one lane's endpoint never delays
// another's. It knows nothing of HTTP serving, tokens or tenants'
// principals: the admin API (package proxy) speaks to it in
// subscription ids through the Dispatcher's exported methods, and
// changes the set of subscriptions only with the set locked (LockSet).
package delivery

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/queue"
)

// Config is what a Dispatcher is made of.
type Config struct {
	Store queue.Store
	// Client is the shared outbound client (egress.NewClient); Routes the
	// egress routes of subscriptions that need more than it.
	Client *fasthttp.Client
	Routes *egress.Routes
	Logger *slog.Logger
	Now    func() time.Time
	// MaxInFlight caps concurrent outbound requests for the process.
	MaxInFlight int
	// RingBytes is the ring of recent events' share of the memory budget.
	RingBytes int64
	// CursorInterval is how often moved cursors are written.
	CursorInterval time.Duration
	RetryBudget    policy.BudgetConfig
	Tracer         Tracer
	// TenantDefaults and Tenants are the tenants' limits (TenantDefaults'
	// already filled in each of Tenants).
	TenantDefaults Tenant
	Tenants        []Tenant
	// Operational, when set, is the operational webhook's subscription
	// (operational.go); nil: none.
	Operational *Subscription
	Registry    prometheus.Registerer
	// OnMaintain, when set, runs at the end of each maintenance pass.
	OnMaintain func(now time.Time)
	// CloudEventsSource is the CloudEvents source attribute of events not
	// posted as CloudEvents, on deliveries in a CloudEvents format
	// (format.go); cloudevents.DefaultSource if "". The caller checks it
	// (cloudevents.CheckSource).
	CloudEventsSource string
}

// New returns a Dispatcher that has not started: Start recovers the lanes.
func New(c Config) *Dispatcher {
	d := newDispatcher(c.Store, c.Client, c.Logger, c.Now, c.MaxInFlight, c.RingBytes, c.CursorInterval, c.RetryBudget)
	d.routes = c.Routes
	d.trace = c.Tracer
	if c.CloudEventsSource != "" {
		d.ceSource = c.CloudEventsSource
	}
	d.defaultBulkhead = c.TenantDefaults.MaxConcurrency
	for _, t := range c.Tenants {
		var b *bulkhead // none: no limit, not the default's
		if t.MaxConcurrency > 0 {
			b = newBulkhead(t.ID, t.MaxConcurrency)
		}
		d.bulkheads[t.ID] = b                    // before any lane exists
		d.tenantBacklog[t.ID] = t.Backlog        // before any lane exists
		d.tenantLetters[t.ID] = t.MaxDeadLetters // before any lane exists
		if len(t.SharedTypes) > 0 {
			m := policy.MatchTypes(t.SharedTypes) // nil for "*": every type
			if m == nil {
				m = func([]byte) bool { return true }
			}
			d.feed.shared[t.ID] = m // before any lane exists
		}
	}
	d.onMaintain = c.OnMaintain
	d.m = newMetrics(c.Registry, d)
	d.ops = newOperational(c.Operational, c.Store, c.Logger, c.Now, c.Registry)
	return d
}

// Start runs the operational webhook and the egress routes, recovers the
// lanes from the log and reconciles them with subs (the server owns them
// from here). On an error everything it started is stopped again.
func (d *Dispatcher) Start(subs []*Subscription) error {
	for _, sub := range subs {
		sub.WithDefaults()
	}
	if d.routes != nil {
		d.wg.Go(func() { d.routes.Run(d.quit, d.bindings) })
	}
	d.ops.start()
	subs, err := d.ops.with(subs)
	if err == nil {
		err = d.start(subs)
	}
	if err != nil {
		d.stop(context.Background())
		d.ops.stop()
	}
	return err
}

// OnCommit hands the lanes a group of new events, in seq order.
func (d *Dispatcher) OnCommit(evs []*queue.Event) { d.feed.onCommit(evs) }

// RaiseHead moves the head to seq if it is behind: the commits a shared
// log made before the Dispatcher existed.
func (d *Dispatcher) RaiseHead(seq uint64) {
	if seq > d.feed.head.Load() {
		d.feed.head.Store(seq)
	}
}

// Reload applies a new set of the file's subscriptions (see
// proxy.Server.Reload). The operational webhook stays; a subscription
// with its id is refused.
func (d *Dispatcher) Reload(subs []*Subscription) error {
	subs, err := d.ops.with(subs)
	if err != nil {
		return err
	}
	for _, sub := range subs {
		sub.WithDefaults()
	}
	if err := d.apply(subs, nil); err != nil {
		return err
	}
	d.routes.Check() // changed certificate and credentials files take effect with the reload
	return nil
}

// Stop stops new deliveries, waits until ctx ends for those in flight,
// writes the cursors and returns how many deliveries it abandoned (they
// run again after a restart).
func (d *Dispatcher) Stop(ctx context.Context) int { return d.stop(ctx) }

// StopOperational ends the operational webhook's appender; it appends,
// so it must run before the log closes.
func (d *Dispatcher) StopOperational() { d.ops.stop() }

// Statuses returns a status line per subscription, sorted by id.
func (d *Dispatcher) Statuses() []api.LaneStatus { return d.statuses(nil) }

// RetryBudget returns the shared retry budget's state over its window.
func (d *Dispatcher) RetryBudget() policy.BudgetStats { return d.budget.Stats() }
