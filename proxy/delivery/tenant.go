package delivery

import (
	"cmp"
	"sync"
	"sync/atomic"
	"time"
)

// Tenant is one tenant's limits. A zero field takes the default
// (proxy.Options.TenantDefaults); a negative one means no limit.
type Tenant struct {
	ID string
	// MaxSubscriptions bounds how many subscriptions name the tenant.
	MaxSubscriptions int
	// MaxConcurrency bounds the in-flight requests of all its
	// subscriptions together: a bulkhead per tenant above the one per
	// subscription.
	MaxConcurrency int
	// MaxSubscriptionConcurrency bounds the concurrency cap (concurrency.max,
	// the highest cap of concurrency: auto) a tenant's token may give one
	// of the tenant's subscriptions: past it, a create or update is
	// refused. The operator's own subscriptions of the tenant are not
	// bounded by it (the bulkhead bounds them all).
	MaxSubscriptionConcurrency int
	// SharedTypes are the platform event types (exact or patterns) the
	// tenant's subscriptions may receive besides the tenant's own events
	// (feed.entitlement); nil for none.
	SharedTypes []string
	// Backlog bounds what may wait for each of the tenant's
	// subscriptions, above their own backlog quota, which may only be
	// tighter; its MaxAge also bounds their retries' max age. A zero field
	// takes DefaultTenantBacklog's: a tenant never goes unbounded, so a
	// stalled, paused or throttled endpoint of one tenant cannot pin the
	// log until the disk guard refuses every producer: nothing a tenant
	// sets can stall ingest or the other tenants.
	Backlog BacklogQuota
	// MaxDeadLetters bounds the dead letters kept for each of the
	// tenant's subscriptions: past it the oldest are deleted (those a
	// replay in flight needs excepted), as the backlog bound turns a
	// stalled endpoint's events into dead letters, each with its body.
	// 0 takes DefaultTenantMaxDeadLetters. The lane's owner trims
	// (queue.DeadLetterTrimmer), in either backend.
	MaxDeadLetters int
}

// DefaultTenantMaxDeadLetters is the dead-letter bound of each tenant's
// subscription where the operator set none (Tenant.MaxDeadLetters): a
// tenth of DefaultTenantBacklog, room for a day's failures of a busy
// endpoint while replay stays useful.
const DefaultTenantMaxDeadLetters = 100_000

// DefaultTenantBacklog is the backlog bound of every tenant's
// subscriptions where the operator set none (Tenant.Backlog): a million
// events (about 1 GiB of 1 KiB bodies per subscription) and three days,
// which outlasts a weekend's outage of an endpoint.
var DefaultTenantBacklog = BacklogQuota{MaxEvents: 1_000_000, MaxAge: 72 * time.Hour}

// tenantBound returns the backlog bound of tenant's subscriptions: the
// operator's, with DefaultTenantBacklog for a field left zero; none for
// the operator's own subscriptions (tenant "").
func (e *engine) tenantBound(tenant string) BacklogQuota {
	if tenant == "" {
		return BacklogQuota{}
	}
	b := e.tenantBacklog[tenant]
	if b.MaxEvents <= 0 {
		b.MaxEvents = DefaultTenantBacklog.MaxEvents
	}
	if b.MaxAge <= 0 {
		b.MaxAge = DefaultTenantBacklog.MaxAge
	}
	return b
}

// letterBound is how many dead letters each of tenant's subscriptions
// keeps: the operator's, or DefaultTenantMaxDeadLetters; 0 (no bound) for
// the operator's own subscriptions.
func (e *engine) letterBound(tenant string) int {
	if tenant == "" {
		return 0
	}
	if n := e.tenantLetters[tenant]; n > 0 {
		return n
	}
	return DefaultTenantMaxDeadLetters
}

// trimLetters bounds a tenant's subscription's dead letters: once it has
// written a tenth of its bound since the last trim (or since start), the
// oldest past the bound are deleted. Not at start as well: a trim scans
// the subscription's letters (in fleet mode a watch of the state bucket),
// and 50,000 of those would be start-up's; letters an earlier run left
// over the bound go with the next trim. The store does it outside the lane's lock: a trim is a scan of
// the subscription's letters, and the lane's deliveries must not wait for
// it. Runs on the maintenance goroutine.
func (l *lane) trimLetters() {
	t := l.e.trimmer
	if t == nil {
		return
	}
	l.mu.Lock()
	bound := l.e.letterBound(l.sub.Tenant)
	if bound == 0 || l.foreign {
		l.mu.Unlock()
		return
	}
	written, at := l.deadLettered.Load(), uint64(0)
	if l.memo != nil {
		at = l.memo.lettersAtTrim
	}
	if written-at < uint64(max(bound/10, 1)) {
		l.mu.Unlock()
		return // and an idle lane gets no memo for it
	}
	l.memoized().lettersAtTrim = written
	l.mu.Unlock()
	n, err := t.TrimDeadLetters(l.id, bound)
	if err != nil {
		l.e.log.Error("trim dead letters", "subscription", l.id, "err", err)
		return
	}
	if n > 0 {
		l.e.m.trimmed.WithLabelValues(l.id).Add(float64(n))
		l.e.log.Info("oldest dead letters deleted: over the tenant's bound", "subscription", l.id, "deleted", n, "bound", bound)
	}
}

// bounded returns q tightened to bound: a field of bound that is set
// replaces q's when q's is unset or larger. A tenant may ask for less
// than the operator allows, never more.
func (q BacklogQuota) bounded(bound BacklogQuota) BacklogQuota {
	if bound.MaxEvents > 0 && (q.MaxEvents <= 0 || q.MaxEvents > bound.MaxEvents) {
		q.MaxEvents = bound.MaxEvents
	}
	if bound.MaxAge > 0 && (q.MaxAge <= 0 || q.MaxAge > bound.MaxAge) {
		q.MaxAge = bound.MaxAge
	}
	return q
}

// The limits of a tenant when the options give none
// (Options.TenantDefaults): enough for a customer managing its endpoints,
// small enough that one tenant's token cannot take most of the process's
// slots (DefaultMaxInFlight) or fill it with lanes. A token may be issued
// for any tenant id, so these are what a tenant nobody listed gets.
const (
	DefaultTenantMaxSubscriptions           = 100
	DefaultTenantMaxConcurrency             = 100
	DefaultTenantMaxSubscriptionConcurrency = 100
)

// Or fills t's zero limits from def.
func (t Tenant) Or(def Tenant) Tenant {
	t.MaxSubscriptions = cmp.Or(t.MaxSubscriptions, def.MaxSubscriptions)
	t.MaxConcurrency = cmp.Or(t.MaxConcurrency, def.MaxConcurrency)
	t.MaxSubscriptionConcurrency = cmp.Or(t.MaxSubscriptionConcurrency, def.MaxSubscriptionConcurrency)
	return t
}

// bulkhead bounds the in-flight requests of one tenant's subscriptions
// together, above each subscription's own cap: a tenant with a hundred
// endpoints at a black hole holds at most its cap of the process's slots,
// not a hundred caps. It works like the process-wide slots: a lane that
// finds it full is remembered and pumped when a request of the tenant
// ends, so work past the cap waits in the log, not in
// memory.
type bulkhead struct {
	tenant   string
	max      int64
	inflight atomic.Int64

	mu      sync.Mutex
	starved map[*lane]struct{}
}

func newBulkhead(tenant string, max int) *bulkhead {
	return &bulkhead{tenant: tenant, max: int64(max), starved: map[*lane]struct{}{}}
}

func (b *bulkhead) full() bool { return b.inflight.Load() >= b.max }

// acquire takes one of the tenant's slots, or parks l until one frees.
func (b *bulkhead) acquire(l *lane) bool {
	for {
		n := b.inflight.Load()
		if n >= b.max {
			b.park(l)
			return false
		}
		if b.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (b *bulkhead) park(l *lane) {
	b.mu.Lock()
	b.starved[l] = struct{}{}
	b.mu.Unlock()
	// A release between the check and the park found nobody to wake:
	// look again, or l would wait for a wake-up that never comes.
	if !b.full() {
		b.wakeAll(l.e.feed)
	}
}

// giveBack returns a slot taken inside a pump (a lane's mu held): the
// lanes waiting are handed to the kick loop, never pumped here.
func (b *bulkhead) giveBack(f *feed) {
	b.inflight.Add(-1)
	b.wakeAll(f)
}

// release returns the slot of a finished request (no lane lock held) and
// pumps the lanes waiting for one until one takes it. Not just the first:
// a lane may take nothing when pumped (paused, or at its own cap, since
// it parked), and the slot would stay free while the others wait for a
// release that may never come (a lane paused while it waited stalled its
// tenant's other lanes for good).
func (b *bulkhead) release(f *feed) {
	b.inflight.Add(-1)
	for !b.full() {
		next := b.takeOne()
		if next == nil {
			return
		}
		next.pump()
	}
}

// takeOne removes one waiting lane and returns it, nil when none waits.
func (b *bulkhead) takeOne() *lane {
	b.mu.Lock()
	defer b.mu.Unlock()
	for l := range b.starved {
		delete(b.starved, l)
		return l
	}
	return nil
}

// wakeAll hands every waiting lane to the kick loop: from inside a pump
// it cannot see whether the one it would wake takes the slot (release
// can), so each tries, and those that find it taken park again.
func (b *bulkhead) wakeAll(f *feed) {
	b.mu.Lock()
	ls := make([]*lane, 0, len(b.starved))
	for l := range b.starved {
		ls = append(ls, l)
	}
	clear(b.starved)
	b.mu.Unlock()
	if len(ls) > 0 {
		f.wake(ls)
	}
}
