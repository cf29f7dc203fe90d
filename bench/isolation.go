package main

// The isolation scenarios: a black-hole endpoint among healthy
// ones (shared pool against lanes), and a full outage (sluice's retry
// budget against a naive deliverer that retries three times at once).

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/proxy/api"
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
	// neverRequests and neverTimeouts disable the breaker's triggers: the
	// most the config takes, more requests and timeouts than a run makes
	// (a black hole times out at most isoPool requests per holeTimeout).
	neverRequests = 1_000_000
	neverTimeouts = 10_000
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
	Window         string           `json:"window"`
	Hole           bool             `json:"black_hole"`
	Seconds        float64          `json:"seconds"`
	HealthyP50     float64          `json:"healthy_p50_ms"`
	HealthyP99     float64          `json:"healthy_p99_ms"`
	HealthyMax     float64          `json:"healthy_max_ms"`
	Samples        int              `json:"healthy_latency_samples"`
	Expected       int64            `json:"healthy_deliveries_expected"` // events of the window × 9
	Missing        int64            `json:"healthy_deliveries_missing"`  // not delivered when the wait ended
	P99LowerBound  bool             `json:"healthy_p99_is_lower_bound,omitempty"`
	HealthyPerSec  float64          `json:"healthy_deliveries_per_s"`
	OfferedPerSec  float64          `json:"healthy_offered_per_s"`
	HoleDeliveries int64            `json:"hole_deliveries_in_window"`
	ReceiverHeld   int64            `json:"receiver_held_total"` // requests the black hole took in
	HeldAtEnd      int64            `json:"receiver_held_at_end"`
	DrainSeconds   float64          `json:"healthy_drain_seconds"` // load end → every healthy delivery received
	Drained        bool             `json:"healthy_drained"`
	Slots          slotSummary      `json:"slots"`
	Readings       []slotReading    `json:"slot_readings,omitempty"`
	Lanes          []api.LaneStatus `json:"lanes_after"`
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
					isoPool, to, neverRequests, neverTimeouts)
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
