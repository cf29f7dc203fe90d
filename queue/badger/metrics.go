package badger

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/queue"
)

// metrics are the log's Prometheus series: one set per Log, registered
// with Options.Registerer (none when it is nil) and unregistered by Close,
// so a log reopened on the same registry registers again.
type metrics struct {
	reg        prometheus.Registerer
	append     prometheus.Histogram
	sync       prometheus.Histogram
	corrupt    prometheus.Counter
	collectors []prometheus.Collector
}

// durationBuckets span a batch that shares a sync with others (tens of
// microseconds) to a disk that stalls (a second).
var durationBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}

func newMetrics(reg prometheus.Registerer, l *Log) *metrics {
	m := &metrics{
		reg: reg,
		append: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_queue_append_duration_seconds",
			Help:    "Duration of one Append: waiting for the group committer, the write and, with durability fsync, the sync it shares.",
			Buckets: durationBuckets,
		}),
		sync: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_queue_sync_duration_seconds",
			Help:    "Duration of one fsync of the log (a group of appends, or cursors and memberships).",
			Buckets: durationBuckets,
		}),
		corrupt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_queue_corrupt_events_total",
			Help: "Events found unreadable in the log (a damaged value), counted once each since start; each is dead-lettered with reason corrupt.",
		}),
	}
	// The disk gauges keep the names and help they had in the proxy,
	// which dashboards and alerts rely on.
	m.collectors = append([]prometheus.Collector{m.append, m.sync, m.corrupt}, queue.DiskGauges(l.DiskUsage,
		"Bytes allocated by the data dir (the log), measured every 250 ms.",
		"Bytes free on the data dir's file system; -1 if unknown.",
		"1 while ingest answers 507: the log is over max_disk_bytes or its file system below min_free_disk_bytes.")...)
	return m
}

// register registers every series, or none.
func (m *metrics) register() error { return queue.RegisterAll(m.reg, m.collectors) }

func (m *metrics) unregister() { queue.UnregisterAll(m.reg, m.collectors) }

// sync fsyncs the log and times it.
func (l *Log) sync() error {
	start := time.Now()
	err := l.db.Sync()
	l.m.sync.Observe(time.Since(start).Seconds())
	return err
}
