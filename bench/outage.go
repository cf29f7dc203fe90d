package main

// The outage scenario: every endpoint fails for a while;
// sluice's shared retry budget against a naive deliverer that retries
// three times at once.

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/testbed"
)

// budgetReading is one sample of the sidecar's retry budget and lanes.
type budgetReading struct {
	T           float64 `json:"t_s"` // since the load started
	Successes   int64   `json:"successes"`
	Retries     int64   `json:"retries"`
	Allowed     int64   `json:"allowed"`
	Available   float64 `json:"available"`
	Deferred    uint64  `json:"retries_deferred"`
	Scheduled   int64   `json:"retries_scheduled"`
	BreakerOpen int     `json:"breakers_open"` // open or half-open
	InFlight    int     `json:"in_flight"`
}

// outageRun is what one deliverer did around the outage.
type outageRun struct {
	Deliverer         string           `json:"deliverer"`
	BasePerSec        float64          `json:"base_deliveries_per_s"` // rate × endpoints
	MeasuredBase      float64          `json:"measured_base_per_s"`   // mean arrivals/s before the outage (after its first second)
	PeakOutage        float64          `json:"peak_offered_outage_per_s"`
	PeakOutageRatio   float64          `json:"peak_offered_outage_ratio"`
	MeanOutage        float64          `json:"mean_offered_outage_per_s"`
	PeakAfter         float64          `json:"peak_offered_after_recovery_per_s"`
	PeakAfterRatio    float64          `json:"peak_offered_after_recovery_ratio"`
	PeakAfterAt       float64          `json:"peak_after_recovery_at_s"` // after recovery
	RetriesOutage     int64            `json:"retries_during_outage"`
	AttemptsOutage    int64            `json:"attempts_during_outage"`
	Retries           int64            `json:"retries_total"`
	Attempts          int64            `json:"attempts_total"`
	Events            int64            `json:"events"` // accepted (sluice) or sent (naive)
	Delivered         int64            `json:"deliveries_unique"`
	Duplicates        int64            `json:"duplicates"`
	Lost              int64            `json:"deliveries_lost"` // naive: pairs whose 4 attempts failed; sluice: dead letters
	EventsLost        int64            `json:"events_lost,omitempty"`
	DueBefore         int64            `json:"events_due_before_recovery,omitempty"`
	BacklogDrain      float64          `json:"backlog_drain_seconds,omitempty"` // recovery → every event published before it everywhere
	BacklogDrained    bool             `json:"backlog_drained"`
	AllDrain          float64          `json:"all_drain_seconds,omitempty"` // recovery → every accepted event everywhere
	AllDrained        bool             `json:"all_drained"`
	LoadAfterRecovery float64          `json:"load_after_recovery_seconds,omitempty"`
	Deferred          uint64           `json:"retries_deferred,omitempty"`
	BreakerSamples    int              `json:"samples_with_breaker_open,omitempty"`
	BudgetAtOutage    *budgetReading   `json:"budget_at_outage,omitempty"`
	BudgetMaxRetries  int64            `json:"budget_max_retries_in_window,omitempty"`
	BudgetMaxAllowed  int64            `json:"budget_max_allowed_in_window,omitempty"`
	BucketSeconds     float64          `json:"bucket_seconds"`
	OutageFrom        int              `json:"outage_first_bucket"`
	OutageTo          int              `json:"recovery_bucket"`
	Total             []int64          `json:"per_bucket_requests"`
	RetrySeries       []int64          `json:"per_bucket_retries"`
	OKSeries          []int64          `json:"per_bucket_ok"`
	Budget            []budgetReading  `json:"budget_readings,omitempty"`
	Lanes             []api.LaneStatus `json:"lanes_after,omitempty"`
	Errors            []string         `json:"errors,omitempty"`
}

// analyse fills the peak figures from the timeline.
func (o *outageRun) analyse(tl *timeline, pre, outage time.Duration, buckets int) {
	o.BucketSeconds = bucket.Seconds()
	o.Total, o.RetrySeries, o.OKSeries = tl.series(buckets)
	o.OutageFrom, o.OutageTo = int(pre/bucket), int((pre+outage)/bucket)
	perSec := func(n int64) float64 { return float64(n) / bucket.Seconds() }
	var baseSum int64
	baseN := 0
	skip := int(min(time.Second, pre/2) / bucket) // the open loop's first moments
	for i, n := range o.Total {
		switch {
		case i < o.OutageFrom:
			if i >= skip {
				baseSum += n
				baseN++
			}
		case i < o.OutageTo:
			o.PeakOutage = max(o.PeakOutage, perSec(n))
			o.RetriesOutage += o.RetrySeries[i]
			o.AttemptsOutage += n
		default:
			if p := perSec(n); p > o.PeakAfter {
				o.PeakAfter, o.PeakAfterAt = p, float64(i-o.OutageTo)*bucket.Seconds()
			}
		}
		o.Attempts += n
		o.Retries += o.RetrySeries[i]
	}
	if baseN > 0 {
		o.MeasuredBase = perSec(baseSum) / float64(baseN)
	}
	if o.OutageTo > o.OutageFrom {
		o.MeanOutage = perSec(o.AttemptsOutage) / float64(o.OutageTo-o.OutageFrom)
	}
	o.PeakOutageRatio = o.PeakOutage / o.BasePerSec
	o.PeakAfterRatio = o.PeakAfter / o.BasePerSec
}

// outageClock switches every endpoint to 500 at start+pre and back at
// start+pre+outage.
func (h *harness) outageClock(ctx context.Context, start time.Time, pre, outage time.Duration) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if sleepUntil(ctx, start.Add(pre)) {
			h.recv.setMode(0, isoSubs, testbed.ModeFail)
		}
		sleepUntil(ctx, start.Add(pre+outage))
		h.recv.setMode(0, isoSubs, testbed.ModeOK)
	}()
	return func() { <-done }
}

// scenarioOutage: every endpoint answers 500 for a while, then recovers;
// sluice with its retry budget, then the naive retry-3 deliverer.
func (h *harness) scenarioOutage(ctx context.Context, name string) error {
	t := h.isoTiming()
	defer h.recv.resetModes()
	sl, err := h.outageSidecar(ctx, name, t)
	var naive *outageRun
	if ctx.Err() == nil {
		naive = h.outageNaive(ctx, name+".naive", t)
	}
	h.rep.Details[name] = map[string]any{
		"rate_events_per_s": isoRate, "subscriptions": isoSubs, "outage": t.outage.String(),
		"sidecar_pre_outage": t.pre.String(), "naive_pre_outage": t.naivePre.String(), "naive_post_outage": t.naivePost.String(),
		"sluice_retry": "{base: 100ms, cap: 2s, max_attempts: 50}", "retry_budget": "default {ratio: 0.1, min_per_second: 10, window: 10s}",
		"budget": sl, "naive_retry3": naive,
	}
	h.outageRows(name, sl, naive, t)
	return err
}

func (h *harness) outageSidecar(ctx context.Context, name string, t isoTiming) (*outageRun, error) {
	sc, err := h.start(ctx, sidecarSpec{Name: name, Durability: "fsync", Subs: []subGroup{{isoSubs, benchType}},
		SubYAML: func(int) string {
			return fmt.Sprintf("concurrency: {max: %d}, retry: {base: 100ms, cap: 2s, max_attempts: 50}", laneCap)
		}})
	if err != nil {
		return nil, err
	}
	defer h.stopSidecar(sc)
	o := &outageRun{Deliverer: "sluice (retry budget)", BasePerSec: isoRate * isoSubs}
	start := time.Now().Add(100 * time.Millisecond)
	recovery := start.Add(t.pre + t.outage)
	const tail = time.Second // load after the backlog drained
	buckets := int((t.pre + t.outage + t.drainMax + tail + 20*time.Second) / bucket)
	tl := newTimeline(start, bucket, buckets)
	tr := newIDTracker(recovery)
	h.recv.tl.Store(tl)
	h.recv.track.Store(tr)
	defer h.recv.tl.CompareAndSwap(tl, nil)
	defer h.recv.track.CompareAndSwap(tr, nil)
	clockDone := h.outageClock(ctx, start, t.pre, t.outage)
	defer clockDone()

	// Events due before recovery: i with start + i/R < recovery.
	o.DueBefore = int64(math.Ceil(isoRate*(t.pre+t.outage).Seconds() - 1e-9))
	stop := make(chan struct{})
	var backlogAt atomic.Pointer[time.Time]
	watchDone := make(chan struct{})
	go func() {
		// Once every event published before recovery has reached every
		// endpoint (or drainMax passed), the load goes on for one more
		// second and stops.
		defer close(watchDone)
		defer close(stop)
		if !sleepUntil(ctx, recovery) {
			return
		}
		if waitFor(ctx, t.drainMax, func() bool { return tr.stats().UniqueBefore >= o.DueBefore*isoSubs }) {
			at := time.Now()
			backlogAt.Store(&at)
		}
		sleepUntil(ctx, time.Now().Add(tail))
	}()

	// Budget and lanes, every bucket.
	var (
		bmu sync.Mutex
		brs []budgetReading
	)
	samDone := make(chan struct{})
	samStop := make(chan struct{})
	go func() {
		defer close(samDone)
		tk := time.NewTicker(bucket)
		defer tk.Stop()
		for range buckets {
			select {
			case <-samStop:
				return
			case <-tk.C:
			}
			b, err := sc.retryBudget()
			if err != nil {
				continue
			}
			r := budgetReading{T: time.Since(start).Seconds(), Successes: b.Successes, Retries: b.Retries, Allowed: b.Allowed, Available: b.Available}
			if ls, err := sc.lanes(); err == nil {
				for _, l := range ls {
					r.Deferred += l.Deferred
					r.Scheduled += l.Scheduled
					r.InFlight += l.InFlight
					if l.Breaker != "closed" {
						r.BreakerOpen++
					}
				}
			}
			bmu.Lock()
			brs = append(brs, r)
			bmu.Unlock()
		}
	}()

	w := h.sidecarWindow(ctx, sc, name, loadSpec{Conc: openWorkers, Rate: isoRate, Body: 512, Grace: openGrace,
		Start: start, Warmup: t.pre, Dur: t.outage + t.drainMax + tail, Stop: stop},
		winOpts{AfterLoad: func() {
			// Every accepted event everywhere (the last second of load
			// comes on top of the drained backlog).
			waitFor(ctx, 15*time.Second, func() bool { return tr.stats().Unique >= sc.accepted*isoSubs })
		}})
	<-watchDone
	close(samStop)
	<-samDone
	clockDone()

	st := tr.stats()
	o.Events, o.Delivered, o.Duplicates = sc.accepted, st.Unique, st.Duplicates
	if at := backlogAt.Load(); at != nil {
		o.BacklogDrained, o.BacklogDrain = true, at.Sub(recovery).Seconds()
	}
	if st.Unique >= sc.accepted*isoSubs {
		o.AllDrained, o.AllDrain = true, st.Last.Sub(recovery).Seconds()
	}
	o.LoadAfterRecovery = w.Seconds - t.outage.Seconds()
	used := min(buckets, int(time.Since(start)/bucket)+1)
	o.analyse(tl, t.pre, t.outage, used)
	bmu.Lock()
	o.Budget = brs
	bmu.Unlock()
	for i := range o.Budget {
		b := &o.Budget[i]
		if b.T <= (t.pre).Seconds() {
			o.BudgetAtOutage = b
		}
		o.BudgetMaxRetries = max(o.BudgetMaxRetries, b.Retries)
		o.BudgetMaxAllowed = max(o.BudgetMaxAllowed, b.Allowed)
		if b.BreakerOpen > 0 {
			o.BreakerSamples++
		}
	}
	if o.BudgetAtOutage != nil {
		c := *o.BudgetAtOutage
		o.BudgetAtOutage = &c
	}
	if ls, err := sc.lanes(); err == nil {
		o.Lanes = ls
		for _, l := range ls {
			o.Lost += int64(l.DeadLettered)
			o.Deferred += l.Deferred
		}
	} else {
		o.Errors = append(o.Errors, err.Error())
	}
	if n := w.Load.Errors + w.Load.BadStatus + w.Load.Missed; n > 0 {
		o.Errors = append(o.Errors, fmt.Sprintf("%d events not accepted: the drain conditions count every event due", n))
	}
	h.logf("  %s: peak %.0f/s in the outage (%.2f× base), %.0f/s after recovery (%.2f×), %d retries in the outage; backlog drained %v in %.1f s; %d duplicates, %d dead letters, %d deferrals",
		name, o.PeakOutage, o.PeakOutageRatio, o.PeakAfter, o.PeakAfterRatio, o.RetriesOutage, o.BacklogDrained, o.BacklogDrain, o.Duplicates, o.Lost, o.Deferred)
	return o, nil
}

// outageNaive is the design sluice replaces, driven at the same rate: for
// each event, each endpoint in turn is POSTed, and a failure is retried at
// once up to naiveAttempts attempts in all; then the endpoint is given up
// on for that event (lost).
func (h *harness) outageNaive(ctx context.Context, name string, t isoTiming) *outageRun {
	o := &outageRun{Deliverer: "naive retry-3 (harness, no sidecar)", BasePerSec: isoRate * isoSubs}
	h.logf("  %s: %d events/s × %d endpoints, outage %s", name, isoRate, isoSubs, t.outage)
	start := time.Now().Add(100 * time.Millisecond)
	span := t.naivePre + t.outage + t.naivePost
	buckets := int((span + openGrace + time.Second) / bucket)
	tl := newTimeline(start, bucket, buckets)
	tr := newIDTracker(time.Time{})
	h.recv.tl.Store(tl)
	h.recv.track.Store(tr)
	defer h.recv.tl.CompareAndSwap(tl, nil)
	defer h.recv.track.CompareAndSwap(tr, nil)
	clockDone := h.outageClock(ctx, start, t.naivePre, t.outage)
	res := naiveRetry(ctx, h.recv.addr, h.runID+"-"+h.nextID("naive"), start, span, openGrace)
	clockDone()
	st := tr.stats()
	o.Events, o.Delivered, o.Duplicates, o.Lost, o.EventsLost = res.events, st.Unique, st.Duplicates, res.lostPairs, res.lostEvents
	o.AllDrained = res.lostPairs == 0
	if res.err != "" {
		o.Errors = append(o.Errors, res.err)
	}
	if res.missed > 0 {
		o.Errors = append(o.Errors, fmt.Sprintf("%d events not sent in time (harness too slow)", res.missed))
	}
	o.analyse(tl, t.naivePre, t.outage, buckets)
	h.logf("  %s: peak %.0f/s in the outage (%.2f× base); %d events, %d deliveries, %d lost (%d events)",
		name, o.PeakOutage, o.PeakOutageRatio, o.Events, o.Delivered, o.Lost, o.EventsLost)
	return o
}

type naiveResult struct {
	events, attempts, lostPairs, lostEvents, missed int64
	err                                             string
}

// naiveRetry sends isoRate events/s for span from start (event i due at
// start + i/R, open loop, openWorkers workers), each to the isoSubs
// receiver paths in turn with up to naiveAttempts immediate attempts.
func naiveRetry(ctx context.Context, addr, runID string, start time.Time, span, grace time.Duration) naiveResult {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: openWorkers, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		MaxIdleConnDuration: time.Minute, MaxConnWaitTimeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	total := int64(isoRate * span.Seconds())
	end := start.Add(span + grace)
	var (
		next    atomic.Int64
		mu      sync.Mutex
		res     naiveResult
		errOnce sync.Once
		wg      sync.WaitGroup
	)
	for range openWorkers {
		wg.Go(func() {
			var my naiveResult
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer func() {
				fasthttp.ReleaseRequest(req)
				fasthttp.ReleaseResponse(resp)
				mu.Lock()
				res.events += my.events
				res.attempts += my.attempts
				res.lostPairs += my.lostPairs
				res.lostEvents += my.lostEvents
				res.missed += my.missed
				mu.Unlock()
			}()
			body := newBody(512)
			timer := time.NewTimer(time.Hour)
			defer timer.Stop()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= total {
					return
				}
				due := start.Add(time.Duration(float64(i) * float64(time.Second) / isoRate))
				if d := time.Until(due); d > 0 {
					timer.Reset(d)
					select {
					case <-ctx.Done():
						return
					case <-timer.C:
					}
				}
				if time.Now().After(end) {
					my.missed++
					continue
				}
				stampBody(body, due.UnixNano())
				id := "naive-" + runID + "-" + strconv.FormatInt(i, 10)
				my.events++
				lost := false
				for p := range isoSubs {
					ok := false
					for a := 1; a <= naiveAttempts && !ok; a++ {
						req.Reset()
						req.SetRequestURI("http://" + addr + "/s" + strconv.Itoa(p))
						req.Header.SetMethod(fasthttp.MethodPost)
						req.Header.SetContentType("application/json")
						req.Header.Set("webhook-id", id)
						req.Header.Set("X-Attempt", strconv.Itoa(a))
						req.SetBodyRaw(body)
						my.attempts++
						err := hc.Do(req, resp)
						ok = err == nil && resp.StatusCode() == fasthttp.StatusOK
						if err != nil {
							errOnce.Do(func() { mu.Lock(); res.err = err.Error(); mu.Unlock() })
						}
					}
					if !ok {
						my.lostPairs++
						lost = true
					}
				}
				if lost {
					my.lostEvents++
				}
			}
		})
	}
	wg.Wait()
	return res
}

func (h *harness) outageRows(name string, sl, naive *outageRun, t isoTiming) {
	r := h.rep
	if sl != nil {
		base := sl.BasePerSec
		row := r.add(name, "budget: peak offered load in the outage", sl.PeakOutage, "/s").vsValue("base", base).want(onRatio, "<=", 1.2)
		nt := fmt.Sprintf("busiest %s bucket of the %s outage (every endpoint 500); mean %.0f/s; measured base %.0f/s", bucket, t.outage, sl.MeanOutage, sl.MeasuredBase)
		row.note(nt)
		ba := "n/a"
		if b := sl.BudgetAtOutage; b != nil {
			ba = fmt.Sprintf("%d allowed, %d spent in the window at the outage", b.Allowed, b.Retries)
		}
		r.add(name, "budget: retries in the outage", float64(sl.RetriesOutage), "").
			note(fmt.Sprintf("of %d attempts; budget %s; %d deferrals in all; breakers open in %d of %d samples",
				sl.AttemptsOutage, ba, sl.Deferred, sl.BreakerSamples, len(sl.Budget)))
		r.add(name, "budget: peak offered load after recovery", sl.PeakAfter, "/s").vsValue("base", base).
			note(fmt.Sprintf("%.1f s after recovery; the load goes on at the base rate", sl.PeakAfterAt))
		dr := r.add(name, "budget: time to drain after recovery", sl.BacklogDrain, "s").
			note(fmt.Sprintf("until every event published before recovery (%d) reached all %d endpoints", sl.DueBefore, isoSubs))
		if !sl.BacklogDrained {
			dr.Value = t.drainMax.Seconds()
			dr.fail(fmt.Sprintf("not drained within %s (value is that bound)", t.drainMax))
		}
		if sl.AllDrained {
			dr.note(fmt.Sprintf("every accepted event (%d) everywhere after %.1f s", sl.Events, sl.AllDrain))
		}
		r.add(name, "budget: duplicates", float64(sl.Duplicates), "").
			note(fmt.Sprintf("200s for a (endpoint, webhook-id) already answered 200; %d unique deliveries; %d dead letters", sl.Delivered, sl.Lost))
	}
	if naive != nil {
		r.add(name, "naive retry-3: peak offered load in the outage", naive.PeakOutage, "/s").vsValue("base", naive.BasePerSec).
			note(fmt.Sprintf("expected ~%d×: every failure retried at once, %d attempts in all; mean %.0f/s", naiveAttempts, naiveAttempts, naive.MeanOutage))
		r.add(name, "naive retry-3: deliveries lost", float64(naive.Lost), "").
			note(fmt.Sprintf("(event, endpoint) pairs whose %d attempts failed; %d of %d events lost somewhere; %d delivered, %d duplicates",
				naiveAttempts, naive.EventsLost, naive.Events, naive.Delivered, naive.Duplicates))
	}
}
