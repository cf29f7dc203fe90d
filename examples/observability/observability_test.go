// Package observability holds the Grafana dashboard and Prometheus alert
// rules of examples/observability; this test keeps them in step with the
// metrics sluice emits (proxy/delivery/metrics.go, proxy/ingest/metrics.go).
package observability

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// metricNames are the series proxy/delivery/metrics.go, proxy/ingest/metrics.go, queue/badger/metrics.go and
// queue/jetstream (own.go, append.go) define. Histograms are listed by their base name.
var metricNames = []string{
	"sluice_ingest_events_total",
	"sluice_ingest_duration_seconds",
	"sluice_ingest_batch_events",
	"sluice_delivery_attempts_total",
	"sluice_delivery_duration_seconds",
	"sluice_delivery_latency_seconds",
	"sluice_lane_in_flight",
	"sluice_lane_concurrency_limit",
	"sluice_lane_backlog_events",
	"sluice_lane_oldest_age_seconds",
	"sluice_lane_rejections_total",
	"sluice_lane_held_until_timestamp_seconds",
	"sluice_dead_letters_total",
	"sluice_dead_letters_trimmed_total",
	"sluice_breaker_state",
	"sluice_retry_budget_available_ratio",
	"sluice_log_disk_used_bytes",
	"sluice_log_disk_free_bytes",
	"sluice_log_disk_full",
	"sluice_queue_append_duration_seconds",
	"sluice_queue_sync_duration_seconds",
	"sluice_queue_corrupt_events_total",
	// Fleet mode (queue/jetstream).
	"sluice_lane_owned",
	"sluice_fleet_nodes_live",
	"sluice_fleet_leases_held",
	"sluice_fleet_heartbeat_age_seconds",
	"sluice_fleet_lease_renewals_total",
	"sluice_fleet_lease_takeovers_total",
	"sluice_jetstream_publish_errors_total",
	"sluice_jetstream_append_commit_wait_seconds",
}

// injectorMetricNames are the injector's (inject/webhook.go, inject/scan.go):
// its own process, so alerts may name them and the sidecars' dashboard
// does not show them.
var injectorMetricNames = []string{
	"sluice_injector_reviews_total",
	"sluice_injector_review_duration_seconds",
	"sluice_injector_reviews_in_flight",
	"sluice_injector_reviews_waiting",
	"sluice_injector_reviews_shed_total",
	"sluice_injector_pods_without_sidecar",
	"sluice_injector_scan_last_success_timestamp_seconds",
	"sluice_injector_scan_errors_total",
}

// TestInjectorMetricList: the list above is what the injector registers.
func TestInjectorMetricList(t *testing.T) {
	var defined []string
	for _, file := range []string{"../../inject/webhook.go", "../../inject/scan.go"} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?:Name: |NewDesc\()"(sluice_[a-z_]+)"`).FindAllStringSubmatch(string(src), -1) {
			defined = append(defined, m[1])
		}
	}
	if got, want := slices.Sorted(slices.Values(defined)), slices.Sorted(slices.Values(injectorMetricNames)); !slices.Equal(got, want) {
		t.Errorf("the injector defines\n  %v\nthis test lists\n  %v", got, want)
	}
}

var metricRE = regexp.MustCompile(`sluice_[a-z_]+`)

// baseName maps a series name to the metric it belongs to: a histogram's
// _bucket, _sum and _count series to the histogram.
func baseName(s string) string {
	if slices.Contains(metricNames, s) {
		return s
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(s, suffix); ok {
			return b
		}
	}
	return s
}

// The list above is the one proxy/delivery/metrics.go, proxy/ingest/metrics.go and queue/badger/metrics.go
// register: a metric renamed or added there fails here until the list
// (and the dashboard) follow.
func TestMetricListMatchesProxy(t *testing.T) {
	var defined []string
	for _, file := range []string{"../../proxy/delivery/metrics.go", "../../proxy/ingest/metrics.go", "../../queue/badger/metrics.go", "../../queue/metrics.go", "../../queue/jetstream/own.go", "../../queue/jetstream/append.go"} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`"(sluice_[a-z_]+)"`).FindAllStringSubmatch(string(src), -1) {
			defined = append(defined, m[1])
		}
	}
	sort.Strings(defined)
	defined = slices.Compact(defined)
	want := slices.Sorted(slices.Values(metricNames))
	if !slices.Equal(defined, want) {
		t.Errorf("the metrics files define\n  %v\nthis test lists\n  %v", defined, want)
	}
}

type panel struct {
	ID      int     `json:"id"`
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Repeat  string  `json:"repeat"`
	Panels  []panel `json:"panels"` // a collapsed row's panels
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

type dashboard struct {
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"` // a string, or an object with a query
			Multi      bool            `json:"multi"`
			IncludeAll bool            `json:"includeAll"`
		} `json:"list"`
	} `json:"templating"`
}

func TestGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d, want 36 or later", d.SchemaVersion)
	}
	if d.UID == "" {
		t.Error("dashboard has no uid")
	}

	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		switch v.Name {
		case "subscription":
			var q string
			if json.Unmarshal(v.Query, &q) != nil {
				var obj struct{ Query string }
				_ = json.Unmarshal(v.Query, &obj)
				q = obj.Query
			}
			if v.Type != "query" || !strings.Contains(q, "label_values(sluice_lane_in_flight, subscription)") || !v.Multi || !v.IncludeAll {
				t.Errorf("variable subscription: type %q, query %q, multi %v, includeAll %v; want a multi-value query over label_values(sluice_lane_in_flight, subscription) with All",
					v.Type, q, v.Multi, v.IncludeAll)
			}
		case "datasource":
			if v.Type != "datasource" {
				t.Errorf("variable datasource has type %q, want datasource", v.Type)
			}
		}
	}
	for _, name := range []string{"subscription", "datasource"} {
		if !vars[name] {
			t.Errorf("no template variable %q", name)
		}
	}

	known := map[string]bool{}
	for _, m := range metricNames {
		known[m] = false
	}
	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if other, dup := ids[p.ID]; dup {
				t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				names := metricRE.FindAllString(tg.Expr, -1)
				if len(names) == 0 {
					t.Errorf("panel %q: expression %q names no sluice metric", p.Title, tg.Expr)
				}
				for _, n := range names {
					b := baseName(n)
					if _, ok := known[b]; !ok {
						t.Errorf("panel %q: %s is not a metric sluice emits (proxy/delivery/metrics.go, proxy/ingest/metrics.go)", p.Title, n)
						continue
					}
					known[b] = true
				}
				if strings.Contains(tg.Expr, "subscription") && !strings.Contains(tg.Expr, `subscription=~"$subscription"`) {
					t.Errorf("panel %q: a per-subscription expression must filter on $subscription: %q", p.Title, tg.Expr)
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for m, used := range known {
		if !used {
			t.Errorf("no panel shows %s", m)
		}
	}
}

// The rules and their tests may only name metrics sluice emits: promtool
// accepts any name, and a typo in both would pass it.
func TestAlertMetricNames(t *testing.T) {
	for _, file := range []string{"alerts.yml", "alerts_test.yml"} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range metricRE.FindAllString(string(src), -1) {
			if !slices.Contains(metricNames, baseName(n)) && !slices.Contains(injectorMetricNames, baseName(n)) {
				t.Errorf("%s: %s is not a metric sluice emits (proxy/delivery/metrics.go, proxy/ingest/metrics.go)", file, n)
			}
		}
	}
}

// promtool comes with the Debian package prometheus. CI must have it (its
// absence fails there); on a workstation without it the checks are skipped.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found on PATH: .ci/run must install it (apt-get install prometheus) before go test")
		}
		t.Skip("promtool not on PATH; install the Debian package prometheus to check the alert rules")
	}
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
