package admin

import (
	"cmp"
	"context"
	"net/http"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/delivery"
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
func (s *API) canSee(p principal, sub string) bool {
	if p.operator() {
		return true
	}
	v, ok := s.d.View(sub)
	return ok && v.Sub.Tenant == p.tenant
}

// canRead reports whether p may read dead letter d: judged by the owner
// recorded on the letter, never by whoever holds its subscription id now
// (tenant isolation judges by owner). A letter written before owners were recorded (not
// Scoped) is judged by its subscription, as before.
func (s *API) canRead(p principal, d *queue.DeadLetter) bool {
	switch {
	case p.operator():
		return true
	case d.Scoped:
		return d.Owner == p.tenant
	}
	return s.canSee(p, d.Subscription)
}

// tenantLimits returns tenant's limits: its own, or the defaults for a
// tenant Options.Tenants does not list; nil for the operator ("").
func (s *API) tenantLimits(tenant string) *delivery.Tenant {
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
func (s *API) boundConcurrency(p principal, doc map[string]any) {
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
	def := delivery.DefaultMaxConcurrency
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
func (s *API) checkConcurrency(p principal, sub *delivery.Subscription) error {
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
