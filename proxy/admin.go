package proxy

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/queue"
)

// adminHandler serves the admin API on its own listener (net/http: it is
// not a hot path, and the standard tooling fits it best).
func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "draining"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.opts.Registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelError)}))
	mux.HandleFunc("GET /v1/retry-budget", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.RetryBudget())
	})
	mux.HandleFunc("GET /v1/subscriptions", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"subscriptions": s.Lanes(), "head": s.d.head.Load()})
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
		var body struct {
			Reason string `json:"reason"`
		}
		if r.ContentLength != 0 {
			if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body); err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body: " + err.Error()})
				return
			}
		}
		adminResult(w, s.Pause(r.PathValue("id"), body.Reason), map[string]string{"subscription": r.PathValue("id"), "state": "paused"})
	})
	mux.HandleFunc("POST /v1/subscriptions/{id}/resume", func(w http.ResponseWriter, r *http.Request) {
		adminResult(w, s.Resume(r.PathValue("id")), map[string]string{"subscription": r.PathValue("id"), "state": "active"})
	})
	mux.HandleFunc("GET /v1/events/{id}", func(w http.ResponseWriter, r *http.Request) {
		st, err := s.Event(r.PathValue("id"))
		adminResult(w, err, st)
	})
	mux.HandleFunc("GET /v1/dead-letters", s.listDeadLetters)
	mux.HandleFunc("GET /v1/dead-letters/{subscription}/{seq}", func(w http.ResponseWriter, r *http.Request) {
		seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "seq: not a sequence number: " + strconv.Quote(r.PathValue("seq"))})
			return
		}
		d, err := s.q.DeadLetter(r.PathValue("subscription"), seq)
		if errors.Is(err, queue.ErrNotFound) {
			err = fmt.Errorf("dead letter %s/%d: %w", r.PathValue("subscription"), seq, ErrNotFound)
		}
		if err != nil {
			adminResult(w, err, nil)
			return
		}
		writeJSON(w, http.StatusOK, deadLetterJSON(d, true))
	})
	mux.HandleFunc("POST /v1/dead-letters/replay", s.replayDeadLetters)
	s.dashboardRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "not found: " + r.Method + " " + r.URL.Path})
	})
	return s.requireToken(mux)
}

// requireToken enforces the optional bearer token on every path but
// /healthz (liveness probes carry no credentials) and the dashboard's
// static shell (it holds no data; every request it makes for data carries
// the token). The comparison is constant-time.
func (s *Server) requireToken(next http.Handler) http.Handler {
	want := []byte(s.opts.AdminToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(want) > 0 && r.URL.Path != "/healthz" && !dashboardPublic(r) {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong admin token"})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// adminResult writes v, or err as JSON with the status it calls for.
func adminResult(w http.ResponseWriter, err error, v any) {
	switch {
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
	default:
		writeJSON(w, http.StatusOK, v)
	}
}

// deadLetterJSON is a dead letter as the admin API shows it; the body is
// included (as text when it is valid UTF-8, else base64) only on request.
func deadLetterJSON(d *queue.DeadLetter, body bool) map[string]any {
	m := map[string]any{
		"subscription": d.Subscription, "seq": d.Seq, "event_id": d.EventID, "type": d.Type,
		"accepted_at": d.AcceptedAt, "reason": d.Reason, "attempts": d.Attempts, "last_status": d.LastStatus,
		"last_error": d.LastError, "response": d.Response, "dead_at": d.DeadAt, "replays": d.Replays,
		"body_bytes": len(d.Body),
	}
	if !d.ReplayedAt.IsZero() {
		m["replayed_at"] = d.ReplayedAt
	}
	if !d.DeliveredAt.IsZero() {
		m["delivered_at"] = d.DeliveredAt
	}
	if body {
		m["content_type"] = d.ContentType
		if utf8.Valid(d.Body) {
			m["body"] = string(d.Body)
		} else {
			m["body_base64"] = base64.StdEncoding.EncodeToString(d.Body)
		}
	}
	return m
}

// listDeadLetters serves GET /v1/dead-letters?subscription=&reason=&limit=&cursor=.
// cursor is the "next" value of the previous page.
func (s *Server) listDeadLetters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "subscription", "reason", "limit", "cursor":
		default:
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unknown parameter " + strconv.Quote(k) + " (want subscription, reason, limit, cursor)"})
			return
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "limit: want 1..1000, got " + strconv.Quote(v)})
			return
		}
		limit = n
	}
	var afterSub string
	var afterSeq uint64
	if c := q.Get("cursor"); c != "" {
		sub, seq, ok := strings.Cut(c, "/")
		n, err := strconv.ParseUint(seq, 10, 64)
		if !ok || err != nil || sub == "" {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "cursor: want SUBSCRIPTION/SEQ from a previous page, got " + strconv.Quote(c)})
			return
		}
		afterSub, afterSeq = sub, n
	}
	sub, reason := q.Get("subscription"), q.Get("reason")
	var out []map[string]any
	next := ""
	for len(out) < limit {
		page, err := s.q.DeadLetters(sub, afterSub, afterSeq, limit)
		if err != nil {
			adminResult(w, err, nil)
			return
		}
		for _, d := range page {
			afterSub, afterSeq = d.Subscription, d.Seq
			if reason != "" && d.Reason != reason {
				continue
			}
			out = append(out, deadLetterJSON(d, false))
			if len(out) == limit {
				next = d.Subscription + "/" + strconv.FormatUint(d.Seq, 10)
				break
			}
		}
		if len(page) < limit {
			break
		}
	}
	if out == nil {
		out = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"dead_letters": out, "next": next})
}

// replayDeadLetters serves POST /v1/dead-letters/replay with a body of
// {"subscription": S, "seq": N}, {"items": [{"subscription", "seq"}...]}, or
// {"filter": {"subscription": S, "reason": R}}; "force" replays dead letters
// already replayed.
func (s *Server) replayDeadLetters(w http.ResponseWriter, r *http.Request) {
	type item struct {
		Subscription string `json:"subscription"`
		Seq          uint64 `json:"seq"`
	}
	var req struct {
		Subscription string `json:"subscription"`
		Seq          uint64 `json:"seq"`
		Items        []item `json:"items"`
		Filter       *struct {
			Subscription string `json:"subscription"`
			Reason       string `json:"reason"`
		} `json:"filter"`
		Force bool `json:"force"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body: " + err.Error()})
		return
	}
	items := req.Items
	if req.Subscription != "" || req.Seq != 0 {
		if req.Subscription == "" || req.Seq == 0 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "subscription and seq: give both for one dead letter"})
			return
		}
		items = append(items, item{req.Subscription, req.Seq})
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
				if req.Filter.Reason == "" || d.Reason == req.Filter.Reason {
					items = append(items, item{d.Subscription, d.Seq})
				}
			}
			if len(page) < 500 {
				break
			}
		}
	}
	if len(items) == 0 && req.Filter == nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "nothing to replay: give subscription and seq, items, or filter"})
		return
	}
	results := make([]ReplayResult, 0, len(items))
	replayed := 0
	for _, it := range items {
		res, err := s.Replay(it.Subscription, it.Seq, req.Force)
		if err != nil {
			res.Skipped = err.Error()
		}
		if res.Replayed {
			replayed++
		}
		results = append(results, res)
	}
	writeJSON(w, http.StatusOK, map[string]any{"replayed": replayed, "results": results})
}
