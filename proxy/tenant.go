package proxy

import (
	"context"
	"net/http"
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
