package proxy_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/testbed"
)

// getAPI GETs path on the admin listener with token and decodes the
// answer into v when it is 200.
func getAPI(t *testing.T, s *proxy.Server, path, token string, v any) int {
	t.Helper()
	code, _, body := getPage(t, s, "GET", path, token)
	if code == http.StatusOK && v != nil {
		if err := json.Unmarshal([]byte(body), v); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, body)
		}
	}
	return code
}

// TestAttemptsAndSeriesOverHTTP: a real sidecar delivering to a testbed (a
// healthy path and a failing one) and to a closed port shows each
// subscription's last attempts, newest first, with what each endpoint
// answered, and its series; unknown ids answer 404, and the clock the
// series keeps time by is the injected one.
func TestAttemptsAndSeriesOverHTTP(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	tb.SetMode("/fail", testbed.ModeFail)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close() // connection refused from here on
	ok, fail, down := sub("ok", tb.URL()+"/ok"), sub("fail", tb.URL()+"/fail"), sub("down", closed.URL)
	fail.Retry, down.Retry = fastRetry(2), fastRetry(2)
	clk := newStepClock(0)
	const token = "s3cret"
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", AdminToken: token,
		DataDir: t.TempDir(), Logger: quietLogger(), CursorInterval: 10 * time.Millisecond, Now: clk.Now,
		Subscriptions: []*delivery.Subscription{ok, fail, down}})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })

	ids := publish(t, s, "t", "e", 5)
	eventually(t, "every event resolved", func() bool {
		return lane(s, "ok").Delivered == 5 && lane(s, "fail").DeadLettered == 5 && lane(s, "down").DeadLettered == 5
	})

	attempts := func(id string) (int, api.AttemptList) {
		t.Helper()
		var al api.AttemptList // fresh: Unmarshal into a used slice keeps fields an answer omits
		code := getAPI(t, s, "/v1/subscriptions/"+id+"/attempts", token, &al)
		return code, al
	}
	code, al := attempts("ok")
	if code != http.StatusOK || al.Subscription != "ok" || len(al.Attempts) != 5 {
		t.Fatalf("ok's attempts: %d %+v", code, al)
	}
	// Newest first is the order in which they ended (TestAttemptLogOrderAndBound):
	// with a cap of 16 that need not be the order of seq.
	seen := map[uint64]bool{}
	for _, a := range al.Attempts {
		if seen[a.Seq] {
			t.Errorf("seq %d listed twice", a.Seq)
		}
		seen[a.Seq] = true
		if a.EventID != ids[a.Seq-1] || a.Attempt != 1 || a.Status != 200 || a.Outcome != "ack" || a.Error != "" || a.Response != "" || a.DurationMS <= 0 || a.At.IsZero() {
			t.Errorf("ok's attempt %+v", a)
		}
	}

	if code, al = attempts("fail"); code != http.StatusOK || len(al.Attempts) != 10 {
		t.Fatalf("fail's attempts: %d %+v", code, al)
	}
	for _, a := range al.Attempts {
		want := map[int]string{1: "retry", 2: "dead_letter"}[a.Attempt]
		if a.Status != 500 || a.Outcome != want || a.Response != "fail\n" || a.Error != "" {
			t.Errorf("fail's attempt %+v; want 500, %s, the testbed's answer", a, want)
		}
	}
	if code, al = attempts("down"); code != http.StatusOK || len(al.Attempts) != 10 {
		t.Fatalf("down's attempts: %d %+v", code, al)
	}
	for _, a := range al.Attempts {
		if a.Status != 0 || a.Error != "connection_refused" || a.Response != "" {
			t.Errorf("down's attempt %+v; want no status and the error word", a)
		}
	}

	sum := func(xs []float64) (s float64) {
		for _, x := range xs {
			s += x
		}
		return s
	}
	series := func(id string) api.SeriesInfo {
		t.Helper()
		var si api.SeriesInfo
		if code := getAPI(t, s, "/v1/subscriptions/"+id+"/series", token, &si); code != http.StatusOK {
			t.Fatalf("%s's series: %d", id, code)
		}
		if si.Subscription != id || si.StepSeconds != 10 || len(si.Deliveries) != 90 || len(si.Failures) != 90 || len(si.P99MS) != 90 {
			t.Fatalf("%s's series: %+v", id, si)
		}
		if end := si.Start.Add(90 * 10 * time.Second); end.Before(clk.Now()) || end.Sub(clk.Now()) > 10*time.Second {
			t.Fatalf("%s's series from %v: the window must end with the bucket of now (%v)", id, si.Start, clk.Now())
		}
		return si
	}
	if si := series("ok"); sum(si.Deliveries) == 0 || sum(si.Failures) != 0 || sum(si.P99MS) == 0 {
		t.Errorf("ok's series: deliveries %v failures %v P99 %v", sum(si.Deliveries), sum(si.Failures), sum(si.P99MS))
	}
	if si := series("fail"); sum(si.Deliveries) != 0 || sum(si.Failures) == 0 {
		t.Errorf("fail's series: deliveries %v failures %v", sum(si.Deliveries), sum(si.Failures))
	}

	for _, p := range []string{"/v1/subscriptions/nope/attempts", "/v1/subscriptions/nope/series"} {
		if code := getAPI(t, s, p, token, nil); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, code)
		}
		if code := getAPI(t, s, p, "", nil); code != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d, want 401", p, code)
		}
	}

	// The series keeps time by the sidecar's clock: 15 minutes on, it is
	// empty; the attempt log is not bounded by time.
	clk.Step(15*time.Minute + 10*time.Second)
	if si := series("ok"); sum(si.Deliveries)+sum(si.Failures)+sum(si.P99MS) != 0 {
		t.Errorf("15 minutes later: %+v", si)
	}
	if _, al = attempts("ok"); len(al.Attempts) != 5 {
		t.Errorf("15 minutes later: %d attempts; want the 5 still", len(al.Attempts))
	}
}

// TestAttemptsScopedByTenantToken: with a tenant's token, its own
// subscription's attempts and series answer; another tenant's answer the
// same 404 as an id that does not exist.
func TestAttemptsScopedByTenantToken(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	mine, theirs := sub("mine", tb.URL()+"/mine"), sub("theirs", tb.URL()+"/theirs")
	mine.Tenant, theirs.Tenant = "acme", "other"
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: t.TempDir(),
		AdminToken: "op", TenantTokens: []admin.TenantToken{{Token: "acme-tok", Tenant: "acme"}},
		Logger: quietLogger(), CursorInterval: 10 * time.Millisecond, Subscriptions: []*delivery.Subscription{mine, theirs}})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })
	publishAs(t, s, "acme", "t", "acme", 2)
	publishAs(t, s, "other", "t", "other", 2)
	waitFor(t, tb, "both delivered", func(m map[string]testbed.PathStats) bool {
		return m["/mine"].Unique == 2 && m["/theirs"].Unique == 2
	})
	for _, route := range []string{"attempts", "series"} {
		if code, _, body := getPage(t, s, "GET", "/v1/subscriptions/mine/"+route, "acme-tok"); code != http.StatusOK {
			t.Errorf("acme's own %s: %d %s", route, code, body)
		}
		code, _, hidden := getPage(t, s, "GET", "/v1/subscriptions/theirs/"+route, "acme-tok")
		codeU, _, unknown := getPage(t, s, "GET", "/v1/subscriptions/nope/"+route, "acme-tok")
		if code != http.StatusNotFound || codeU != http.StatusNotFound ||
			strings.ReplaceAll(hidden, "theirs", "X") != strings.ReplaceAll(unknown, "nope", "X") {
			t.Errorf("other's %s with acme's token: %d %q; an unknown id: %d %q; want the same 404", route, code, hidden, codeU, unknown)
		}
		if code, _, _ := getPage(t, s, "GET", "/v1/subscriptions/theirs/"+route, "op"); code != http.StatusOK {
			t.Errorf("other's %s with the operator's token: %d", route, code)
		}
	}
}
