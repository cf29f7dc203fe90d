package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
)

// What every generated subscription shares.
const (
	benchSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	benchType   = "bench.event"
	idleType    = "idle.type"
	laneCap     = 64
	eventsPath  = "/v1/events/" + benchType
	batchPath   = "/v1/events" // an NDJSON batch (loadSpec.Batch)
)

// subGroup is Count subscriptions to the receiver with the same types. The
// subscriptions of a sidecar are numbered across groups: s0, s1, ... and
// subscription sN posts to the receiver's /sN.
type subGroup struct {
	Count int
	Type  string
}

// sidecarSpec is what a scenario asks for.
type sidecarSpec struct {
	Name       string
	Durability string // fsync or async
	Subs       []subGroup
	// MaxInFlight sets max_in_flight; 0 leaves the sidecar's default.
	MaxInFlight int
	// MemoryBytes, when set, is the sidecar's memory budget (memory_bytes).
	MemoryBytes int64
	// SubYAML, when set, returns the policy keys of subscription i in flow
	// syntax ("concurrency: {max: 8}, timeout: 5s"), in place of the
	// default "concurrency: {max: 64}".
	SubYAML func(i int) string
	// JSON writes the config as sluice.json instead of YAML (SubYAML must
	// be nil): the form a generated fleet would use, parsed by
	// encoding/json.
	JSON bool
	// Fleet, when set, makes the sidecar a node of a fleet (log.backend:
	// jetstream) on the cluster and stream it names.
	Fleet *fleetNode
	// DataDir, when set, is the data dir to use instead of a fresh one,
	// and stop leaves it: the scenario owns it (api restarts a sidecar on
	// the data dir of an earlier one).
	DataDir string
}

// fleetNode is what a fleet node's config adds.
type fleetNode struct {
	NodeID   string
	URLs     []string
	Stream   string // its own per scenario, so scenarios share no state
	Replicas int
	LeaseTTL time.Duration // 0: the sidecar's default
	// NodeHeader adds headers: {X-Node: <node id>} to every subscription,
	// so the receiver sees which node sent a delivery (fleet-takeover).
	NodeHeader bool
}

// nodeHeader is the header that names the sending node.
const nodeHeader = "X-Node"

func (s sidecarSpec) subscriptions() int {
	n := 0
	for _, g := range s.Subs {
		n += g.Count
	}
	return n
}

// sidecar is a running `sluice serve`.
type sidecar struct {
	*child
	spec     sidecarSpec
	ingest   string // host:port
	admin    string // host:port
	dataDir  string
	cfgPath  string
	logPath  string
	ready    time.Duration // process start → first /readyz 200
	cfgBytes int64
	// api reads the admin API without retries: the harness times start-up
	// and samples lanes, and polls by itself.
	api       *client.Client
	http      *http.Client // the debug paths (expvar, pprof), which are no API
	recvStart int64        // receiver total when the sidecar became ready
	accepted  int64        // events the producers got a 202 for
	// fleetTotals: accepted and recvStart are its fleet's (fleet.stop).
	fleetTotals bool
}

// errNotReady is returned when /readyz did not answer 200 in time.
var errNotReady = errors.New("sidecar not ready")

// startSidecar writes a config, starts `sluice serve --config` and waits for
// /readyz. On a timeout it returns the sidecar (so the caller can measure
// and stop it) together with an error wrapping errNotReady.
func (h *harness) startSidecar(ctx context.Context, spec sidecarSpec) (*sidecar, error) {
	id := h.nextID(spec.Name)
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		s, err := h.tryStartSidecar(ctx, spec, id+"-"+strconv.Itoa(attempt))
		if err == nil || errors.Is(err, errNotReady) || ctx.Err() != nil {
			return s, err
		}
		// The free ports we picked may have been taken in between: retry.
		last = err
		h.logf("%s: start failed (%v), retrying", spec.Name, err)
	}
	return nil, last
}

func (h *harness) tryStartSidecar(ctx context.Context, spec sidecarSpec, id string) (*sidecar, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	s := &sidecar{
		spec:    spec,
		ingest:  "127.0.0.1:" + strconv.Itoa(ports[0]),
		admin:   "127.0.0.1:" + strconv.Itoa(ports[1]),
		dataDir: filepath.Join(h.tmp, id+"-data"),
		cfgPath: filepath.Join(h.tmp, id+".yaml"),
		logPath: filepath.Join(h.tmp, id+".log"),
		// No client-wide timeout: each request carries its own deadline
		// (get's), and a CPU profile of a 30 s window takes longer than
		// any fixed one would allow (it was cut off at 30 s).
		http: &http.Client{},
	}
	if spec.JSON {
		s.cfgPath = filepath.Join(h.tmp, id+".json") // sluice picks the parser by the extension
	}
	if spec.DataDir != "" {
		s.dataDir = spec.DataDir
	}
	if s.api, err = client.New(s.admin, client.Options{RetryMax: -1}); err != nil {
		return nil, err
	}
	if s.cfgBytes, err = h.writeConfig(s); err != nil {
		return nil, err
	}
	c, err := h.startChild(spec.Name, h.sluice, []string{"serve", "--config", s.cfgPath}, s.logPath, nil)
	if err != nil {
		return nil, err
	}
	s.child = c
	ok := waitFor(ctx, h.opts.startTimeout, func() bool {
		if !c.running() {
			return true
		}
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return s.api.Ready(ctx) == nil
	})
	if !c.running() {
		s.stop()
		return nil, fmt.Errorf("sluice exited at start-up: %v: %s", c.err, tail(s.logPath, 2000))
	}
	s.ready = time.Since(c.start)
	s.recvStart = h.recv.delivered()
	if !ok {
		return s, fmt.Errorf("%w: /readyz not 200 after %s (%d subscriptions)", errNotReady, h.opts.startTimeout, spec.subscriptions())
	}
	return s, nil
}

// writeConfig writes the sidecar's config: loopback listeners, warn
// logging, a short shutdown grace, and the subscriptions, one a line (YAML
// flow mappings, or JSON objects with spec.JSON).
func (h *harness) writeConfig(s *sidecar) (int64, error) {
	if s.spec.JSON && (s.spec.SubYAML != nil || s.spec.Fleet != nil) {
		return 0, errors.New("writeConfig: SubYAML and Fleet are written as YAML only")
	}
	f, err := os.Create(s.cfgPath)
	if err != nil {
		return 0, err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if s.spec.JSON {
		err = h.writeJSONConfig(w, s)
	} else {
		h.writeYAMLConfig(w, s)
	}
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		f.Close()
		return 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return 0, err
	}
	return fi.Size(), f.Close()
}

func (h *harness) writeYAMLConfig(w *bufio.Writer, s *sidecar) {
	fmt.Fprintf(w, "# generated by go run ./bench (%s)\n", s.spec.Name)
	fmt.Fprintf(w, "listen: %s\nadmin:\n  listen: %s\ndata_dir: %q\n", s.ingest, s.admin, s.dataDir)
	// The receivers are on loopback, which the SSRF guard refuses by default.
	fmt.Fprintf(w, "durability: %s\nlog_level: warn\nshutdown_grace: 2s\nallow_private_targets: true\n", s.spec.Durability)
	if s.spec.MaxInFlight > 0 {
		fmt.Fprintf(w, "max_in_flight: %d\n", s.spec.MaxInFlight)
	}
	if s.spec.MemoryBytes > 0 {
		fmt.Fprintf(w, "memory_bytes: %d\n", s.spec.MemoryBytes)
	}
	fl := s.spec.Fleet
	if fl != nil {
		fmt.Fprintf(w, "node_id: %s\nlog: {backend: jetstream}\njetstream:\n  urls: [%s]\n  stream: %s\n  replicas: %d\n",
			fl.NodeID, strings.Join(fl.URLs, ", "), fl.Stream, fl.Replicas)
		if fl.LeaseTTL > 0 {
			fmt.Fprintf(w, "  lease_ttl: %s\n", yamlDur(fl.LeaseTTL))
		}
	}
	if n := s.spec.subscriptions(); n == 0 {
		fmt.Fprintf(w, "subscriptions: []\n")
	} else {
		fmt.Fprintf(w, "subscriptions:\n")
	}
	i := 0
	base := h.recv.url()
	for _, g := range s.spec.Subs {
		for range g.Count {
			pol := fmt.Sprintf("concurrency: {max: %d}", laneCap)
			if s.spec.SubYAML != nil {
				pol = s.spec.SubYAML(i)
			}
			if fl != nil && fl.NodeHeader {
				pol += fmt.Sprintf(", headers: {%s: %s}", nodeHeader, fl.NodeID)
			}
			fmt.Fprintf(w, "  - {id: s%d, url: \"%s/s%d\", secret: %q, types: [%q], %s}\n",
				i, base, i, benchSecret, g.Type, pol)
			i++
		}
	}
}

func (h *harness) writeJSONConfig(w *bufio.Writer, s *sidecar) error {
	type sub struct {
		ID          string         `json:"id"`
		URL         string         `json:"url"`
		Secret      string         `json:"secret"`
		Types       []string       `json:"types"`
		Concurrency map[string]int `json:"concurrency"`
	}
	cfg := map[string]any{
		"listen": s.ingest, "admin": map[string]string{"listen": s.admin}, "data_dir": s.dataDir,
		"durability": s.spec.Durability, "log_level": "warn", "shutdown_grace": "2s",
		"allow_private_targets": true, // as in the YAML
	}
	if s.spec.MaxInFlight > 0 {
		cfg["max_in_flight"] = s.spec.MaxInFlight
	}
	if s.spec.MemoryBytes > 0 {
		cfg["memory_bytes"] = s.spec.MemoryBytes
	}
	subs := make([]sub, 0, s.spec.subscriptions())
	base := h.recv.url()
	for _, g := range s.spec.Subs {
		for range g.Count {
			i := len(subs)
			subs = append(subs, sub{ID: fmt.Sprintf("s%d", i), URL: fmt.Sprintf("%s/s%d", base, i), Secret: benchSecret,
				Types: []string{g.Type}, Concurrency: map[string]int{"max": laneCap}})
		}
	}
	cfg["subscriptions"] = subs
	return json.NewEncoder(w).Encode(cfg)
}

// stop stops the sidecar and removes its data dir, unless the spec named
// it. It returns the time from SIGTERM to exit.
func (s *sidecar) stop() (time.Duration, bool) {
	took, killed := s.child.stop(20 * time.Second)
	if s.spec.DataDir == "" {
		os.RemoveAll(s.dataDir)
	}
	return took, killed
}

// get fetches a debug path of the admin listener.
func (s *sidecar) get(path string, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.admin+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	return resp.StatusCode, b, err
}

// lanes reads GET /v1/subscriptions.
func (s *sidecar) lanes() ([]api.LaneStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.api.Subscriptions(ctx)
	if err != nil {
		return nil, err
	}
	return v.Subscriptions, nil
}

// retryBudget reads GET /v1/retry-budget.
func (s *sidecar) retryBudget() (policy.BudgetStats, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.api.RetryBudget(ctx)
	if err != nil {
		return policy.BudgetStats{}, err
	}
	return *v, nil
}

// memStats is the part of runtime.MemStats the harness reads from the
// sidecar's /debug/vars.
type memStats struct {
	TotalAlloc uint64 `json:"TotalAlloc"`
	Mallocs    uint64 `json:"Mallocs"`
	HeapAlloc  uint64 `json:"HeapAlloc"`
	HeapInuse  uint64 `json:"HeapInuse"`
	Sys        uint64 `json:"Sys"`
	NumGC      uint32 `json:"NumGC"`
}

func (s *sidecar) memstats() (memStats, error) {
	code, b, err := s.get("/debug/vars", 10*time.Second)
	if err != nil {
		return memStats{}, err
	}
	if code != http.StatusOK {
		return memStats{}, fmt.Errorf("/debug/vars: status %d", code)
	}
	var v struct {
		MemStats memStats `json:"memstats"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return memStats{}, fmt.Errorf("/debug/vars: %w", err)
	}
	return v.MemStats, nil
}

// gc makes the sidecar collect garbage (the heap profile handler runs
// runtime.GC with gc=1), so HeapAlloc afterwards is the live heap.
func (s *sidecar) gc() error {
	code, _, err := s.get("/debug/pprof/heap?gc=1", 30*time.Second)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("/debug/pprof/heap: status %d", code)
	}
	return err
}

// liveHeap is HeapAlloc right after forced GCs. Two of them: sync.Pool
// contents survive the first one (victim cache).
func (s *sidecar) liveHeap() (memStats, error) {
	for range 2 {
		if err := s.gc(); err != nil {
			return memStats{}, err
		}
	}
	return s.memstats()
}

// profile fetches a CPU profile of secs seconds (blocking that long) and
// writes it to path.
func (s *sidecar) profile(path string, secs int) error {
	code, b, err := s.get("/debug/pprof/profile?seconds="+strconv.Itoa(secs), time.Duration(secs)*time.Second+30*time.Second)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("cpu profile: status %d: %.200s", code, b)
	}
	return os.WriteFile(path, b, 0o644)
}

func (s *sidecar) allocsProfile(path string) error {
	code, b, err := s.get("/debug/pprof/allocs", 30*time.Second)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("allocs profile: status %d", code)
	}
	return os.WriteFile(path, b, 0o644)
}

// logProblems returns the lines of the sidecar's log at warn or above,
// without the one warning every sidecar without subscriptions prints.
func (s *sidecar) logProblems(max int) []string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.TrimSpace(line) == "" || strings.Contains(line, "no subscriptions configured") {
			continue
		}
		if len(out) < max {
			if len(line) > 400 {
				line = line[:400] + "…"
			}
			out = append(out, line)
		}
	}
	return out
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. Another process
// could take one before the sidecar binds it; startSidecar retries then.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// metricValues reads unlabelled series from the sidecar's GET /metrics, in
// the order asked; a series that is missing reads 0.
func (s *sidecar) metricValues(names ...string) ([]float64, error) {
	out := make([]float64, len(names))
	code, b, err := s.get("/metrics", 10*time.Second)
	if err != nil {
		return out, err
	}
	if code != http.StatusOK {
		return out, fmt.Errorf("/metrics: status %d", code)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		for i, n := range names {
			if name == n {
				out[i], _ = strconv.ParseFloat(strings.TrimSpace(val), 64)
			}
		}
	}
	return out, nil
}
