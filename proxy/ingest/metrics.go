package ingest

import "github.com/prometheus/client_golang/prometheus"

// metrics are the ingest server's series.
type metrics struct {
	events                        *prometheus.CounterVec // result: accepted, duplicate, rejected
	duration                      prometheus.Histogram
	batchEvents                   prometheus.Histogram
	accepted, duplicate, rejected prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ingest_events_total", Help: "Events posted by producers, by result: accepted (202), duplicate (200), rejected (4xx/5xx). A batch counts each event by its own result; a batch refused whole counts once, rejected.",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sluice_ingest_duration_seconds", Help: "Time from receiving an event to answering it, including the durable append.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, 1},
		}),
	}
	// Batch sizes tell whether producers batch at all, and how well: a
	// batch of 1 costs more than a single post.
	m.batchEvents = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sluice_ingest_batch_events", Help: "Events per batch (POST /v1/events, NDJSON or a CloudEvents batch) handed to the log.",
		Buckets: []float64{1, 10, 50, 100, 250, 500, 1000, 2500, 10000},
	})
	m.accepted = m.events.WithLabelValues("accepted")
	m.duplicate = m.events.WithLabelValues("duplicate")
	m.rejected = m.events.WithLabelValues("rejected")
	if reg != nil {
		reg.MustRegister(m.events, m.duration, m.batchEvents)
	}
	return m
}
