package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// subscriptionRoutes registers the subscription API (the
// endpoint API, recovery and the undelivered list; tenant tokens are
// tokenRoutes').
func (s *API) subscriptionRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/subscriptions", func(w http.ResponseWriter, r *http.Request) {
		body, ok := readBody(w, r, maxSpecBytes)
		if !ok {
			return
		}
		info, err := s.CreateSubscription(principalOf(r), body)
		registryResult(w, http.StatusCreated, err, info)
	})
	mux.HandleFunc("GET /v1/subscriptions/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if _, ok := s.d.View(id); !ok || !s.canSee(principalOf(r), id) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("subscription %q: not found", id))
			return
		}
		info, err := s.subscriptionInfo(id)
		registryResult(w, http.StatusOK, err, info)
	})
	mux.HandleFunc("PATCH /v1/subscriptions/{id}", func(w http.ResponseWriter, r *http.Request) {
		body, ok := readBody(w, r, maxSpecBytes)
		if !ok {
			return
		}
		info, err := s.UpdateSubscription(principalOf(r), r.PathValue("id"), body)
		registryResult(w, http.StatusOK, err, info)
	})
	mux.HandleFunc("DELETE /v1/subscriptions/{id}", func(w http.ResponseWriter, r *http.Request) {
		info, err := s.DeleteSubscription(principalOf(r), r.PathValue("id"))
		registryResult(w, http.StatusAccepted, err, info)
	})
	mux.HandleFunc("POST /v1/subscriptions/{id}/rotate-secret", func(w http.ResponseWriter, r *http.Request) {
		var req api.RotateRequest
		if !decodeBody(w, r, &req, true) {
			return
		}
		grace := DefaultRotationGrace
		if req.Grace != "" {
			g, err := time.ParseDuration(req.Grace)
			if err != nil {
				writeError(w, http.StatusBadRequest, "grace: want a duration such as 24h, got "+strconv.Quote(req.Grace))
				return
			}
			grace = g
		}
		ans, err := s.RotateSecret(principalOf(r), r.PathValue("id"), grace)
		registryResult(w, http.StatusOK, err, ans)
	})
	mux.HandleFunc("POST /v1/subscriptions/{id}/recover", func(w http.ResponseWriter, r *http.Request) {
		// RecoverRequest, with its times decoded one by one: decoded with
		// the body, a bad one failed without naming its key ("body:
		// parsing time ...").
		var req struct {
			Since, Until json.RawMessage
		}
		if !decodeBody(w, r, &req, false) {
			return
		}
		var since, until time.Time
		for _, f := range []struct {
			key string
			raw json.RawMessage
			to  *time.Time
		}{{"since", req.Since, &since}, {"until", req.Until, &until}} {
			if len(f.raw) == 0 {
				continue
			}
			if err := json.Unmarshal(f.raw, f.to); err != nil {
				writeError(w, http.StatusBadRequest, f.key+": want an RFC 3339 time, got "+string(f.raw))
				return
			}
		}
		if since.IsZero() {
			writeError(w, http.StatusBadRequest, "since: required (RFC 3339)")
			return
		}
		ans, err := s.Recover(principalOf(r), r.PathValue("id"), since, until)
		registryResult(w, http.StatusOK, err, ans)
	})
	mux.HandleFunc("GET /v1/undelivered", s.listUndelivered)
	mux.HandleFunc("GET /v1/whoami", func(w http.ResponseWriter, r *http.Request) {
		p := principalOf(r)
		writeJSON(w, http.StatusOK, api.WhoAmI{Operator: p.operator(), Tenant: p.tenant})
	})
}

// readBody reads a request body of at most limit bytes; a longer one is
// answered 413 naming the limit.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body: over %d bytes", limit))
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, "body: "+err.Error())
		return nil, false
	}
	return b, true
}

// decodeBody decodes a small JSON body into v, refusing unknown fields;
// optional lets the body be empty.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, optional bool) bool {
	b, ok := readBody(w, r, 4096)
	if !ok {
		return false
	}
	if len(b) == 0 && optional {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "body: "+err.Error())
		return false
	}
	return true
}

// registryResult writes v with status, or err with the status its kind
// calls for.
func registryResult(w http.ResponseWriter, status int, err error, v any) {
	switch {
	case err == nil:
		writeJSON(w, status, v)
	case errors.Is(err, ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, ErrExists), errors.Is(err, ErrManagedByFile), errors.Is(err, ErrLimit), errors.Is(err, ErrVariantLimit):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, ErrNoSpecs):
		writeError(w, http.StatusNotImplemented, err.Error())
	case errors.Is(err, queue.ErrUnavailable):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

// listUndelivered serves GET /v1/undelivered?subscription=S[&since=T]
// [&limit=N][&cursor=C].
func (s *API) listUndelivered(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "subscription", "since", "limit", "cursor":
		default:
			writeError(w, http.StatusBadRequest, "unknown parameter "+strconv.Quote(k)+" (want subscription, since, limit, cursor)")
			return
		}
	}
	sub := q.Get("subscription")
	if sub == "" {
		writeError(w, http.StatusBadRequest, "subscription: required")
		return
	}
	var since time.Time
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "since: want an RFC 3339 time, got "+strconv.Quote(v))
			return
		}
		since = t
	}
	limit, ok := pageLimit(w, q.Get("limit"))
	if !ok {
		return
	}
	page, err := s.Undelivered(principalOf(r), sub, since, limit, q.Get("cursor"))
	registryResult(w, http.StatusOK, err, page)
}
