package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// Tenant isolation: with one tenant's token, every admin route
// tried with another tenant's ids answers exactly what it answers for ids
// that do not exist, and nothing of the other tenant shows anywhere.

const (
	isoOpToken    = "iso-operator-token-8c"
	isoAcmeToken  = "iso-acme-token-41f7"
	isoOtherToken = "iso-other-token"
)

// adminRoutes reads the admin API's routes from package admin's source:
// every pattern given to a mux's Handle or HandleFunc, and the keys of
// tenantRoutes, the routes a tenant's token may use. Read from the
// source, so that a route added later is seen by the isolation test
// without anyone remembering to list it there.
func adminRoutes(t *testing.T) (registered, tenant []string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "proxy", "admin", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("the admin API's sources: %v", err)
	}
	fset := token.NewFileSet()
	literal := func(e ast.Expr) string {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			t.Fatalf("%s: a route that is not a string literal: the isolation test cannot check it", fset.Position(e.Pos()))
		}
		s, _ := strconv.Unquote(lit.Value)
		return s
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.CallExpr:
				if sel, ok := x.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "HandleFunc" || sel.Sel.Name == "Handle") && len(x.Args) == 2 {
					registered = append(registered, literal(x.Args[0]))
				}
			case *ast.ValueSpec:
				for i, id := range x.Names {
					if id.Name != "tenantRoutes" || i >= len(x.Values) {
						continue
					}
					for _, e := range x.Values[i].(*ast.CompositeLit).Elts {
						tenant = append(tenant, literal(e.(*ast.KeyValueExpr).Key))
					}
				}
			}
			return true
		})
	}
	if len(tenant) == 0 {
		t.Fatal("no tenantRoutes in the admin API's source")
	}
	slices.Sort(registered)
	slices.Sort(tenant)
	return registered, tenant
}

// isoWorld is a sidecar with two tenants, acme and other, each with a
// subscription of the file (its endpoint fails: dead letters) and one of
// the API (its endpoint answers: attempts, delivered ledger entries).
type isoWorld struct {
	*apiSidecar
	tb *testbed.Server
	// deadSeq is a seq of each file subscription's dead letters.
	deadSeq map[string]uint64
}

// isoFileSubs are the file's subscriptions of the isolation tests: one per
// tenant, at a failing endpoint, one attempt each.
func isoFileSubs(tb *testbed.Server) []*delivery.Subscription {
	k, _ := signing.ParseSecret(e2eSecret)
	mk := func(id, tenant, path string, types ...string) *delivery.Subscription {
		return &delivery.Subscription{ID: id, Tenant: tenant, URL: tb.URL() + path, Secrets: []signing.Secret{k}, Types: types,
			Timeout: 2 * time.Second, Retry: policy.RetryPolicy{MaxAttempts: 1}}
	}
	return []*delivery.Subscription{
		mk("acme-file", "acme", "/acme-file-hook", "acme.*", "shared.*"),
		mk("other-file", "other", "/other-file-hook-7f3a", "other.*", "shared.*"),
	}
}

func startIsoWorld(t *testing.T) *isoWorld {
	t.Helper()
	tb := testbed.New(testbed.Options{})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	tb.SetMode("/acme-file-hook", testbed.ModeFail)
	tb.SetMode("/other-file-hook-7f3a", testbed.ModeFail)
	s := openAPISidecar(t, proxy.Options{AdminToken: isoOpToken, Subscriptions: isoFileSubs(tb),
		Tenants:      []delivery.Tenant{{ID: "acme", SharedTypes: []string{"shared.*"}}, {ID: "other", SharedTypes: []string{"shared.*"}}},
		TenantTokens: []admin.TenantToken{{Token: isoAcmeToken, Tenant: "acme"}, {Token: isoOtherToken, Tenant: "other"}}})
	w := &isoWorld{apiSidecar: s, tb: tb, deadSeq: map[string]uint64{}}
	s.mustCall(t, isoAcmeToken, "POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "acme-api", "url": tb.URL() + "/acme-api-hook",
		"types": []string{"acme.*", "shared.*"}, "headers": map[string]string{"X-Who": "acme-header"}}), 201, nil)
	s.mustCall(t, isoOtherToken, "POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "other-api", "url": tb.URL() + "/other-api-hook-9c2e",
		"types": []string{"other.*", "shared.*"}, "headers": map[string]string{"X-Who": "other-header-5d1b"},
		"filter": map[string]any{"data.zone": map[string]any{"$startsWith": "other-zone"}}}), 201, nil)
	body := `{"data": {"zone": "other-zone-1"}}`
	// Each tenant's events carry its tenant; shared.e is a platform event
	// of a type the operator shares with both.
	for _, ev := range [][3]string{{"acme", "acme.e", "acme-ev-1"}, {"acme", "acme.e", "acme-ev-2"}, {"other", "other.e", "other-ev-1"},
		{"other", "other.e", "other-ev-2"}, {"", "shared.e", "shared-ev-1"}} {
		s.postAs(t, ev[0], ev[1], ev[2], body)
	}
	eventually(t, "every tenant's deliveries and dead letters", func() bool {
		return s.laneOf(t, "acme-file").DeadLettered == 3 && s.laneOf(t, "other-file").DeadLettered == 3 &&
			s.laneOf(t, "acme-api").Delivered == 3 && s.laneOf(t, "other-api").Delivered == 3
	})
	for _, sub := range []string{"acme-file", "other-file"} {
		var page api.DeadLetterPage
		s.mustCall(t, "", "GET", "/v1/dead-letters?subscription="+sub, "", 200, &page)
		w.deadSeq[sub] = page.DeadLetters[0].Seq
	}
	return w
}

// otherLeaks are the strings of tenant other that acme must never see.
var otherLeaks = []string{"other-file", "other-api", "other-file-hook-7f3a", "other-api-hook-9c2e", "other-ev-", "other-header-5d1b", "other-zone"}

// otherWord finds the tenant's name itself ("another" is not it).
var otherWord = regexp.MustCompile(`\bother\b`)

// isoReq is one request; names are what it names (ids, event ids), each
// replaced by one placeholder before two answers are compared.
type isoReq struct {
	method, path, body string
	names              []string
}

func (r isoReq) masked(body string) string {
	for _, n := range r.names {
		body = strings.ReplaceAll(body, n, "NAME")
	}
	return body
}

// isoRoute is one admin route (its pattern as registered) as a tenant
// meets it: the request naming other's things, and the same naming things
// that do not exist, must answer alike (status too); own, when set, is it
// naming acme's own, which must work (so that a 404 is not all the route
// ever says); check, when set, looks at what acme's token is answered
// when it asks for its own (lists hold only acme's).
type isoRoute struct {
	pattern        string
	other, unknown isoReq
	status         int
	own            func(t *testing.T, w *isoWorld, token string)
	// static: the answer is the dashboard's embedded files, the same
	// for everyone (its words are not other's).
	static bool
}

// isoTenantRoutes are tenantRoutes as tenant acme meets them.
func isoTenantRoutes(w *isoWorld) []isoRoute {
	od, ad := w.deadSeq["other-file"], w.deadSeq["acme-file"]
	since := jsonOf(api.RecoverRequest{Since: time.Now().Add(-time.Hour)})
	sub := func(method, path, body string) (isoReq, isoReq) {
		return isoReq{method, strings.ReplaceAll(path, "{id}", "other-api"), body, []string{"other-api"}},
			isoReq{method, strings.ReplaceAll(path, "{id}", "nope-api"), body, []string{"nope-api"}}
	}
	route := func(pattern, body string, own func(t *testing.T, w *isoWorld, token string)) isoRoute {
		method, path, _ := strings.Cut(pattern, " ")
		o, u := sub(method, path, body)
		return isoRoute{pattern: pattern, other: o, unknown: u, status: 404, own: own}
	}
	ownOK := func(method, path, body string, want int) func(*testing.T, *isoWorld, string) {
		return func(t *testing.T, w *isoWorld, token string) {
			w.mustCall(t, token, method, path, body, want, nil)
		}
	}
	return []isoRoute{
		{pattern: "GET /v1/subscriptions", status: 200,
			other:   isoReq{"GET", "/v1/subscriptions?tenant=other", "", nil},
			unknown: isoReq{"GET", "/v1/subscriptions?tenant=nobody", "", nil},
			own: func(t *testing.T, w *isoWorld, token string) {
				for _, q := range []string{"", "?tenant=acme"} {
					// acme-scratch-...: deleted by DELETE's check, draining.
					got := w.ids(t, token, q)
					if !slices.Contains(got, "acme-api") || !slices.Contains(got, "acme-file") ||
						slices.ContainsFunc(got, func(id string) bool { return !strings.HasPrefix(id, "acme-") }) {
						t.Errorf("acme lists%s %v", q, got)
					}
				}
			}},
		// The id space is one (ids are metric labels): another tenant's id
		// is taken, and says no more than that: the answer is the one for
		// a duplicate of acme's own.
		{pattern: "POST /v1/subscriptions", status: 409,
			other:   isoReq{"POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "other-api", "url": w.tb.URL() + "/x"}), []string{"other-api"}},
			unknown: isoReq{"POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "acme-api", "url": w.tb.URL() + "/x"}), []string{"acme-api"}},
			own: func(t *testing.T, w *isoWorld, token string) {
				// The file's subscription of other, too, is only taken.
				code, a := w.call(t, token, "POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "other-file", "url": w.tb.URL() + "/x"}))
				_, b := w.call(t, token, "POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "acme-api", "url": w.tb.URL() + "/x"}))
				if code != 409 || strings.ReplaceAll(a, "other-file", "NAME") != strings.ReplaceAll(b, "acme-api", "NAME") {
					t.Errorf("creating other's file subscription's id: %d %s; acme's own duplicate: %s", code, a, b)
				}
			}},
		route("GET /v1/subscriptions/{id}", "", ownOK("GET", "/v1/subscriptions/acme-api", "", 200)),
		route("PATCH /v1/subscriptions/{id}", `{"timeout": "2s"}`, ownOK("PATCH", "/v1/subscriptions/acme-api", `{"timeout": "2s"}`, 200)),
		route("DELETE /v1/subscriptions/{id}", "", func(t *testing.T, w *isoWorld, token string) {
			id := fmt.Sprintf("acme-scratch-%d", time.Now().UnixNano())
			w.mustCall(t, token, "POST", "/v1/subscriptions", jsonOf(map[string]any{"id": id, "url": w.tb.URL() + "/scratch"}), 201, nil)
			w.mustCall(t, token, "DELETE", "/v1/subscriptions/"+id, "", 202, nil)
		}),
		route("POST /v1/subscriptions/{id}/pause", "", func(t *testing.T, w *isoWorld, token string) {
			w.mustCall(t, token, "POST", "/v1/subscriptions/acme-api/pause", "", 200, nil)
			w.mustCall(t, token, "POST", "/v1/subscriptions/acme-api/resume", "", 200, nil)
		}),
		route("POST /v1/subscriptions/{id}/resume", "", ownOK("POST", "/v1/subscriptions/acme-api/resume", "", 200)),
		route("POST /v1/subscriptions/{id}/rotate-secret", `{"grace": "0s"}`, ownOK("POST", "/v1/subscriptions/acme-api/rotate-secret", `{"grace": "0s"}`, 200)),
		route("POST /v1/subscriptions/{id}/recover", since, ownOK("POST", "/v1/subscriptions/acme-file/recover", since, 200)),
		route("GET /v1/subscriptions/{id}/attempts", "", ownOK("GET", "/v1/subscriptions/acme-api/attempts", "", 200)),
		route("GET /v1/subscriptions/{id}/series", "", ownOK("GET", "/v1/subscriptions/acme-api/series", "", 200)),
		{pattern: "GET /v1/events/{id}", status: 404,
			other:   isoReq{"GET", "/v1/events/other-ev-1", "", []string{"other-ev-1"}},
			unknown: isoReq{"GET", "/v1/events/nope-ev-1", "", []string{"nope-ev-1"}},
			own: func(t *testing.T, w *isoWorld, token string) {
				// An event both tenants take: acme sees its own deliveries.
				var st api.EventStatus
				w.mustCall(t, token, "GET", "/v1/events/shared-ev-1", "", 200, &st)
				var subs []string
				for _, d := range st.Deliveries {
					subs = append(subs, d.Subscription)
				}
				if slices.Sort(subs); !slices.Equal(subs, []string{"acme-api", "acme-file"}) {
					t.Errorf("acme's ledger of the shared event: %+v", st.Deliveries)
				}
				w.mustCall(t, token, "GET", "/v1/events/acme-ev-1", "", 200, nil)
			}},
		{pattern: "GET /v1/dead-letters", status: 200,
			other:   isoReq{"GET", "/v1/dead-letters?subscription=other-file", "", []string{"other-file"}},
			unknown: isoReq{"GET", "/v1/dead-letters?subscription=nope-file", "", []string{"nope-file"}},
			own: func(t *testing.T, w *isoWorld, token string) {
				for _, q := range []string{"", "?limit=1", "?reason=max_attempts"} {
					var page api.DeadLetterPage
					w.mustCall(t, token, "GET", "/v1/dead-letters"+q, "", 200, &page)
					if len(page.DeadLetters) == 0 {
						t.Errorf("acme's dead letters%s: none", q)
					}
					for _, d := range page.DeadLetters {
						if d.Subscription != "acme-file" {
							t.Errorf("acme's dead letters%s hold %s/%d", q, d.Subscription, d.Seq)
						}
					}
				}
			}},
		{pattern: "GET /v1/dead-letters/{subscription}/{seq}", status: 404,
			other:   isoReq{"GET", fmt.Sprintf("/v1/dead-letters/other-file/%d", od), "", []string{"other-file"}},
			unknown: isoReq{"GET", fmt.Sprintf("/v1/dead-letters/nope-file/%d", od), "", []string{"nope-file"}},
			own:     ownOK("GET", fmt.Sprintf("/v1/dead-letters/acme-file/%d", ad), "", 200)},
		{pattern: "POST /v1/dead-letters/replay", status: 200,
			other:   isoReq{"POST", "/v1/dead-letters/replay", jsonOf(map[string]any{"subscription": "other-file", "seq": od}), []string{"other-file"}},
			unknown: isoReq{"POST", "/v1/dead-letters/replay", jsonOf(map[string]any{"subscription": "nope-file", "seq": od}), []string{"nope-file"}},
			own: func(t *testing.T, w *isoWorld, token string) {
				for _, body := range []string{`{"filter": {"subscription": "other-file"}}`, `{"items": [{"subscription": "other-file", "seq": ` + fmt.Sprint(od) + `}]}`} {
					_, a := w.call(t, token, "POST", "/v1/dead-letters/replay", body)
					_, b := w.call(t, token, "POST", "/v1/dead-letters/replay", strings.ReplaceAll(body, "other-file", "nope-file"))
					if strings.ReplaceAll(a, "other-file", "NAME") != strings.ReplaceAll(b, "nope-file", "NAME") {
						t.Errorf("replay %s: %s; of one that does not exist: %s", body, a, b)
					}
				}
				// By a filter naming nobody: acme's only.
				var ans api.ReplayAnswer
				w.mustCall(t, token, "POST", "/v1/dead-letters/replay", `{"filter": {}}`, 200, &ans)
				for _, r := range ans.Results {
					if r.Subscription != "acme-file" {
						t.Errorf("replay by filter with acme's token: %+v", r)
					}
				}
			}},
		{pattern: "GET /v1/undelivered", status: 404,
			other:   isoReq{"GET", "/v1/undelivered?subscription=other-file", "", []string{"other-file"}},
			unknown: isoReq{"GET", "/v1/undelivered?subscription=nope-file", "", []string{"nope-file"}},
			own:     ownOK("GET", "/v1/undelivered?subscription=acme-file", "", 200)},
		{pattern: "GET /v1/whoami", status: 200,
			other:   isoReq{"GET", "/v1/whoami", "", nil},
			unknown: isoReq{"GET", "/v1/whoami", "", nil}},
		{pattern: "GET /{$}", status: 200, static: true,
			other:   isoReq{"GET", "/", "", nil},
			unknown: isoReq{"GET", "/", "", nil}},
		{pattern: "GET /assets/{name}", status: 200, static: true,
			other:   isoReq{"GET", "/assets/app.js", "", nil},
			unknown: isoReq{"GET", "/assets/app.js", "", nil}},
	}
}

// isoOperatorRoutes are the routes only the operator may use, each with
// a path that reaches it: a tenant is answered what a path that does not
// exist is.
var isoOperatorRoutes = map[string]isoReq{
	"GET /readyz":                             {"GET", "/readyz", "", nil},
	"GET /metrics":                            {"GET", "/metrics", "", nil},
	"GET /v1/retry-budget":                    {"GET", "/v1/retry-budget", "", nil},
	"GET /debug/pprof/":                       {"GET", "/debug/pprof/heap", "", nil},
	"GET /debug/pprof/cmdline":                {"GET", "/debug/pprof/cmdline", "", nil},
	"GET /debug/pprof/profile":                {"GET", "/debug/pprof/profile", "", nil},
	"GET /debug/pprof/symbol":                 {"GET", "/debug/pprof/symbol", "", nil},
	"GET /debug/pprof/trace":                  {"GET", "/debug/pprof/trace", "", nil},
	"GET /debug/vars":                         {"GET", "/debug/vars", "", nil},
	"POST /v1/tenants/{tenant}/tokens":        {"POST", "/v1/tenants/acme/tokens", "", nil},
	"GET /v1/tenants/{tenant}/tokens":         {"GET", "/v1/tenants/acme/tokens", "", nil},
	"GET /v1/tokens":                          {"GET", "/v1/tokens", "", nil},
	"DELETE /v1/tenants/{tenant}/tokens/{id}": {"DELETE", "/v1/tenants/acme/tokens/0123456789ab", "", nil},
}

// isoPublicRoutes need no token at all; "/" is the mux's catch-all,
// which answers 404 to everyone.
var isoPublicRoutes = []string{"GET /healthz", "/"}

// TestTenantIsolationEveryRoute: the route lists of this test are the
// admin API's (read from package admin's source: a route added later fails the
// test until it is listed here, as a tenant's or the operator's). With
// acme's token (a configured one, an issued one, and the issued one after
// a restart on the same data dir, whose hash the store keeps) every
// route naming other's subscriptions, events and dead letters answers as
// for ids that do not exist and shows nothing of other; lists hold only
// acme's; the operator's routes answer acme 404, as a path that does not
// exist; a wrong token is refused (401) everywhere but the public paths.
func TestTenantIsolationEveryRoute(t *testing.T) {
	w := startIsoWorld(t)
	tenantRoutes := isoTenantRoutes(w)

	registered, tenant := adminRoutes(t)
	var listed, listedTenant []string
	for _, r := range tenantRoutes {
		listed, listedTenant = append(listed, r.pattern), append(listedTenant, r.pattern)
	}
	for p := range isoOperatorRoutes {
		listed = append(listed, p)
	}
	listed = append(listed, isoPublicRoutes...)
	slices.Sort(listed)
	slices.Sort(listedTenant)
	if missing, extra := setDiff(tenant, listedTenant), setDiff(listedTenant, tenant); len(missing)+len(extra) > 0 {
		t.Fatalf("tenantRoutes has %q that this test does not check as a tenant's, and lacks %q that it does: list every tenant route in isoTenantRoutes", missing, extra)
	}
	if missing, extra := setDiff(registered, listed), setDiff(listed, registered); len(missing)+len(extra) > 0 {
		t.Fatalf("the admin mux has %q that this test does not know, and lacks %q that it does: list a new route in isoTenantRoutes (and tenantRoutes) or in isoOperatorRoutes", missing, extra)
	}

	var issued api.TokenAnswer
	w.mustCall(t, "", "POST", "/v1/tenants/acme/tokens", "", 201, &issued)
	check := func(t *testing.T, token string) {
		for _, r := range tenantRoutes {
			t.Run(r.pattern, func(t *testing.T) {
				codeO, other := w.call(t, token, r.other.method, r.other.path, r.other.body)
				codeU, unknown := w.call(t, token, r.unknown.method, r.unknown.path, r.unknown.body)
				if codeO != r.status || codeU != r.status {
					t.Errorf("%s %s: %d; %s %s: %d; want %d", r.other.method, r.other.path, codeO, r.unknown.method, r.unknown.path, codeU, r.status)
				}
				if a, b := r.other.masked(other), r.unknown.masked(unknown); a != b {
					t.Errorf("other's and nobody's answer differ:\n%s %s %s:\n%s\n%s %s %s:\n%s", r.other.method, r.other.path, r.other.body, other,
						r.unknown.method, r.unknown.path, r.unknown.body, unknown)
				}
				if !r.static {
					assertNoLeak(t, r.other.masked(other))
				}
				if r.own != nil {
					r.own(t, w, token)
				}
			})
		}
		for p, req := range isoOperatorRoutes {
			t.Run(p, func(t *testing.T) {
				code, body := w.call(t, token, req.method, req.path, req.body)
				_, nowhere := w.call(t, token, req.method, "/no/such/path", req.body)
				if code != 404 || strings.ReplaceAll(body, req.path, "PATH") != strings.ReplaceAll(nowhere, "/no/such/path", "PATH") {
					t.Errorf("%s %s with a tenant's token: %d %s; want what a path that does not exist answers: %s", req.method, req.path, code, body, nowhere)
				}
			})
		}
		// Every subscription, dead letter and event of acme's, seen with
		// its token, shows nothing of other.
		for _, path := range []string{"/v1/subscriptions", "/v1/subscriptions/acme-api", "/v1/subscriptions/acme-file", "/v1/dead-letters",
			"/v1/events/shared-ev-1", "/v1/subscriptions/acme-api/attempts", "/v1/undelivered?subscription=acme-file"} {
			code, body := w.call(t, token, "GET", path, "")
			if code != 200 {
				t.Errorf("GET %s: %d %s", path, code, body)
			}
			assertNoLeak(t, body)
		}
	}
	t.Run("configured token", func(t *testing.T) { check(t, isoAcmeToken) })
	t.Run("issued token", func(t *testing.T) { check(t, issued.Token) })

	t.Run("wrong token", func(t *testing.T) {
		for _, r := range tenantRoutes {
			if code, body := w.call(t, "not-a-token", r.other.method, r.other.path, r.other.body); code != 401 && !r.static {
				t.Errorf("%s with a wrong token: %d %s", r.pattern, code, body)
			}
		}
		for p, req := range isoOperatorRoutes {
			if code, _ := w.call(t, "not-a-token", req.method, req.path, req.body); code != 401 {
				t.Errorf("%s with a wrong token: %d", p, code)
			}
		}
		if code, _ := w.call(t, "not-a-token", "GET", "/healthz", ""); code != 200 {
			t.Errorf("/healthz with a wrong token: %d", code)
		}
		// other's own token still sees other's: the 404s above are acme's.
		w.mustCall(t, isoOtherToken, "GET", "/v1/subscriptions/other-api", "", 200, nil)
	})

	// The issued token outlives the process: its hash is in the store.
	w.reopen(t, isoFileSubs(w.tb)...)
	t.Run("issued token after a restart", func(t *testing.T) { check(t, issued.Token) })

	// Nothing acme did touched other's.
	var page api.DeadLetterPage
	w.mustCall(t, "", "GET", "/v1/dead-letters?subscription=other-file", "", 200, &page)
	for _, d := range page.DeadLetters {
		if d.Replays != 0 {
			t.Errorf("other's dead letter %d was replayed %d times", d.Seq, d.Replays)
		}
	}
	if info := w.info(t, "other-api"); info.State != "active" || info.Config["timeout"] != nil || info.Config["secrets_count"] != float64(1) {
		t.Errorf("other's subscription changed: %+v", info)
	}
}

// setDiff is what a holds that b does not.
func setDiff(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// assertNoLeak fails when body shows anything of tenant other.
func assertNoLeak(t *testing.T, body string) {
	t.Helper()
	for _, s := range otherLeaks {
		if strings.Contains(body, s) {
			t.Errorf("acme's answer shows %q of other:\n%s", s, body)
		}
	}
	if otherWord.MatchString(body) {
		t.Errorf("acme's answer names tenant other:\n%s", body)
	}
}
