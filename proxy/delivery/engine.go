package delivery

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/queue"
)

// engine is what every lane shares with the others, as named parts with
// small method sets: the store, the feed of commits, the in-flight slots
// and their workers, the retry timer, the set of moved cursors, the shared
// retry budget, the metrics and the clock. A lane holds the engine and
// nothing else of the dispatcher: the lane set, reconciliation with the
// config, the cursor flusher and maintenance are the dispatcher's alone.
type engine struct {
	store queue.Store
	fleet queue.Fleet // store as a Fleet; nil: this node owns every lane
	// trimmer is store as a DeadLetterTrimmer; nil when it cannot trim
	// (a test's store), and tenants' dead letters are then not bounded.
	trimmer queue.DeadLetterTrimmer
	feed    *feed
	slots   *slots
	timers  *timerHeap
	dirty   *dirtySet
	budget  *policy.Budget
	m       *metrics
	log     *slog.Logger
	now     func() time.Time
	client  *fasthttp.Client
	gates   hostGates      // deliver.go: the wait for client's per-host cap
	routes  *egress.Routes // routes and tokens of the subscriptions that need more than client
	quit    chan struct{}  // closed at stop
	ops     *operational   // the operational webhook; nil when not configured
	trace   Tracer         // tracing.go: trace headers and spans of attempts
	// ceSource is the CloudEvents source of events not posted as
	// CloudEvents (format.go); Config.CloudEventsSource.
	ceSource string
	// bulkheads are the tenants' concurrency caps, by tenant (nil: none):
	// the listed tenants' made before any lane, an unlisted tenant's with
	// defaultBulkhead when its first lane asks (bulkheadOf).
	bulkheadMu      sync.Mutex
	bulkheads       map[string]*bulkhead
	defaultBulkhead int
	// tenantBacklog holds the tenants' own backlog bounds
	// (Tenant.Backlog); a tenant absent takes DefaultTenantBacklog.
	tenantBacklog map[string]BacklogQuota
	// tenantLetters holds the tenants' own dead-letter bounds
	// (Tenant.MaxDeadLetters); a tenant absent takes
	// DefaultTenantMaxDeadLetters.
	tenantLetters map[string]int
	// rotating is set when a lane takes a subscription whose old secrets
	// expire (a rotation's grace): the maintenance pass looks for expired
	// ones only then, not over 50,000 lanes every second.
	rotating atomic.Bool
	// quotas is set once any lane takes a subscription with a backlog
	// quota, and never cleared: until then the maintenance pass does not
	// lock each of 50,000 lanes every second to find none (that was most
	// of an idle sidecar's CPU with 50,000 lanes).
	quotas atomic.Bool

	stopping atomic.Bool  // no new deliveries
	life     sync.RWMutex // finish holds it shared while writing outcomes and moving the cursor
	closed   bool         // under life: outcomes are no longer written
}

func newEngine(store queue.Store, client *fasthttp.Client, log *slog.Logger, now func() time.Time, maxInFlight int, ringBytes int64, budget policy.BudgetConfig) *engine {
	e := &engine{
		store: store, client: client, log: log, now: now, ceSource: cloudevents.DefaultSource,
		feed:          newFeed(store, ringBytes),
		timers:        &timerHeap{wake: make(chan struct{}, 1)},
		dirty:         newDirtySet(),
		budget:        policy.NewBudget(budget, now),
		quit:          make(chan struct{}),
		bulkheads:     map[string]*bulkhead{},
		tenantBacklog: map[string]BacklogQuota{},
		tenantLetters: map[string]int{},
	}
	e.fleet, _ = store.(queue.Fleet)
	e.trimmer, _ = store.(queue.DeadLetterTrimmer)
	e.slots = newSlots(maxInFlight, e.feed, e.quit, func(j *job, w *workerState) {
		res := e.deliver(j, w)
		j.lane.finish(j, res)
	})
	return e
}

// bulkheadOf returns tenant's bulkhead, nil for none (the operator's
// subscriptions, or a tenant without a limit). Any tenant id may come
// with a token, so an unlisted one gets the default's, made once.
func (e *engine) bulkheadOf(tenant string) *bulkhead {
	if tenant == "" {
		return nil
	}
	e.bulkheadMu.Lock()
	defer e.bulkheadMu.Unlock()
	b, ok := e.bulkheads[tenant]
	if !ok {
		if e.defaultBulkhead > 0 {
			b = newBulkhead(tenant, e.defaultBulkhead)
		}
		e.bulkheads[tenant] = b
	}
	return b
}

// dirtySet holds the lanes whose cursor moved since the last flush.
type dirtySet struct {
	mu sync.Mutex
	m  map[*lane]struct{}
	// armed is signalled when the set stops being empty: the flush loop
	// sleeps until then instead of ticking every cursor interval, which
	// woke a quiet sidecar 50 times a second for nothing.
	armed chan struct{}
}

func newDirtySet() *dirtySet {
	return &dirtySet{m: map[*lane]struct{}{}, armed: make(chan struct{}, 1)}
}

func (s *dirtySet) mark(l *lane) {
	s.mu.Lock()
	first := len(s.m) == 0
	s.m[l] = struct{}{}
	s.mu.Unlock()
	if first {
		select {
		case s.armed <- struct{}{}:
		default:
		}
	}
}

// take returns the lanes marked since the last take and forgets them.
func (s *dirtySet) take() map[*lane]struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.m
	s.m = make(map[*lane]struct{}, len(m))
	return m
}
