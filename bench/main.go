// Command bench measures the sluice sidecar against the ceilings of the
// machine it runs on, in the same run. It starts the sidecar as a
// real child process on a real data directory, an in-process fasthttp
// receiver, closed- and open-loop producers, and four baselines (a no-op
// fasthttp server, a bare Badger group-commit appender, a bare fasthttp
// client→server loop and a naive synchronous fan-out producer), then prints
// a table of ratios against those baselines and writes every number to a
// JSON file.
//
//	go run ./bench                          # every scenario, about 6-7 minutes
//	go run ./bench -quick                   # CI smoke run, about 110 s
//	go run ./bench -scenarios fanout-10 -profile prof/
//
// Everything listens on 127.0.0.1. Every load loop is bounded in time and in
// count and stops by itself; children are stopped (SIGTERM, then SIGKILL)
// when a scenario ends or the harness is interrupted. The machine is assumed
// to be shared and noisy: read ratios against the baselines of the same run,
// never absolute figures against another run. See bench/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Scenario names, in the order they run.
var allScenarios = []string{
	"ingest-fsync", "ingest-async", "ingest-batch", "fanout-1", "sidecar", "fanout-10", "fanout-40",
	"latency", "lanes-50k", "api", "payload", "blackhole", "outage",
	"fleet-ingest", "sidecar-fleet", "fleet-fanout-10", "fleet-latency", "fleet-takeover", "fleet-scale",
}

// defaultScenarios run without -scenarios: all but the fleet ones, which
// start a JetStream cluster and several sidecars and roughly double the
// run (-scenarios fleet selects them all, -scenarios all everything).
var defaultScenarios = slices.DeleteFunc(slices.Clone(allScenarios), func(s string) bool {
	return slices.Contains(fleetScenarios, s)
})

// options are the command-line flags after defaults and -quick are applied.
type options struct {
	scenarios    []string
	duration     time.Duration // one measurement window
	warmup       time.Duration // run before each window, not measured
	quick        bool
	jsonPath     string
	profileDir   string
	sluicePath   string
	lanes        int           // subscriptions of lanes-50k
	lanesRate    float64       // events/s of the lanes-50k steady phase
	payloadRate  float64       // events/s of the paced payload runs
	pacedRate    float64       // events/s of fanout-1's paced windows and sidecar's low one
	startTimeout time.Duration // process start → /readyz 200
	idle         time.Duration // idle CPU window of lanes-50k
	settle       time.Duration // longest wait for a sidecar to go quiet after /readyz
	keep         bool          // keep the temp dir (configs, logs)
	args         []string
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the exit, so the test can call it. Arguments starting
// with "_" are the hidden child subcommands (see children.go).
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && strings.HasPrefix(args[0], "_") {
		return childMain(args, stdout, stderr)
	}
	opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	h, err := newHarness(opts, stdout, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	err = h.run(ctx)
	h.close()
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scen := fs.String("scenarios", strings.Join(defaultScenarios, ","), "comma-separated scenarios to run; \"fleet\" = every fleet-mode scenario (fleet-*, sidecar-fleet), \"all\" = every scenario")
	dur := fs.Duration("duration", 5*time.Second, "length of each measurement window")
	warm := fs.Duration("warmup", 0, "unmeasured run before each window (default 1s, 300ms with -quick)")
	quick := fs.Bool("quick", false, "short windows, 5,000 instead of 50,000 lanes, shorter isolation phases (CI smoke run, about 110 s)")
	jsonPath := fs.String("json", "bench-out/results.json", "where to write every number")
	prof := fs.String("profile", "", "write the sidecar's CPU and allocation profiles of each window to this directory")
	sluice := fs.String("sluice", "", "prebuilt sluice binary (default: go build ./cmd/sluice into a temp dir)")
	lanes := fs.Int("lanes", 0, "subscriptions of lanes-50k (default 50000, 5000 with -quick); 1% of them active")
	lanesRate := fs.Float64("lanes-rate", 20, "events/s offered in the steady phase of lanes-50k (each goes to 1% of the lanes: 20/s × 500 = 10k deliveries/s)")
	payloadRate := fs.Float64("payload-rate", 200, "events/s of the paced payload runs (fan-out 10)")
	pacedRate := fs.Float64("paced-rate", 200, "events/s of fanout-1's paced windows (low load: CPU per delivery vs saturated) and of sidecar's low paced window")
	startTimeout := fs.Duration("start-timeout", 60*time.Second, "how long a sidecar may take to answer /readyz")
	keep := fs.Bool("keep", false, "keep the temp dir with generated configs and sidecar logs")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run ./bench [flags]\n\nscenarios: %s\n\n", strings.Join(allScenarios, ", "))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	o := &options{
		duration: *dur, warmup: *warm, quick: *quick, jsonPath: *jsonPath, profileDir: *prof,
		sluicePath: *sluice, lanes: *lanes, lanesRate: *lanesRate, payloadRate: *payloadRate, pacedRate: *pacedRate,
		startTimeout: *startTimeout, idle: 2 * time.Second, settle: 15 * time.Second, keep: *keep, args: args,
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.quick {
		if !set["duration"] {
			o.duration = time.Second
		}
		if !set["start-timeout"] {
			o.startTimeout = 20 * time.Second
		}
		o.idle, o.settle = time.Second, 5*time.Second
	}
	if o.warmup <= 0 {
		o.warmup = time.Second
		if o.quick {
			o.warmup = 300 * time.Millisecond
		}
	}
	if o.lanes <= 0 {
		o.lanes = 50000
		if o.quick {
			o.lanes = 5000
		}
	}
	if o.duration < 200*time.Millisecond || o.duration > 10*time.Minute {
		return nil, fmt.Errorf("-duration %s: want 200ms to 10m", o.duration)
	}
	if o.lanes < 100 || o.lanes > 200000 {
		return nil, fmt.Errorf("-lanes %d: want 100 to 200000", o.lanes)
	}
	if o.lanesRate <= 0 || o.payloadRate <= 0 || o.pacedRate <= 0 {
		return nil, errors.New("-lanes-rate, -payload-rate and -paced-rate must be positive")
	}
	for _, s := range strings.Split(*scen, ",") {
		s = strings.TrimSpace(s)
		var names []string
		switch s {
		case "":
			continue
		case "all":
			names = allScenarios
		case "fleet":
			names = fleetScenarios
		default:
			if !slices.Contains(allScenarios, s) {
				return nil, fmt.Errorf("unknown scenario %q (have %s; fleet, all)", s, strings.Join(allScenarios, ", "))
			}
			names = []string{s}
		}
		for _, s := range names {
			if !slices.Contains(o.scenarios, s) {
				o.scenarios = append(o.scenarios, s)
			}
		}
	}
	if len(o.scenarios) == 0 {
		return nil, errors.New("no scenario selected")
	}
	// Run in the canonical order whatever order they were given in.
	slices.SortFunc(o.scenarios, func(a, b string) int {
		return slices.Index(allScenarios, a) - slices.Index(allScenarios, b)
	})
	return o, nil
}

// harness owns everything one run starts: the temp dir, the sluice binary,
// the receiver, the children, and the report.
type harness struct {
	opts   *options
	stdout io.Writer
	log    io.Writer
	begin  time.Time
	tmp    string
	sluice string
	recv   *receiver
	rep    *report
	runID  string

	mu       sync.Mutex
	children map[*child]bool

	// baselines already measured, by name (see baselines.go).
	base map[string]*baselineResult
	seq  int // for nextID

	// natsCl is the JetStream cluster of the fleet scenarios, started by
	// the first of them (fleetcluster.go); guarded by mu.
	natsCl *natsCluster
	// badgerLat50 is the latency scenario's publish→receipt at 50% load,
	// which fleet-latency compares with when both run.
	badgerLat50 *latSummary
}

func newHarness(opts *options, stdout, stderr io.Writer) (*harness, error) {
	h := &harness{
		opts: opts, stdout: stdout, log: stderr, begin: time.Now(),
		children: map[*child]bool{}, base: map[string]*baselineResult{},
		runID: fmt.Sprintf("r%x", time.Now().UnixNano()&0xffffffffff),
	}
	h.rep = newReport(opts)
	var err error
	if h.tmp, err = os.MkdirTemp("", "sluice-bench-*"); err != nil {
		return nil, err
	}
	if opts.profileDir != "" {
		if err := os.MkdirAll(opts.profileDir, 0o755); err != nil {
			return nil, err
		}
	}
	initClockTicks()
	return h, nil
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.log, "[%6.1fs] %s\n", time.Since(h.begin).Seconds(), fmt.Sprintf(format, args...))
}

func (h *harness) run(ctx context.Context) error {
	h.rep.Machine = machineInfo()
	if err := h.buildSluice(ctx); err != nil {
		return err
	}
	h.rep.Sluice = h.sluice
	h.rep.Machine.SluiceVersion = sluiceVersion(h.sluice)
	var err error
	if h.recv, err = newReceiver(); err != nil {
		return fmt.Errorf("receiver: %w", err)
	}
	h.logf("receiver on %s; scenarios %s; window %s (+%s warm-up)", h.recv.addr,
		strings.Join(h.opts.scenarios, ","), h.opts.duration, h.opts.warmup)

	// Baselines first, each once, so their rows lead the table.
	for _, b := range h.neededBaselines() {
		if ctx.Err() != nil {
			break
		}
		h.runBaseline(ctx, b)
	}
	for _, s := range h.opts.scenarios {
		if ctx.Err() != nil {
			break
		}
		h.logf("scenario %s", s)
		start := time.Now()
		if err := h.runScenario(ctx, s); err != nil {
			h.logf("scenario %s: %v", s, err)
			h.rep.fail(s, err)
		}
		h.rep.ScenarioSeconds[s] = time.Since(start).Seconds()
	}
	h.addModel() // model.go: the platform past this machine, from this run's figures
	h.rep.TotalSeconds = time.Since(h.begin).Seconds()
	h.rep.printTable(h.stdout)
	if err := h.rep.writeJSON(h.opts.jsonPath); err != nil {
		return fmt.Errorf("write %s: %w", h.opts.jsonPath, err)
	}
	h.logf("wrote %s", h.opts.jsonPath)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// Missed targets are results; a scenario that could not be measured is
	// an error (exit 1), so a smoke run catches a broken harness or sidecar.
	if n := len(h.rep.Failures); n > 0 {
		return fmt.Errorf("%d scenario(s) could not be measured", n)
	}
	return nil
}

func (h *harness) runScenario(ctx context.Context, name string) error {
	switch name {
	case "ingest-fsync":
		return h.scenarioIngest(ctx, name, "fsync")
	case "ingest-async":
		return h.scenarioIngest(ctx, name, "async")
	case "ingest-batch":
		return h.scenarioIngestBatch(ctx, name, "fsync")
	case "fanout-1":
		return h.scenarioFanout(ctx, name, 1)
	case "sidecar":
		return h.scenarioSidecar(ctx, name)
	case "fanout-10":
		return h.scenarioFanout(ctx, name, 10)
	case "fanout-40":
		return h.scenarioFanout(ctx, name, 40)
	case "latency":
		return h.scenarioLatency(ctx, name)
	case "lanes-50k":
		return h.scenarioLanes(ctx, name)
	case "api":
		return h.scenarioAPI(ctx, name)
	case "payload":
		return h.scenarioPayload(ctx, name)
	case "blackhole":
		return h.scenarioBlackhole(ctx, name)
	case "outage":
		return h.scenarioOutage(ctx, name)
	case "fleet-ingest":
		return h.scenarioFleetIngest(ctx, name)
	case "sidecar-fleet":
		return h.scenarioSidecarFleet(ctx, name)
	case "fleet-fanout-10":
		return h.scenarioFleetFanout(ctx, name, []int{fleetNodes}, true)
	case "fleet-scale":
		return h.scenarioFleetFanout(ctx, name, []int{1, 2, 3}, false)
	case "fleet-latency":
		return h.scenarioFleetLatency(ctx, name)
	case "fleet-takeover":
		return h.scenarioFleetTakeover(ctx, name)
	}
	return fmt.Errorf("unknown scenario %q", name)
}

// close stops every child still running and removes the temp dir.
func (h *harness) close() {
	h.mu.Lock()
	cs := make([]*child, 0, len(h.children))
	for c := range h.children {
		if h.natsCl == nil || c != h.natsCl.child {
			cs = append(cs, c)
		}
	}
	nc := h.natsCl
	h.mu.Unlock()
	for _, c := range cs {
		c.stop(5 * time.Second)
	}
	// The cluster last: sidecars still running want their log.
	if nc != nil {
		nc.close()
	}
	if h.recv != nil {
		h.recv.close()
	}
	if h.opts.keep {
		h.logf("kept %s", h.tmp)
	} else if h.tmp != "" {
		os.RemoveAll(h.tmp)
	}
}

// buildSluice builds ./cmd/sluice of the module bench belongs to, unless
// -sluice names a binary.
func (h *harness) buildSluice(ctx context.Context) error {
	if h.opts.sluicePath != "" {
		p, err := filepath.Abs(h.opts.sluicePath)
		if err != nil {
			return err
		}
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("-sluice: %w", err)
		}
		h.sluice = p
		return nil
	}
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return errors.New("not inside the sluice module: run from the repository or pass -sluice")
	}
	h.sluice = filepath.Join(h.tmp, "sluice")
	bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(bctx, "go", "build", "-o", h.sluice, "./cmd/sluice")
	cmd.Dir = filepath.Dir(gomod)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/sluice: %w\n%s", err, b)
	}
	h.logf("built %s in %s", h.sluice, time.Since(start).Round(time.Millisecond))
	return nil
}

// nextID returns a short unique name for data dirs, keys and logs.
func (h *harness) nextID(prefix string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	return fmt.Sprintf("%s-%d", prefix, h.seq)
}
