package proxy

import (
	"cmp"
	"context"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

// principal is who an admin request acts for: the operator (tenant "")
// or one tenant, whose token sees only that tenant's subscriptions and
// what belongs to them. Everything else answers 404 to a tenant, as if
// it did not exist: a tenant learns nothing of the others, not even
// their ids.
type principal struct {
	tenant string
}

func (p principal) operator() bool { return p.tenant == "" }

type principalKey struct{}

// principalOf is the principal requireToken found for r; the operator
// when no token is configured.
func principalOf(r *http.Request) principal {
	p, _ := r.Context().Value(principalKey{}).(principal)
	return p
}

func withPrincipal(r *http.Request, p principal) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
}

// canSee reports whether p may see subscription sub (and its dead
// letters, attempts, ledger entries): the operator sees every one, a
// tenant those that name it.
func (s *Server) canSee(p principal, sub string) bool {
	if p.operator() {
		return true
	}
	l := s.d.lane(sub)
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sub.Tenant == p.tenant
}

// canRead reports whether p may read dead letter d: judged by the owner
// recorded on the letter, never by whoever holds its subscription id now
// (tenant isolation judges by owner). A letter written before owners were recorded (not
// Scoped) is judged by its subscription, as before.
func (s *Server) canRead(p principal, d *queue.DeadLetter) bool {
	switch {
	case p.operator():
		return true
	case d.Scoped:
		return d.Owner == p.tenant
	}
	return s.canSee(p, d.Subscription)
}

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

// or fills t's zero limits from def.
func (t Tenant) or(def Tenant) Tenant {
	t.MaxSubscriptions = cmp.Or(t.MaxSubscriptions, def.MaxSubscriptions)
	t.MaxConcurrency = cmp.Or(t.MaxConcurrency, def.MaxConcurrency)
	t.MaxSubscriptionConcurrency = cmp.Or(t.MaxSubscriptionConcurrency, def.MaxSubscriptionConcurrency)
	return t
}

// tenantLimits returns tenant's limits: its own, or the defaults for a
// tenant Options.Tenants does not list; nil for the operator ("").
func (s *Server) tenantLimits(tenant string) *Tenant {
	if tenant == "" {
		return nil
	}
	for i := range s.opts.Tenants {
		if s.opts.Tenants[i].ID == tenant {
			return &s.opts.Tenants[i]
		}
	}
	t := s.opts.TenantDefaults
	t.ID = tenant
	return &t
}

// boundConcurrency keeps what a tenant's token sets within the tenant's
// MaxSubscriptionConcurrency: doc, a subscription document about to be
// parsed, gets concurrency.max = the bound when it sets no max and the
// default cap would exceed it (the tenant did not ask for more);
// checkConcurrency then refuses what the tenant did ask for.
func (s *Server) boundConcurrency(p principal, doc map[string]any) {
	t := s.tenantLimits(p.tenant)
	if p.operator() || t == nil || t.MaxSubscriptionConcurrency <= 0 {
		return
	}
	c, ok := doc["concurrency"].(map[string]any)
	if doc["concurrency"] != nil && !ok {
		return // not an object: the parser names the key
	}
	if _, set := c["max"]; set {
		return
	}
	def := DefaultMaxConcurrency
	if auto, _ := c["auto"].(bool); auto {
		def = policy.DefaultAutoCapMax
	}
	if def <= t.MaxSubscriptionConcurrency {
		return
	}
	if c == nil {
		c = map[string]any{}
	}
	c["max"] = t.MaxSubscriptionConcurrency
	doc["concurrency"] = c
}

// checkConcurrency refuses a subscription a tenant's token made or
// changed whose cap is above the tenant's MaxSubscriptionConcurrency.
func (s *Server) checkConcurrency(p principal, sub *Subscription) error {
	t := s.tenantLimits(p.tenant)
	if p.operator() || t == nil || t.MaxSubscriptionConcurrency <= 0 {
		return nil
	}
	limit, key := sub.MaxConcurrency, "concurrency.max"
	if sub.Auto != nil {
		limit = cmp.Or(sub.Auto.Max, policy.DefaultAutoCapMax)
	}
	if limit > t.MaxSubscriptionConcurrency {
		return invalidf("%s: %d is over tenant %s's bound of %d per subscription (its max_subscription_concurrency)", key, limit, p.tenant, t.MaxSubscriptionConcurrency)
	}
	return nil
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
