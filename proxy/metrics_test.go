package proxy_test

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/testbed"
)

func TestMetricsPerSubscription(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	tb.SetMode("/hole", testbed.ModeBlackhole)
	hole := sub("hole", tb.URL()+"/hole")
	hole.MaxConcurrency, hole.Timeout = 2, time.Minute
	hole.Backlog = delivery.BacklogQuota{MaxEvents: 3}
	reg := prometheus.NewRegistry()
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: t.TempDir(), Logger: quietLogger(),
		Registry: reg, Subscriptions: []*delivery.Subscription{sub("ok", tb.URL()+"/ok"), hole}})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, time.Second) })
	publish(t, s, "t", "e", 10)
	post(t, s, "t", "e-0", "{}") // a duplicate
	waitFor(t, tb, "ok delivered", uniqueAt("/ok", 10))
	eventually(t, "quota enforced", func() bool { return lane(s, "hole").QuotaDropped == 5 })

	want := map[string]float64{
		`sluice_ingest_events_total{result="accepted"}`:                            10,
		`sluice_ingest_events_total{result="duplicate"}`:                           1,
		`sluice_delivery_attempts_total{outcome="ack",subscription="ok"}`:          10,
		`sluice_lane_rejections_total{reason="backlog_quota",subscription="hole"}`: 5,
		`sluice_dead_letters_total{reason="backlog_quota",subscription="hole"}`:    5,
		`sluice_lane_in_flight{subscription="hole"}`:                               2,
		`sluice_lane_concurrency_limit{subscription="hole"}`:                       2,
		`sluice_breaker_state{subscription="ok"}`:                                  0,
		`sluice_retry_budget_available_ratio`:                                      1,
	}
	resp, err := http.Get(s.AdminURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(b)
	for series, v := range want {
		line := series + " " + strconv.FormatFloat(v, 'g', -1, 64)
		if !strings.Contains(text, line+"\n") {
			t.Errorf("scrape lacks %q", line)
		}
	}
	if strings.Contains(text, "http://") {
		t.Error("a metric carries a URL")
	}
	if n := testutil.CollectAndCount(reg, "sluice_delivery_latency_seconds"); n == 0 {
		t.Error("no delivery latency histogram")
	}
}

// TestMetricsPassPromtoolCheck: `promtool check metrics` finds nothing to
// complain about on a live scrape (names, units, help, types).
func TestMetricsPassPromtoolCheck(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found: .ci/run installs Debian's prometheus package")
		}
		t.Skip("promtool not installed")
	}
	tb := startTestbed(t, testbed.ModeOK)
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: t.TempDir(), Logger: quietLogger(),
		Subscriptions: []*delivery.Subscription{sub("ok", tb.URL()+"/ok")}})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, time.Second) })
	publish(t, s, "t", "e", 3)
	waitFor(t, tb, "delivered", uniqueAt("/ok", 3))
	resp, err := http.Get(s.AdminURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = resp.Body
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}
