package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// snap is the state of the measured processes at one instant.
type snap struct {
	T    time.Time
	CPU  time.Duration // the measured child (sidecar or no-op server); a fleet's nodes summed
	Self time.Duration // the harness: producers, receiver
	RSS  int64
	MS   memStats
	Recv int64
	Err  error
	// NodeCPU is each node's CPU (in target order) when the target is a
	// fleet; NATS the JetStream cluster's process, when one runs.
	NodeCPU []time.Duration
	NATS    time.Duration
	// Sys is the system part of CPU; Wake the measured processes'
	// context switches and read/write syscalls (summed over nodes).
	Sys  time.Duration
	Wake wakeups
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

// snapshotTarget is snapshot for every node of t (CPU, RSS and memstats
// summed) and the NATS cluster's CPU.
func (h *harness) snapshotTarget(t *target) snap {
	s := snap{T: time.Now(), Recv: h.recv.delivered()}
	for _, sc := range t.nodes {
		c, err := procTimes(sc.pid)
		if err != nil && s.Err == nil {
			s.Err = err
		}
		s.CPU += c.User + c.Sys
		s.Sys += c.Sys
		s.NodeCPU = append(s.NodeCPU, c.User+c.Sys)
	}
	if t.nats != nil {
		s.NATS, _ = procCPU(t.nats.pid)
	}
	s.Self, _ = procCPU(os.Getpid())
	for _, sc := range t.nodes {
		if wk, err := procWakeups(sc.pid); err == nil {
			s.Wake.add(wk)
		}
		rss, _ := procRSS(sc.pid)
		s.RSS += rss
		ms, err := sc.memstats()
		if err != nil && s.Err == nil {
			s.Err = err
		}
		s.MS.TotalAlloc += ms.TotalAlloc
		s.MS.Mallocs += ms.Mallocs
		s.MS.HeapAlloc += ms.HeapAlloc
		s.MS.HeapInuse += ms.HeapInuse
		s.MS.Sys += ms.Sys
		s.MS.NumGC += ms.NumGC
	}
	return s
}

// target is what one window loads and measures: one sidecar, or the nodes
// of a fleet (producers spread over their ingest listeners; CPU and
// allocations summed), with the NATS cluster's CPU beside them when one
// runs.
type target struct {
	nodes []*sidecar
	nats  *natsCluster // nil: none running
	// recvStart is the receiver's count when the target was ready;
	// accepted counts the events its producers got a 202 for, so far.
	recvStart int64
	accepted  *int64
}

// single is the target of one sidecar.
func (h *harness) single(sc *sidecar) *target {
	return &target{nodes: []*sidecar{sc}, nats: h.natsRunning(), recvStart: sc.recvStart, accepted: &sc.accepted}
}

// window is one measured interval of a sidecar under load, with every
// number the scenario may report. Per-delivery figures divide by the
// deliveries the receiver counted between the two snapshots; per-event
// figures by the 202s the producers got in the window.
type window struct {
	Name             string     `json:"name"`
	Scenario         string     `json:"scenario"`
	Subscriptions    int        `json:"subscriptions"`
	Durability       string     `json:"durability"`
	Producers        int        `json:"producers"`
	RateOffered      float64    `json:"rate_offered_per_s,omitempty"`
	BodyBytes        int        `json:"body_bytes"`
	Load             loadResult `json:"producer"`
	Seconds          float64    `json:"seconds"`
	Deliveries       int64      `json:"deliveries"`
	DeliveriesPerSec float64    `json:"deliveries_per_s"`
	CPUms            float64    `json:"sidecar_cpu_ms"`
	CPUPerEventUs    float64    `json:"sidecar_cpu_us_per_event"`
	CPUPerDelivUs    float64    `json:"sidecar_cpu_us_per_delivery,omitempty"`
	CPUCores         float64    `json:"sidecar_cpu_cores"`
	SysCPUms         float64    `json:"sidecar_sys_cpu_ms"`
	// Per delivery (per accepted event when nothing was delivered):
	// context switches of the sidecar's threads and its read/write syscalls.
	SwitchesPerDeliv float64     `json:"sidecar_ctx_switches_per_delivery,omitempty"`
	SyscallsPerDeliv float64     `json:"sidecar_rw_syscalls_per_delivery,omitempty"`
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
	Nodes            int         `json:"nodes,omitempty"` // fleet windows: the sidecar figures sum this many nodes
	NodeCPUms        []float64   `json:"node_cpu_ms,omitempty"`
	NATSCPUms        float64     `json:"nats_cpu_ms,omitempty"`
	NATSCores        float64     `json:"nats_cpu_cores,omitempty"`
	NATSPerEventUs   float64     `json:"nats_cpu_us_per_event,omitempty"`
	NATSPerDelivUs   float64     `json:"nats_cpu_us_per_delivery,omitempty"`
	Receipt          *latSummary `json:"publish_to_receipt,omitempty"`
	// ReceiptNet is the same deliveries timed from when the harness
	// actually sent each event, not from when it was due: Receipt less
	// the harness's own lateness (open loops).
	ReceiptNet     *latSummary `json:"publish_to_receipt_from_send,omitempty"`
	ReceiptDropped int64       `json:"publish_to_receipt_dropped,omitempty"`
	DrainSeconds   float64     `json:"drain_seconds,omitempty"`
	Drained        *bool       `json:"drained,omitempty"`
	Profiles       []string    `json:"profiles,omitempty"`
	Errors         []string    `json:"errors,omitempty"`
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
	return h.targetWindow(ctx, h.single(sc), name, spec, o)
}

// targetWindow runs one load against t and measures it: the events the
// producers got accepted are added to *t.accepted. With several nodes the
// producers are spread over them (loadSpec.Addrs) and the sidecar figures
// are the nodes' sums.
func (h *harness) targetWindow(ctx context.Context, t *target, name string, spec loadSpec, o winOpts) *window {
	sc := t.nodes[0]
	w := &window{
		Name: name, Scenario: sc.spec.Name, Subscriptions: sc.spec.subscriptions(), Durability: sc.spec.Durability,
		Producers: spec.Conc, RateOffered: spec.Rate, BodyBytes: spec.Body,
	}
	if sc.spec.Fleet != nil {
		w.Durability, w.Nodes = "jetstream", len(t.nodes)
		w.Scenario = strings.TrimSuffix(sc.spec.Name, "."+sc.spec.Fleet.NodeID)
	}
	if len(t.nodes) > 1 {
		spec.Addrs = nil
		for _, n := range t.nodes {
			spec.Addrs = append(spec.Addrs, n.ingest)
		}
	}
	spec = h.asIngest(spec, sc.ingest)
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
	// Profiles: DIR/<window>.cpu.pprof for one sidecar;
	// DIR/<window>.<node id>.cpu.pprof for each node of a fleet, and
	// DIR/<window>.nats.cpu.pprof of the NATS cluster in fleet windows.
	var profs []profTarget
	if h.opts.profileDir != "" {
		for _, n := range t.nodes {
			p := name
			if len(t.nodes) > 1 {
				p += "." + n.spec.Fleet.NodeID
			}
			profs = append(profs, profTarget{sc: n, path: filepath.Join(h.opts.profileDir, p)})
		}
		if t.nats != nil && sc.spec.Fleet != nil {
			profs = append(profs, profTarget{nats: t.nats, path: filepath.Join(h.opts.profileDir, name+".nats")})
		}
	}
	profErr = make(chan error, len(profs))
	spec.Tick = func(phase int) {
		if phase == 0 {
			s0 = h.snapshotTarget(t)
			secs := max(1, int(math.Round(spec.Dur.Seconds())))
			for _, p := range profs {
				profWG.Go(func() { profErr <- p.cpu(secs) })
			}
		} else {
			s1 = h.snapshotTarget(t)
		}
		if o.Tick != nil {
			o.Tick(phase)
		}
	}
	w.Load = runLoad(ctx, spec)
	*t.accepted += w.Load.OK
	if w.Load.FirstErr != "" {
		w.Errors = append(w.Errors, "producer: "+w.Load.FirstErr)
	}
	if o.AfterLoad != nil {
		o.AfterLoad()
	}
	if o.Receipt {
		if o.Drain > 0 && o.AfterLoad == nil {
			w.drain(ctx, h, t, o.Drain)
		}
		lat := h.recv.stopRecording(rec)
		sum, net := summarize(lat), summarize(rec.netSamples())
		w.Receipt, w.ReceiptNet, w.ReceiptDropped = &sum, &net, rec.dropped.Load()
	}
	profWG.Wait()
	for range profs {
		if err := <-profErr; err != nil {
			w.Errors = append(w.Errors, "cpu profile: "+err.Error())
		}
	}
	for _, p := range profs {
		if _, err := os.Stat(p.path + ".cpu.pprof"); err == nil {
			w.Profiles = append(w.Profiles, p.path+".cpu.pprof")
		}
		if p.sc == nil {
			continue
		}
		ap := p.path + ".allocs.pprof"
		if err := p.sc.allocsProfile(ap); err != nil {
			w.Errors = append(w.Errors, "allocs profile: "+err.Error())
		} else {
			w.Profiles = append(w.Profiles, ap)
		}
	}
	w.fill(s0, s1)
	for _, n := range t.nodes {
		if !n.running() {
			w.Errors = append(w.Errors, fmt.Sprintf("sidecar %s exited during the window: %v", n.spec.Name, n.err))
		}
	}
	h.rep.Windows = append(h.rep.Windows, w)
	nats := ""
	if w.NATSCPUms > 0 {
		nats = fmt.Sprintf("  nats %.2f cores", w.NATSCores)
	}
	h.logf("  %-22s %8.0f events/s  %9.0f deliveries/s  cpu %6.1f µs/event (%.2f cores)%s  P99 %.2f ms%s",
		name, w.Load.PerSec, w.DeliveriesPerSec, w.CPUPerEventUs, w.CPUCores, nats, w.Load.Lat.P99, receiptNote(w))
	return w
}

// profTarget is one process a window profiles: a sidecar, or the NATS
// cluster (nats set). path is the profile's name without ".cpu.pprof".
type profTarget struct {
	sc   *sidecar
	nats *natsCluster
	path string
}

func (p profTarget) cpu(secs int) error {
	if p.nats != nil {
		return p.nats.profile(p.path+".cpu.pprof", secs)
	}
	return p.sc.profile(p.path+".cpu.pprof", secs)
}

func receiptNote(w *window) string {
	if w.Receipt == nil {
		return ""
	}
	return fmt.Sprintf("  receipt P50 %.2f P99 %.2f max %.1f ms", w.Receipt.P50, w.Receipt.P99, w.Receipt.Max)
}

// drain waits until the receiver has accepted×fan-out deliveries since the
// target was ready.
func (w *window) drain(ctx context.Context, h *harness, t *target, timeout time.Duration) {
	fan := int64(activeSubs(t.nodes[0].spec))
	accepted := *t.accepted
	start := time.Now()
	ok := waitFor(ctx, timeout, func() bool {
		return h.recv.delivered()-t.recvStart >= accepted*fan
	})
	w.DrainSeconds = time.Since(start).Seconds()
	w.Drained = &ok
	if !ok {
		w.Errors = append(w.Errors, fmt.Sprintf("deliveries not drained after %s: %d of %d",
			timeout, h.recv.delivered()-t.recvStart, accepted*fan))
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
	w.SysCPUms = float64(s1.Sys-s0.Sys) / 1e6
	per := w.Deliveries
	if per == 0 {
		per = w.Load.WinOK
	}
	if per > 0 {
		w.SwitchesPerDeliv = float64(s1.Wake.switches()-s0.Wake.switches()) / float64(per)
		w.SyscallsPerDeliv = float64(s1.Wake.syscalls()-s0.Wake.syscalls()) / float64(per)
	}
	w.HarnessCPUms = float64(s1.Self-s0.Self) / 1e6
	w.AllocBytes = s1.MS.TotalAlloc - s0.MS.TotalAlloc
	w.Mallocs = s1.MS.Mallocs - s0.MS.Mallocs
	w.GCs = s1.MS.NumGC - s0.MS.NumGC
	w.RSSStart, w.RSSEnd = s0.RSS, s1.RSS
	w.HeapStart, w.HeapEnd = s0.MS.HeapAlloc, s1.MS.HeapAlloc
	if len(s1.NodeCPU) > 1 {
		for i := range s1.NodeCPU {
			if i < len(s0.NodeCPU) {
				w.NodeCPUms = append(w.NodeCPUms, float64(s1.NodeCPU[i]-s0.NodeCPU[i])/1e6)
			}
		}
	}
	nats := s1.NATS - s0.NATS
	w.NATSCPUms, w.NATSCores = float64(nats)/1e6, nats.Seconds()/w.Seconds
	if ev := w.Load.WinOK; ev > 0 {
		w.NATSPerEventUs = float64(nats) / 1e3 / float64(ev)
	}
	if d := w.Deliveries; d > 0 {
		w.NATSPerDelivUs = float64(nats) / 1e3 / float64(d)
	}
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

// memPeaks samples a process's resident memory every 100 ms while a window
// runs (tick is its winOpts.Tick) and keeps the highest reading of each
// figure: the window's own peak, where VmHWM holds the process's whole
// life, start-up included. The peaks of RSS, Anon and File need not come
// from the same reading.
type memPeaks struct {
	pid  int
	stop chan struct{}
	wg   sync.WaitGroup
	peak memUse // HWM not used
	n    int    // readings
}

func (m *memPeaks) tick(phase int) {
	if phase == 0 {
		m.stop = make(chan struct{})
		m.wg.Go(m.sample)
		return
	}
	if m.stop != nil { // nil: the window ended before it began (interrupted)
		close(m.stop)
		m.wg.Wait()
	}
}

func (m *memPeaks) sample() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		m.read()
		select {
		case <-m.stop:
			m.read()
			return
		case <-t.C:
		}
	}
}

func (m *memPeaks) read() {
	u, err := procMem(m.pid)
	if err != nil {
		return
	}
	m.n++
	m.peak.RSS = max(m.peak.RSS, u.RSS)
	m.peak.Anon = max(m.peak.Anon, u.Anon)
	m.peak.File = max(m.peak.File, u.File)
}
