package main

// The isolation scenarios of issue 4: a black-hole endpoint among healthy
// ones (shared pool against lanes), and a full outage (sluice's retry
// budget against a naive deliverer that retries three times at once).

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/testbed"
)

// Settings shared by both scenarios.
const (
	isoRate    = 200 // events/s offered by the open loop; each goes to all isoSubs
	isoSubs    = 10
	isoPool    = 64 // max_in_flight of both blackhole designs
	isoLaneCap = 8  // a lane's cap in the lanes design: pool/8
	holePath   = 0  // /s0 is the black hole
	bucket     = 250 * time.Millisecond
	// slotSample is how often GET /v1/subscriptions is read during a
	// blackhole window.
	slotSample = 50 * time.Millisecond
	// naiveAttempts is the naive deliverer's attempts per event and
	// endpoint: the first and three immediate retries.
	naiveAttempts = 4
	// never disables a breaker trigger: more requests than a run makes.
	never = 1000000000
)

// isoTiming is how long each phase of the isolation scenarios lasts.
type isoTiming struct {
	holeTimeout time.Duration // subscription timeout in the blackhole runs
	healthyWin  time.Duration // blackhole: window with every endpoint healthy
	holeWin     time.Duration // blackhole: window with /s0 a black hole (as long, so the P99s compare)
	pre         time.Duration // outage: steady load before the outage
	outage      time.Duration // outage: every endpoint answers 500
	drainMax    time.Duration // outage: longest wait for the backlog after recovery
	naivePre    time.Duration // naive retry-3: load before the outage
	naivePost   time.Duration // naive retry-3: load after it
}

func (h *harness) isoTiming() isoTiming {
	if h.opts.quick {
		return isoTiming{holeTimeout: 2 * time.Second, healthyWin: 2500 * time.Millisecond, holeWin: 2500 * time.Millisecond,
			pre: 2 * time.Second, outage: 2 * time.Second, drainMax: 30 * time.Second,
			naivePre: time.Second, naivePost: 500 * time.Millisecond}
	}
	return isoTiming{holeTimeout: 5 * time.Second, healthyWin: 8 * time.Second, holeWin: 8 * time.Second,
		pre: 10 * time.Second, outage: 4 * time.Second, drainMax: 60 * time.Second,
		naivePre: 2 * time.Second, naivePost: 2 * time.Second}
}

// yamlDur prints a duration the way the config expects it (5s, 100ms).
func yamlDur(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// ---------------------------------------------------------------- blackhole

// slotReading is one reading of the lanes' slots.
type slotReading struct {
	T            float64 `json:"t_s"` // since the window started
	HoleInFlight int     `json:"hole_in_flight"`
	InFlight     int     `json:"in_flight"` // all lanes
	HoleBreaker  string  `json:"hole_breaker"`
	ReceiverHeld int64   `json:"receiver_held"` // requests the black hole holds at the receiver
}

// slotSummary sums up the readings of one window.
type slotSummary struct {
	Samples          int     `json:"samples"`
	Errors           int     `json:"errors,omitempty"`
	HolePoolMax      float64 `json:"hole_share_of_pool_max"` // hole in_flight / max_in_flight
	HolePoolMean     float64 `json:"hole_share_of_pool_mean"`
	HoleBusyMax      float64 `json:"hole_share_of_busy_max"` // hole in_flight / all in_flight
	HoleBusyMean     float64 `json:"hole_share_of_busy_mean"`
	HoleInFlightMax  int     `json:"hole_in_flight_max"`
	HealthyMax       int     `json:"healthy_in_flight_max"`
	ReceiverHeldMax  int64   `json:"receiver_held_max"`
	OverCap          int     `json:"samples_hole_over_cap"`
	BreakerOpenFirst float64 `json:"hole_breaker_first_open_s"` // -1: never seen open
	BreakerOpenShare float64 `json:"hole_breaker_open_share"`   // of samples
}

// slotSampler reads GET /v1/subscriptions every slotSample while running.
type slotSampler struct {
	sc    *sidecar
	recv  *receiver
	cap   int
	stop  chan struct{}
	done  chan struct{}
	start time.Time
	mu    sync.Mutex
	rs    []slotReading
	errs  int
}

func startSlotSampler(sc *sidecar, recv *receiver, laneCap int) *slotSampler {
	s := &slotSampler{sc: sc, recv: recv, cap: laneCap, stop: make(chan struct{}), done: make(chan struct{}), start: time.Now()}
	go func() {
		defer close(s.done)
		t := time.NewTicker(slotSample)
		defer t.Stop()
		// Bounded in count as well: one reading per tick for at most 10
		// minutes.
		for range int(10 * time.Minute / slotSample) {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			ls, err := sc.lanes()
			s.mu.Lock()
			if err != nil {
				s.errs++
				s.mu.Unlock()
				continue
			}
			r := slotReading{T: time.Since(s.start).Seconds(), ReceiverHeld: recv.tb.Totals().Holding}
			for _, l := range ls {
				r.InFlight += l.InFlight
				if l.Subscription == "s"+strconv.Itoa(holePath) {
					r.HoleInFlight, r.HoleBreaker = l.InFlight, l.Breaker
				}
			}
			s.rs = append(s.rs, r)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *slotSampler) finish() ([]slotReading, slotSummary) {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := slotSummary{Samples: len(s.rs), Errors: s.errs, BreakerOpenFirst: -1}
	busyN, open := 0, 0
	for _, r := range s.rs {
		pool := float64(r.HoleInFlight) / isoPool
		sum.HolePoolMax = max(sum.HolePoolMax, pool)
		sum.HolePoolMean += pool
		if r.InFlight > 0 {
			busy := float64(r.HoleInFlight) / float64(r.InFlight)
			sum.HoleBusyMax = max(sum.HoleBusyMax, busy)
			sum.HoleBusyMean += busy
			busyN++
		}
		sum.HoleInFlightMax = max(sum.HoleInFlightMax, r.HoleInFlight)
		sum.HealthyMax = max(sum.HealthyMax, r.InFlight-r.HoleInFlight)
		sum.ReceiverHeldMax = max(sum.ReceiverHeldMax, r.ReceiverHeld)
		if r.HoleInFlight > s.cap {
			sum.OverCap++
		}
		if r.HoleBreaker == "open" {
			open++
			if sum.BreakerOpenFirst < 0 {
				sum.BreakerOpenFirst = r.T
			}
		}
	}
	if n := len(s.rs); n > 0 {
		sum.HolePoolMean /= float64(n)
		sum.BreakerOpenShare = float64(open) / float64(n)
	}
	if busyN > 0 {
		sum.HoleBusyMean /= float64(busyN)
	}
	return s.rs, sum
}

// bhPhase is one blackhole window: every endpoint healthy, or /s0 a black
// hole.
type bhPhase struct {
	Window         string             `json:"window"`
	Hole           bool               `json:"black_hole"`
	Seconds        float64            `json:"seconds"`
	HealthyP50     float64            `json:"healthy_p50_ms"`
	HealthyP99     float64            `json:"healthy_p99_ms"`
	HealthyMax     float64            `json:"healthy_max_ms"`
	Samples        int                `json:"healthy_latency_samples"`
	Expected       int64              `json:"healthy_deliveries_expected"` // events of the window × 9
	Missing        int64              `json:"healthy_deliveries_missing"`  // not delivered when the wait ended
	P99LowerBound  bool               `json:"healthy_p99_is_lower_bound,omitempty"`
	HealthyPerSec  float64            `json:"healthy_deliveries_per_s"`
	OfferedPerSec  float64            `json:"healthy_offered_per_s"`
	HoleDeliveries int64              `json:"hole_deliveries_in_window"`
	ReceiverHeld   int64              `json:"receiver_held_total"` // requests the black hole took in
	HeldAtEnd      int64              `json:"receiver_held_at_end"`
	DrainSeconds   float64            `json:"healthy_drain_seconds"` // load end → every healthy delivery received
	Drained        bool               `json:"healthy_drained"`
	Slots          slotSummary        `json:"slots"`
	Readings       []slotReading      `json:"slot_readings,omitempty"`
	Lanes          []proxy.LaneStatus `json:"lanes_after"`
}

// bhDesign is one design of the blackhole scenario.
type bhDesign struct {
	Key         string   `json:"key"`
	Label       string   `json:"label"`
	Pool        int      `json:"max_in_flight"`
	Cap         int      `json:"lane_cap"`
	Breaker     string   `json:"breaker"`
	Timeout     string   `json:"timeout"`
	Healthy     *bhPhase `json:"healthy"`
	WithHole    *bhPhase `json:"black_hole"`
	Error       string   `json:"error,omitempty"`
	subYAML     func(int) string
	targetsHere bool
}

// scenarioBlackhole: 10 subscriptions at isoRate events/s, /s0 a black
// hole in the second window, under two designs run by the same binary:
// "shared pool" (every subscription may take the whole pool, breakers off)
// and "lanes" (cap pool/8, default breakers).
func (h *harness) scenarioBlackhole(ctx context.Context, name string) error {
	t := h.isoTiming()
	to := yamlDur(t.holeTimeout)
	designs := []*bhDesign{
		{Key: "shared", Label: "shared pool", Pool: isoPool, Cap: isoPool, Breaker: "off", Timeout: to,
			subYAML: func(int) string {
				return fmt.Sprintf("concurrency: {max: %d}, timeout: %s, breaker: {min_requests: %d, consecutive_timeouts: %d}",
					isoPool, to, never, never)
			}},
		{Key: "lanes", Label: "lanes", Pool: isoPool, Cap: isoLaneCap, Breaker: "default", Timeout: to, targetsHere: true,
			subYAML: func(int) string { return fmt.Sprintf("concurrency: {max: %d}, timeout: %s", isoLaneCap, to) }},
	}
	var firstErr error
	for _, d := range designs {
		if ctx.Err() != nil {
			break
		}
		if err := h.blackholeDesign(ctx, name, d, t); err != nil {
			d.Error = err.Error()
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", d.Label, err)
			}
		}
	}
	h.rep.Details[name] = map[string]any{
		"rate_events_per_s": isoRate, "subscriptions": isoSubs, "black_hole": "/s" + strconv.Itoa(holePath),
		"hole_timeout": to, "designs": designs,
	}
	h.blackholeRows(name, designs)
	return firstErr
}

func (h *harness) blackholeDesign(ctx context.Context, name string, d *bhDesign, t isoTiming) error {
	defer h.recv.resetModes()
	sc, err := h.start(ctx, sidecarSpec{Name: name + "." + d.Key, Durability: "fsync",
		Subs: []subGroup{{isoSubs, benchType}}, MaxInFlight: d.Pool, SubYAML: d.subYAML})
	if err != nil {
		return err
	}
	defer h.stopSidecar(sc)
	base := h.recv.snapshotPaths(isoSubs)
	healthy := make([]bool, isoSubs)
	for i := range healthy {
		healthy[i] = i != holePath
	}
	// drained: every path in want has every accepted event since the
	// sidecar started.
	drained := func(want []bool) bool {
		cur := h.recv.snapshotPaths(isoSubs)
		for i, w := range want {
			if w && cur[i]-base[i] < sc.accepted {
				return false
			}
		}
		return true
	}
	all := slices.Repeat([]bool{true}, isoSubs)
	phase := func(hole bool, dur time.Duration) *bhPhase {
		p := &bhPhase{Window: name + "." + d.Key + ".healthy", Hole: hole, OfferedPerSec: isoRate * float64(isoSubs-1)}
		if hole {
			p.Window = name + "." + d.Key + ".hole"
			h.recv.setMode(holePath, 1, testbed.ModeBlackhole)
		}
		held0 := h.recv.tb.Totals().Held
		var p0, p1 []int64
		var sam *slotSampler
		w := h.sidecarWindow(ctx, sc, p.Window, loadSpec{Conc: openWorkers, Rate: isoRate, Body: 512, Grace: openGrace, Dur: dur},
			winOpts{Receipt: true, ReceiptPaths: healthy,
				Tick: func(ph int) {
					if ph == 0 {
						p0 = h.recv.snapshotPaths(isoSubs)
						sam = startSlotSampler(sc, h.recv, d.Cap)
						return
					}
					p1 = h.recv.snapshotPaths(isoSubs)
					if sam != nil {
						p.Readings, p.Slots = sam.finish()
						sam = nil
					}
				},
				AfterLoad: func() {
					if sam != nil { // interrupted before the window ended
						p.Readings, p.Slots = sam.finish()
						sam = nil
					}
					p.HeldAtEnd = h.recv.tb.Totals().Holding
					p.ReceiverHeld = h.recv.tb.Totals().Held - held0
					// The black hole comes back: what it holds is let go,
					// so the sidecar's slots free up and the healthy
					// backlog can be measured to the end.
					h.recv.resetModes()
					start := time.Now()
					want := all
					if hole {
						want = healthy
					}
					p.Drained = waitFor(ctx, h.drainTimeout(), func() bool { return drained(want) })
					p.DrainSeconds = time.Since(start).Seconds()
				}})
		p.Seconds = w.Seconds
		if p0 != nil && p1 != nil && w.Seconds > 0 {
			var n int64
			for i := range isoSubs {
				if i == holePath {
					p.HoleDeliveries = p1[i] - p0[i]
					continue
				}
				n += p1[i] - p0[i]
			}
			p.HealthyPerSec = float64(n) / w.Seconds
		}
		if rc := w.Receipt; rc != nil {
			p.HealthyP50, p.HealthyP99, p.HealthyMax, p.Samples = rc.P50, rc.P99, rc.Max, rc.N
		}
		p.Expected = w.Load.WinOK * int64(isoSubs-1)
		p.Missing = max(0, p.Expected-int64(p.Samples))
		if p.Missing > 0 {
			// Undelivered events would sit above every sample: the P99
			// of what arrived is a lower bound, and with more than 1%
			// missing the true P99 is at least the wait itself.
			p.P99LowerBound = true
			if float64(p.Missing) > 0.01*float64(p.Expected) {
				p.HealthyP99 = max(p.HealthyP99, (w.Seconds+p.DrainSeconds)*1e3)
			}
		}
		if ls, err := sc.lanes(); err == nil {
			p.Lanes = ls
		}
		h.logf("  %s: healthy P99 %.1f ms (%d/%d samples), healthy %.0f/s of %.0f, hole share of pool max %.3f, busy mean %.2f, breaker first open %.1f s",
			p.Window, p.HealthyP99, p.Samples, p.Expected, p.HealthyPerSec, p.OfferedPerSec, p.Slots.HolePoolMax, p.Slots.HoleBusyMean, p.Slots.BreakerOpenFirst)
		return p
	}
	d.Healthy = phase(false, t.healthyWin)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	d.WithHole = phase(true, t.holeWin)
	if !sc.running() {
		return fmt.Errorf("sidecar exited: %v", sc.err)
	}
	return nil
}

func (h *harness) blackholeRows(name string, designs []*bhDesign) {
	r := h.rep
	for _, d := range designs {
		if d.Healthy == nil || d.WithHole == nil {
			continue
		}
		pfx := d.Label + ": "
		a, b := d.Healthy, d.WithHole
		r.add(name, pfx+"healthy P99 publish→receipt, all healthy", a.HealthyP99, "ms").
			note(fmt.Sprintf("cap %d, pool %d, breaker %s; P50 %.2f ms; %d samples", d.Cap, d.Pool, d.Breaker, a.HealthyP50, a.Samples))
		row := r.add(name, pfx+"healthy P99 publish→receipt, 1 black hole", b.HealthyP99, "ms").vsValue("all healthy", a.HealthyP99)
		nt := fmt.Sprintf("P50 %.2f ms, max %.0f ms; %d of %d healthy deliveries in time", b.HealthyP50, b.HealthyMax, b.Samples, b.Expected)
		if b.P99LowerBound {
			nt += fmt.Sprintf("; lower bound: %d not delivered when the wait ended", b.Missing)
		}
		row.note(nt)
		if d.targetsHere {
			row.want(onRatio, "<=", 1.2)
		} else {
			row.note("the design sluice replaces: no target")
		}
		share := r.add(name, pfx+"black-hole share of pool slots (max)", b.Slots.HolePoolMax, "").
			note(fmt.Sprintf("in_flight of /s%d ÷ max_in_flight %d, sampled every %s: mean %.3f; max held at the receiver %d; %d samples",
				holePath, d.Pool, slotSample, b.Slots.HolePoolMean, b.Slots.ReceiverHeldMax, b.Slots.Samples))
		if d.targetsHere {
			share.want(onValue, "<=", float64(d.Cap)/float64(d.Pool))
			if b.Slots.Samples == 0 {
				share.fail("no slot samples")
			}
		}
		r.add(name, pfx+"black-hole share of busy slots (mean)", b.Slots.HoleBusyMean, "").
			note(fmt.Sprintf("hole in_flight ÷ all in_flight; max %.2f; healthy in_flight max %d", b.Slots.HoleBusyMax, b.Slots.HealthyMax))
		r.add(name, pfx+"healthy deliveries/s, 1 black hole", b.HealthyPerSec, "/s").vsValue("offered", b.OfferedPerSec).
			note(fmt.Sprintf("all healthy: %.0f/s; healthy backlog drained %.1f s after the load", a.HealthyPerSec, b.DrainSeconds))
		if d.targetsHere {
			bo := "never seen open"
			if b.Slots.BreakerOpenFirst >= 0 {
				bo = fmt.Sprintf("first seen open %.1f s into the window, open in %.0f%% of samples", b.Slots.BreakerOpenFirst, 100*b.Slots.BreakerOpenShare)
			}
			var sc uint64
			for _, l := range b.Lanes {
				if l.Subscription == "s"+strconv.Itoa(holePath) {
					sc = l.ShortCircuit
				}
			}
			r.add(name, pfx+"black-hole breaker", b.Slots.BreakerOpenShare, "").
				note(fmt.Sprintf("share of samples open; %s; %d short circuits; timeout %s", bo, sc, d.Timeout))
		}
	}
}

// ---------------------------------------------------------------- outage

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
	Deliverer         string             `json:"deliverer"`
	BasePerSec        float64            `json:"base_deliveries_per_s"` // rate × endpoints
	MeasuredBase      float64            `json:"measured_base_per_s"`   // mean arrivals/s before the outage (after its first second)
	PeakOutage        float64            `json:"peak_offered_outage_per_s"`
	PeakOutageRatio   float64            `json:"peak_offered_outage_ratio"`
	MeanOutage        float64            `json:"mean_offered_outage_per_s"`
	PeakAfter         float64            `json:"peak_offered_after_recovery_per_s"`
	PeakAfterRatio    float64            `json:"peak_offered_after_recovery_ratio"`
	PeakAfterAt       float64            `json:"peak_after_recovery_at_s"` // after recovery
	RetriesOutage     int64              `json:"retries_during_outage"`
	AttemptsOutage    int64              `json:"attempts_during_outage"`
	Retries           int64              `json:"retries_total"`
	Attempts          int64              `json:"attempts_total"`
	Events            int64              `json:"events"` // accepted (sluice) or sent (naive)
	Delivered         int64              `json:"deliveries_unique"`
	Duplicates        int64              `json:"duplicates"`
	Lost              int64              `json:"deliveries_lost"` // naive: pairs whose 4 attempts failed; sluice: dead letters
	EventsLost        int64              `json:"events_lost,omitempty"`
	DueBefore         int64              `json:"events_due_before_recovery,omitempty"`
	BacklogDrain      float64            `json:"backlog_drain_seconds,omitempty"` // recovery → every event published before it everywhere
	BacklogDrained    bool               `json:"backlog_drained"`
	AllDrain          float64            `json:"all_drain_seconds,omitempty"` // recovery → every accepted event everywhere
	AllDrained        bool               `json:"all_drained"`
	LoadAfterRecovery float64            `json:"load_after_recovery_seconds,omitempty"`
	Deferred          uint64             `json:"retries_deferred,omitempty"`
	BreakerSamples    int                `json:"samples_with_breaker_open,omitempty"`
	BudgetAtOutage    *budgetReading     `json:"budget_at_outage,omitempty"`
	BudgetMaxRetries  int64              `json:"budget_max_retries_in_window,omitempty"`
	BudgetMaxAllowed  int64              `json:"budget_max_allowed_in_window,omitempty"`
	BucketSeconds     float64            `json:"bucket_seconds"`
	OutageFrom        int                `json:"outage_first_bucket"`
	OutageTo          int                `json:"recovery_bucket"`
	Total             []int64            `json:"per_bucket_requests"`
	RetrySeries       []int64            `json:"per_bucket_retries"`
	OKSeries          []int64            `json:"per_bucket_ok"`
	Budget            []budgetReading    `json:"budget_readings,omitempty"`
	Lanes             []proxy.LaneStatus `json:"lanes_after,omitempty"`
	Errors            []string           `json:"errors,omitempty"`
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
