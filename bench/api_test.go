package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestQuickRunAPI runs the api scenario with -quick: 1,000 creates, a
// restart, 5,000 seeded, a restart; every check row must pass and the
// figures must be there. It starts real sidecars, so -short skips it.
func TestQuickRunAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes; skipped with -short")
	}
	out := filepath.Join(t.TempDir(), "results.json")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-quick", "-scenarios", "api", "-json", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	rep := readReport(t, out)
	if len(rep.Failures) > 0 {
		t.Errorf("failures: %q", rep.Failures)
	}
	checks := 0
	for _, r := range rep.Rows {
		if r.Scenario != "api" {
			continue
		}
		if r.Pass != nil && !*r.Pass {
			t.Errorf("row %q failed: %s", r.Metric, r.Note)
		}
		if strings.Contains(r.Metric, "lists, of") || strings.Contains(r.Metric, "sample lanes") {
			checks++
		}
	}
	if checks != 4 {
		t.Errorf("%d check rows, want 4 (list and delivery after each restart)", checks)
	}
	for _, k := range []string{"creates_per_s", "fsyncs_per_s", "seed_creates_per_s", "ready_seconds", "ready_empty_seconds"} {
		if rep.Extra["api."+k] <= 0 {
			t.Errorf("extra api.%s = %v", k, rep.Extra["api."+k])
		}
	}
}
