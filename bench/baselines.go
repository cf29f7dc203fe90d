package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Baselines are measured once per run, before the scenarios, so every
// ratio in the table compares figures taken minutes apart on the same
// machine rather than against a number from elsewhere.
const (
	baseNoopIngest    = "noop-ingest"
	baseClientServer  = "client-server"
	baseAppender      = "badger-appender"
	baseAppenderAsync = "badger-appender-nosync"
	baseNaivePrefix   = "naive-fanout-"
)

// baselineResult is one baseline's numbers.
type baselineResult struct {
	Name string `json:"name"`
	// PerSec is requests/s (noop-ingest, client-server), appends/s
	// (appenders) or deliveries/s (naive fan-out).
	PerSec float64 `json:"per_s"`
	// CPUPerOpUs is CPU µs per request of the no-op server alone
	// (noop-ingest), of client and server together (client-server), of the
	// appender process per append, or of the harness per delivery (naive
	// fan-out: producers and receiver).
	CPUPerOpUs float64            `json:"cpu_us_per_op"`
	Latency    latSummary         `json:"latency"`
	Load       *loadResult        `json:"producer,omitempty"`
	Extra      map[string]float64 `json:"extra,omitempty"`
	Seconds    float64            `json:"seconds"`
	Err        string             `json:"error,omitempty"`
}

func naiveName(n int) string { return baseNaivePrefix + strconv.Itoa(max(n, 10)) }

// neededBaselines lists the baselines the selected scenarios compare with.
func (h *harness) neededBaselines() []string {
	var out []string
	add := func(b string) {
		for _, x := range out {
			if x == b {
				return
			}
		}
		out = append(out, b)
	}
	for _, s := range h.opts.scenarios {
		switch s {
		case "ingest-fsync":
			add(baseNoopIngest)
			add(baseAppender)
		case "ingest-async":
			add(baseNoopIngest)
			add(baseAppenderAsync)
		case "ingest-batch":
			add(baseAppender)
		case "latency":
			add(baseAppender) // the disk's own P99 saturated, for context beside the open-loop one (scenarioLatency)
		case "fanout-1", "fanout-10", "fanout-40":
			add(baseClientServer)
			n, _ := strconv.Atoi(strings.TrimPrefix(s, "fanout-"))
			add(naiveName(n))
		}
	}
	return out
}

func (h *harness) runBaseline(ctx context.Context, name string) {
	h.logf("baseline %s", name)
	var b *baselineResult
	var err error
	switch {
	case name == baseNoopIngest || name == baseClientServer:
		b, err = h.baselineNoop(ctx, name)
	case name == baseAppender:
		b, err = h.baselineAppender(ctx, name, true)
	case name == baseAppenderAsync:
		b, err = h.baselineAppender(ctx, name, false)
	case strings.HasPrefix(name, baseNaivePrefix):
		n, _ := strconv.Atoi(strings.TrimPrefix(name, baseNaivePrefix))
		b, err = h.baselineNaive(ctx, name, n)
	default:
		err = fmt.Errorf("unknown baseline %q", name)
	}
	if b == nil {
		b = &baselineResult{Name: name}
	}
	if err != nil {
		b.Err = err.Error()
		h.logf("baseline %s: %v", name, err)
	}
	h.base[name] = b
	h.rep.Baselines[name] = b
	h.baselineRows(b)
}

// baselineNoop loads the no-op server child: like the sidecar's ingest for
// noop-ingest (64 producers, Idempotency-Key, 202), and as a plain POST of
// 512 bytes for client-server, whose CPU per exchange counts the harness
// (client) and the child (server) together.
func (h *harness) baselineNoop(ctx context.Context, name string) (*baselineResult, error) {
	c, addr, err := h.startNoop(name)
	if err != nil {
		return nil, err
	}
	defer c.stop(5 * time.Second)
	spec := loadSpec{Addr: addr, Conc: 64, Body: 512, Warmup: h.opts.warmup, Dur: h.opts.duration}
	if name == baseNoopIngest {
		spec = h.asIngest(spec, addr)
	} else {
		spec.Paths, spec.Status = []string{"/s0"}, 200
	}
	var s0, s1 snap
	spec.Tick = func(phase int) {
		if phase == 0 {
			s0 = h.snapshot(c.pid, nil)
		} else {
			s1 = h.snapshot(c.pid, nil)
		}
	}
	res := runLoad(ctx, spec)
	b := &baselineResult{Name: name, PerSec: res.PerSec, Latency: res.Lat, Load: &res, Seconds: res.Seconds}
	if res.WinOK == 0 || s1.T.IsZero() {
		return b, fmt.Errorf("no answers: %s", res.FirstErr)
	}
	server := float64(s1.CPU-s0.CPU) / 1e3 / float64(res.WinOK)
	client := float64(s1.Self-s0.Self) / 1e3 / float64(res.WinOK)
	b.Extra = map[string]float64{"server_cpu_us_per_request": server, "client_cpu_us_per_request": client}
	if name == baseNoopIngest {
		b.CPUPerOpUs = server
	} else {
		b.CPUPerOpUs = server + client
	}
	h.logf("  %-22s %8.0f req/s  cpu %5.1f µs (server %.1f, client %.1f)  P99 %.2f ms",
		name, b.PerSec, b.CPUPerOpUs, server, client, res.Lat.P99)
	if name == baseClientServer && slices.Contains(h.opts.scenarios, "fanout-1") && ctx.Err() == nil {
		h.noopPaced(ctx, c, spec, b)
	}
	return b, nil
}

// startNoop starts the no-op server child and returns it with the address
// it announced; the caller stops it.
func (h *harness) startNoop(name string) (*child, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	lw := newLineWriter()
	c, err := h.startChild(name, self, []string{"_noop", "-listen", "127.0.0.1:0", "-max-life", "10m"},
		filepath.Join(h.tmp, h.nextID(name)+".log"), lw)
	if err != nil {
		return nil, "", err
	}
	line, err := firstLine(c, lw, 10*time.Second)
	if err != nil {
		c.stop(5 * time.Second)
		return nil, "", err
	}
	addr, ok := strings.CutPrefix(line, "listening ")
	if !ok {
		c.stop(5 * time.Second)
		return nil, "", fmt.Errorf("no-op server said %q", line)
	}
	return c, addr, nil
}

// asIngest points spec at addr the way producers post to a sidecar's
// ingest: POST /v1/events/bench.event with a unique Idempotency-Key per
// event, answered 202.
func (h *harness) asIngest(spec loadSpec, addr string) loadSpec {
	spec.Addr, spec.Paths, spec.Status, spec.Keys = addr, []string{eventsPath}, 202, true
	if spec.Batch > 1 {
		spec.Paths = []string{batchPath}
	}
	spec.KeyID = h.runID + "-" + h.nextID("k")
	return spec
}

// noopPaced loads the no-op server at -paced-rate requests/s: what one
// wake-up per request costs a Go fasthttp server that does nothing, the
// floor under fanout-1's paced CPU per delivery (a delivery is at least
// two such wake-ups: the producer's POST and the endpoint's answer).
func (h *harness) noopPaced(ctx context.Context, c *child, spec loadSpec, b *baselineResult) {
	spec.Conc, spec.Rate, spec.Grace = openWorkers, h.opts.pacedRate, openGrace
	cost, res, ok := noopLoad(ctx, c, spec)
	if !ok {
		return
	}
	b.Extra["paced_server_cpu_us_per_request"] = cost.CPUUs
	b.Extra["paced_server_sys_us_per_request"] = cost.SysUs
	b.Extra["paced_server_ctx_switches_per_request"] = cost.Switches
	h.logf("  %-22s %8.0f req/s  server cpu %5.1f µs per request, paced", b.Name, res.PerSec, cost.CPUUs)
}

// noopCost is what the no-op server child spent per request answered in
// one window.
type noopCost struct {
	CPUUs, SysUs float64 // CPU, and its system part
	Switches     float64 // context switches
	// ResolutionUs is one clock tick of CPU spread over the window's
	// requests: the CPU figures are multiples of it.
	ResolutionUs float64
}

// noopLoad runs spec against the no-op child c and reads the child's CPU
// and context switches at the window's start and end; ok is false when no
// answer came in the window or a reading failed.
func noopLoad(ctx context.Context, c *child, spec loadSpec) (cost noopCost, res loadResult, ok bool) {
	type reading struct {
		t  cpuTimes
		wk wakeups
		ok bool
	}
	var r [2]reading
	spec.Tick = func(phase int) {
		t, err1 := procTimes(c.pid)
		wk, err2 := procWakeups(c.pid)
		r[phase] = reading{t, wk, err1 == nil && err2 == nil}
	}
	res = runLoad(ctx, spec)
	if res.WinOK == 0 || !r[0].ok || !r[1].ok {
		return cost, res, false
	}
	n := float64(res.WinOK)
	cpu := (r[1].t.User + r[1].t.Sys) - (r[0].t.User + r[0].t.Sys)
	return noopCost{
		CPUUs:        float64(cpu) / 1e3 / n,
		SysUs:        float64(r[1].t.Sys-r[0].t.Sys) / 1e3 / n,
		Switches:     float64(r[1].wk.switches()-r[0].wk.switches()) / n,
		ResolutionUs: 1e6 / clockTicks / n,
	}, res, true
}

// baselineAppender runs the bare Badger group-commit appender as a child,
// 64 writers in a closed loop.
func (h *harness) baselineAppender(ctx context.Context, name string, sync bool) (*baselineResult, error) {
	return h.baselineAppenderAt(ctx, name, sync, 0)
}

// baselineAppenderAt runs it in an open loop at rate appends/s (128
// writers, latency from each append's due time) when rate > 0.
func (h *harness) baselineAppenderAt(ctx context.Context, name string, sync bool, rate float64) (*baselineResult, error) {
	dir := filepath.Join(h.tmp, h.nextID(name)+"-data")
	defer os.RemoveAll(dir)
	writers := 64
	if rate > 0 {
		writers = openWorkers
	}
	args := []string{"_appender", "-dir", dir, "-sync=" + strconv.FormatBool(sync), "-writers", strconv.Itoa(writers), "-size", "512",
		"-warmup", h.opts.warmup.String(), "-duration", h.opts.duration.String(), "-rate", strconv.FormatFloat(rate, 'f', 0, 64)}
	var r appenderResult
	if err := h.runChildJSON(ctx, name, "appender", args, h.opts.warmup+h.opts.duration+60*time.Second, &r); err != nil {
		return nil, err
	}
	b := &baselineResult{Name: name, PerSec: r.PerSec, CPUPerOpUs: r.CPUPerAppendUs, Latency: r.Latency, Seconds: r.Seconds,
		Extra: map[string]float64{"mean_batch": r.MeanBatch, "batches_per_s": r.BatchesPerSec}}
	h.logf("  %-22s %8.0f appends/s  cpu %5.1f µs/append  batch %.1f  P99 %.2f ms",
		name, b.PerSec, b.CPUPerOpUs, r.MeanBatch, r.Latency.P99)
	return b, nil
}

// baselineNaive is what sluice replaces: 64 producers that each POST every
// event to n endpoints one after another, and only then go on.
func (h *harness) baselineNaive(ctx context.Context, name string, n int) (*baselineResult, error) {
	paths := make([]string, n)
	for i := range paths {
		paths[i] = "/s" + strconv.Itoa(i)
	}
	spec := loadSpec{Addr: h.recv.addr, Paths: paths, Conc: 64, Body: 512, Status: 200,
		Warmup: h.opts.warmup, Dur: h.opts.duration}
	var s0, s1 snap
	pid := os.Getpid()
	spec.Tick = func(phase int) {
		if phase == 0 {
			s0 = h.snapshot(pid, nil)
		} else {
			s1 = h.snapshot(pid, nil)
		}
	}
	res := runLoad(ctx, spec)
	b := &baselineResult{Name: name, Latency: res.Lat, Load: &res, Seconds: res.Seconds}
	if s1.T.IsZero() || res.WinOK == 0 {
		return b, fmt.Errorf("no answers: %s", res.FirstErr)
	}
	secs := s1.T.Sub(s0.T).Seconds()
	deliv := s1.Recv - s0.Recv
	b.PerSec = float64(deliv) / secs
	if deliv > 0 {
		b.CPUPerOpUs = float64(s1.CPU-s0.CPU) / 1e3 / float64(deliv)
	}
	b.Extra = map[string]float64{"events_per_s": res.PerSec, "fanout": float64(n)}
	h.logf("  %-22s %8.0f deliveries/s  %6.0f events/s  publish P50 %.2f P99 %.2f ms",
		name, b.PerSec, res.PerSec, res.Lat.P50, res.Lat.P99)
	return b, nil
}

// baselineRows adds a baseline's own rows to the table.
func (h *harness) baselineRows(b *baselineResult) {
	r := h.rep
	if b.Err != "" {
		r.add(b.Name, "error", 0, "").note(b.Err)
		return
	}
	switch {
	case b.Name == baseNoopIngest:
		r.add(b.Name, "requests/s (64 producers, 512 B)", b.PerSec, "req/s")
		r.add(b.Name, "server CPU per request", b.CPUPerOpUs, "µs")
		r.add(b.Name, "P99 (saturated)", b.Latency.P99, "ms")
	case b.Name == baseClientServer:
		r.add(b.Name, "requests/s (64 in flight, 512 B)", b.PerSec, "req/s")
		r.add(b.Name, "CPU per exchange (client+server)", b.CPUPerOpUs, "µs")
	case b.Name == baseAppender || b.Name == baseAppenderAsync:
		r.add(b.Name, "appends/s (64 writers, 512 B)", b.PerSec, "/s")
		r.add(b.Name, "CPU per append", b.CPUPerOpUs, "µs")
	case b.Name == baseJSPublish || b.Name == baseJSWindow || b.Name == baseJSFollow:
		what := "publishes/s (64 async publishers, 512 B, R3)"
		switch b.Name {
		case baseJSWindow:
			what = fmt.Sprintf("publishes/s (1 publisher, %d in flight, 512 B, R3)", jsWindow)
		case baseJSFollow:
			what = "publishes/s (64 publishers, each awaiting PubAck and an ordered consumer)"
		}
		r.add(b.Name, what, b.PerSec, "/s").note(fmt.Sprintf("P50 %.2f ms, P99 %.2f ms", b.Latency.P50, b.Latency.P99))
		r.add(b.Name, "publisher CPU per publish", b.CPUPerOpUs, "µs")
		r.add(b.Name, "NATS cluster CPU per publish", b.Extra["nats_cpu_us_per_publish"], "µs").
			note(fmt.Sprintf("%.2f cores busy", b.Extra["nats_cpu_cores"]))
	case strings.HasPrefix(b.Name, baseNaivePrefix):
		r.add(b.Name, "deliveries/s (64 producers)", b.PerSec, "/s")
		r.add(b.Name, "publish P50 (all endpoints)", b.Latency.P50, "ms")
		r.add(b.Name, "publish P99 (all endpoints)", b.Latency.P99, "ms")
	}
}
