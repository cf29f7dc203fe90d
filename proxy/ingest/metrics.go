package ingest

import "github.com/prometheus/client_golang/prometheus"

// metrics are the ingest server's series.
type metrics struct {
	events                        *prometheus.CounterVec // result: accepted, duplicate, rejected
	duration                      prometheus.Histogram
	accepted, duplicate, rejected prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ingest_events_total", Help: "Events posted by producers, by result: accepted (202), duplicate (200), rejected (4xx/5xx).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sluice_ingest_duration_seconds", Help: "Time from receiving an event to answering it, including the durable append.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, 1},
		}),
	}
	m.accepted = m.events.WithLabelValues("accepted")
	m.duplicate = m.events.WithLabelValues("duplicate")
	m.rejected = m.events.WithLabelValues("rejected")
	if reg != nil {
		reg.MustRegister(m.events, m.duration)
	}
	return m
}
