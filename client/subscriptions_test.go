package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/proxy/api"
)

// The subscription API's encoding and error mapping, against a scripted
// server over loopback: what each method sends (method, path, query,
// content type, body, token) and how it reads the answers. The server
// itself is tested in proxy and, end to end, by cmd/sluice.

// seen is one request as the scripted server read it.
type seen struct {
	Method, Path, Query, ContentType, Auth string
	Body                                   string
}

// scripted is a server that records every request and answers each with
// what answer returns (status and body).
type scripted struct {
	mu     sync.Mutex
	reqs   []seen
	answer func(n int, r *http.Request) (int, string)
	srv    *httptest.Server
}

func newScripted(t *testing.T) *scripted {
	s := &scripted{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.reqs = append(s.reqs, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), r.Header.Get("Authorization"), string(b)})
		n, answer := len(s.reqs), s.answer
		s.mu.Unlock()
		code, body := answer(n, r)
		if code < 0 { // the answer is lost: the connection closes with none
			hj, _ := w.(http.Hijacker)
			conn, _, err := hj.Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *scripted) script(answer func(n int, r *http.Request) (int, string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs, s.answer = nil, answer
}

func (s *scripted) requests() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.reqs...)
}

// always answers every request alike.
func always(code int, body string) func(int, *http.Request) (int, string) {
	return func(int, *http.Request) (int, string) { return code, body }
}

// sameJSON reports whether two JSON texts are equal as values.
func sameJSON(t *testing.T, a, b string) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal([]byte(a), &va); err != nil {
		t.Fatalf("%q: %v", a, err)
	}
	if err := json.Unmarshal([]byte(b), &vb); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

const infoJSON = `{"subscription":"billing","state":"active","cap":4,"tenant":"acme","managed_by":"api",
	"config":{"id":"billing","url":"https://billing.example.com/hooks","secrets_count":1},"secret":"whsec_new"}`

func TestSubscriptionCallsEncodeRequests(t *testing.T) {
	srv := newScripted(t)
	c := newClient(t, srv.srv.URL, client.Options{Token: "tok"})
	since := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	expires := time.Date(2026, 12, 30, 12, 0, 0, 0, time.UTC)
	until := since.Add(6 * time.Hour)
	info := func(v *api.SubscriptionInfo, err error) (any, error) { return v, err }
	wantInfo := &api.SubscriptionInfo{
		LaneStatus: api.LaneStatus{Subscription: "billing", State: "active", Cap: 4, Tenant: "acme", ManagedBy: api.ManagedByAPI},
		Config:     map[string]any{"id": "billing", "url": "https://billing.example.com/hooks", "secrets_count": float64(1)},
		Secret:     "whsec_new",
	}
	cases := []struct {
		name   string
		call   func(context.Context) (any, error)
		answer string
		status int
		want   seen // Auth is checked for every case
		result any
	}{
		{
			name: "create from a map",
			call: func(ctx context.Context) (any, error) {
				return info(c.CreateSubscription(ctx, map[string]any{"id": "billing", "url": "https://billing.example.com/hooks", "types": []string{"a", "b"}}))
			},
			status: 201, answer: infoJSON,
			want:   seen{Method: "POST", Path: "/v1/subscriptions", ContentType: "application/json", Body: `{"id":"billing","url":"https://billing.example.com/hooks","types":["a","b"]}`},
			result: wantInfo,
		},
		{
			name: "create from raw JSON",
			call: func(ctx context.Context) (any, error) {
				return info(c.CreateSubscription(ctx, json.RawMessage(`{"id": "billing", "retry": {"max_attempts": 3}}`)))
			},
			status: 201, answer: infoJSON,
			want:   seen{Method: "POST", Path: "/v1/subscriptions", ContentType: "application/json", Body: `{"id":"billing","retry":{"max_attempts":3}}`},
			result: wantInfo,
		},
		{
			name:   "get",
			call:   func(ctx context.Context) (any, error) { return info(c.Subscription(ctx, "billing")) },
			status: 200, answer: infoJSON,
			want:   seen{Method: "GET", Path: "/v1/subscriptions/billing"},
			result: wantInfo,
		},
		{
			name:   "list of a tenant",
			call:   func(ctx context.Context) (any, error) { return c.SubscriptionsOfTenant(ctx, "acme & co") },
			status: 200, answer: `{"subscriptions":[{"subscription":"billing","state":"active","tenant":"acme & co","managed_by":"api"}],"head":7}`,
			want: seen{Method: "GET", Path: "/v1/subscriptions", Query: "tenant=acme+%26+co"},
			result: &api.SubscriptionList{Head: 7, Subscriptions: []api.LaneStatus{
				{Subscription: "billing", State: "active", Tenant: "acme & co", ManagedBy: api.ManagedByAPI}}},
		},
		{
			name:   "list of every tenant",
			call:   func(ctx context.Context) (any, error) { return c.SubscriptionsOfTenant(ctx, "") },
			status: 200, answer: `{"subscriptions":[],"head":0}`,
			want:   seen{Method: "GET", Path: "/v1/subscriptions"},
			result: &api.SubscriptionList{Subscriptions: []api.LaneStatus{}},
		},
		{
			name: "update by merge patch",
			call: func(ctx context.Context) (any, error) {
				return info(c.UpdateSubscription(ctx, "billing", map[string]any{"rate": map[string]any{"per_second": 5}, "headers": nil}))
			},
			status: 200, answer: infoJSON,
			want:   seen{Method: "PATCH", Path: "/v1/subscriptions/billing", ContentType: "application/merge-patch+json", Body: `{"headers":null,"rate":{"per_second":5}}`},
			result: wantInfo,
		},
		{
			name:   "delete",
			call:   func(ctx context.Context) (any, error) { return info(c.DeleteSubscription(ctx, "a/b")) },
			status: 202, answer: `{"subscription":"a/b","state":"draining","managed_by":"api","config":{}}`,
			want:   seen{Method: "DELETE", Path: "/v1/subscriptions/a/b"},
			result: &api.SubscriptionInfo{LaneStatus: api.LaneStatus{Subscription: "a/b", State: "draining", ManagedBy: "api"}, Config: map[string]any{}},
		},
		{
			name:   "rotate with a grace",
			call:   func(ctx context.Context) (any, error) { return c.RotateSecret(ctx, "billing", 24*time.Hour) },
			status: 200, answer: `{"subscription":"billing","secret":"whsec_rot","old_secrets_until":"2026-12-01T12:00:00Z"}`,
			want:   seen{Method: "POST", Path: "/v1/subscriptions/billing/rotate-secret", ContentType: "application/json", Body: `{"grace":"24h0m0s"}`},
			result: &api.RotateAnswer{Subscription: "billing", Secret: "whsec_rot", OldUntil: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)},
		},
		{
			name:   "rotate with the default grace",
			call:   func(ctx context.Context) (any, error) { return c.RotateSecret(ctx, "billing", -1) },
			status: 200, answer: `{"subscription":"billing","secret":"whsec_rot"}`,
			want:   seen{Method: "POST", Path: "/v1/subscriptions/billing/rotate-secret", ContentType: "application/json", Body: `{}`},
			result: &api.RotateAnswer{Subscription: "billing", Secret: "whsec_rot"},
		},
		{
			name:   "rotate retiring the old secrets at once",
			call:   func(ctx context.Context) (any, error) { return c.RotateSecret(ctx, "billing", 0) },
			status: 200, answer: `{"subscription":"billing","secret":"whsec_rot"}`,
			want:   seen{Method: "POST", Path: "/v1/subscriptions/billing/rotate-secret", ContentType: "application/json", Body: `{"grace":"0s"}`},
			result: &api.RotateAnswer{Subscription: "billing", Secret: "whsec_rot"},
		},
		{
			name:   "recover a range",
			call:   func(ctx context.Context) (any, error) { return c.Recover(ctx, "billing", since, until) },
			status: 200, answer: `{"subscription":"billing","matched":3,"replayed":2,"skipped":1}`,
			want:   seen{Method: "POST", Path: "/v1/subscriptions/billing/recover", ContentType: "application/json", Body: `{"since":"2026-11-30T12:00:00Z","until":"2026-11-30T18:00:00Z"}`},
			result: &api.RecoverAnswer{Subscription: "billing", Matched: 3, Replayed: 2, Skipped: 1},
		},
		{
			name:   "recover until now",
			call:   func(ctx context.Context) (any, error) { return c.Recover(ctx, "billing", since, time.Time{}) },
			status: 200, answer: `{"subscription":"billing","matched":0,"replayed":0,"skipped":0}`,
			want:   seen{Method: "POST", Path: "/v1/subscriptions/billing/recover", ContentType: "application/json", Body: `{"since":"2026-11-30T12:00:00Z"}`},
			result: &api.RecoverAnswer{Subscription: "billing"},
		},
		{
			name: "undelivered page",
			call: func(ctx context.Context) (any, error) {
				return c.Undelivered(ctx, client.UndeliveredQuery{Subscription: "billing", Since: since, Limit: 50, Cursor: "r/9"})
			},
			status: 200, answer: `{"subscription":"billing","events":[{"seq":9,"event_id":"e9","type":"t","state":"retrying","attempts":2,"due":"2026-11-30T13:00:00Z"}],"next":"d/3"}`,
			want: seen{Method: "GET", Path: "/v1/undelivered", Query: "cursor=r%2F9&limit=50&since=2026-11-30T12%3A00%3A00Z&subscription=billing"},
			result: &api.UndeliveredPage{Subscription: "billing", Next: "d/3", Events: []api.UndeliveredEvent{
				{Seq: 9, EventID: "e9", Type: "t", State: "retrying", Attempts: 2, Due: time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC)}}},
		},
		{
			name: "undelivered, first page",
			call: func(ctx context.Context) (any, error) {
				return c.Undelivered(ctx, client.UndeliveredQuery{Subscription: "billing"})
			},
			status: 200, answer: `{"subscription":"billing","events":[],"next":""}`,
			want:   seen{Method: "GET", Path: "/v1/undelivered", Query: "subscription=billing"},
			result: &api.UndeliveredPage{Subscription: "billing", Events: []api.UndeliveredEvent{}},
		},
		{
			name:   "tenant token",
			call:   func(ctx context.Context) (any, error) { return c.IssueTenantToken(ctx, "acme") },
			status: 201, answer: `{"tenant":"acme","token":"sluice_t_abc"}`,
			want:   seen{Method: "POST", Path: "/v1/tenants/acme/tokens"},
			result: &api.TokenAnswer{Tenant: "acme", Token: "sluice_t_abc"},
		},
		{
			name:   "expiring tenant token",
			call:   func(ctx context.Context) (any, error) { return c.IssueTenantTokenExpiring(ctx, "acme", 720*time.Hour) },
			status: 201, answer: `{"tenant":"acme","token":"sltk_abc","id":"0123456789ab","expires_at":"2026-12-30T12:00:00Z"}`,
			want:   seen{Method: "POST", Path: "/v1/tenants/acme/tokens", ContentType: "application/json", Body: `{"expires_in":"720h0m0s"}`},
			result: &api.TokenAnswer{Tenant: "acme", Token: "sltk_abc", ID: "0123456789ab", ExpiresAt: &expires},
		},
		{
			name:   "tenant tokens of one tenant",
			call:   func(ctx context.Context) (any, error) { return c.TenantTokens(ctx, "acme") },
			status: 200, answer: `{"tokens":[{"id":"0123456789ab","tenant":"acme","source":"issued"}]}`,
			want:   seen{Method: "GET", Path: "/v1/tenants/acme/tokens"},
			result: &api.TokenList{Tokens: []api.TokenInfo{{ID: "0123456789ab", Tenant: "acme", Source: "issued"}}},
		},
		{
			name:   "every tenant token",
			call:   func(ctx context.Context) (any, error) { return c.TenantTokens(ctx, "") },
			status: 200, answer: `{"tokens":[]}`,
			want:   seen{Method: "GET", Path: "/v1/tokens"},
			result: &api.TokenList{Tokens: []api.TokenInfo{}},
		},
		{
			name:   "revoke a tenant token",
			call:   func(ctx context.Context) (any, error) { return c.RevokeTenantToken(ctx, "acme", "0123456789ab") },
			status: 200, answer: `{"id":"0123456789ab","tenant":"acme","source":"issued","revoked":true}`,
			want:   seen{Method: "DELETE", Path: "/v1/tenants/acme/tokens/0123456789ab"},
			result: &api.TokenInfo{ID: "0123456789ab", Tenant: "acme", Source: "issued", Revoked: true},
		},
		{
			name:   "whoami",
			call:   func(ctx context.Context) (any, error) { return c.WhoAmI(ctx) },
			status: 200, answer: `{"operator":false,"tenant":"acme"}`,
			want:   seen{Method: "GET", Path: "/v1/whoami"},
			result: &api.WhoAmI{Tenant: "acme"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv.script(always(tc.status, tc.answer))
			got, err := tc.call(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.result) {
				t.Errorf("answer = %+v\nwant     %+v", got, tc.result)
			}
			reqs := srv.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests, want 1", len(reqs))
			}
			r, w := reqs[0], tc.want
			w.Auth = "Bearer tok"
			body, wantBody := r.Body, w.Body
			r.Body, w.Body = "", ""
			if r != w {
				t.Errorf("request = %+v\nwant      %+v", r, w)
			}
			if (wantBody == "") != (body == "") || wantBody != "" && !sameJSON(t, body, wantBody) {
				t.Errorf("body = %s, want %s", body, wantBody)
			}
		})
	}
}

func TestSubscriptionErrorsAreTheServersMessage(t *testing.T) {
	srv := newScripted(t)
	c := newClient(t, srv.srv.URL, client.Options{})
	ctx := ctxT(t)
	for _, tc := range []struct {
		status int
		msg    string
		call   func() error
	}{
		{400, `url: "ftp://x": want an http or https URL`, func() error {
			_, err := c.CreateSubscription(ctx, map[string]string{"id": "x", "url": "ftp://x"})
			return err
		}},
		{409, `subscription "x" exists`, func() error { _, err := c.CreateSubscription(ctx, map[string]string{"id": "x"}); return err }},
		{409, `subscription "f" is managed by the config file`, func() error {
			_, err := c.UpdateSubscription(ctx, "f", map[string]int{"timeout": 1})
			return err
		}},
		{404, `subscription "nope": not found`, func() error { _, err := c.Subscription(ctx, "nope"); return err }},
		{403, "a tenant token may not issue tokens", func() error { _, err := c.IssueTenantToken(ctx, "acme"); return err }},
	} {
		body, _ := json.Marshal(api.ErrorAnswer{Error: tc.msg})
		srv.script(always(tc.status, string(body)))
		err := tc.call()
		ae := apiError(t, err, tc.status)
		if ae.Message != tc.msg {
			t.Errorf("%d: message %q, want %q", tc.status, ae.Message, tc.msg)
		}
		if client.IsMaybeDone(err) {
			t.Errorf("%d: IsMaybeDone, but the server refused", tc.status)
		}
		if n := len(srv.requests()); n != 1 {
			t.Errorf("%d: %d requests, want 1 (4xx is never retried)", tc.status, n)
		}
	}
}

// TestSubscriptionCallsResendOnlyWhatIsSafe: a call that makes something
// new (a subscription, a secret, a token) is not sent again once the
// sidecar may have seen it; the idempotent ones are.
func TestSubscriptionCallsResendOnlyWhatIsSafe(t *testing.T) {
	api := newScripted(t)
	c := newClient(t, api.srv.URL, client.Options{RetryWaitMin: time.Millisecond, RetryWaitMax: 2 * time.Millisecond})
	ok := map[string]string{
		"POST /v1/subscriptions":                       infoJSON,
		"GET /v1/subscriptions/billing":                infoJSON,
		"PATCH /v1/subscriptions/billing":              infoJSON,
		"DELETE /v1/subscriptions/billing":             infoJSON,
		"POST /v1/subscriptions/billing/recover":       `{"subscription":"billing","matched":1,"replayed":1}`,
		"POST /v1/subscriptions/billing/rotate-secret": `{"subscription":"billing","secret":"whsec_x"}`,
		"POST /v1/tenants/acme/tokens":                 `{"tenant":"acme","token":"t"}`,
	}
	type call struct {
		name   string
		fn     func(context.Context) error
		resend bool
	}
	calls := []call{
		{"create", func(ctx context.Context) error {
			_, err := c.CreateSubscription(ctx, map[string]string{"id": "billing"})
			return err
		}, false},
		{"rotate", func(ctx context.Context) error { _, err := c.RotateSecret(ctx, "billing", time.Hour); return err }, false},
		{"token", func(ctx context.Context) error { _, err := c.IssueTenantToken(ctx, "acme"); return err }, false},
		{"get", func(ctx context.Context) error { _, err := c.Subscription(ctx, "billing"); return err }, true},
		{"update", func(ctx context.Context) error {
			_, err := c.UpdateSubscription(ctx, "billing", map[string]int{"timeout": 1})
			return err
		}, true},
		{"delete", func(ctx context.Context) error { _, err := c.DeleteSubscription(ctx, "billing"); return err }, true},
		{"recover", func(ctx context.Context) error {
			_, err := c.Recover(ctx, "billing", time.Now().Add(-time.Hour), time.Time{})
			return err
		}, true},
	}
	for _, failure := range []struct {
		name string
		code int // -1: the connection closes without an answer
	}{{"answer lost", -1}, {"503", 503}, {"500", 500}} {
		for _, cl := range calls {
			t.Run(failure.name+"/"+cl.name, func(t *testing.T) {
				api.script(func(n int, r *http.Request) (int, string) {
					if n == 1 {
						return failure.code, `{"error":"scripted"}`
					}
					return 200, ok[r.Method+" "+r.URL.Path]
				})
				err := cl.fn(ctxT(t))
				n := len(api.requests())
				if cl.resend {
					if err != nil || n != 2 {
						t.Fatalf("%d requests, error %v; want it sent again and answered", n, err)
					}
					return
				}
				if err == nil || n != 1 {
					t.Fatalf("%d requests, error %v; want one request and its error", n, err)
				}
				if !client.IsMaybeDone(err) {
					t.Fatalf("IsMaybeDone(%v) = false: the sidecar may have acted", err)
				}
			})
		}
	}
}

// TestCreateRidesOutARefusedConnection: a create the sidecar cannot have
// seen (connection refused while it restarts) is sent again, and
// succeeds once the sidecar listens.
func TestCreateRidesOutARefusedConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var created atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		created.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, infoJSON)
	})}
	late := time.AfterFunc(200*time.Millisecond, func() {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
			return
		}
		go srv.Serve(ln)
	})
	t.Cleanup(func() {
		late.Stop()
		srv.Close()
	})
	var retries atomic.Int64
	c := newClient(t, addr, client.Options{OnRetry: func(int, string) { retries.Add(1) }})
	info, err := c.CreateSubscription(ctxT(t), map[string]string{"id": "billing"})
	if err != nil || info.Secret != "whsec_new" {
		t.Fatalf("create across a late start: %+v, %v", info, err)
	}
	if created.Load() != 1 || retries.Load() == 0 {
		t.Fatalf("%d creates after %d retries, want 1 after some", created.Load(), retries.Load())
	}

	// A sidecar that stays away: the error is not "maybe done".
	_, err = newClient(t, "127.0.0.1:1", client.Options{RetryMax: -1}).CreateSubscription(ctxT(t), map[string]string{"id": "x"})
	if err == nil || client.IsMaybeDone(err) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("create to a closed port: %v (IsMaybeDone %v)", err, client.IsMaybeDone(err))
	}
}
