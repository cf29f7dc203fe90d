package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/testbed"
)

func adminCall(t *testing.T, s *proxy.Server, method, path, body, token string) (int, map[string]any) {
	t.Helper()
	code, b, _ := adminRequest(t, s, method, path, body, token)
	var m map[string]any
	if len(b) > 0 && b[0] == '{' {
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return code, m
}

// apiClient is the typed admin client of s; it does not retry, so a test
// sees every answer.
func apiClient(t *testing.T, s *proxy.Server) *client.Client {
	t.Helper()
	c, err := client.New(s.AdminURL(), client.Options{RetryMax: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func startAdminServer(t *testing.T, dir, token string, subs ...*delivery.Subscription) *proxy.Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", AdminToken: token, DataDir: dir,
		Logger: quietLogger(), CursorInterval: 10 * time.Millisecond, Subscriptions: subs})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, time.Second) })
	return s
}

func TestAdminTokenOnEveryPathButHealthz(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	s := startAdminServer(t, "", "s3cret", sub("a", tb.URL()))
	paths := []struct{ method, path string }{
		{"GET", "/readyz"}, {"GET", "/metrics"}, {"GET", "/v1/subscriptions"}, {"GET", "/v1/retry-budget"},
		{"POST", "/v1/subscriptions/a/pause"}, {"POST", "/v1/subscriptions/a/resume"}, {"GET", "/v1/events/x"},
		{"GET", "/v1/dead-letters"}, {"GET", "/v1/dead-letters/a/1"}, {"POST", "/v1/dead-letters/replay"},
		{"GET", "/debug/vars"}, {"GET", "/nope"},
	}
	for _, p := range paths {
		if code, _ := adminCall(t, s, p.method, p.path, "", ""); code != http.StatusUnauthorized {
			t.Errorf("%s %s without the token: %d, want 401", p.method, p.path, code)
		}
		if code, _ := adminCall(t, s, p.method, p.path, "", "wrong"); code != http.StatusUnauthorized {
			t.Errorf("%s %s with a wrong token: %d, want 401", p.method, p.path, code)
		}
		if code, _ := adminCall(t, s, p.method, p.path, "", "s3cret"); code == http.StatusUnauthorized {
			t.Errorf("%s %s with the token: 401", p.method, p.path)
		}
	}
	if code, _ := adminCall(t, s, "GET", "/healthz", "", ""); code != 200 {
		t.Errorf("/healthz without the token: %d", code)
	}
}

// TestAdminBearerSchemeIsCaseInsensitive: RFC 9110 §11.1 makes auth
// schemes case-insensitive, so "bearer" and "BEARER" carry the token as
// "Bearer" does; the token itself stays case-sensitive.
func TestAdminBearerSchemeIsCaseInsensitive(t *testing.T) {
	const token = "operator-token-3f9c1e"
	s := startAdminServer(t, "", token)
	for _, c := range []struct {
		header string
		want   int
	}{
		{"Bearer " + token, 200},
		{"bearer " + token, 200},
		{"BEARER " + token, 200},
		{"bEaReR  " + token, 200},
		{"Bearer " + strings.ToUpper(token), 401},
		{"Basic " + token, 401},
		{"Bearer" + token, 401},
		{token, 401},
	} {
		req, _ := http.NewRequest("GET", s.AdminURL()+"/v1/subscriptions", nil)
		req.Header.Set("Authorization", c.header)
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("Authorization: %q: %d, want %d", c.header, resp.StatusCode, c.want)
		}
	}
}

// TestAdminRefusesCrossSiteRequests: what a page of another site can make
// a browser send is refused before it acts: a foreign Origin (403), a
// write whose body is not JSON (415, naming Content-Type), and, with no
// token configured, a Host that is not the listener's (403: DNS
// rebinding). The same requests from the sidecar's own origin are served.
func TestAdminRefusesCrossSiteRequests(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	call := func(s *proxy.Server, method, path, host, origin, ctype, body, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, s.AdminURL()+path, strings.NewReader(body))
		if host != "" {
			req.Host = host
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	t.Run("no token", func(t *testing.T) {
		s := startAdminServer(t, "", "", sub("a", tb.URL()))
		own := strings.TrimPrefix(s.AdminURL(), "http://")
		_, port, _ := net.SplitHostPort(own)
		const pause, reason = "/v1/subscriptions/a/pause", `{"reason":"csrf"}`
		for _, c := range []struct {
			name, method, path, host, origin, ctype, body string
			want                                          int
			names                                         string
		}{
			{"the attack: foreign origin and host, text/plain", "POST", pause, "evil.example", "http://evil.example", "text/plain", reason, 403, "Host"},
			{"foreign origin", "POST", pause, "", "http://evil.example", "application/json", reason, 403, "Origin"},
			{"null origin", "POST", pause, "", "null", "application/json", reason, 403, "Origin"},
			{"rebinding host", "POST", pause, "evil.example:" + port, "", "application/json", reason, 403, "Host"},
			{"rebinding host, same origin", "POST", pause, "evil.example:" + port, "http://evil.example:" + port, "application/json", reason, 403, "Host"},
			{"rebinding host reads", "GET", "/v1/subscriptions", "evil.example:" + port, "", "", "", 403, "Host"},
			{"rebinding host, dashboard", "GET", "/", "evil.example:" + port, "", "", "", 403, "Host"},
			{"text/plain body", "POST", pause, "", "", "text/plain", reason, 415, "Content-Type"},
			{"form body", "POST", pause, "", "", "application/x-www-form-urlencoded", "reason=csrf", 415, "Content-Type"},
			{"no Content-Type", "POST", pause, "", "", "", reason, 415, "Content-Type"},
		} {
			code, body := call(s, c.method, c.path, c.host, c.origin, c.ctype, c.body, "")
			if code != c.want || !strings.Contains(body, c.names) {
				t.Errorf("%s: %d %s, want %d naming %s", c.name, code, body, c.want, c.names)
			}
		}
		if l := lane(s, "a"); l.State != "active" {
			t.Fatalf("a cross-site request changed the lane: %+v", l)
		}
		for _, c := range []struct{ name, method, path, host, origin, ctype, body string }{
			{"same origin", "POST", pause, "", "http://" + own, "application/json; charset=utf-8", reason},
			{"localhost", "GET", "/v1/subscriptions", "localhost:" + port, "http://localhost:" + port, "", ""},
			{"no body, no type", "POST", "/v1/subscriptions/a/resume", "", "", "", ""},
			{"dashboard", "GET", "/", "", "", "", ""},
		} {
			if code, body := call(s, c.method, c.path, c.host, c.origin, c.ctype, c.body, ""); code != 200 {
				t.Errorf("%s: %d %s, want 200", c.name, code, body)
			}
		}
	})

	t.Run("with a token", func(t *testing.T) {
		const token = "operator-token-5b7e21"
		s := startAdminServer(t, "", token, sub("a", tb.URL()))
		// A token is what a rebinding page cannot have: any Host is served.
		if code, body := call(s, "GET", "/v1/subscriptions", "sluice.internal.example", "", "", "", token); code != 200 {
			t.Errorf("named host with the token: %d %s", code, body)
		}
		if code, body := call(s, "POST", "/v1/subscriptions/a/pause", "", "http://evil.example", "application/json", `{}`, token); code != 403 {
			t.Errorf("foreign origin with the token: %d %s, want 403", code, body)
		}
		if code, body := call(s, "POST", "/v1/subscriptions/a/pause", "", "", "text/plain", `{}`, token); code != 415 {
			t.Errorf("text/plain with the token: %d %s, want 415", code, body)
		}
	})
}

func TestAdminBadParametersAreNamed(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	s := startAdminServer(t, "", "", sub("a", tb.URL()))
	cases := []struct{ method, path, body, want string }{
		{"GET", "/v1/dead-letters?limit=0", "", "limit"},
		{"GET", "/v1/dead-letters?limit=x", "", "limit"},
		{"GET", "/v1/dead-letters?cursor=nope", "", "cursor"},
		{"GET", "/v1/dead-letters?colour=red", "", "colour"},
		{"GET", "/v1/dead-letters/a/notanumber", "", "seq"},
		{"POST", "/v1/dead-letters/replay", "{", "body"},
		{"POST", "/v1/dead-letters/replay", `{"subscription":"a"}`, "seq"},
		{"POST", "/v1/dead-letters/replay", `{"colour":1}`, "colour"},
		{"POST", "/v1/dead-letters/replay", `{}`, "nothing to replay"},
	}
	for _, c := range cases {
		code, m := adminCall(t, s, c.method, c.path, c.body, "")
		if code != 400 || !strings.Contains(m["error"].(string), c.want) {
			t.Errorf("%s %s %s: %d %v, want 400 naming %q", c.method, c.path, c.body, code, m, c.want)
		}
	}
	for _, p := range []string{"/v1/events/unknown", "/v1/dead-letters/a/7"} {
		if code, _ := adminCall(t, s, "GET", p, "", ""); code != 404 {
			t.Errorf("GET %s: %d, want 404", p, code)
		}
	}
	if code, _ := adminCall(t, s, "POST", "/v1/subscriptions/nope/pause", "", ""); code != 404 {
		t.Errorf("pause of an unknown subscription: %d, want 404", code)
	}
}

func TestPauseAndResume(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	dir := t.TempDir()
	s := startAdminServer(t, dir, "", sub("a", tb.URL()+"/a"))
	if code, _ := adminCall(t, s, "POST", "/v1/subscriptions/a/pause", `{"reason":"maintenance"}`, ""); code != 200 {
		t.Fatalf("pause: %d", code)
	}
	publish(t, s, "t", "e", 5)
	if l := lane(s, "a"); l.State != "paused" || l.PausedBy != "maintenance" || l.Backlog != 5 {
		t.Fatalf("paused lane %+v", l)
	}
	closeServer(t, s, time.Second)
	s = startAdminServer(t, dir, "", sub("a", tb.URL()+"/a"))
	if l := lane(s, "a"); l.State != "paused" {
		t.Fatalf("pause lost across restart: %+v", l)
	}
	if st := tb.Stats()["/a"]; st.Requests != 0 {
		t.Fatalf("a paused subscription was delivered to: %+v", st)
	}
	if code, _ := adminCall(t, s, "POST", "/v1/subscriptions/a/resume", "", ""); code != 200 {
		t.Fatalf("resume: %d", code)
	}
	waitFor(t, tb, "delivered after resume", uniqueAt("/a", 5))
}

// TestLedgerAnswersEachState: pending (paused), in flight (black hole),
// retry scheduled, delivered and dead-lettered, also after a restart.
func TestLedgerAnswersEachState(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	tb.SetMode("/hole", testbed.ModeBlackhole)
	tb.SetMode("/fail", testbed.ModeFail)
	rejecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(422) }))
	t.Cleanup(rejecting.Close)
	hole := sub("hole", tb.URL()+"/hole")
	hole.Timeout = time.Minute
	failing := sub("fail", tb.URL()+"/fail")
	failing.Retry = fastRetry(10)
	failing.Retry.Backoff.Base, failing.Retry.Backoff.Cap = time.Hour, time.Hour
	dir := t.TempDir()
	subs := func() []*delivery.Subscription {
		h, f := *hole, *failing
		return []*delivery.Subscription{sub("ok", tb.URL()+"/ok"), &h, &f, sub("dead", rejecting.URL), sub("paused", tb.URL()+"/p")}
	}
	s := startAdminServer(t, dir, "", subs()...)
	if code, _ := adminCall(t, s, "POST", "/v1/subscriptions/paused/pause", "", ""); code != 200 {
		t.Fatal("pause")
	}
	publish(t, s, "t", "ev", 1)
	want := map[string]string{"ok": "delivered", "hole": "in_flight", "fail": "retry_scheduled", "dead": "dead_lettered", "paused": "pending"}
	check := func(s *proxy.Server, want map[string]string) bool {
		st, err := s.Event("ev-0")
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, d := range st.Deliveries {
			got[d.Subscription] = d.State
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	}
	eventually(t, "every state", func() bool { return check(s, want) })
	if ev, err := apiClient(t, s).Event(context.Background(), "ev-0"); err != nil || len(ev.Deliveries) != 5 {
		t.Fatalf("GET /v1/events: %+v %v", ev, err)
	}
	closeServer(t, s, 50*time.Millisecond)
	s = startAdminServer(t, dir, "", subs()...)
	// After a restart the black-holed delivery is in flight again; the rest is as it was.
	eventually(t, "every state after restart", func() bool { return check(s, want) })
}

// TestReplayDeliversOnceUnlessForced, and the replay is recorded on the
// dead letter and survives a restart.
func TestReplayDeliversOnceUnlessForced(t *testing.T) {
	var accept atomic.Bool
	var delivered atomic.Int64
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !accept.Load() {
			w.WriteHeader(404)
			return
		}
		delivered.Add(1)
	}))
	t.Cleanup(rcv.Close)
	dir := t.TempDir()
	s := startAdminServer(t, dir, "", sub("a", rcv.URL))
	publish(t, s, "t", "e", 3)
	eventually(t, "dead letters", func() bool { return lane(s, "a").DeadLettered == 3 })
	ctx := context.Background()
	page, err := apiClient(t, s).DeadLetters(ctx, client.DeadLetterQuery{Subscription: "a", Reason: "rejected", Limit: 2})
	if err != nil || len(page.DeadLetters) != 2 || page.Next == "" {
		t.Fatalf("list page 1: %+v %v", page, err)
	}
	page2, err := apiClient(t, s).DeadLetters(ctx, client.DeadLetterQuery{Subscription: "a", Cursor: page.Next})
	if err != nil || len(page2.DeadLetters) != 1 {
		t.Fatalf("list page 2: %+v %v", page2, err)
	}
	seq := page.DeadLetters[0].Seq

	// Restart between the dead-lettering and the replay: nothing is lost.
	closeServer(t, s, time.Second)
	s = startAdminServer(t, dir, "", sub("a", rcv.URL))
	accept.Store(true)
	c := apiClient(t, s)
	one := api.ReplayRequest{Subscription: "a", Seq: seq}
	if r, err := c.Replay(ctx, one); err != nil || r.Replayed != 1 {
		t.Fatalf("replay: %+v %v", r, err)
	}
	eventually(t, "replayed delivery", func() bool { return delivered.Load() == 1 })
	if r, err := c.Replay(ctx, one); err != nil || r.Replayed != 0 || !strings.Contains(r.Results[0].Skipped, "already replayed") {
		t.Fatalf("second replay without force: %+v %v", r, err)
	}
	// The receiver counts before its answer reaches sluice, so the ACK of the
	// replay is recorded a moment after delivered moves: await it.
	var d *api.DeadLetterInfo
	eventually(t, "replay ACK recorded", func() bool {
		d, err = c.DeadLetter(ctx, "a", seq)
		return err == nil && !d.DeliveredAt.IsZero()
	})
	if d.Replays != 1 || d.Body == nil || *d.Body != `{"n":0}` {
		t.Fatalf("dead letter after replay: %+v", d)
	}
	// Everything matching a filter, forced: the other two and the first again.
	if r, err := c.Replay(ctx, api.ReplayRequest{Filter: &api.ReplayFilter{Subscription: "a", Reason: "rejected"}, Force: true}); err != nil || r.Replayed != 3 {
		t.Fatalf("replay by filter: %+v %v", r, err)
	}
	eventually(t, "all replayed", func() bool { return delivered.Load() == 4 })
	eventually(t, "ledger shows the replay delivered", func() bool {
		st, err := s.Event("e-0")
		return err == nil && st.Deliveries[0].State == "delivered"
	})
}
