package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// The subscription API, route by route, against a real
// proxy.Server with serve's own parser of documents (specParser), Badger
// under t.TempDir() and testbed endpoints.

const (
	apiOpToken   = "api-operator-token-2b"
	apiAcmeToken = "api-acme-token-9e03"
)

// deliveryLog is a testbed Hook: it remembers every request's path,
// webhook-id and X-Added header, and answers a path with a script when
// the test gives it one (the mode's answer otherwise).
type deliveryLog struct {
	mu     sync.Mutex
	seen   []seenRequest
	script map[string]func(body []byte) int
}

type seenRequest struct{ path, id, added string }

func newDeliveryLog() *deliveryLog { return &deliveryLog{script: map[string]func([]byte) int{}} }

func (d *deliveryLog) hook(r testbed.Request, status int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := string(r.Path())
	d.seen = append(d.seen, seenRequest{path: p, id: string(r.Header("webhook-id")), added: string(r.Header("X-Added"))})
	if f := d.script[p]; f != nil {
		return f(r.Body())
	}
	return status
}

func (d *deliveryLog) setScript(path string, f func(body []byte) int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.script[path] = f
}

// request returns the first request of event id to path.
func (d *deliveryLog) request(path, id string) (seenRequest, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.seen {
		if r.path == path && r.id == id {
			return r, true
		}
	}
	return seenRequest{}, false
}

// startDeliveryTestbed opens a testbed whose requests log records.
func startDeliveryTestbed(t *testing.T, log *deliveryLog) *testbed.Server {
	t.Helper()
	tb := testbed.New(testbed.Options{Hook: log.hook})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	return tb
}

// state is what the API shows of the subscriptions, without the lanes'
// counters: each one's id, state, tenant, manager and config, as the
// operator sees them. Two equal states mean nothing was changed.
func (s *apiSidecar) state(t *testing.T) string {
	t.Helper()
	code, body := s.call(t, s.opts.AdminToken, "GET", "/v1/subscriptions", "")
	if code != 200 {
		t.Fatalf("list: %d %s", code, body)
	}
	var list api.SubscriptionList
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, l := range list.Subscriptions {
		info := s.info(t, l.Subscription)
		cfg, _ := json.Marshal(info.Config)
		fmt.Fprintf(&b, "%s state=%s tenant=%s managed_by=%s config=%s\n", l.Subscription, l.State, l.Tenant, l.ManagedBy, cfg)
	}
	return b.String()
}

// info is GET /v1/subscriptions/{id} with the operator's token.
func (s *apiSidecar) info(t *testing.T, id string) api.SubscriptionInfo {
	t.Helper()
	code, body := s.call(t, s.opts.AdminToken, "GET", "/v1/subscriptions/"+id, "")
	if code != 200 {
		t.Fatalf("GET %s: %d %s", id, code, body)
	}
	var info api.SubscriptionInfo
	if err := json.Unmarshal([]byte(body), &info); err != nil {
		t.Fatal(err)
	}
	return info
}

// ids lists the subscriptions GET /v1/subscriptions{query} shows token.
func (s *apiSidecar) ids(t *testing.T, token, query string) []string {
	t.Helper()
	code, body := s.call(t, token, "GET", "/v1/subscriptions"+query, "")
	if code != 200 {
		t.Fatalf("list%s: %d %s", query, code, body)
	}
	var list api.SubscriptionList
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, l := range list.Subscriptions {
		out = append(out, l.Subscription)
	}
	return out
}

// mustCall makes a request that must answer want, and decodes the answer
// into v (unless nil); token "" is the operator's.
func (s *apiSidecar) mustCall(t *testing.T, token, method, path, body string, want int, v any) string {
	t.Helper()
	if token == "" {
		token = s.opts.AdminToken
	}
	code, got := s.call(t, token, method, path, body)
	if code != want {
		t.Fatalf("%s %s %s: %d %s, want %d", method, path, body, code, got, want)
	}
	if v != nil {
		if err := json.Unmarshal([]byte(got), v); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, got)
		}
	}
	return got
}

// apiError is one request the API must refuse: its status, the words its
// error must hold (the key, the operator, the path...), what it must
// never show (a secret), and nothing changed by it.
type apiError struct {
	name               string
	token              string // "" is the operator's
	method, path, body string
	status             int
	want               []string
	never              []string
}

func (s *apiSidecar) refuses(t *testing.T, cases []apiError) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := s.state(t)
			token := tc.token
			if token == "" {
				token = s.opts.AdminToken
			}
			code, body := s.call(t, token, tc.method, tc.path, tc.body)
			var ans api.ErrorAnswer
			if err := json.Unmarshal([]byte(body), &ans); err != nil || ans.Error == "" {
				t.Fatalf("%s %s: %d %q, want a JSON error", tc.method, tc.path, code, body)
			}
			if code != tc.status {
				t.Errorf("%s %s %s: %d %q, want %d", tc.method, tc.path, tc.body, code, ans.Error, tc.status)
			}
			for _, w := range tc.want {
				if !strings.Contains(ans.Error, w) {
					t.Errorf("error %q does not name %q", ans.Error, w)
				}
			}
			for _, n := range tc.never {
				if strings.Contains(body, n) {
					t.Errorf("answer %q shows %q", body, n)
				}
			}
			if after := s.state(t); after != before {
				t.Errorf("a refused request changed the subscriptions:\nbefore:\n%safter:\n%s", before, after)
			}
		})
	}
}

// waitFor waits until the testbed's counts satisfy cond.
func waitFor(t *testing.T, tb *testbed.Server, what string, cond func(map[string]testbed.PathStats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tb.Wait(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v; testbed %+v", what, err, tb.Stats())
	}
}

func jsonOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// laneOf is the lane of id as the server has it; the test fails without one.
func (s *apiSidecar) laneOf(t *testing.T, id string) api.LaneStatus {
	t.Helper()
	l, ok := s.lane(id)
	if !ok {
		t.Fatalf("no lane %q", id)
	}
	return l
}

// TestAPIEveryRow drives every route of the subscription API with its
// errors:
// create (a generated secret shown once; each invalid document refused
// with its key named), get and list by tenant, patch (new settings on the
// next delivery; the file's subscriptions, the id and bad patches
// refused), delete (drains, then 404), rotate-secret, recover (each dead
// letter in the range once), the undelivered list (retrying and dead,
// paged, since) and tenant tokens. Every refusal leaves every
// subscription as it was.
func TestAPIEveryRow(t *testing.T) {
	log := newDeliveryLog()
	tb := startDeliveryTestbed(t, log)
	k, _ := signing.ParseSecret(e2eSecret)
	filed := &delivery.Subscription{ID: "filed", URL: tb.URL() + "/filed", Secrets: []signing.Secret{k}, Types: []string{"file.*"}}
	s := openAPISidecar(t, proxy.Options{AdminToken: apiOpToken, Subscriptions: []*delivery.Subscription{filed},
		TenantTokens: []admin.TenantToken{{Token: apiAcmeToken, Tenant: "acme"}}})
	doc := func(id string, kv ...any) string {
		m := map[string]any{"id": id, "url": tb.URL() + "/" + id}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == nil {
				delete(m, kv[i].(string))
			} else {
				m[kv[i].(string)] = kv[i+1]
			}
		}
		return jsonOf(m)
	}

	var generated string
	t.Run("create", func(t *testing.T) {
		var info api.SubscriptionInfo
		s.mustCall(t, "", "POST", "/v1/subscriptions", doc("billing", "types", []string{"order.*"}), 201, &info)
		if !strings.HasPrefix(info.Secret, "whsec_") || info.ManagedBy != api.ManagedByAPI || info.State != "active" || info.Config["secrets_count"] != float64(1) {
			t.Fatalf("create answered %+v; want a generated whsec_ secret, managed by the API, active", info)
		}
		generated = info.Secret
		if _, err := signing.ParseSecret(generated); err != nil {
			t.Fatalf("the generated secret: %v", err)
		}
		if strings.Contains(jsonOf(info.Config), generated) {
			t.Fatalf("the config shows the secret: %v", info.Config)
		}
		// Shown once: never by GET, the list, or another tenant's view.
		for _, path := range []string{"/v1/subscriptions/billing", "/v1/subscriptions", "/v1/subscriptions?tenant="} {
			if _, body := s.call(t, apiOpToken, "GET", path, ""); strings.Contains(body, generated) || strings.Contains(body, `"secret"`) {
				t.Fatalf("GET %s shows the secret: %s", path, body)
			}
		}
		// A secret of its own is not shown back at all.
		info = api.SubscriptionInfo{}
		body := s.mustCall(t, "", "POST", "/v1/subscriptions", doc("shipping", "secret", e2eSecret, "tenant", "acme"), 201, &info)
		if info.Secret != "" || strings.Contains(body, e2eSecret) || info.Tenant != "acme" {
			t.Fatalf("create with a secret: %s", body)
		}
		// A tenant's token makes subscriptions of its tenant.
		info = api.SubscriptionInfo{}
		s.mustCall(t, apiAcmeToken, "POST", "/v1/subscriptions", doc("acme-own"), 201, &info)
		if info.Tenant != "acme" {
			t.Fatalf("created with acme's token: tenant %q", info.Tenant)
		}
	})

	t.Run("create errors", func(t *testing.T) {
		u := tb.URL() + "/x"
		s.refuses(t, []apiError{
			{name: "not JSON", method: "POST", path: "/v1/subscriptions", body: `{"id":`, status: 400, want: []string{"body"}},
			{name: "bad url", method: "POST", path: "/v1/subscriptions", body: doc("x", "url", "ftp://example.com/hooks"), status: 400, want: []string{"url", "http or https"}},
			{name: "decimal IPv4 host", method: "POST", path: "/v1/subscriptions", body: doc("x", "url", "http://2130706433:8080/hooks"), status: 400, want: []string{"url", "IPv4 address in another spelling"}},
			{name: "octal IPv4 host", method: "POST", path: "/v1/subscriptions", body: doc("x", "url", "http://0177.0.0.1/hooks"), status: 400, want: []string{"url", "IPv4 address in another spelling"}},
			{name: "no url", method: "POST", path: "/v1/subscriptions", body: doc("x", "url", nil), status: 400, want: []string{"url", "required"}},
			{name: "bad id", method: "POST", path: "/v1/subscriptions", body: doc("Bad Id!", "url", u), status: 400, want: []string{"id", "Bad Id!"}},
			{name: "bad secret", method: "POST", path: "/v1/subscriptions", body: doc("x", "secret", "whsec_%%%notbase64"), status: 400,
				want: []string{"secret"}, never: []string{"%%%notbase64"}},
			{name: "secret without prefix", method: "POST", path: "/v1/subscriptions", body: doc("x", "secret", "hunter2hunter2"), status: 400,
				want: []string{"secret", "whsec_"}, never: []string{"hunter2"}},
			{name: "unknown key", method: "POST", path: "/v1/subscriptions", body: doc("x", "colour", "red"), status: 400, want: []string{`"colour"`}},
			{name: "wrong type", method: "POST", path: "/v1/subscriptions", body: doc("x", "concurrency", map[string]any{"max": "lots"}), status: 400,
				want: []string{"concurrency.max", "integer"}},
			{name: "wrong type of duration", method: "POST", path: "/v1/subscriptions", body: doc("x", "timeout", 5), status: 400, want: []string{"timeout"}},
			{name: "types not a list", method: "POST", path: "/v1/subscriptions", body: doc("x", "types", "order.created"), status: 400, want: []string{"types"}},
			{name: "invalid filter operator", method: "POST", path: "/v1/subscriptions", body: doc("x", "filter", map[string]any{"data.speed": map[string]any{"$gtx": 80}}),
				status: 400, want: []string{"filter", "$gtx", "data.speed"}},
			{name: "invalid filter operand", method: "POST", path: "/v1/subscriptions",
				body:   doc("x", "filter", map[string]any{"$or": []any{map[string]any{"data.depot": map[string]any{"$in": 5}}}}),
				status: 400, want: []string{"filter", "$in", "data.depot"}},
			{name: "bad type pattern", method: "POST", path: "/v1/subscriptions", body: doc("x", "types", []string{"geo*"}), status: 400, want: []string{"types", "geo*"}},
			{name: "empty type segment", method: "POST", path: "/v1/subscriptions", body: doc("x", "types", []string{"geofence..*"}), status: 400, want: []string{"types"}},
			{name: "secret_file", method: "POST", path: "/v1/subscriptions", body: doc("x", "secret_file", "/etc/passwd"), status: 400, want: []string{"secret_file"}},
			{name: "secret_env", method: "POST", path: "/v1/subscriptions", body: doc("x", "secret_env", "HOME"), status: 400, want: []string{"secret_env"}},
			{name: "the operational webhook's id", method: "POST", path: "/v1/subscriptions", body: doc(delivery.OperationalID), status: 400,
				want: []string{"id", delivery.OperationalID, "operational"}},
			{name: "bad tenant", method: "POST", path: "/v1/subscriptions", body: doc("x", "tenant", "Not A Tenant"), status: 400, want: []string{"tenant"}},
			{name: "another tenant with a tenant's token", token: apiAcmeToken, method: "POST", path: "/v1/subscriptions", body: doc("x", "tenant", "other"),
				status: 400, want: []string{"tenant"}},
			{name: "duplicate id", method: "POST", path: "/v1/subscriptions", body: doc("billing"), status: 409, want: []string{"billing", "already exists"}},
			{name: "the config file's id", method: "POST", path: "/v1/subscriptions", body: doc("filed"), status: 409, want: []string{"filed", "config file"}},
		})
	})

	t.Run("get and list", func(t *testing.T) {
		if got := s.ids(t, apiOpToken, "?tenant=acme"); !slices.Equal(got, []string{"acme-own", "shipping"}) {
			t.Errorf("?tenant=acme lists %v", got)
		}
		if got := s.ids(t, apiOpToken, "?tenant=nobody"); len(got) != 0 {
			t.Errorf("?tenant=nobody lists %v", got)
		}
		if got := s.ids(t, apiOpToken, ""); !slices.Equal(got, []string{"acme-own", "billing", "filed", "shipping"}) {
			t.Errorf("the list is %v", got)
		}
		if got := s.ids(t, apiAcmeToken, ""); !slices.Equal(got, []string{"acme-own", "shipping"}) {
			t.Errorf("acme's token lists %v", got)
		}
		info := s.info(t, "filed")
		if info.ManagedBy != api.ManagedByFile || info.Secret != "" {
			t.Errorf("GET filed: %+v", info)
		}
		info = s.info(t, "shipping")
		if info.Config["url"] != tb.URL()+"/shipping" || info.Config["tenant"] != "acme" || info.Config["secrets_count"] != float64(1) {
			t.Errorf("GET shipping: config %v", info.Config)
		}
		s.refuses(t, []apiError{{name: "unknown id", method: "GET", path: "/v1/subscriptions/nope", status: 404, want: []string{`"nope"`}}})
	})

	t.Run("patch", func(t *testing.T) {
		s.publish(t, "order.created", "before-patch")
		eventually(t, "the delivery before the patch", func() bool { _, ok := log.request("/billing", "before-patch"); return ok })
		var info api.SubscriptionInfo
		s.mustCall(t, "", "PATCH", "/v1/subscriptions/billing", `{"headers": {"X-Added": "yes"}, "timeout": "3s"}`, 200, &info)
		if jsonOf(info.Config["headers"]) != `{"X-Added":"yes"}` || info.Config["timeout"] != "3s" || info.Config["secrets_count"] != float64(1) {
			t.Fatalf("after the patch: %v", info.Config)
		}
		s.publish(t, "order.created", "after-patch")
		eventually(t, "the delivery after the patch", func() bool { _, ok := log.request("/billing", "after-patch"); return ok })
		before, _ := log.request("/billing", "before-patch")
		after, _ := log.request("/billing", "after-patch")
		if before.added != "" || after.added != "yes" {
			t.Fatalf("X-Added before the patch %q, after %q; want none, then yes", before.added, after.added)
		}
		// The same secret signs: the patch did not touch it.
		if s.info(t, "billing").Config["secrets_count"] != float64(1) {
			t.Fatal("the patch changed the secrets")
		}
		// What is owed at a patch is not lost, and goes with the new
		// settings: paused, three wait; patched, resumed, all three come.
		s.mustCall(t, "", "POST", "/v1/subscriptions/billing/pause", "", 200, nil)
		for _, id := range []string{"owed-0", "owed-1", "owed-2"} {
			s.publish(t, "order.created", id)
		}
		s.mustCall(t, "", "PATCH", "/v1/subscriptions/billing", `{"headers": {"X-Added": "again"}}`, 200, nil)
		if st := s.laneOf(t, "billing").State; st != "paused" {
			t.Fatalf("a patch resumed a paused subscription: %s", st)
		}
		s.mustCall(t, "", "POST", "/v1/subscriptions/billing/resume", "", 200, nil)
		for _, id := range []string{"owed-0", "owed-1", "owed-2"} {
			eventually(t, "the delivery of "+id, func() bool { _, ok := log.request("/billing", id); return ok })
			if r, _ := log.request("/billing", id); r.added != "again" {
				t.Errorf("%s, owed at the patch, went with X-Added %q", id, r.added)
			}
		}
		s.mustCall(t, "", "PATCH", "/v1/subscriptions/billing", `{"headers": {"X-Added": "yes"}}`, 200, nil)
	})

	t.Run("patch errors", func(t *testing.T) {
		p := "/v1/subscriptions/billing"
		s.refuses(t, []apiError{
			{name: "the file's", method: "PATCH", path: "/v1/subscriptions/filed", body: `{"timeout": "1s"}`, status: 409, want: []string{"filed", "config file"}},
			{name: "the id", method: "PATCH", path: p, body: `{"id": "renamed"}`, status: 400, want: []string{"id", "cannot be changed"}},
			{name: "no id", method: "PATCH", path: p, body: `{"id": null}`, status: 400, want: []string{"id"}},
			{name: "wrong type", method: "PATCH", path: p, body: `{"retry": {"max_attempts": "many"}}`, status: 400, want: []string{"retry.max_attempts"}},
			{name: "invalid filter", method: "PATCH", path: p, body: `{"filter": {"data.x": {"$bad": 1}}}`, status: 400, want: []string{"$bad", "data.x"}},
			{name: "bad url", method: "PATCH", path: p, body: `{"url": "ftp://example.com"}`, status: 400, want: []string{"url"}},
			{name: "short IPv4 host", method: "PATCH", path: p, body: `{"url": "http://127.1/hooks"}`, status: 400, want: []string{"url", "IPv4 address in another spelling"}},
			{name: "unknown key", method: "PATCH", path: p, body: `{"colour": "red"}`, status: 400, want: []string{`"colour"`}},
			{name: "no secret left", method: "PATCH", path: p, body: `{"secret": null}`, status: 400, want: []string{"secret"}},
			{name: "secret_file", method: "PATCH", path: p, body: `{"secret_file": "/etc/passwd"}`, status: 400, want: []string{"secret_file"}},
			{name: "not JSON", method: "PATCH", path: p, body: `{"timeout":`, status: 400, want: []string{"body"}},
			{name: "not an object", method: "PATCH", path: p, body: `[1]`, status: 400, want: []string{"body"}},
			{name: "to another tenant with a tenant's token", token: apiAcmeToken, method: "PATCH", path: "/v1/subscriptions/acme-own",
				body: `{"tenant": "other"}`, status: 400, want: []string{"tenant"}},
			{name: "unknown id", method: "PATCH", path: "/v1/subscriptions/nope", body: `{"timeout": "1s"}`, status: 404, want: []string{`"nope"`}},
		})
		// The old settings still deliver.
		s.publish(t, "order.created", "after-bad-patches")
		eventually(t, "the delivery after the bad patches", func() bool { _, ok := log.request("/billing", "after-bad-patches"); return ok })
		if r, _ := log.request("/billing", "after-bad-patches"); r.added != "yes" {
			t.Fatalf("after the refused patches X-Added is %q", r.added)
		}
	})

	t.Run("delete", func(t *testing.T) {
		s.refuses(t, []apiError{
			{name: "the file's", method: "DELETE", path: "/v1/subscriptions/filed", status: 409, want: []string{"filed", "config file"}},
			{name: "unknown id", method: "DELETE", path: "/v1/subscriptions/nope", status: 404, want: []string{`"nope"`}},
		})
		s.mustCall(t, "", "POST", "/v1/subscriptions", doc("scratch"), 201, nil)
		var info api.SubscriptionInfo
		s.mustCall(t, "", "DELETE", "/v1/subscriptions/scratch", "", 202, &info)
		if info.State != "draining" {
			t.Fatalf("delete answered state %q, want draining", info.State)
		}
		s.refuses(t, []apiError{{name: "deleted", method: "DELETE", path: "/v1/subscriptions/scratch", status: 404, want: []string{"scratch", "deleted"}}})
		eventually(t, "scratch to retire", func() bool {
			code, _ := s.call(t, apiOpToken, "GET", "/v1/subscriptions/scratch", "")
			return code == 404
		})
		if slices.Contains(s.ids(t, apiOpToken, ""), "scratch") {
			t.Fatal("a retired subscription is still listed")
		}
		// Retired, its id is free again: a new one takes only new events.
		s.mustCall(t, "", "POST", "/v1/subscriptions", doc("scratch"), 201, nil)
		s.mustCall(t, "", "DELETE", "/v1/subscriptions/scratch", "", 202, nil)
		// Let it retire here: retiring during a later row, between the
		// list and the GETs of that row's before/after snapshot, fails
		// the row for nothing it did.
		eventually(t, "the second scratch to retire", func() bool {
			code, _ := s.call(t, apiOpToken, "GET", "/v1/subscriptions/scratch", "")
			return code == 404
		})
	})

	t.Run("rotate-secret", func(t *testing.T) {
		var ans api.RotateAnswer
		at := time.Now()
		s.mustCall(t, "", "POST", "/v1/subscriptions/billing/rotate-secret", `{"grace": "1h"}`, 200, &ans)
		if !strings.HasPrefix(ans.Secret, "whsec_") || ans.Secret == generated || ans.Subscription != "billing" ||
			ans.OldUntil.Before(at.Add(time.Hour-time.Minute)) || ans.OldUntil.After(time.Now().Add(time.Hour+time.Minute)) {
			t.Fatalf("rotate-secret answered %+v", ans)
		}
		info := s.info(t, "billing")
		if info.Config["secrets_count"] != float64(2) {
			t.Fatalf("after the rotation: %v", info.Config)
		}
		if _, body := s.call(t, apiOpToken, "GET", "/v1/subscriptions/billing", ""); strings.Contains(body, ans.Secret) {
			t.Fatal("GET shows the new secret")
		}
		rot := "/v1/subscriptions/billing/rotate-secret"
		s.refuses(t, []apiError{
			{name: "the file's", method: "POST", path: "/v1/subscriptions/filed/rotate-secret", body: `{"grace": "1h"}`, status: 409, want: []string{"filed", "config file"}},
			{name: "bad grace", method: "POST", path: rot, body: `{"grace": "soon"}`, status: 400, want: []string{"grace", "soon"}},
			{name: "negative grace", method: "POST", path: rot, body: `{"grace": "-1h"}`, status: 400, want: []string{"grace"}},
			{name: "grace too long", method: "POST", path: rot, body: `{"grace": "9999h"}`, status: 400, want: []string{"grace"}},
			{name: "unknown field", method: "POST", path: rot, body: `{"grace": "1h", "colour": "red"}`, status: 400, want: []string{"colour"}},
			{name: "unknown id", method: "POST", path: "/v1/subscriptions/nope/rotate-secret", body: `{}`, status: 404, want: []string{`"nope"`}},
		})
	})

	t.Run("recover", func(t *testing.T) {
		tb.SetMode("/dead", testbed.ModeFail)
		s.mustCall(t, "", "POST", "/v1/subscriptions", doc("dead", "types", []string{"dl.*"}, "retry", map[string]any{"max_attempts": 1}), 201, nil)
		start := time.Now()
		for _, id := range []string{"a0", "a1"} {
			s.publish(t, "dl.x", id)
		}
		mid := time.Now()
		for _, id := range []string{"b0", "b1", "b2"} {
			s.publish(t, "dl.x", id)
		}
		eventually(t, "five dead letters", func() bool { return s.laneOf(t, "dead").DeadLettered == 5 })
		tb.SetMode("/dead", testbed.ModeOK)
		recoverFrom := func(since time.Time) api.RecoverAnswer {
			var ans api.RecoverAnswer
			s.mustCall(t, "", "POST", "/v1/subscriptions/dead/recover", jsonOf(api.RecoverRequest{Since: since}), 200, &ans)
			return ans
		}
		if ans := recoverFrom(mid); ans.Matched != 3 || ans.Replayed != 3 || ans.Skipped != 0 {
			t.Fatalf("recover since the middle: %+v, want the three of b replayed", ans)
		}
		// At once again: each is replayed once, whether delivered yet or not.
		if ans := recoverFrom(mid); ans.Replayed != 0 {
			t.Fatalf("a second recover: %+v, want none replayed", ans)
		}
		waitFor(t, tb, "b's replays", func(m map[string]testbed.PathStats) bool { return m["/dead"].Unique == 3 })
		// The receiver answers before the ACK is recorded on the letters:
		// await the record, replaying nothing meanwhile.
		eventually(t, "b's replays recorded as delivered", func() bool {
			ans := recoverFrom(mid)
			if ans.Replayed != 0 {
				t.Fatalf("recover after the replays: %+v, want none replayed", ans)
			}
			return ans.Matched == 0
		})
		// Delivered letters are counted as such, so that a range of them
		// does not answer like an empty one.
		if ans := recoverFrom(mid); ans.Matched != 0 || ans.Delivered != 3 {
			t.Fatalf("recover after b's replays were delivered: %+v, want the three counted delivered", ans)
		}
		if ans := recoverFrom(start); ans.Matched != 2 || ans.Replayed != 2 {
			t.Fatalf("recover since the start: %+v, want a's two", ans)
		}
		waitFor(t, tb, "a's replays", func(m map[string]testbed.PathStats) bool { return m["/dead"].Unique == 5 })
		got := tb.IDs("/dead")
		slices.Sort(got)
		if st := tb.Stats()["/dead"]; !slices.Equal(got, []string{"a0", "a1", "b0", "b1", "b2"}) || st.Duplicates != 0 {
			t.Fatalf("delivered by the recoveries %v (%d duplicates), want each once", got, st.Duplicates)
		}
		r := "/v1/subscriptions/dead/recover"
		s.refuses(t, []apiError{
			{name: "no since", method: "POST", path: r, body: `{}`, status: 400, want: []string{"since"}},
			{name: "since after until", method: "POST", path: r, body: jsonOf(api.RecoverRequest{Since: mid, Until: start}), status: 400, want: []string{"since", "until"}},
			{name: "since not a time", method: "POST", path: r, body: `{"since": "yesterday"}`, status: 400, want: []string{"since", "yesterday"}},
			{name: "until not a time", method: "POST", path: r, body: `{"since": "2026-01-01T00:00:00Z", "until": "soon"}`, status: 400, want: []string{"until", "soon"}},
			{name: "since not a string", method: "POST", path: r, body: `{"since": 17}`, status: 400, want: []string{"since"}},
			{name: "unknown field", method: "POST", path: r, body: `{"since": "2026-01-01T00:00:00Z", "colour": 1}`, status: 400, want: []string{"colour"}},
			{name: "unknown id", method: "POST", path: "/v1/subscriptions/nope/recover", body: jsonOf(api.RecoverRequest{Since: start}), status: 404, want: []string{`"nope"`}},
			{name: "another tenant's", token: apiAcmeToken, method: "POST", path: r, body: jsonOf(api.RecoverRequest{Since: start}), status: 404, want: []string{`"dead"`}},
		})
	})

	t.Run("undelivered", func(t *testing.T) {
		// owed's endpoint dead-letters the events whose body says so (404)
		// and keeps the others retrying for an hour (500).
		log.setScript("/owed", func(body []byte) int {
			if strings.Contains(string(body), "dead") {
				return 404
			}
			return 500
		})
		s.mustCall(t, "", "POST", "/v1/subscriptions",
			doc("owed", "types", []string{"owed.*"}, "retry", map[string]any{"max_attempts": 10, "base": "1h", "cap": "1h"}), 201, nil)
		owe := func(ids ...string) {
			for _, id := range ids {
				fate := "retry"
				if id[0] == 'd' {
					fate = "dead"
				}
				s.post(t, "owed.x", id, fmt.Sprintf(`{"fate": %q}`, fate))
			}
		}
		owe("r1", "d1", "r2")
		mid := time.Now()
		owe("r3", "d2")
		eventually(t, "three retrying and two dead", func() bool {
			l := s.laneOf(t, "owed")
			return l.Scheduled == 3 && l.DeadLettered == 2
		})
		listed := func(query string, limit int) (events []string, pages int) {
			cursor := ""
			for {
				var page api.UndeliveredPage
				s.mustCall(t, "", "GET", fmt.Sprintf("/v1/undelivered?subscription=owed&limit=%d%s&cursor=%s", limit, query, url.QueryEscape(cursor)), "", 200, &page)
				pages++
				if len(page.Events) > limit {
					t.Fatalf("a page of %d with limit %d", len(page.Events), limit)
				}
				for _, e := range page.Events {
					want := "retrying"
					if e.EventID[0] == 'd' {
						want = "dead_lettered"
					}
					if e.State != want || e.Type != "owed.x" || e.Attempts < 1 {
						t.Errorf("undelivered %+v, want %s", e, want)
					}
					events = append(events, e.EventID)
				}
				if page.Next == "" {
					return events, pages
				}
				if pages > 10 {
					t.Fatal("the pages do not end")
				}
				cursor = page.Next
			}
		}
		if got, pages := listed("", 2); !slices.Equal(got, []string{"r1", "r2", "r3", "d1", "d2"}) || pages != 3 {
			t.Errorf("undelivered in pages of 2: %v in %d pages, want the retrying then the dead, in 3", got, pages)
		}
		if got, _ := listed("", 100); !slices.Equal(got, []string{"r1", "r2", "r3", "d1", "d2"}) {
			t.Errorf("undelivered in one page: %v", got)
		}
		if got, _ := listed("&since="+url.QueryEscape(mid.UTC().Format(time.RFC3339Nano)), 1); !slices.Equal(got, []string{"r3", "d2"}) {
			t.Errorf("undelivered since the middle: %v, want r3 and d2", got)
		}
		u := "/v1/undelivered?subscription=owed"
		s.refuses(t, []apiError{
			{name: "no subscription", method: "GET", path: "/v1/undelivered", status: 400, want: []string{"subscription"}},
			{name: "bad since", method: "GET", path: u + "&since=yesterday", status: 400, want: []string{"since", "yesterday"}},
			{name: "bad limit", method: "GET", path: u + "&limit=0", status: 400, want: []string{"limit"}},
			{name: "bad cursor", method: "GET", path: u + "&cursor=bogus", status: 400, want: []string{"cursor", "bogus"}},
			{name: "unknown parameter", method: "GET", path: u + "&colour=red", status: 400, want: []string{`"colour"`}},
			{name: "unknown id", method: "GET", path: "/v1/undelivered?subscription=nope", status: 404, want: []string{`"nope"`}},
			{name: "another tenant's", token: apiAcmeToken, method: "GET", path: u, status: 404, want: []string{`"owed"`}},
		})
	})

	t.Run("tenant tokens", func(t *testing.T) {
		var tok api.TokenAnswer
		s.mustCall(t, "", "POST", "/v1/tenants/acme/tokens", "", 201, &tok)
		if tok.Tenant != "acme" || !strings.HasPrefix(tok.Token, "sltk_") {
			t.Fatalf("token answer %+v", tok)
		}
		var who api.WhoAmI
		s.mustCall(t, tok.Token, "GET", "/v1/whoami", "", 200, &who)
		if who.Tenant != "acme" || who.Operator {
			t.Fatalf("whoami with the issued token: %+v", who)
		}
		if got := s.ids(t, tok.Token, ""); !slices.Equal(got, []string{"acme-own", "shipping"}) {
			t.Fatalf("the issued token lists %v", got)
		}
		s.refuses(t, []apiError{
			{name: "by a tenant's token", token: apiAcmeToken, method: "POST", path: "/v1/tenants/acme/tokens", status: 404, want: []string{"not found"}},
			{name: "by an issued token", token: tok.Token, method: "POST", path: "/v1/tenants/acme/tokens", status: 404, want: []string{"not found"}},
			{name: "bad tenant", method: "POST", path: "/v1/tenants/Not-A-Tenant/tokens", status: 400, want: []string{"tenant", "Not-A-Tenant"}},
		})
		// Without an operator token every request acts as the operator: a
		// tenant token would scope nothing.
		open := openAPISidecar(t, proxy.Options{})
		code, body := open.call(t, "", "POST", "/v1/tenants/acme/tokens", "")
		if code != 409 || !strings.Contains(body, "operator token") {
			t.Fatalf("a token without an operator token: %d %s, want 409 naming the operator token", code, body)
		}
	})
}
