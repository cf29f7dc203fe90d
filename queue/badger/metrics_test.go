package badger_test

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// value reads the one series of the family name: a histogram's sample
// count or a gauge's value.
func value(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		if h := m.GetHistogram(); h != nil {
			return float64(h.GetSampleCount())
		}
		if c := m.GetCounter(); c != nil {
			return c.GetValue()
		}
		return m.GetGauge().GetValue()
	}
	t.Fatalf("%s not registered", name)
	return 0
}

// TestMetrics: appends and syncs are timed, the disk gauges read the
// guard, a nil registerer registers nothing, and Close unregisters so the
// log reopens on the same registry.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	q := queuetest.MustOpen(t, dir, badger.Options{Sync: true, Registerer: reg, MaxDiskBytes: 1 << 30})
	for i := range 5 {
		queuetest.MustAppend(t, q, queuetest.Event(fmt.Sprint(i), "t", "x"))
	}
	if n := value(t, reg, "sluice_queue_append_duration_seconds"); n != 5 {
		t.Fatalf("append duration samples = %v after 5 appends, want 5", n)
	}
	// Each append was answered after its group's sync: at least one sync,
	// at most one per append.
	if n := value(t, reg, "sluice_queue_sync_duration_seconds"); n < 1 || n > 5 {
		t.Fatalf("sync duration samples = %v after 5 synced appends, want 1..5", n)
	}
	if used := value(t, reg, "sluice_log_disk_used_bytes"); used <= 0 {
		t.Fatalf("sluice_log_disk_used_bytes = %v, want the data dir's size", used)
	}
	if full := value(t, reg, "sluice_log_disk_full"); full != 0 {
		t.Fatalf("sluice_log_disk_full = %v under the quota", full)
	}
	if corrupt := value(t, reg, "sluice_queue_corrupt_events_total"); corrupt != 0 {
		t.Fatalf("sluice_queue_corrupt_events_total = %v with every event readable", corrupt)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 6 {
		t.Fatalf("%d series registered (%v), want 6", n, err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if n, _ := testutil.GatherAndCount(reg); n != 0 {
		t.Fatalf("%d series left registered after Close", n)
	}
	q = queuetest.MustOpen(t, dir, badger.Options{Registerer: reg, MinFreeBytes: -1})
	if free := value(t, reg, "sluice_log_disk_free_bytes"); free != -1 {
		t.Fatalf("sluice_log_disk_free_bytes = %v without a disk limit, want -1", free)
	}
	// A second log on one registry is refused, not a panic.
	if _, err := badger.Open(badger.Options{Dir: t.TempDir(), Registerer: reg}); err == nil {
		t.Fatal("a second log registered its metrics on the same registry")
	}
	queuetest.MustOpen(t, "", badger.Options{}) // nil registerer: nothing to register
}
