package admin

import (
	"cmp"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// adminHandler serves the admin API on its own listener (net/http: it is
// not a hot path, and the standard tooling fits it best). Every answer is
// one of the wire types of package api, so that package client decodes exactly
// what is encoded here.
func (s *API) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.HealthAnswer{Status: "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			writeJSON(w, http.StatusServiceUnavailable, api.HealthAnswer{Status: "draining"})
			return
		}
		if f, ok := s.q.(queue.Fleet); ok {
			if err := f.Ready(); err != nil {
				writeJSON(w, http.StatusServiceUnavailable, api.HealthAnswer{Status: "unavailable: " + err.Error()})
				return
			}
		}
		writeJSON(w, http.StatusOK, api.HealthAnswer{Status: "ready"})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.opts.Registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelError)}))
	mux.HandleFunc("GET /v1/retry-budget", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.d.RetryBudget())
	})
	mux.HandleFunc("GET /v1/subscriptions", func(w http.ResponseWriter, r *http.Request) {
		p, tenant := principalOf(r), r.URL.Query().Get("tenant")
		list := api.SubscriptionList{Head: s.d.Head()}
		if !p.operator() || tenant != "" {
			if !p.operator() && tenant != "" && tenant != p.tenant {
				tenant = "\x00" // another tenant's: nothing, as if it had none
			}
			list.Subscriptions = s.d.StatusesOfTenant(cmp.Or(tenant, p.tenant))
		} else {
			list.Subscriptions = s.d.Statuses()
		}
		if !p.operator() {
			list.Head = 0 // the log's head counts every tenant's events
		}
		writeJSON(w, http.StatusOK, list)
	})
	// Profiles and runtime counters, for explaining a regression on a live
	// sidecar (bench -profile uses them). Behind the admin token like
	// everything else here.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.Handle("GET /debug/vars", expvar.Handler())
	mux.HandleFunc("POST /v1/subscriptions/{id}/pause", func(w http.ResponseWriter, r *http.Request) {
		var body api.PauseRequest
		if r.ContentLength != 0 {
			if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body); err != nil {
				writeError(w, http.StatusBadRequest, "body: "+err.Error())
				return
			}
		}
		if !s.canSee(principalOf(r), r.PathValue("id")) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("subscription %q: not found", r.PathValue("id")))
			return
		}
		adminResult(w, s.d.Pause(r.PathValue("id"), body.Reason), api.StateAnswer{Subscription: r.PathValue("id"), State: "paused"})
	})
	mux.HandleFunc("POST /v1/subscriptions/{id}/resume", func(w http.ResponseWriter, r *http.Request) {
		if !s.canSee(principalOf(r), r.PathValue("id")) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("subscription %q: not found", r.PathValue("id")))
			return
		}
		adminResult(w, s.d.Resume(r.PathValue("id")), api.StateAnswer{Subscription: r.PathValue("id"), State: "active"})
	})
	mux.HandleFunc("GET /v1/events/{id}", func(w http.ResponseWriter, r *http.Request) {
		st, err := s.d.Event(r.PathValue("id"))
		if p := principalOf(r); err == nil && !p.operator() {
			// A tenant sees its own deliveries of the event, and the event
			// only when one of them is entitled to it.
			mine := st.Deliveries[:0:0]
			for _, d := range st.Deliveries {
				if s.canSee(p, d.Subscription) {
					mine = append(mine, d)
				}
			}
			if len(mine) == 0 {
				// The words Event uses for an id it does not know
				// (ledger.go): another tenant's event must not answer
				// otherwise, or a tenant could tell which ids exist.
				err = fmt.Errorf("event %q (ids are kept for dedup_window): %w", r.PathValue("id"), ErrNotFound)
			}
			st.Deliveries = mine
		}
		if p := principalOf(r); err != nil && !errors.Is(err, ErrNotFound) && !p.operator() {
			// A store error names the subscription it was reading, which
			// may be another tenant's.
			s.log.Error("event ledger", "event", r.PathValue("id"), "err", err)
			err = errors.New("the ledger could not be read; try again")
		}
		adminResult(w, err, st)
	})
	mux.HandleFunc("GET /v1/dead-letters", s.listDeadLetters)
	mux.HandleFunc("GET /v1/dead-letters/{subscription}/{seq}", func(w http.ResponseWriter, r *http.Request) {
		seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "seq: not a sequence number: "+strconv.Quote(r.PathValue("seq")))
			return
		}
		d, err := s.q.DeadLetter(r.PathValue("subscription"), seq)
		if err == nil && !s.canRead(principalOf(r), d) {
			err = queue.ErrNotFound
		}
		if errors.Is(err, queue.ErrNotFound) {
			err = fmt.Errorf("dead letter %s/%d: %w", r.PathValue("subscription"), seq, ErrNotFound)
		}
		if err != nil {
			adminResult(w, err, nil)
			return
		}
		writeJSON(w, http.StatusOK, api.NewDeadLetterInfo(d, true))
	})
	mux.HandleFunc("POST /v1/dead-letters/replay", s.replayDeadLetters)
	s.subscriptionRoutes(mux)
	s.tokenRoutes(mux)
	s.dashboardRoutes(mux)
	s.attemptRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not found: "+r.Method+" "+r.URL.Path)
	})
	return s.requireToken(mux)
}

// tenantRoutes are the admin routes a tenant's token may use; each
// handler scopes what it answers to the tenant (canSee). Every other
// route answers a tenant 404, as a path that does not exist would: the
// metrics, profiles and retry budget describe every tenant.
var tenantRoutes = map[string]bool{
	"GET /v1/subscriptions":                     true,
	"POST /v1/subscriptions":                    true,
	"GET /v1/subscriptions/{id}":                true,
	"PATCH /v1/subscriptions/{id}":              true,
	"DELETE /v1/subscriptions/{id}":             true,
	"POST /v1/subscriptions/{id}/pause":         true,
	"POST /v1/subscriptions/{id}/resume":        true,
	"POST /v1/subscriptions/{id}/rotate-secret": true,
	"POST /v1/subscriptions/{id}/recover":       true,
	"GET /v1/subscriptions/{id}/attempts":       true,
	"GET /v1/subscriptions/{id}/series":         true,
	"GET /v1/events/{id}":                       true,
	"GET /v1/dead-letters":                      true,
	"GET /v1/dead-letters/{subscription}/{seq}": true,
	"POST /v1/dead-letters/replay":              true,
	"GET /v1/undelivered":                       true,
	"GET /v1/whoami":                            true,
	"GET /{$}":                                  true,
	"GET /assets/{name}":                        true,
}

// requireToken finds who a request acts for (principal) from its bearer
// token, on every path but /healthz (liveness probes carry no
// credentials) and the dashboard's static shell (it holds no data; every
// request it makes for data carries the token):
//
//   - the operator token (admin.token): everything;
//   - a tenant token (admin.tokens, or issued by POST
//     /v1/tenants/{t}/tokens and neither expired nor revoked): the routes
//     of tenantRoutes, scoped to the tenant; any other route answers 404;
//   - no token at all while no operator token is configured: the
//     operator, as before tenants existed (the listener is on loopback
//     by default). A token that is neither is refused, even then: a
//     mistyped tenant token must not act as the operator.
//
// Comparisons of the operator token are constant-time; tenant tokens are
// looked up by their SHA-256, which leaks nothing of the token. Before
// any of it, adminGuard refuses what a browser page of another site could
// send (adminguard.go); a refused request's body is never read.
func (s *API) requireToken(mux *http.ServeMux) http.Handler {
	op := []byte(s.opts.AdminToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.adminGuard(w, r, len(op) > 0) {
			return
		}
		if r.URL.Path == "/healthz" || dashboardPublic(r) {
			mux.ServeHTTP(w, r)
			return
		}
		got, hasBearer := bearerCredentials(r.Header.Get("Authorization"))
		var p principal
		switch {
		case hasBearer && len(op) > 0 && subtle.ConstantTimeCompare([]byte(got), op) == 1:
		case hasBearer:
			v, err := s.tenantOfToken(got)
			if err != nil {
				writeError(w, http.StatusServiceUnavailable, "check the token: "+err.Error())
				return
			}
			if v.tenant == "" {
				if !v.expired {
					refuseUnauthenticated(w, r)
					return
				}
				// Only the token's holder can learn this, and it tells
				// them what to do.
				w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
				refuseUnread(w, r, http.StatusUnauthorized, "tenant token expired: ask the operator for a new one")
				return
			}
			p.tenant = v.tenant
		case len(op) > 0:
			refuseUnauthenticated(w, r)
			return
		}
		if !p.operator() {
			if _, pattern := mux.Handler(r); !tenantRoutes[pattern] {
				writeError(w, http.StatusNotFound, "not found: "+r.Method+" "+r.URL.Path)
				return
			}
		}
		mux.ServeHTTP(w, withPrincipal(r, p))
	})
}

// MinTokenBytes is the shortest admin token config accepts (operator and
// tenant tokens alike). Anything shorter can be guessed online: the admin
// API does not rate-limit wrong tokens. 16 bytes of hex is 64 bits; the
// tokens the API issues are longer.
const MinTokenBytes = 16

// bearerCredentials returns the credentials of an Authorization header using the
// Bearer scheme, which it matches case-insensitively (RFC 9110 §11.1: auth
// schemes are case-insensitive; some clients send "bearer").
func bearerCredentials(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimLeft(tok, " "), true // 1*SP between them
}

// writeJSON writes v, indented by two spaces (people read these answers
// with curl).
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// writeError writes msg as an ErrorAnswer.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, api.ErrorAnswer{Error: msg})
}

// adminResult writes v, or err as an ErrorAnswer with the status it calls
// for.
func adminResult(w http.ResponseWriter, err error, v any) {
	switch {
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, http.StatusOK, v)
	}
}

// pageLimit parses a page's limit parameter: 1..1000, 100 when absent;
// a bad one is answered 400.
func pageLimit(w http.ResponseWriter, v string) (int, bool) {
	if v == "" {
		return 100, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		writeError(w, http.StatusBadRequest, "limit: want 1..1000, got "+strconv.Quote(v))
		return 0, false
	}
	return n, true
}

// listDeadLetters serves GET /v1/dead-letters?subscription=&reason=&limit=&cursor=.
// cursor is the "next" value of the previous page.
func (s *API) listDeadLetters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "subscription", "reason", "limit", "cursor":
		default:
			writeError(w, http.StatusBadRequest, "unknown parameter "+strconv.Quote(k)+" (want subscription, reason, limit, cursor)")
			return
		}
	}
	limit, ok := pageLimit(w, q.Get("limit"))
	if !ok {
		return
	}
	var afterSub string
	var afterSeq uint64
	if c := q.Get("cursor"); c != "" {
		sub, seq, ok := strings.Cut(c, "/")
		n, err := strconv.ParseUint(seq, 10, 64)
		if !ok || err != nil || sub == "" {
			writeError(w, http.StatusBadRequest, "cursor: want SUBSCRIPTION/SEQ from a previous page, got "+strconv.Quote(c))
			return
		}
		afterSub, afterSeq = sub, n
	}
	sub, reason, p := q.Get("subscription"), q.Get("reason"), principalOf(r)
	// Never null: a script may take the length of an empty page.
	out := api.DeadLetterPage{DeadLetters: []api.DeadLetterInfo{}}
	for len(out.DeadLetters) < limit {
		page, err := s.q.DeadLetters(sub, afterSub, afterSeq, limit)
		if err != nil {
			adminResult(w, err, nil)
			return
		}
		for _, d := range page {
			afterSub, afterSeq = d.Subscription, d.Seq
			if reason != "" && d.Reason != reason || !s.canRead(p, d) {
				continue
			}
			out.DeadLetters = append(out.DeadLetters, api.NewDeadLetterInfo(d, false))
			if len(out.DeadLetters) == limit {
				out.Next = d.Subscription + "/" + strconv.FormatUint(d.Seq, 10)
				break
			}
		}
		if len(page) < limit {
			break
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// replayDeadLetters serves POST /v1/dead-letters/replay with a
// ReplayRequest: {"subscription": S, "seq": N}, {"items": [{"subscription",
// "seq"}...]}, or {"filter": {"subscription": S, "reason": R}}; "force"
// replays dead letters already replayed.
func (s *API) replayDeadLetters(w http.ResponseWriter, r *http.Request) {
	var req api.ReplayRequest
	p := principalOf(r)
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	items := req.Items
	if req.Subscription != "" || req.Seq != 0 {
		if req.Subscription == "" || req.Seq == 0 {
			writeError(w, http.StatusBadRequest, "subscription and seq: give both for one dead letter")
			return
		}
		items = append(items, api.ReplayItem{Subscription: req.Subscription, Seq: req.Seq})
	}
	if req.Filter != nil {
		var afterSub string
		var afterSeq uint64
		for {
			page, err := s.q.DeadLetters(req.Filter.Subscription, afterSub, afterSeq, 500)
			if err != nil {
				adminResult(w, err, nil)
				return
			}
			for _, d := range page {
				afterSub, afterSeq = d.Subscription, d.Seq
				if (req.Filter.Reason == "" || d.Reason == req.Filter.Reason) && s.canRead(p, d) {
					items = append(items, api.ReplayItem{Subscription: d.Subscription, Seq: d.Seq})
				}
			}
			if len(page) < 500 {
				break
			}
		}
	}
	if len(items) == 0 && req.Filter == nil {
		writeError(w, http.StatusBadRequest, "nothing to replay: give subscription and seq, items, or filter")
		return
	}
	ans := api.ReplayAnswer{Results: make([]api.ReplayResult, 0, len(items))}
	for _, it := range items {
		var res api.ReplayResult
		var err error
		if s.canSee(p, it.Subscription) {
			res, err = s.d.Replay(it.Subscription, it.Seq, req.Force)
		} else {
			// Exactly what a subscription that does not exist answers.
			res, err = api.ReplayResult{Subscription: it.Subscription, Seq: it.Seq}, fmt.Errorf("subscription %q: %w", it.Subscription, ErrNotFound)
		}
		if err != nil {
			res.Skipped = err.Error()
		}
		if res.Replayed {
			ans.Replayed++
		}
		ans.Results = append(ans.Results, res)
	}
	writeJSON(w, http.StatusOK, ans)
}
