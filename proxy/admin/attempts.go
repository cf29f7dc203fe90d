package admin

import (
	"fmt"
	"net/http"
)

// notFoundSubscription is the error of an unknown subscription, and of
// one the principal may not see: the same words, so a tenant cannot tell
// the two apart.
func notFoundSubscription(id string) error {
	return fmt.Errorf("subscription %q: %w", id, ErrNotFound)
}

// attemptRoutes registers GET /v1/subscriptions/{id}/attempts and
// /series, scoped to what the request's principal may see.
func (s *API) attemptRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/subscriptions/{id}/attempts", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !s.canSee(principalOf(r), id) {
			adminResult(w, notFoundSubscription(id), nil)
			return
		}
		v, ok := s.d.Attempts(id)
		adminResult(w, found(ok, id), v)
	})
	mux.HandleFunc("GET /v1/subscriptions/{id}/series", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !s.canSee(principalOf(r), id) {
			adminResult(w, notFoundSubscription(id), nil)
			return
		}
		v, ok := s.d.Series(id)
		adminResult(w, found(ok, id), v)
	})
}

// found is nil when ok, else the error of an unknown subscription id.
func found(ok bool, id string) error {
	if ok {
		return nil
	}
	return notFoundSubscription(id)
}
