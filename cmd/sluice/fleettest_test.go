package main

// Helpers of the fleet tests (fleet_e2e_test.go): real `sluice serve`
// processes on an embedded JetStream cluster, a receiver that records
// which node sent each delivery, producers spread over the nodes, and a
// loopback TCP proxy that can cut one node off from NATS.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/natscluster"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// fleetBin is the plain (not -race) build of sluice the fleet tests run
// when the test binary itself was built with -race: three instrumented
// sidecars and a JetStream cluster are too slow for a 2-core machine, and
// the race detector has the test process (receiver, proxy, producers) to
// watch. Without -race the children re-execute the test binary, as the
// other crash tests do. SLUICE_FLEET_BIN names a ready binary instead.
var fleetBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// fleetCmd returns a command running `sluice args...` as a child process
// whose output goes to logTo.
func fleetCmd(t *testing.T, logTo io.Writer, args ...string) *exec.Cmd {
	t.Helper()
	bin := os.Getenv("SLUICE_FLEET_BIN")
	if bin == "" {
		if !raceEnabled {
			return sluiceCmd(t, logTo, args...)
		}
		fleetBin.once.Do(buildFleetBinary)
		if fleetBin.err != nil {
			t.Fatalf("build the sluice binary for the fleet tests: %v", fleetBin.err)
		}
		bin = fleetBin.path
	}
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = logTo, logTo
	return cmd
}

func buildFleetBinary() {
	dir, err := os.MkdirTemp("", "sluice-fleettest-")
	if err != nil {
		fleetBin.err = err
		return
	}
	fleetBin.dir = dir
	fleetBin.path = filepath.Join(dir, "sluice")
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	// The package under test is the working directory of its tests.
	cmd := exec.Command(gobin, "build", "-o", fleetBin.path, ".")
	cmd.Env = append(os.Environ(), "GOFLAGS=") // no -race inherited from GOFLAGS
	if out, err := cmd.CombinedOutput(); err != nil {
		fleetBin.err = fmt.Errorf("%v: %s", err, out)
	}
}

// removeFleetBinary is called by TestMain after the tests.
func removeFleetBinary() {
	if fleetBin.dir != "" {
		os.RemoveAll(fleetBin.dir)
	}
}

// fleetAwait polls cond until it holds and fails the test at the deadline
// with the last state cond described. The poll interval is only how often
// another process's state is looked at.
func fleetAwait(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last state: %s", what, timeout, state)
		}
		time.Sleep(20 * time.Millisecond) // polling other processes' state
	}
}

// startNATS runs an embedded 3-node JetStream cluster under t.TempDir().
func startNATS(t *testing.T) *natscluster.Cluster {
	t.Helper()
	cl, err := natscluster.Start(natscluster.Options{Dir: filepath.Join(t.TempDir(), "nats"), MaxPayloadBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// fleetSub is one subscription of every node's config. Each node adds
// `headers: {X-Node: <node id>}`, so the receiver knows who sent what.
type fleetSub struct {
	ID    string
	Types string // a YAML list; `["*"]` when empty
	Extra string // more keys of the subscription, one per line
}

// fleetConfig is what the nodes of one test share.
type fleetConfig struct {
	URLs     []string // jetstream.urls
	Replicas int      // default 3
	LeaseTTL time.Duration
	Stream   string // jetstream.stream; the default when empty
	LogLevel string // info when empty; SLUICE_FLEET_LOG_LEVEL overrides
	// JetStream holds more jetstream.* keys, one per line; Top more
	// top-level keys.
	JetStream, Top string
	Subs           []fleetSub
	// AdminToken, when set, is the operator token (admin.token_file, in
	// the node's directory); the node's API client and metrics() send it.
	AdminToken string
}

// fleetNode is one `sluice serve` process of the fleet, on unix sockets in
// its own directory (restarts keep the addresses).
type fleetNode struct {
	t          *testing.T
	id         string
	dir        string
	config     string
	ingestSock string
	adminSock  string
	log        *syncBuffer
	token      string // the operator token; "" for none
	ingest     *http.Client
	admin      *http.Client
	api        *client.Client

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed once the current process has exited
}

func newFleetNode(t *testing.T, parent, id, recvURL string, c fleetConfig) *fleetNode {
	t.Helper()
	dir := filepath.Join(parent, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	n := &fleetNode{
		t: t, id: id, dir: dir, config: filepath.Join(dir, "sluice.yaml"),
		ingestSock: filepath.Join(dir, "in.sock"), adminSock: filepath.Join(dir, "adm.sock"),
		log: &syncBuffer{}, token: c.AdminToken,
	}
	n.ingest = unixClient(n.ingestSock)
	n.admin = unixClient(n.adminSock)
	api, err := client.New("unix://"+n.adminSock, client.Options{Token: n.token, RetryMax: -1, AttemptTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n.api = api
	n.writeConfig(c, recvURL)
	t.Cleanup(func() {
		n.stopNow()
		// SLUICE_FLEET_LOGS=DIR keeps every node's whole log there.
		if d := os.Getenv("SLUICE_FLEET_LOGS"); d != "" {
			name := strings.NewReplacer("/", "_").Replace(t.Name()) + "-" + n.id + ".log"
			if err := os.WriteFile(filepath.Join(d, name), []byte(n.log.String()), 0o644); err != nil {
				t.Logf("keep the log of %s: %v", n.id, err)
			}
		}
		if log := n.log.String(); strings.Contains(log, "panic:") || strings.Contains(log, "DATA RACE") {
			t.Errorf("%s's log shows a panic or a race", n.id)
		}
		if t.Failed() {
			t.Logf("log of %s (last 80 lines):\n%s", n.id, lastLines(n.log.String(), 80))
		}
	})
	return n
}

func (n *fleetNode) writeConfig(c fleetConfig, recvURL string) {
	var b strings.Builder
	urls := make([]string, len(c.URLs))
	for i, u := range c.URLs {
		urls[i] = strconv.Quote(u)
	}
	tokenFile := ""
	if c.AdminToken != "" {
		f := filepath.Join(n.dir, "admin-token")
		if err := os.WriteFile(f, []byte(c.AdminToken), 0o600); err != nil {
			n.t.Fatal(err)
		}
		tokenFile = "  token_file: " + f + "\n"
	}
	fmt.Fprintf(&b, `listen: unix://%s
admin:
  listen: unix://%s
%sdata_dir: %s
node_id: %s
log_level: %s
allow_private_targets: true
shutdown_grace: 3s
retry_budget: {ratio: 1, min_per_second: 1000, window: 1s}
log: {backend: jetstream}
jetstream:
  urls: [%s]
  replicas: %d
  lease_ttl: %s
`, n.ingestSock, n.adminSock, tokenFile, filepath.Join(n.dir, "data"), n.id, cmp.Or(os.Getenv("SLUICE_FLEET_LOG_LEVEL"), c.LogLevel, "info"),
		strings.Join(urls, ", "), cmp.Or(c.Replicas, 3), cmp.Or(c.LeaseTTL, 2*time.Second))
	if c.Stream != "" {
		fmt.Fprintf(&b, "  stream: %s\n", c.Stream)
	}
	for _, l := range lines(c.JetStream) {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	for _, l := range lines(c.Top) {
		fmt.Fprintf(&b, "%s\n", l)
	}
	if len(c.Subs) > 0 {
		b.WriteString("subscriptions:\n")
	}
	for _, s := range c.Subs {
		fmt.Fprintf(&b, "  - id: %s\n    url: %s/%s\n    secret: %s\n    types: %s\n    headers: {X-Node: %s}\n",
			s.ID, recvURL, s.ID, e2eSecret, cmp.Or(s.Types, `["*"]`), n.id)
		for _, l := range lines(s.Extra) {
			fmt.Fprintf(&b, "    %s\n", l)
		}
	}
	if err := os.WriteFile(n.config, []byte(b.String()), 0o600); err != nil {
		n.t.Fatal(err)
	}
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// start runs the node's process; it does not wait for it (awaitReady).
func (n *fleetNode) start() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil && !n.exitedLocked() {
		n.t.Fatalf("start %s: still running", n.id)
	}
	fmt.Fprintf(n.log, "---- test: starting %s at %s\n", n.id, time.Now().Format(time.StampMilli))
	cmd := fleetCmd(n.t, n.log, "serve", "--config", n.config)
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("start %s: %v", n.id, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	n.cmd, n.done = cmd, done
}

func (n *fleetNode) exitedLocked() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// running reports whether the node's process is up.
func (n *fleetNode) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil && !n.exitedLocked()
}

// exited returns a channel closed when the current process has exited.
func (n *fleetNode) exited() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.done
}

// exitCode is the exit status of the process that has exited (-1 for a
// signal).
func (n *fleetNode) exitCode() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd.ProcessState.ExitCode()
}

// awaitReady waits until GET /readyz answers 200.
func (n *fleetNode) awaitReady(timeout time.Duration) time.Time {
	n.t.Helper()
	return fleetAwait(n.t, n.id+" ready", timeout, func() (bool, string) {
		select {
		case <-n.exited():
			n.t.Fatalf("%s exited while starting (status %d); log:\n%s", n.id, n.exitCode(), lastLines(n.log.String(), 40))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := n.api.Ready(ctx)
		return err == nil, fmt.Sprint(err)
	})
}

// kill sends SIGKILL and waits for the process to go.
func (n *fleetNode) kill() time.Time {
	n.t.Helper()
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	at := time.Now()
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		n.t.Fatalf("%s ended by itself (%v) before its SIGKILL", n.id, cmd.ProcessState)
	}
	fmt.Fprintf(n.log, "---- test: SIGKILLed %s at %s\n", n.id, at.Format(time.StampMilli))
	n.ingest.Transport.(*http.Transport).CloseIdleConnections()
	n.admin.Transport.(*http.Transport).CloseIdleConnections()
	n.api.CloseIdleConnections()
	return at
}

// term sends SIGTERM and waits up to timeout for a clean exit (status 0).
func (n *fleetNode) term(timeout time.Duration) {
	n.t.Helper()
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	fmt.Fprintf(n.log, "---- test: SIGTERM to %s at %s\n", n.id, time.Now().Format(time.StampMilli))
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		n.t.Errorf("%s did not exit within %v of SIGTERM", n.id, timeout)
		return
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		n.t.Errorf("%s exited with status %d after SIGTERM, want 0", n.id, code)
	}
	n.ingest.Transport.(*http.Transport).CloseIdleConnections()
	n.api.CloseIdleConnections()
}

// stopNow kills the process if it runs (cleanup).
func (n *fleetNode) stopNow() {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
	default:
		cmd.Process.Kill()
		<-done
	}
}

// lanes reads the node's GET /v1/subscriptions.
func (n *fleetNode) lanes() ([]api.LaneStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ls, err := n.api.Subscriptions(ctx)
	if err != nil {
		return nil, err
	}
	return ls.Subscriptions, nil
}

// owners maps each subscription to the owner the node's admin API names.
func (n *fleetNode) owners() (map[string]string, error) {
	ls, err := n.lanes()
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, len(ls))
	for _, l := range ls {
		m[l.Subscription] = l.Owner
	}
	return m, nil
}

// metrics reads the node's GET /metrics.
func (n *fleetNode) metrics() (string, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://sluice/metrics", nil)
	if n.token != "" {
		req.Header.Set("Authorization", "Bearer "+n.token)
	}
	resp, err := n.admin.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return string(b), err
}

// metricSum adds the values of every sample of metric whose labels contain
// all of the given label pairs (`result="lost"`).
func metricSum(text, metric string, labels ...string) (float64, bool) {
	sum, found := 0.0, false
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, metric) || strings.HasPrefix(l, "#") {
			continue
		}
		rest := l[len(metric):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue // a longer name
		}
		ok := true
		for _, want := range labels {
			ok = ok && strings.Contains(rest, want)
		}
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		sum, found = sum+v, true
	}
	return sum, found
}

// fleetIngestAnswer is what ingest answers with 2xx.
type fleetIngestAnswer struct {
	ID        string `json:"id"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
}

// post publishes one event to the node.
func (n *fleetNode) post(typ, key string) (int, fleetIngestAnswer, http.Header, error) {
	return n.postVia(n.ingest, typ, key)
}

// postVia is post through c, a client of the node's ingest socket. A
// tenant test's key (tk-<n>) goes with its tenant's Sluice-Tenant.
func (n *fleetNode) postVia(c *http.Client, typ, key string) (int, fleetIngestAnswer, http.Header, error) {
	var ans fleetIngestAnswer
	req, _ := http.NewRequest(http.MethodPost, "http://sluice/v1/events/"+typ, strings.NewReader(fleetBody(key, typ)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if tenant := tenantKeyKind(key).tenant; tenant != "" {
		req.Header.Set(ingest.HeaderTenant, tenant)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, ans, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, ans, nil, err
	}
	if resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, &ans); err != nil {
			return resp.StatusCode, ans, resp.Header, fmt.Errorf("answer %q: %w", b, err)
		}
	}
	return resp.StatusCode, ans, resp.Header, nil
}

// Events: key k-<n> has type fleetTypes[n%3] and this body; key tk-<n>,
// the tenant tests' (tenantKey), has the type of its tenantKeyKind.
var fleetTypes = [...]string{"t.a", "t.b", "t.c"}

func fleetKey(n int) string { return "k-" + strconv.Itoa(n) }

func fleetType(key string) (string, bool) {
	if k := tenantKeyKind(key); k.typ != "" {
		return k.typ, true
	}
	s, ok := strings.CutPrefix(key, "k-")
	if !ok {
		return "", false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return "", false
	}
	return fleetTypes[n%3], true
}

func fleetBody(key, typ string) string { return fmt.Sprintf(`{"key":%q,"type":%q}`, key, typ) }

// fleetReq is one request the receiver got.
type fleetReq struct {
	node    string // X-Node: the node that sent it
	version string // X-Version, when the subscription sets it
	attempt int
	status  int // the answer; 0 for a black hole
	at      time.Time
}

// fleetRecorder is the receiver: one testbed (signatures verified), one
// path per subscription, a Hook that checks every delivery and records who
// sent it and when. Paths in hold are answered after holding the request
// that long, and the Hook checks that no two nodes have requests of one
// subscription in flight at once.
type fleetRecorder struct {
	tb   *testbed.Server
	hold map[string]time.Duration
	quit chan struct{}

	mu       sync.Mutex
	reqs     map[string]map[string][]fleetReq // subscription → id → requests in arrival order
	acks     map[string]map[string]int        // subscription → id → 2xx answers
	inFlight map[string]map[string]int        // held subscriptions: → node → requests in flight
	// holes: the black-holed requests of each subscription, by their
	// number on the path, from arrival until the client hung up.
	holes    map[string]map[int64]*heldReq
	overlaps []string
	nOverlap int
	problems []string
	nProblem int
}

func newFleetRecorder(t *testing.T, hold map[string]time.Duration) *fleetRecorder {
	t.Helper()
	k, err := signing.ParseSecret(e2eSecret)
	if err != nil {
		t.Fatal(err)
	}
	r := &fleetRecorder{
		hold: hold, quit: make(chan struct{}),
		reqs: map[string]map[string][]fleetReq{}, acks: map[string]map[string]int{}, inFlight: map[string]map[string]int{},
		holes: map[string]map[int64]*heldReq{},
	}
	r.tb = testbed.New(testbed.Options{Secrets: []signing.Secret{k}, Hook: r.answer, HangUp: r.hungUp})
	if err := r.tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(r.quit)
		r.tb.Close()
	})
	return r
}

func (r *fleetRecorder) problemf(format string, args ...any) {
	r.nProblem++
	if len(r.problems) < 10 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

func (r *fleetRecorder) answer(req testbed.Request, status int) int {
	sub := strings.TrimPrefix(string(req.Path()), "/")
	id := string(req.Header("webhook-id"))
	node := string(req.Header("X-Node"))
	version := string(req.Header("X-Version"))
	attempt, _ := strconv.Atoi(string(req.Header("X-Attempt")))
	typ, okKey := fleetType(id)
	var problem string
	switch {
	case node == "":
		problem = "no X-Node header"
	case !okKey:
		problem = "webhook-id " + strconv.Quote(id) + " was never sent"
	case string(req.Body()) != fleetBody(id, typ):
		problem = fmt.Sprintf("body %q", req.Body())
	case string(req.Header("X-Event-Type")) != typ:
		problem = "X-Event-Type " + string(req.Header("X-Event-Type")) + ", want " + typ
	case sub == "typed" && typ != "t.a":
		problem = "type " + typ + " delivered to typed (types [t.a])"
	case status == http.StatusUnauthorized:
		problem = "signature missing or not made with the subscription's secret"
	}
	at := req.Received()
	r.mu.Lock()
	if problem != "" {
		r.problemf("/%s %s from %s: %s", sub, id, node, problem)
		r.mu.Unlock()
		return http.StatusBadRequest
	}
	if status == 0 {
		m := r.holes[sub]
		if m == nil {
			m = map[int64]*heldReq{}
			r.holes[sub] = m
		}
		m[req.N()] = &heldReq{node: node, at: at}
	}
	hold := r.hold[sub]
	if hold > 0 && status/100 == 2 {
		m := r.inFlight[sub]
		if m == nil {
			m = map[string]int{}
			r.inFlight[sub] = m
		}
		for other, k := range m {
			if other != node && k > 0 {
				if r.nOverlap++; len(r.overlaps) < 10 {
					r.overlaps = append(r.overlaps, fmt.Sprintf("%s at %s: %s sent %s while %d of %s's were in flight",
						sub, at.Format(time.StampMilli), node, id, k, other))
				}
			}
		}
		m[node]++
	}
	r.mu.Unlock()
	if hold > 0 && status/100 == 2 {
		// The endpoint's own latency, not a synchronisation.
		select {
		case <-time.After(hold):
		case <-r.quit:
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if hold > 0 && status/100 == 2 {
		r.inFlight[sub][node]--
	}
	m := r.reqs[sub]
	if m == nil {
		m = map[string][]fleetReq{}
		r.reqs[sub] = m
		r.acks[sub] = map[string]int{}
	}
	m[id] = append(m[id], fleetReq{node: node, version: version, attempt: attempt, status: status, at: at})
	if status/100 == 2 {
		r.acks[sub][id]++
	}
	return status
}

// heldReq is one black-holed request: who sent it, when it arrived and
// when its client hung up (zero while held).
type heldReq struct {
	node      string
	at, ended time.Time
}

func (r *fleetRecorder) hungUp(path string, n int64, ended time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h := r.holes[strings.TrimPrefix(path, "/")][n]; h != nil {
		h.ended = ended
	}
}

// heldOverlaps lists, for a black-holed subscription, each request that
// arrived from one node while another node's request was still held: two
// nodes with requests in flight to it at once. (A hang-up is seen a
// moment after the client closed: this errs on the side of an overlap.)
func (r *fleetRecorder) heldOverlaps(sub string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	hs := r.holes[sub]
	for _, a := range hs {
		for _, b := range hs {
			if a.node == b.node || !b.at.After(a.at) {
				continue
			}
			if a.ended.IsZero() || b.at.Before(a.ended) {
				out = append(out, fmt.Sprintf("%s's request arrived at %s while %s's, from %s, was held until %s",
					b.node, b.at.Format(time.StampMilli), a.node, a.at.Format(time.StampMilli), a.ended.Format(time.StampMilli)))
			}
		}
	}
	slices.Sort(out)
	return out
}

// nodeInFlight is how many requests of held subscriptions node has in
// flight now.
func (r *fleetRecorder) nodeInFlight(node string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.inFlight {
		n += m[node]
	}
	return n
}

// snapshot copies what the receiver recorded.
func (r *fleetRecorder) snapshot() map[string]map[string][]fleetReq {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]map[string][]fleetReq, len(r.reqs))
	for sub, m := range r.reqs {
		c := make(map[string][]fleetReq, len(m))
		for id, rs := range m {
			c[id] = slices.Clone(rs)
		}
		out[sub] = c
	}
	return out
}

// missing counts the (event, subscription) pairs not yet acknowledged.
func (r *fleetRecorder) missing(evs []*fleetEvent, entitled func(sub string, ev *fleetEvent) bool, subs []string) (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	total := 0
	var parts []string
	for _, sub := range subs {
		n := 0
		for _, ev := range evs {
			if entitled(sub, ev) && r.acks[sub][ev.key] == 0 {
				n++
			}
		}
		total += n
		parts = append(parts, fmt.Sprintf("%s %d", sub, n))
	}
	return total, "missing: " + strings.Join(parts, ", ")
}

// checkProblems reports what the receiver found wrong.
func (r *fleetRecorder) checkProblems(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.problems {
		t.Errorf("receiver: %s", p)
	}
	if r.nProblem > len(r.problems) {
		t.Errorf("receiver: %d more bad requests", r.nProblem-len(r.problems))
	}
	for _, o := range r.overlaps {
		t.Errorf("two nodes delivering one subscription at once: %s", o)
	}
	if r.nOverlap > len(r.overlaps) {
		t.Errorf("%d more overlapping deliveries", r.nOverlap-len(r.overlaps))
	}
}

// fleetEvent is one event a node accepted.
type fleetEvent struct {
	key, typ  string
	seq       uint64
	node      string    // the node whose 2xx the producer got
	firstSent time.Time // the first POST began
	accepted  time.Time // the 2xx arrived
}

// fleetLoad is the producers: each posts events with unique
// Idempotency-Keys to its own node and, when that node is down, cut off or
// draining, re-posts the same key to the next node until one answers 2xx
// (any node ingests, and the stream's duplicate window makes the key
// idempotent fleet-wide).
type fleetLoad struct {
	t     *testing.T
	nodes func() []*fleetNode // the current node of each slot
	// key names the producers' n-th event; fleetKey when nil. Set it
	// before run.
	key func(n int) string

	next atomic.Int64
	stop chan struct{} // closed by halt; nil while halted
	wg   sync.WaitGroup

	mu       sync.Mutex
	events   map[string]*fleetEvent
	bySeq    map[uint64]string
	reposts  int // answers 200 duplicate to a retried key
	refused  map[int]int
	problems []string
}

func newFleetLoad(t *testing.T, nodes func() []*fleetNode) *fleetLoad {
	l := &fleetLoad{t: t, nodes: nodes, events: map[string]*fleetEvent{}, bySeq: map[uint64]string{}, refused: map[int]int{}}
	t.Cleanup(l.halt)
	return l
}

func (l *fleetLoad) problemf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.problems) < 20 {
		l.problems = append(l.problems, fmt.Sprintf(format, args...))
	}
}

// run starts n producers, each posting one event per every; producer i
// prefers slot i mod the fleet size. Call halt before running again.
func (l *fleetLoad) run(n int, every time.Duration) {
	l.stop = make(chan struct{})
	for i := range n {
		l.wg.Go(func() { l.producer(i, every, l.stop) })
	}
}

// halt stops the producers and waits for them.
func (l *fleetLoad) halt() {
	if l.stop != nil {
		close(l.stop)
		l.stop = nil
	}
	l.wg.Wait()
}

func (l *fleetLoad) accepted() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events)
}

func (l *fleetLoad) list() []*fleetEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*fleetEvent, 0, len(l.events))
	for _, ev := range l.events {
		out = append(out, ev)
	}
	slices.SortFunc(out, func(a, b *fleetEvent) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

func (l *fleetLoad) producer(i int, every time.Duration, stop chan struct{}) {
	tick := time.NewTicker(every) // the workload's pace
	defer tick.Stop()
	keyOf := fleetKey
	if l.key != nil {
		keyOf = l.key
	}
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		key := keyOf(int(l.next.Add(1) - 1))
		if !l.publish(i, key, stop) {
			return
		}
	}
}

// publish posts key until some node answers 2xx; false when the producers
// stop first or something is wrong.
func (l *fleetLoad) publish(i int, key string, stop chan struct{}) bool {
	typ, _ := fleetType(key)
	ev := &fleetEvent{key: key, typ: typ, firstSent: time.Now()}
	deadline := ev.firstSent.Add(60 * time.Second)
	for try := 0; ; try++ {
		nodes := l.nodes()
		n := nodes[(i+try)%len(nodes)]
		code, ans, _, err := n.post(typ, key)
		switch {
		case err == nil && (code == http.StatusAccepted && !ans.Duplicate || code == http.StatusOK && ans.Duplicate && try > 0):
			if ans.ID != key || ans.Seq == 0 {
				l.problemf("POST %s to %s: answer %+v", key, n.id, ans)
				return false
			}
			ev.seq, ev.node, ev.accepted = ans.Seq, n.id, time.Now()
			l.mu.Lock()
			defer l.mu.Unlock()
			if other, dup := l.bySeq[ev.seq]; dup {
				l.problems = append(l.problems, fmt.Sprintf("seq %d given to %s and %s", ev.seq, other, key))
				return false
			}
			if ans.Duplicate {
				l.reposts++
			}
			l.events[key], l.bySeq[ev.seq] = ev, key
			return true
		case err == nil && code/100 == 2:
			l.problemf("POST %s to %s (try %d): %d %+v", key, n.id, try+1, code, ans)
			return false
		case err == nil && code != http.StatusServiceUnavailable:
			l.problemf("POST %s to %s (try %d): status %d, want 202 or 503", key, n.id, try+1, code)
			return false
		}
		if code != 0 {
			l.mu.Lock()
			l.refused[code]++
			l.mu.Unlock()
		}
		if time.Now().After(deadline) {
			l.problemf("POST %s: no node accepted it within 60 s (last: %d %v)", key, code, err)
			return false
		}
		if (try+1)%len(nodes) == 0 {
			// Every node refused: the fleet is failing over; try again soon.
			select {
			case <-stop:
				return false
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

func (l *fleetLoad) checkProblems(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.problems {
		t.Errorf("producer: %s", p)
	}
}

// natsProxy is a loopback TCP proxy between one sluice node and one NATS
// server that the test can cut. It removes the servers' connect_urls from
// the INFO they send, so the client cannot learn the other servers'
// addresses and go round the proxy. Two ways to cut:
//
//   - sever closes every connection it has, and every one it accepts until
//     restore: the client sees the connection drop and cannot reconnect;
//   - stall holds what either side sends, on connections that stay open,
//     until resume delivers it late, as a partition that heals does (TCP
//     retransmits): the client sees no disconnect, its requests time out,
//     and what it wrote while cut off reaches the server afterwards.
type natsProxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	open    *sync.Cond // broadcast when stalled turns false
	severed bool
	stalled bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

func startNATSProxy(t *testing.T, upstream string) *natsProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &natsProxy{ln: ln, upstream: strings.TrimPrefix(upstream, "nats://"), conns: map[net.Conn]struct{}{}}
	p.open = sync.NewCond(&p.mu)
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.resume()
		p.sever()
		p.wg.Wait()
	})
	return p
}

func (p *natsProxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *natsProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			continue
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *natsProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.severed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *natsProxy) serve(c net.Conn) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	if !p.track(up) {
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.pipe(up, c); up.Close(); done <- struct{}{} }()
	go func() { copyNATSServerStream(&gatedWriter{p, c}, up); c.Close(); done <- struct{}{} }()
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// pipe copies client to server, holding each chunk while stalled.
func (p *natsProxy) pipe(dst, src net.Conn) {
	w := &gatedWriter{p, dst}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// gatedWriter writes once the proxy is not stalled.
type gatedWriter struct {
	p *natsProxy
	w io.Writer
}

func (g *gatedWriter) Write(b []byte) (int, error) {
	g.p.mu.Lock()
	for g.p.stalled {
		g.p.open.Wait()
	}
	g.p.mu.Unlock()
	return g.w.Write(b)
}

// sever closes every proxied connection, and any accepted later.
func (p *natsProxy) sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.severed = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// restore lets connections through again after sever.
func (p *natsProxy) restore() {
	p.mu.Lock()
	p.severed = false
	p.mu.Unlock()
}

// stall holds everything either side sends from now on.
func (p *natsProxy) stall() {
	p.mu.Lock()
	p.stalled = true
	p.mu.Unlock()
}

// resume delivers what stall held, and lets traffic flow again.
func (p *natsProxy) resume() {
	p.mu.Lock()
	p.stalled = false
	p.open.Broadcast()
	p.mu.Unlock()
}

// copyNATSServerStream copies what a NATS server sends to its client, op
// by op (INFO, MSG and HMSG with their payloads, PING, PONG, +OK, -ERR),
// rewriting each INFO without connect_urls and ws_connect_urls.
func copyNATSServerStream(dst io.Writer, src io.Reader) error {
	r := bufio.NewReaderSize(src, 64<<10)
	w := bufio.NewWriterSize(dst, 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return err
		}
		op := line
		if i := bytes.IndexAny(op, " \t\r"); i >= 0 {
			op = op[:i]
		}
		switch strings.ToUpper(string(op)) {
		case "INFO":
			raw := bytes.TrimSpace(line[len(op):])
			var info map[string]any
			if err := json.Unmarshal(raw, &info); err != nil {
				return fmt.Errorf("nats proxy: INFO %q: %w", raw, err)
			}
			delete(info, "connect_urls")
			delete(info, "ws_connect_urls")
			b, _ := json.Marshal(info)
			w.WriteString("INFO ")
			w.Write(b)
			w.WriteString("\r\n")
		case "MSG", "HMSG":
			f := bytes.Fields(line)
			size, err := strconv.Atoi(string(f[len(f)-1]))
			if err != nil {
				return fmt.Errorf("nats proxy: %q: %w", line, err)
			}
			w.Write(line)
			if _, err := io.CopyN(w, r, int64(size)+2); err != nil {
				return err
			}
		default:
			w.Write(line)
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return err
			}
		}
	}
}

// TestFleetNATSProxy checks the fencing test's tool: a client that reaches
// a clustered NATS server through the proxy learns no other server's
// address, loses its connection when the proxy is severed, cannot
// reconnect while severed, and reconnects once it is restored.
func TestFleetNATSProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a JetStream cluster")
	}
	t.Parallel() // mostly idle processes: overlaps the other parallel fleet tests only
	cl := startNATS(t)
	px := startNATSProxy(t, cl.URL(1))
	disconnected, reconnected := make(chan struct{}, 8), make(chan struct{}, 8)
	nc, err := nats.Connect(px.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { disconnected <- struct{}{} }),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PX", Subjects: []string{"px.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// A payload with protocol-looking lines must pass through unchanged.
	payload := []byte("INFO {\"connect_urls\":[\"x\"]}\r\nMSG a 1 5\r\n")
	// A new R3 stream may not answer until its leader is elected ("no
	// response from stream", seen once on CI): the first publish is
	// retried until it is stored, once (its message id).
	fleetAwait(t, "the new stream stores the first publish", 10*time.Second, func() (bool, string) {
		_, err := js.Publish(ctx, "px.1", payload, jetstream.WithMsgID("px-1"))
		return err == nil, fmt.Sprint(err)
	})
	if got := nc.DiscoveredServers(); len(got) > 0 {
		t.Fatalf("the client learnt other servers through the proxy: %v", got)
	}
	if got := nc.Servers(); len(got) != 1 {
		t.Fatalf("the client's servers: %v, want the proxy only", got)
	}
	st, err := js.Stream(ctx, "PX")
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, "px.1")
	if err != nil || string(m.Data) != string(payload) {
		t.Fatalf("read back %v, %v; want %q", m, err, payload)
	}
	px.sever()
	select {
	case <-disconnected:
	case <-ctx.Done():
		t.Fatal("no disconnect after sever")
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = js.Publish(short, "px.2", []byte("x"), jetstream.WithRetryAttempts(0))
	cancelShort()
	if err == nil {
		t.Fatal("published while severed")
	}
	if nc.IsConnected() {
		t.Fatal("connected while severed")
	}
	px.restore()
	select {
	case <-reconnected:
	case <-ctx.Done():
		t.Fatalf("no reconnect after restore: status %v, last error %v, servers %v", nc.Status(), nc.LastError(), nc.Servers())
	}
	if _, err := js.Publish(ctx, "px.3", []byte("x")); err != nil {
		t.Fatalf("publish after restore: %v", err)
	}

	// Stalled: no answer, no disconnect; what was sent arrives on resume.
	px.stall()
	short, cancelShort = context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = js.Publish(short, "px.4", []byte("late"))
	cancelShort()
	if err == nil {
		t.Fatal("a publish was answered while stalled")
	}
	if !nc.IsConnected() {
		t.Fatal("the client saw a disconnect while stalled")
	}
	px.resume()
	fleetAwait(t, "the stalled publish stored late", 10*time.Second, func() (bool, string) {
		m, err := st.GetLastMsgForSubject(ctx, "px.4")
		return err == nil && string(m.Data) == "late", fmt.Sprint(err)
	})
	if _, err := js.Publish(ctx, "px.5", []byte("x")); err != nil {
		t.Fatalf("publish after resume: %v", err)
	}
}

// fleetLeaseLosses reads from a node's log when it dropped each lease it
// lost, by subscription: the watchdog's safety stop when a renewal came
// too late, a renewal refused, a lease seen taken. The log's clock is the
// test's (one machine), to the millisecond.
func fleetLeaseLosses(log string) map[string][]time.Time {
	out := map[string][]time.Time{}
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `msg="lease lost"`) {
			continue
		}
		var at time.Time
		var sub string
		for _, f := range strings.Fields(line) {
			switch k, v, _ := strings.Cut(f, "="); k {
			case "time":
				at, _ = time.Parse(time.RFC3339Nano, v)
			case "subscription":
				sub = v
			}
		}
		if !at.IsZero() && sub != "" {
			out[sub] = append(out[sub], at)
		}
	}
	return out
}

// fleetLossExplains says whether a loss of sub's lease, logged by the node
// that acknowledged the first copy of an event, explains the event being
// sent again: the loss came within ttl of the first copy (acknowledged
// while the renewal lagged, or by a delivery in flight at the loss, whose
// deadline the lease bounds) and before the copy. It returns the loss.
func fleetLossExplains(losses map[string]map[string][]time.Time, sub string, first, again fleetReq, ttl time.Duration) (time.Time, bool) {
	for _, at := range losses[first.node][sub] {
		if first.at.After(at.Add(-ttl)) && first.at.Before(at.Add(ttl)) && again.at.After(at) {
			return at, true
		}
	}
	return time.Time{}, false
}
