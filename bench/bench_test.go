package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary stand in for the bench binary when the
// harness re-executes itself for its children (_noop, _appender).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "_") {
		os.Exit(childMain(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestQuickRun runs the harness end to end the way CI would smoke it, and
// checks the JSON holds non-zero results. It builds and starts real sidecar
// processes, so -short skips it.
func TestQuickRun(t *testing.T) {
	rep, stdout := runQuick(t, "starts real processes", "ingest-async,ingest-batch,fanout-1")
	if len(rep.Failures) > 0 {
		t.Errorf("failures: %q", rep.Failures)
	}
	if rep.Machine.CPUs == 0 || rep.Machine.GoVersion == "" {
		t.Errorf("machine not recorded: %+v", rep.Machine)
	}
	for _, name := range []string{baseNoopIngest, baseClientServer, naiveName(1)} {
		if b := rep.Baselines[name]; b == nil || b.PerSec <= 0 {
			t.Errorf("baseline %s: %+v", name, b)
		}
	}
	windows := map[string]*window{}
	for _, w := range rep.Windows {
		windows[w.Name] = w
	}
	if w := windows["ingest-async"]; w == nil || w.Load.PerSec <= 0 || w.CPUPerEventUs <= 0 || w.BytesPerEvent <= 0 {
		t.Errorf("ingest-async window: %+v", w)
	}
	// Batches are counted by their events, and the sidecar takes them
	// all: a refused batch would be the harness posting malformed ones.
	if w := windows["ingest-batch"]; w == nil || w.Load.PerSec <= 0 || w.Load.BadStatus > 0 || w.Load.WinOK%batchSize != 0 {
		t.Errorf("ingest-batch window: %+v", w)
	}
	if w := windows["fanout-1"]; w == nil || w.DeliveriesPerSec <= 0 || w.CPUPerDelivUs <= 0 || w.BytesPerDeliv <= 0 {
		t.Errorf("fanout-1 window: %+v", w)
	}
	rows := map[string]int{}
	for _, r := range rep.Rows {
		if r.Value > 0 {
			rows[r.Scenario]++
		}
	}
	for _, s := range []string{"ingest-async", "ingest-batch", "fanout-1"} {
		if rows[s] == 0 {
			t.Errorf("no non-zero rows for %s", s)
		}
	}
	if !strings.Contains(stdout, "deliveries/s vs client→server loop") {
		t.Errorf("table missing the fan-out row:\n%s", stdout)
	}
}

// TestQuickSidecar runs the sidecar scenario end to end and checks that it
// was measured and that the burst lost nothing. Its performance targets
// are results, not assertions: they must not gate CI. -short skips it.
func TestQuickSidecar(t *testing.T) {
	rep, stdout := runQuick(t, "starts real processes", "sidecar")
	for _, f := range rep.Failures {
		t.Errorf("failed: %s", f)
	}
	targets := 0
	for _, r := range rep.Rows {
		if r.Scenario != "sidecar" || r.TargetLimit == nil {
			continue
		}
		targets++
		// Idle CPU may be 0: no clock tick in the window.
		if r.Value <= 0 && !strings.HasPrefix(r.Metric, "idle CPU") {
			t.Errorf("row %q: %v %s", r.Metric, r.Value, r.Unit)
		}
	}
	// RSS and CPU at rest, CPU per event at both rates, peak RSS, 202 P50
	// and P99, publish→receipt.
	if targets < 8 {
		t.Errorf("%d sidecar rows with a target, want at least 8:\n%s", targets, stdout)
	}
	accepted, delivered := rep.Extra["sidecar.burst.accepted"], rep.Extra["sidecar.burst.delivered_unique"]
	if accepted <= 0 || delivered < accepted {
		t.Errorf("burst: %.0f events delivered (unique) of %.0f accepted", delivered, accepted)
	}
}

// TestAppendBatch: a batch the producers post is NDJSON the sidecar reads:
// one JSON object per line, each with the body and its own id.
func TestAppendBatch(t *testing.T) {
	body := newBody(512)
	b := appendBatch(nil, []byte("run-k-3-7"), body, 3)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3: %q", len(lines), b)
	}
	for i, l := range lines {
		var ev struct {
			Type, ID string
			Body     json.RawMessage
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if ev.Type != benchType || ev.ID != "run-k-3-7-"+string(rune('0'+i)) || !bytes.Equal(ev.Body, body) {
			t.Fatalf("line %d = %+v", i, ev)
		}
	}
}

func TestBody(t *testing.T) {
	for _, size := range []int{1, 512, 4096} {
		b := newBody(size)
		if size >= 64 && len(b) != size {
			t.Errorf("newBody(%d) has %d bytes", size, len(b))
		}
		if !json.Valid(b) {
			t.Errorf("newBody(%d) is not JSON: %.80s…", size, b)
		}
		want := time.Now().UnixNano()
		stampSent(b, want, want+1234)
		if got, ok := sentNs(b); !ok || got != want {
			t.Errorf("sentNs = %d, %v; want %d", got, ok, want)
		}
		if got, ok := atNs(b); !ok || got != want+1234 {
			t.Errorf("atNs = %d, %v; want %d", got, ok, want+1234)
		}
		if !json.Valid(b) {
			t.Errorf("stamped body is not JSON: %.80s…", b)
		}
	}
}

func TestPathIndex(t *testing.T) {
	for p, want := range map[string]int{"/s0": 0, "/s49999": 49999, "/s": -1, "/x1": -1, "/s1a": -1, "/v1/events/x": -1} {
		got, ok := pathIndex([]byte(p))
		if !ok {
			got = -1
		}
		if got != want {
			t.Errorf("pathIndex(%q) = %d, want %d", p, got, want)
		}
	}
}

func TestSummarize(t *testing.T) {
	ns := make([]int64, 1000)
	for i := range ns {
		ns[len(ns)-1-i] = int64(i+1) * 1e6 // 1..1000 ms, reversed
	}
	s := summarize(ns)
	if s.N != 1000 || s.P50 != 500 || s.P99 != 990 || s.Max != 1000 {
		t.Errorf("summarize: %+v", s)
	}
}

// TestQuickFleetIngest smokes one fleet scenario end to end: the NATS
// cluster child, a fleet node, the bare-publisher baseline and the ratio
// row. About 15 s; -short skips it.
func TestQuickFleetIngest(t *testing.T) {
	rep, stdout := runQuick(t, "starts a JetStream cluster and a sidecar", "fleet-ingest")
	if b := rep.Baselines[baseJSPublish]; b == nil || b.PerSec <= 0 || b.Extra["nats_cpu_us_per_publish"] <= 0 {
		t.Errorf("baseline %s: %+v", baseJSPublish, b)
	}
	var w *window
	for _, x := range rep.Windows {
		if x.Name == "fleet-ingest" {
			w = x
		}
	}
	if w == nil || w.Load.PerSec <= 0 || w.CPUPerEventUs <= 0 || w.NATSPerEventUs <= 0 || len(w.Errors) > 0 {
		t.Errorf("fleet-ingest window: %+v", w)
	}
	found := false
	for _, r := range rep.Rows {
		if r.Scenario == "fleet-ingest" && r.TargetLimit != nil && r.Ratio != nil && *r.Ratio > 0 {
			found = true
		}
	}
	if !found {
		t.Errorf("no fleet-ingest row with a ratio against its target:\n%s", stdout)
	}
}

// TestQuickSidecarFleet smokes sidecar-fleet end to end: the no-op floor,
// the cluster child, one fleet node and its two paced windows. It checks
// that every row was measured, not what they measured: the scenario has no
// targets. -short skips it.
func TestQuickSidecarFleet(t *testing.T) {
	const name = "sidecar-fleet"
	rep, _ := runQuick(t, "starts a JetStream cluster and a sidecar", name)
	for _, f := range rep.Failures {
		t.Errorf("failed: %s", f)
	}
	for _, wn := range []string{name, name + ".paced-200"} {
		var w *window
		for _, x := range rep.Windows {
			if x.Name == wn {
				w = x
			}
		}
		if w == nil || w.Nodes != 1 || w.Load.WinOK <= 0 || w.NATSPerEventUs <= 0 || w.Receipt == nil || w.Receipt.N == 0 || len(w.Errors) > 0 {
			t.Errorf("window %s: %+v", wn, w)
		}
	}
	rows := map[string]*row{}
	for _, r := range rep.Rows {
		if r.Scenario != name {
			continue
		}
		rows[r.Metric] = r
		if r.TargetLimit != nil || (r.Pass != nil && !*r.Pass) {
			t.Errorf("row %q: target %v, pass %v (%s)", r.Metric, r.TargetLimit, r.Pass, r.Note)
		}
	}
	for _, at := range []string{"1,000/s", "200/s"} {
		for _, m := range []string{
			"fleet node CPU per event, paced " + at,
			"  NATS cluster CPU per event, paced " + at,
			"202 latency P50, paced " + at,
			"202 latency P99, paced " + at,
			"publish→receipt P50, paced " + at,
			"publish→receipt P99, paced " + at,
		} {
			if r := rows[m]; r == nil || r.Value <= 0 {
				t.Errorf("row %q: %+v", m, r)
			}
		}
		// The floor may be 0 in a 1 s window (less than one clock tick):
		// the row must be there, and the node's row names it as baseline.
		if rows["  no-op server CPU per request, paced "+at+" (floor)"] == nil {
			t.Errorf("no floor row at %s", at)
		}
	}
	if r := rows["peak RSS (VmHWM), paced 1,000/s"]; r == nil || r.Value <= 0 {
		t.Errorf("peak RSS row: %+v", r)
	}
}

// readReport reads the -json report the harness wrote to path.
// runQuick runs the harness with -quick on scenarios, as CI smokes it, and
// returns the report and the printed table. It starts real processes, so
// -short skips it (why says what it starts); a non-zero exit fails the
// test.
func runQuick(t *testing.T, why, scenarios string) (report, string) {
	t.Helper()
	if testing.Short() {
		t.Skip(why + "; skipped with -short")
	}
	out := filepath.Join(t.TempDir(), "results.json")
	args := []string{"-quick", "-scenarios", scenarios, "-json", out}
	if raceEnabled {
		// The race detector slows the producers and the receiver several
		// times over; shorter windows keep each test well under a minute.
		args = append(args, "-duration", "500ms", "-warmup", "200ms")
	}
	var stdout, stderr bytes.Buffer
	start := time.Now()
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	t.Logf("harness took %s\n%s", time.Since(start).Round(time.Millisecond), stdout.String())
	return readReport(t, out), stdout.String()
}

func readReport(t *testing.T, path string) report {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}
