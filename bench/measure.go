package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// snap is the state of the measured processes at one instant.
type snap struct {
	T    time.Time
	CPU  time.Duration // the measured child (sidecar or no-op server)
	Self time.Duration // the harness: producers, receiver
	RSS  int64
	MS   memStats
	Recv int64
	Err  error
}

// snapshot reads the child's CPU and RSS from /proc, the harness's own CPU,
// the receiver's count and, for a sidecar, its memstats. CPU and the
// receiver count come first so the expvar round trip does not skew them.
func (h *harness) snapshot(pid int, sc *sidecar) snap {
	s := snap{T: time.Now(), Recv: h.recv.delivered()}
	var err error
	if s.CPU, err = procCPU(pid); err != nil {
		s.Err = err
	}
	s.Self, _ = procCPU(os.Getpid())
	s.RSS, _ = procRSS(pid)
	if sc != nil {
		if s.MS, err = sc.memstats(); err != nil && s.Err == nil {
			s.Err = err
		}
	}
	return s
}

// window is one measured interval of a sidecar under load, with every
// number the scenario may report. Per-delivery figures divide by the
// deliveries the receiver counted between the two snapshots; per-event
// figures by the 202s the producers got in the window.
type window struct {
	Name             string      `json:"name"`
	Scenario         string      `json:"scenario"`
	Subscriptions    int         `json:"subscriptions"`
	Durability       string      `json:"durability"`
	Producers        int         `json:"producers"`
	RateOffered      float64     `json:"rate_offered_per_s,omitempty"`
	BodyBytes        int         `json:"body_bytes"`
	Load             loadResult  `json:"producer"`
	Seconds          float64     `json:"seconds"`
	Deliveries       int64       `json:"deliveries"`
	DeliveriesPerSec float64     `json:"deliveries_per_s"`
	CPUms            float64     `json:"sidecar_cpu_ms"`
	CPUPerEventUs    float64     `json:"sidecar_cpu_us_per_event"`
	CPUPerDelivUs    float64     `json:"sidecar_cpu_us_per_delivery,omitempty"`
	CPUCores         float64     `json:"sidecar_cpu_cores"`
	HarnessCPUms     float64     `json:"harness_cpu_ms"`
	AllocBytes       uint64      `json:"sidecar_alloc_bytes"`
	Mallocs          uint64      `json:"sidecar_mallocs"`
	BytesPerEvent    float64     `json:"sidecar_bytes_per_event"`
	AllocsPerEvent   float64     `json:"sidecar_allocs_per_event"`
	BytesPerDeliv    float64     `json:"sidecar_bytes_per_delivery,omitempty"`
	AllocsPerDeliv   float64     `json:"sidecar_allocs_per_delivery,omitempty"`
	GCs              uint32      `json:"sidecar_gcs"`
	RSSStart         int64       `json:"sidecar_rss_start_bytes"`
	RSSEnd           int64       `json:"sidecar_rss_end_bytes"`
	HeapStart        uint64      `json:"sidecar_heap_start_bytes"`
	HeapEnd          uint64      `json:"sidecar_heap_end_bytes"`
	Receipt          *latSummary `json:"publish_to_receipt,omitempty"`
	ReceiptDropped   int64       `json:"publish_to_receipt_dropped,omitempty"`
	DrainSeconds     float64     `json:"drain_seconds,omitempty"`
	Drained          *bool       `json:"drained,omitempty"`
	Profiles         []string    `json:"profiles,omitempty"`
	Errors           []string    `json:"errors,omitempty"`
}

// winOpts says what a sidecar window records besides the defaults.
type winOpts struct {
	// Receipt records publish→receipt latency at the receiver for events
	// sent in the window, and after the window waits (up to Drain) until
	// the receiver has every delivery of the events accepted so far.
	Receipt bool
	Drain   time.Duration
	// ReceiptPaths, when set, records latency only for deliveries to the
	// paths /s<i> with ReceiptPaths[i] true.
	ReceiptPaths []bool
	// Tick, when set, is called after the window's own snapshot at its
	// start (0) and end (1).
	Tick func(phase int)
	// AfterLoad, when set, runs once the producers stopped and before the
	// latency window closes, instead of the Drain wait.
	AfterLoad func()
}

// sidecarWindow runs one load against a sidecar and measures it. The
// events the producers got accepted are added to sc.accepted.
func (h *harness) sidecarWindow(ctx context.Context, sc *sidecar, name string, spec loadSpec, o winOpts) *window {
	w := &window{
		Name: name, Scenario: sc.spec.Name, Subscriptions: sc.spec.subscriptions(), Durability: sc.spec.Durability,
		Producers: spec.Conc, RateOffered: spec.Rate, BodyBytes: spec.Body,
	}
	spec.Addr, spec.Paths, spec.Status, spec.Keys = sc.ingest, []string{eventsPath}, 202, true
	spec.KeyID = h.runID + "-" + h.nextID("k")
	if spec.Start.IsZero() {
		spec.Start = time.Now()
	}
	if spec.Warmup == 0 {
		spec.Warmup = h.opts.warmup
	}
	if spec.Dur == 0 {
		spec.Dur = h.opts.duration
	}
	winStart := spec.Start.Add(spec.Warmup)
	var rec *latRecorder
	if o.Receipt {
		// Enough slots for this window's deliveries at 250k/s.
		rec = h.recv.startRecording(winStart, int(math.Min(4e6, math.Max(1e4, spec.Dur.Seconds()*250e3))), o.ReceiptPaths)
	}
	var (
		s0, s1  snap
		profErr = make(chan error, 1)
		profWG  sync.WaitGroup
	)
	cpuPath := ""
	if h.opts.profileDir != "" {
		cpuPath = filepath.Join(h.opts.profileDir, name+".cpu.pprof")
	}
	spec.Tick = func(phase int) {
		if phase == 0 {
			s0 = h.snapshot(sc.pid, sc)
			if cpuPath != "" {
				secs := max(1, int(math.Round(spec.Dur.Seconds())))
				profWG.Go(func() { profErr <- sc.profile(cpuPath, secs) })
			}
		} else {
			s1 = h.snapshot(sc.pid, sc)
		}
		if o.Tick != nil {
			o.Tick(phase)
		}
	}
	w.Load = runLoad(ctx, spec)
	sc.accepted += w.Load.OK
	if w.Load.FirstErr != "" {
		w.Errors = append(w.Errors, "producer: "+w.Load.FirstErr)
	}
	if o.AfterLoad != nil {
		o.AfterLoad()
	}
	if o.Receipt {
		if o.Drain > 0 && o.AfterLoad == nil {
			w.drain(ctx, h, sc, sc.accepted, o.Drain)
		}
		lat := h.recv.stopRecording(rec)
		sum := summarize(lat)
		w.Receipt, w.ReceiptDropped = &sum, rec.dropped.Load()
	}
	profWG.Wait()
	if cpuPath != "" {
		if err := <-profErr; err != nil {
			w.Errors = append(w.Errors, "cpu profile: "+err.Error())
		} else {
			w.Profiles = append(w.Profiles, cpuPath)
		}
		ap := filepath.Join(h.opts.profileDir, name+".allocs.pprof")
		if err := sc.allocsProfile(ap); err != nil {
			w.Errors = append(w.Errors, "allocs profile: "+err.Error())
		} else {
			w.Profiles = append(w.Profiles, ap)
		}
	}
	w.fill(s0, s1)
	if !sc.running() {
		w.Errors = append(w.Errors, fmt.Sprintf("sidecar exited during the window: %v", sc.err))
	}
	h.rep.Windows = append(h.rep.Windows, w)
	h.logf("  %-22s %8.0f events/s  %9.0f deliveries/s  cpu %6.1f µs/event  P99 %.2f ms%s",
		name, w.Load.PerSec, w.DeliveriesPerSec, w.CPUPerEventUs, w.Load.Lat.P99, receiptNote(w))
	return w
}

func receiptNote(w *window) string {
	if w.Receipt == nil {
		return ""
	}
	return fmt.Sprintf("  receipt P50 %.2f P99 %.2f max %.1f ms", w.Receipt.P50, w.Receipt.P99, w.Receipt.Max)
}

// drain waits until the receiver has accepted×fan-out deliveries since the
// sidecar started.
func (w *window) drain(ctx context.Context, h *harness, sc *sidecar, accepted int64, timeout time.Duration) {
	fan := int64(activeSubs(sc.spec))
	start := time.Now()
	ok := waitFor(ctx, timeout, func() bool {
		return h.recv.delivered()-sc.recvStart >= accepted*fan
	})
	w.DrainSeconds = time.Since(start).Seconds()
	w.Drained = &ok
	if !ok {
		w.Errors = append(w.Errors, fmt.Sprintf("deliveries not drained after %s: %d of %d",
			timeout, h.recv.delivered()-sc.recvStart, accepted*fan))
	}
}

// activeSubs counts the subscriptions that match bench.event.
func activeSubs(spec sidecarSpec) int {
	n := 0
	for _, g := range spec.Subs {
		if g.Type == benchType || g.Type == "*" {
			n += g.Count
		}
	}
	return n
}

func (w *window) fill(s0, s1 snap) {
	for _, s := range []snap{s0, s1} {
		if s.Err != nil {
			w.Errors = append(w.Errors, "snapshot: "+s.Err.Error())
		}
	}
	if s0.T.IsZero() || s1.T.IsZero() {
		w.Errors = append(w.Errors, "window not measured (interrupted)")
		return
	}
	w.Seconds = s1.T.Sub(s0.T).Seconds()
	w.Deliveries = s1.Recv - s0.Recv
	w.DeliveriesPerSec = float64(w.Deliveries) / w.Seconds
	cpu := s1.CPU - s0.CPU
	w.CPUms = float64(cpu) / 1e6
	w.CPUCores = cpu.Seconds() / w.Seconds
	w.HarnessCPUms = float64(s1.Self-s0.Self) / 1e6
	w.AllocBytes = s1.MS.TotalAlloc - s0.MS.TotalAlloc
	w.Mallocs = s1.MS.Mallocs - s0.MS.Mallocs
	w.GCs = s1.MS.NumGC - s0.MS.NumGC
	w.RSSStart, w.RSSEnd = s0.RSS, s1.RSS
	w.HeapStart, w.HeapEnd = s0.MS.HeapAlloc, s1.MS.HeapAlloc
	if ev := w.Load.WinOK; ev > 0 {
		w.CPUPerEventUs = float64(cpu) / 1e3 / float64(ev)
		w.BytesPerEvent = float64(w.AllocBytes) / float64(ev)
		w.AllocsPerEvent = float64(w.Mallocs) / float64(ev)
	}
	if d := w.Deliveries; d > 0 {
		w.CPUPerDelivUs = float64(cpu) / 1e3 / float64(d)
		w.BytesPerDeliv = float64(w.AllocBytes) / float64(d)
		w.AllocsPerDeliv = float64(w.Mallocs) / float64(d)
	}
}
