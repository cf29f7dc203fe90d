package delivery

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/policy"
)

// metrics are the delivery engine's Prometheus series. The
// label "subscription" is the configured id, never a URL. Per-lane gauges
// are read from the lanes at scrape time, so an idle lane costs no series
// objects between scrapes; per-lane counters and histograms are created on
// a lane's first delivery.
type metrics struct {
	attempts    *prometheus.CounterVec   // subscription, outcome
	exchange    *prometheus.HistogramVec // subscription: one HTTP exchange
	latency     *prometheus.HistogramVec // subscription: accepted → ACK
	rejections  *prometheus.CounterVec   // subscription, reason
	deadLetters *prometheus.CounterVec   // subscription, reason
	trimmed     *prometheus.CounterVec   // subscription: dead letters deleted past a tenant's bound
	variants    *variantMetrics          // body renderings (variant.go)
}

// Attempt outcomes (the outcome label of sluice_delivery_attempts_total).
const (
	outcomeAck          = "ack"
	outcomeRetry        = "retry"
	outcomeDeadLetter   = "dead_letter"
	outcomeTimeout      = "timeout"
	outcomeShortCircuit = "short_circuit"
)

func newMetrics(reg prometheus.Registerer, d *Dispatcher) *metrics {
	m := &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_delivery_attempts_total", Help: "Delivery attempts by outcome: ack, retry, dead_letter, timeout, short_circuit (refused by an open breaker).",
		}, []string{"subscription", "outcome"}),
		exchange: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_delivery_duration_seconds", Help: "Duration of one HTTP exchange with the endpoint.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"subscription"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_delivery_latency_seconds", Help: "Time from acceptance of an event to its acknowledgement by the endpoint.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30, 60, 300, 3600},
		}, []string{"subscription"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_lane_rejections_total", Help: "Events a lane rejected without an attempt (reasons backlog_quota, variant_failed, corrupt); always equal to the dead letters admitted for that reason.",
		}, []string{"subscription", "reason"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_dead_letters_total", Help: "Dead letters admitted, by reason.",
		}, []string{"subscription", "reason"}),
		trimmed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_dead_letters_trimmed_total", Help: "Dead letters deleted, oldest first, past the bound of their tenant's subscription (tenants[].max_dead_letters): a tenant's retention, never silent.",
		}, []string{"subscription"}),
		variants: newVariantMetrics(reg),
	}
	if reg != nil {
		reg.MustRegister(m.attempts, m.exchange, m.latency, m.rejections, m.deadLetters, m.trimmed,
			&laneCollector{d: d},
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "sluice_retry_budget_available_ratio",
				Help: "Fill level of the shared retry budget, 0..1. An empty budget is the system working: it is why retries stopped.",
			}, func() float64 { return d.budget.Available() }))
	}
	return m
}

// laneMetrics caches one lane's series handles so a delivery does no label
// lookups.
type laneMetrics struct {
	ack, retry, dead, timeout, shorted prometheus.Counter
	exchange, latency                  prometheus.Observer
}

// laneMetrics returns the lane's series handles, made on its first
// delivery attempt. The lane holds only a pointer until then: most of
// 50,000 lanes may never deliver, and the handles would be 120 of the
// bytes each idle lane costs (docs/benchmarks.md, lanes-50k). Two first
// attempts racing make the same series (WithLabelValues returns the
// existing child); one set of handles wins.
func (l *lane) laneMetrics(m *metrics) *laneMetrics {
	if lm := l.metrics.Load(); lm != nil {
		return lm
	}
	lm := &laneMetrics{
		ack:      m.attempts.WithLabelValues(l.id, outcomeAck),
		retry:    m.attempts.WithLabelValues(l.id, outcomeRetry),
		dead:     m.attempts.WithLabelValues(l.id, outcomeDeadLetter),
		timeout:  m.attempts.WithLabelValues(l.id, outcomeTimeout),
		shorted:  m.attempts.WithLabelValues(l.id, outcomeShortCircuit),
		exchange: m.exchange.WithLabelValues(l.id),
		latency:  m.latency.WithLabelValues(l.id),
	}
	if !l.metrics.CompareAndSwap(nil, lm) {
		return l.metrics.Load()
	}
	return lm
}

// laneCollector reads the per-lane gauges at scrape time.
type laneCollector struct{ d *Dispatcher }

var (
	descInFlight = prometheus.NewDesc("sluice_lane_in_flight", "Deliveries in flight (alert above 80% of the limit for 30 s).", []string{"subscription"}, nil)
	descLimit    = prometheus.NewDesc("sluice_lane_concurrency_limit", "The lane's concurrency cap now (static, or derived with concurrency auto).", []string{"subscription"}, nil)
	descBacklog  = prometheus.NewDesc("sluice_lane_backlog_events", "Log entries past the lane's cursor (an upper bound for a lane filtered by type).", []string{"subscription"}, nil)
	descOldest   = prometheus.NewDesc("sluice_lane_oldest_age_seconds", "Age of the oldest event the lane has not resolved; 0 when caught up.", []string{"subscription"}, nil)
	descBreaker  = prometheus.NewDesc("sluice_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open.", []string{"subscription"}, nil)
	descOwned    = prometheus.NewDesc("sluice_lane_owned", "Fleet mode: 1 while this node holds the lane's lease and delivers it, else 0.", []string{"subscription"}, nil)
	descHeld     = prometheus.NewDesc("sluice_lane_held_until_timestamp_seconds", "Unix time until which the endpoint's own announced limit (RateLimit, X-RateLimit-*) holds the lane; present only while it does.", []string{"subscription"}, nil)
)

func (c *laneCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descInFlight
	ch <- descLimit
	ch <- descBacklog
	ch <- descOldest
	ch <- descBreaker
	ch <- descOwned
	ch <- descHeld
	describeOrdering(ch) // ordering.go
}

func (c *laneCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.d.now()
	for _, l := range c.d.laneList() {
		if c.d.fleet != nil {
			// Every node says which lanes it owns; only the owner exports
			// a lane's gauges, so a fleet-wide sum counts each lane once.
			foreign := l.isForeign()
			owned := 1.0
			if foreign {
				owned = 0
			}
			ch <- prometheus.MustNewConstMetric(descOwned, prometheus.GaugeValue, owned, l.id)
			if foreign {
				continue
			}
		}
		st := l.withOldestAge(l.status(), now)
		oldest := st.OldestAge
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(st.InFlight), st.Subscription)
		ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, float64(st.Cap), st.Subscription)
		ch <- prometheus.MustNewConstMetric(descBacklog, prometheus.GaugeValue, float64(st.Backlog), st.Subscription)
		ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, oldest, st.Subscription)
		ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, float64(breakerValue(st.Breaker)), st.Subscription)
		if st.HeldUntil != nil {
			ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, float64(st.HeldUntil.UnixMilli())/1e3, st.Subscription)
		}
		collectOrdering(ch, st) // ordering.go
	}
}

func breakerValue(s string) policy.BreakerState {
	switch s {
	case policy.BreakerOpen.String():
		return policy.BreakerOpen
	case policy.BreakerHalfOpen.String():
		return policy.BreakerHalfOpen
	}
	return policy.BreakerClosed
}
