package main

// The fleet scenarios (targets in bench/README.md): sluice nodes in
// fleet mode (log.backend: jetstream) on an embedded 3-node JetStream
// cluster that runs in a child process of its own (_nats), against a bare
// JetStream publisher on the same cluster and against one Badger node on
// the same machine, in the same run.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Fleet settings shared by the scenarios.
const (
	fleetNodes    = 3 // sluice nodes of the multi-node scenarios, and NATS servers
	fleetReplicas = 3 // jetstream.replicas: R3, as in production
	// fleetSettle bounds the wait for every lane to have an owner, the
	// same on every node, after the nodes are ready.
	fleetSettle = 30 * time.Second
	// jsWindow is the in-flight window of the second bare-publisher
	// baseline: the backend's DefaultPublishWindow.
	jsWindow = 4096
)

// Baselines of the fleet scenarios, measured inside fleet-ingest on the
// cluster the node uses, with the settings of the stream it created.
const (
	baseJSPublish = "jetstream-publish"        // 64 closed-loop async publishers
	baseJSWindow  = "jetstream-publish-window" // one publisher, jsWindow in flight
	baseJSFollow  = "jetstream-publish-follow" // 64 publishers, each waiting for an ordered consumer too
)

// fleetScenarios are opt-in: -scenarios fleet selects them all.
var fleetScenarios = []string{"fleet-ingest", "sidecar-fleet", "fleet-fanout-10", "fleet-latency", "fleet-takeover", "fleet-scale"}

// jsEventHeaders are the headers the bare publisher adds besides
// Nats-Msg-Id, with values of the size sluice's append gives them, so that
// both publish messages of the same shape.
var jsEventHeaders = "Sluice-Type=bench.event;Sluice-Content-Type=application/json;Sluice-Accepted-At=1767225600123456789"

// ---------------------------------------------------------------- cluster

// natsCluster is the _nats child: the JetStream cluster every fleet
// scenario of a run shares, each on a stream (and buckets) of its own that
// it deletes when it is done.
type natsCluster struct {
	*child
	urls  []string
	pprof string // host:port of its net/http/pprof
	nc    *nats.Conn
	js    jetstream.JetStream
}

// natsRunning returns the run's cluster if it runs, else nil.
func (h *harness) natsRunning() *natsCluster {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.natsCl != nil && h.natsCl.running() {
		return h.natsCl
	}
	return nil
}

// startNATS starts the cluster the first time a fleet scenario asks for it.
func (h *harness) startNATS(ctx context.Context) (*natsCluster, error) {
	if c := h.natsRunning(); c != nil {
		return c, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	lw := newLineWriter()
	id := h.nextID("nats")
	c, err := h.startChild("nats", self, []string{"_nats", "-dir", filepath.Join(h.tmp, id),
		"-nodes", strconv.Itoa(fleetNodes), "-max-life", "3h"}, filepath.Join(h.tmp, id+".log"), lw)
	if err != nil {
		return nil, err
	}
	line, err := firstLine(c, lw, 90*time.Second)
	if err != nil {
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("nats cluster: %w: %s", err, tail(c.logf.Name(), 1000))
	}
	f := strings.Fields(line)
	if len(f) != 4 || f[0] != "nats" || f[2] != "pprof" {
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("nats cluster said %q", line)
	}
	n := &natsCluster{child: c, urls: strings.Split(f[1], ","), pprof: f[3]}
	if n.nc, err = nats.Connect(f[1], nats.MaxReconnects(-1)); err != nil {
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("nats cluster: connect: %w", err)
	}
	if n.js, err = jetstream.New(n.nc); err != nil {
		n.nc.Close()
		c.stop(5 * time.Second)
		return nil, err
	}
	h.mu.Lock()
	h.natsCl = n
	h.mu.Unlock()
	h.logf("  nats cluster (%d nodes, one process) up in %s: %s", fleetNodes, time.Since(start).Round(time.Millisecond), f[1])
	return n, nil
}

// dropStream deletes stream and the KV buckets named after it.
func (n *natsCluster) dropStream(stream string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var names []string
	l := n.js.StreamNames(ctx)
	for s := range l.Name() {
		if s == stream || strings.HasPrefix(s, "KV_"+stream+"_") || strings.HasPrefix(s, "OBJ_"+stream+"_") {
			names = append(names, s)
		}
	}
	for _, s := range names {
		n.js.DeleteStream(ctx, s)
	}
}

// streamStats reads a stream's message count and bytes.
func (n *natsCluster) streamStats(stream string) (msgs, bytes uint64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := n.js.Stream(ctx, stream)
	if err != nil {
		return 0, 0, err
	}
	st := s.CachedInfo().State
	return st.Msgs, st.Bytes, nil
}

func (n *natsCluster) close() {
	if n.nc != nil {
		n.nc.Close()
	}
	n.stop(10 * time.Second)
}

// profile fetches a CPU profile of the cluster's process.
func (n *natsCluster) profile(path string, secs int) error {
	c := &http.Client{Timeout: time.Duration(secs)*time.Second + 30*time.Second}
	resp, err := c.Get("http://" + n.pprof + "/debug/pprof/profile?seconds=" + strconv.Itoa(secs))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("nats cpu profile: status %d", resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.ReadFrom(resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ---------------------------------------------------------------- fleet

// fleetOpts is how a scenario's fleet differs from the defaults.
type fleetOpts struct {
	LeaseTTL   time.Duration // 0: the sidecar's default
	NodeHeader bool
}

// fleet is the nodes of one scenario, sharing a stream of their own.
type fleet struct {
	*target
	h      *harness
	name   string
	stream string
	subs   int
	owners map[string]string // subscription → node id, once settled
	// pathDelta is the deliveries per path /s<i> of the last window.
	pathDelta []int64
}

// streamName is a stream of its own for one fleet: scenarios share the
// cluster but no state.
func (h *harness) streamName(scenario string) string {
	s := strings.NewReplacer("-", "_", ".", "_").Replace(strings.ToUpper(scenario))
	return "BENCH_" + s + "_" + strings.TrimPrefix(h.nextID(""), "-")
}

// startFleet starts n fleet nodes (node-0 … node-<n-1>) on the run's
// cluster, on a fresh stream, with the given subscriptions on every node:
// node-0 first (it creates the stream and buckets), then the others
// together. With subscriptions it waits until every lane has an owner that
// every node agrees on, unchanged for a second.
func (h *harness) startFleet(ctx context.Context, name string, n int, subs []subGroup, o fleetOpts) (*fleet, error) {
	nc, err := h.startNATS(ctx)
	if err != nil {
		return nil, err
	}
	f := &fleet{h: h, name: name, stream: h.streamName(name), target: &target{nats: nc, accepted: new(int64)}}
	spec := func(i int) sidecarSpec {
		id := "node-" + strconv.Itoa(i)
		return sidecarSpec{Name: name + "." + id, Durability: "fsync", Subs: subs,
			Fleet: &fleetNode{NodeID: id, URLs: nc.urls, Stream: f.stream, Replicas: fleetReplicas,
				LeaseTTL: o.LeaseTTL, NodeHeader: o.NodeHeader}}
	}
	f.subs = spec(0).subscriptions()
	first, err := h.start(ctx, spec(0))
	if err != nil {
		f.stop()
		return nil, fmt.Errorf("node-0: %w", err)
	}
	f.nodes = []*sidecar{first}
	rest := make([]*sidecar, n-1)
	errs := make([]error, n-1)
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Go(func() { rest[i-1], errs[i-1] = h.start(ctx, spec(i)) })
	}
	wg.Wait()
	for i, sc := range rest {
		if errs[i] == nil {
			f.nodes = append(f.nodes, sc)
		}
	}
	if err := errors.Join(errs...); err != nil {
		f.stop()
		return nil, err
	}
	if f.subs > 0 {
		start := time.Now()
		owners, err := f.settle(ctx)
		if err != nil {
			f.stop()
			return nil, err
		}
		f.owners = owners
		h.logf("  %d lanes owned after %s: %s", len(owners), time.Since(start).Round(time.Millisecond), f.ownerSummary())
	}
	f.recvStart = h.recv.delivered()
	return f, nil
}

// ownersOf reads the lanes' owners as one node reports them.
func ownersOf(sc *sidecar) (map[string]string, error) {
	ls, err := sc.lanes()
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, len(ls))
	for _, l := range ls {
		m[l.Subscription] = l.Owner
	}
	return m, nil
}

// settle waits until every node reports the same owner for every lane,
// and the same for three readings 500 ms apart.
func (f *fleet) settle(ctx context.Context) (map[string]string, error) {
	deadline := time.Now().Add(fleetSettle)
	var last map[string]string
	same := 0
	for ctx.Err() == nil && time.Now().Before(deadline) {
		cur, err := f.agreedOwners()
		switch {
		case err != nil:
			same = 0
		case maps.Equal(cur, last):
			same++
		default:
			last, same = cur, 1
		}
		if same >= 3 {
			return last, nil
		}
		sleepUntil(ctx, time.Now().Add(500*time.Millisecond))
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("lane owners not settled within %s: %v", fleetSettle, last)
}

// agreedOwners is the owner of every lane if every node reports the same
// one and every lane has one.
func (f *fleet) agreedOwners() (map[string]string, error) {
	var first map[string]string
	for _, sc := range f.nodes {
		m, err := ownersOf(sc)
		if err != nil {
			return nil, err
		}
		if len(m) != f.subs {
			return nil, fmt.Errorf("%s lists %d lanes, want %d", sc.spec.Name, len(m), f.subs)
		}
		for sub, o := range m {
			if o == "" {
				return nil, fmt.Errorf("%s: %s has no owner", sc.spec.Name, sub)
			}
		}
		if first == nil {
			first = m
		} else if !maps.Equal(first, m) {
			return nil, errors.New("nodes disagree on owners")
		}
	}
	return first, nil
}

// lanesPerNode counts the lanes each node owns, in node order.
func (f *fleet) lanesPerNode() []int {
	out := make([]int, len(f.nodes))
	for _, o := range f.owners {
		for i, sc := range f.nodes {
			if sc.spec.Fleet.NodeID == o {
				out[i]++
			}
		}
	}
	return out
}

func (f *fleet) ownerSummary() string {
	var parts []string
	for i, n := range f.lanesPerNode() {
		parts = append(parts, fmt.Sprintf("%s %d", f.nodes[i].spec.Fleet.NodeID, n))
	}
	return strings.Join(parts, ", ")
}

// stop stops every node still running (in parallel), records them, and
// deletes the fleet's stream and buckets.
func (f *fleet) stop() {
	var wg sync.WaitGroup
	for _, sc := range f.nodes {
		sc.accepted, sc.recvStart, sc.fleetTotals = *f.accepted, f.recvStart, true
		wg.Go(func() { f.h.stopSidecar(sc) })
	}
	wg.Wait()
	if f.nats != nil {
		f.nats.dropStream(f.stream)
	}
}

// kill SIGKILLs a node and waits for it to be gone.
func (c *child) kill() {
	if c.running() {
		c.cmd.Process.Kill()
		<-c.exited
	}
}

// ---------------------------------------------------------------- baselines

// jsBaseline runs the bare publisher (_jspub) on f's cluster, its stream
// made with the settings of f's: window 0 is 64 closed-loop publishers,
// else one publisher with window publishes in flight.
func (h *harness) jsBaseline(ctx context.Context, f *fleet, name string, window int) *baselineResult {
	h.logf("baseline %s", name)
	b := &baselineResult{Name: name}
	r, err := h.runJSPub(ctx, f, window, name == baseJSFollow)
	if err == nil && r.PerSec <= 0 {
		err = fmt.Errorf("no publish acknowledged in the window: %s", r.FirstErr)
	}
	if err != nil {
		b.Err = err.Error()
		h.logf("baseline %s: %v", name, err)
	} else {
		b.PerSec, b.CPUPerOpUs, b.Latency, b.Seconds = r.PerSec, r.CPUPerPubUs, r.Latency, r.Seconds
		b.Extra = map[string]float64{"nats_cpu_us_per_publish": r.NATSCPUPerPubUs, "nats_cpu_cores": r.NATSCores,
			"window": float64(r.Window), "publishers": float64(r.Publishers), "errors": float64(r.Errors)}
		h.logf("  %-24s %8.0f publishes/s  cpu %5.1f µs/publish  nats %5.1f µs/publish (%.2f cores)  P99 %.2f ms",
			name, r.PerSec, r.CPUPerPubUs, r.NATSCPUPerPubUs, r.NATSCores, r.Latency.P99)
	}
	h.base[name] = b
	h.rep.Baselines[name] = b
	h.baselineRows(b)
	return b
}

func (h *harness) runJSPub(ctx context.Context, f *fleet, window int, follow bool) (*jspubResult, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var out strings.Builder
	args := []string{"_jspub", "-urls", strings.Join(f.nats.urls, ","), "-like", f.stream, "-stream", f.stream + "_BASE",
		"-publishers", strconv.Itoa(ingestProducers), "-window", strconv.Itoa(window), "-size", "512",
		"-headers", jsEventHeaders, "-key-prefix", h.runID + "-" + h.nextID("jspub"),
		"-warmup", h.opts.warmup.String(), "-duration", h.opts.duration.String(), "-nats-pid", strconv.Itoa(f.nats.pid),
		"-follow=" + strconv.FormatBool(follow)}
	logPath := filepath.Join(h.tmp, h.nextID("jspub")+".log")
	c, err := h.startChild("jspub", self, args, logPath, &syncWriter{w: &out})
	if err != nil {
		return nil, err
	}
	limit := h.opts.warmup + h.opts.duration + 90*time.Second
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-ctx.Done():
		c.stop(5 * time.Second)
		return nil, ctx.Err()
	case <-t.C:
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("publisher did not finish within %s", limit)
	}
	c.stop(time.Second)
	if c.err != nil {
		return nil, fmt.Errorf("publisher: %v: %s", c.err, tail(logPath, 1000))
	}
	var r jspubResult
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		return nil, fmt.Errorf("publisher output %q: %w", out.String(), err)
	}
	return &r, nil
}

// syncWriter serialises writes to w (a child's stdout is copied by a
// goroutine of exec).
type syncWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// ---------------------------------------------------------------- fleet-ingest

// scenarioFleetIngest: one fleet node (R3 on the 3-node cluster), no
// subscriptions, 64 closed-loop producers, against the bare JetStream
// publisher on the same cluster, then an open loop at half the rate.
func (h *harness) scenarioFleetIngest(ctx context.Context, name string) error {
	f, err := h.startFleet(ctx, name, 1, nil, fleetOpts{})
	if err != nil {
		return err
	}
	defer f.stop()
	// The baselines run while the node idles (it follows its own stream,
	// which they do not write to).
	pub := h.jsBaseline(ctx, f, baseJSPublish, 0)
	win := h.jsBaseline(ctx, f, baseJSWindow, jsWindow)
	fol := h.jsBaseline(ctx, f, baseJSFollow, 0)
	// The backend's own histogram of Append (publish, PubAck from the
	// quorum, and OnCommit of the event by this node's stream follower),
	// read around the window: how much of a request's time is the log's.
	var a0, a1 [2]float64
	appendStat := func() [2]float64 {
		v, _ := f.nodes[0].metricValues("sluice_queue_append_duration_seconds_sum", "sluice_queue_append_duration_seconds_count")
		return [2]float64{v[0], v[1]}
	}
	w := h.targetWindow(ctx, f.target, name, loadSpec{Conc: ingestProducers, Body: 512}, winOpts{Tick: func(phase int) {
		if phase == 0 {
			a0 = appendStat()
		} else {
			a1 = appendStat()
		}
	}})
	var open *window
	if w.Load.PerSec > 0 && ctx.Err() == nil {
		open = h.targetWindow(ctx, f.target, name+".open50", loadSpec{Conc: openWorkers, Rate: w.Load.PerSec / 2, Body: 512, Grace: openGrace}, winOpts{})
	}
	msgs, bytes, serr := f.nats.streamStats(f.stream)
	// The id index (<S>_IDS) holds an entry per event compaction removed
	// within the dedup window: with no subscription, every event.
	idMsgs, _, iderr := f.nats.streamStats("KV_" + f.stream + "_IDS")

	r := h.rep
	perSec := func(b *baselineResult) float64 { return b.PerSec }
	r.add(name, "requests/s (64 producers, 512 B)", w.Load.PerSec, "req/s").vs(pub, perSec).want(onRatio, ">=", 0.5).
		note(fmt.Sprintf("1 node, R%d on %d NATS servers", fleetReplicas, fleetNodes))
	r.add(name, "requests/s vs one publisher, 4096 in flight", w.Load.PerSec, "req/s").vs(win, perSec)
	r.add(name, "requests/s vs publishers that also await a follower", w.Load.PerSec, "req/s").vs(fol, perSec).
		note("the bare form of Append's wait for OnCommit")
	r.add(name, "P50 / P99 saturated", w.Load.Lat.P50, "ms").
		note(fmt.Sprintf("P99 %.2f ms; bare publisher P50 %.2f, P99 %.2f ms", w.Load.Lat.P99, pub.Latency.P50, pub.Latency.P99))
	if n := a1[1] - a0[1]; n > 0 {
		r.add(name, "mean Append (publish + PubAck + OnCommit) vs mean request", (a1[0]-a0[0])/n*1e3, "ms").
			vsValue("request", w.Load.Lat.Mean).
			note(fmt.Sprintf("sluice_queue_append_duration_seconds over the window, %.0f appends; bare publisher's mean PubAck %.2f ms, PubAck + follower %.2f ms", n, pub.Latency.Mean, fol.Latency.Mean))
	}
	if open != nil {
		r.add(name, fmt.Sprintf("P99 at 50%% load (%.0f/s, open loop)", open.RateOffered), open.Load.Lat.P99, "ms").
			note(fmt.Sprintf("P50 %.2f ms, max %.1f ms%s", open.Load.Lat.P50, open.Load.Lat.Max, slipNote(open)))
	}
	r.add(name, "sidecar CPU per request", w.CPUPerEventUs, "µs").vs(pub, func(b *baselineResult) float64 { return b.CPUPerOpUs }).
		note(fmt.Sprintf("%.2f cores busy; baseline = the bare publisher's CPU per publish", w.CPUCores))
	r.add(name, "NATS cluster CPU per request", w.NATSPerEventUs, "µs").
		vs(pub, func(b *baselineResult) float64 { return b.Extra["nats_cpu_us_per_publish"] }).
		note(fmt.Sprintf("%.2f cores busy (bare publisher: %.2f)", w.NATSCores, pub.Extra["nats_cpu_cores"]))
	if open != nil {
		r.add(name, "sidecar CPU per request at 50% load", open.CPUPerEventUs, "µs").vsValue("saturated", w.CPUPerEventUs).
			note(fmt.Sprintf("%.2f cores busy; NATS %.1f µs per request", open.CPUCores, open.NATSPerEventUs))
	}
	row := r.add(name, "sidecar allocated per request", w.BytesPerEvent, "B").note(fmt.Sprintf("%.1f allocs", w.AllocsPerEvent))
	if serr == nil {
		row.note(fmt.Sprintf("stream after the run: %d messages, %.0f B each", msgs, float64(bytes)/float64(max(msgs, 1))))
		if msgs > 0 {
			r.Extra[name+".stream_bytes_per_msg"] = float64(bytes) / float64(msgs) // for the model (model.go)
		}
	}
	if iderr != nil {
		h.logf("  id index of %s: %v", f.stream, iderr)
	} else {
		r.add(name, "id index entries written per accepted event", float64(idMsgs)/float64(max(*f.accepted, 1)), "").
			note(fmt.Sprintf("KV %s_IDS holds %d entries for %d events accepted: compaction's KV write per removed event (no subscription keeps any)", f.stream, idMsgs, *f.accepted))
	}
	r.add(name, "start-up (process start → /readyz)", f.nodes[0].ready.Seconds()*1e3, "ms").note("connects, creates the stream and buckets")
	return nil
}

// ---------------------------------------------------------------- fan-out

// scenarioFleetFanout: fan-out 10 on one Badger node, then on fleets of
// each size in counts (producers spread over the nodes), in the same run.
// With target, the per-node row of the first count carries the per-node
// target (fleet-fanout-10, ≥ 0.5× the Badger node); fleet-scale compares each size with the first.
func (h *harness) scenarioFleetFanout(ctx context.Context, name string, counts []int, target bool) error {
	const fan = 10
	subs := []subGroup{{fan, benchType}}
	bsc, err := h.start(ctx, sidecarSpec{Name: name + ".badger", Durability: "fsync", Subs: subs})
	if err != nil {
		return fmt.Errorf("badger node: %w", err)
	}
	bw := h.sidecarWindow(ctx, bsc, name+".badger", loadSpec{Conc: fanoutProducers, Body: 512}, winOpts{})
	h.stopSidecar(bsc)
	r := h.rep
	r.add(name, "Badger node: deliveries/s (fan-out 10, 32 producers)", bw.DeliveriesPerSec, "/s").
		note(fmt.Sprintf("%.0f events accepted/s; %.1f µs sidecar CPU per delivery", bw.Load.PerSec, bw.CPUPerDelivUs))
	perNode := map[int]float64{}
	for _, n := range counts {
		if ctx.Err() != nil {
			break
		}
		wn := name
		if len(counts) > 1 {
			wn = fmt.Sprintf("%s.nodes-%d", name, n)
		}
		w, f, err := h.fleetFanoutWindow(ctx, wn, n, subs)
		if err != nil {
			return err
		}
		per := w.DeliveriesPerSec / float64(n)
		perNode[n] = per
		lbl := fmt.Sprintf("%d fleet nodes", n)
		if n == 1 {
			lbl = "1 fleet node"
		}
		row := r.add(name, "deliveries/s per node, "+lbl, per, "/s").vsValue("Badger node", bw.DeliveriesPerSec).
			note(fmt.Sprintf("fleet total %.0f/s; lanes per node %s; per node delivered %s", w.DeliveriesPerSec, f.ownerSummary(), f.perNodeNote(w)))
		if target && n == counts[0] {
			row.want(onRatio, ">=", 0.5)
		}
		if n != counts[0] && perNode[counts[0]] > 0 {
			row.note(fmt.Sprintf("%.2f× the per-node figure with %d", per/perNode[counts[0]], counts[0]))
		}
		r.add(name, "events accepted/s, "+lbl, w.Load.PerSec, "/s").vsValue("Badger node", bw.Load.PerSec).
			note(fmt.Sprintf("backlog %+.0f deliveries over the window", float64(w.Load.WinOK*fan-w.Deliveries)))
		r.add(name, "sidecar CPU per delivery, "+lbl+" summed", w.CPUPerDelivUs, "µs").vsValue("Badger node", bw.CPUPerDelivUs).
			note(fmt.Sprintf("%.2f cores busy in the nodes; per node %s", w.CPUCores, cpuNote(w)))
		r.add(name, "NATS cluster CPU per delivery, "+lbl, w.NATSPerDelivUs, "µs").
			note(fmt.Sprintf("%.2f cores busy; %.1f µs per event", w.NATSCores, w.NATSPerEventUs))
		// What a node would deliver with the CPU the Badger node used: the
		// per-node figure on one machine each, which a shared 2-core
		// machine cannot show directly.
		if w.CPUPerDelivUs > 0 && bw.CPUPerDelivUs > 0 {
			badgerPerCPU := 1e6 / bw.CPUPerDelivUs
			r.add(name, "deliveries per CPU-second of the sidecars, "+lbl, 1e6/w.CPUPerDelivUs, "/s").
				vsValue("Badger node", badgerPerCPU).note("per core the nodes use; NATS not counted")
			r.add(name, "deliveries per CPU-second of sidecars + NATS, "+lbl, 1e6/(w.CPUPerDelivUs+w.NATSPerDelivUs), "/s").
				vsValue("Badger node", badgerPerCPU).note("the cluster's CPU charged to the fleet's deliveries")
		}
		r.add(name, "sidecar allocated per delivery, "+lbl, w.BytesPerDeliv, "B").vsValue("Badger node", bw.BytesPerDeliv).
			note(fmt.Sprintf("%.1f allocs (Badger node %.1f)", w.AllocsPerDeliv, bw.AllocsPerDeliv))
		r.add(name, "publish P99 (202), "+lbl, w.Load.Lat.P99, "ms").vsValue("Badger node", bw.Load.Lat.P99)
	}
	return nil
}

// fleetFanoutWindow starts a fleet of n nodes, measures one closed-loop
// window with the producers spread over them, and stops it.
func (h *harness) fleetFanoutWindow(ctx context.Context, wn string, n int, subs []subGroup) (*window, *fleet, error) {
	f, err := h.startFleet(ctx, wn, n, subs, fleetOpts{})
	if err != nil {
		return nil, nil, err
	}
	defer f.stop()
	paths := subs[0].Count
	var p0, p1 []int64
	w := h.targetWindow(ctx, f.target, wn, loadSpec{Conc: fanoutProducers, Body: 512}, winOpts{Tick: func(phase int) {
		if phase == 0 {
			p0 = h.recv.snapshotPaths(paths)
		} else {
			p1 = h.recv.snapshotPaths(paths)
		}
	}})
	f.pathDelta = make([]int64, paths)
	for i := range p1 {
		if i < len(p0) {
			f.pathDelta[i] = p1[i] - p0[i]
		}
	}
	return w, f, nil
}

// perNodeNote is the deliveries/s each node made in the window, from the
// receiver's per-path counts and the lanes' owners.
func (f *fleet) perNodeNote(w *window) string {
	if w.Seconds <= 0 {
		return "n/a"
	}
	by := map[string]int64{}
	for i, d := range f.pathDelta {
		by[f.owners["s"+strconv.Itoa(i)]] += d
	}
	var parts []string
	for _, sc := range f.nodes {
		id := sc.spec.Fleet.NodeID
		parts = append(parts, fmt.Sprintf("%s %.0f/s", id, float64(by[id])/w.Seconds))
	}
	return strings.Join(parts, ", ")
}

func cpuNote(w *window) string {
	var parts []string
	for _, c := range w.NodeCPUms {
		parts = append(parts, fmt.Sprintf("%.2f", c/1e3/w.Seconds))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%.2f", w.CPUCores)
	}
	return strings.Join(parts, "/") + " cores"
}

// ---------------------------------------------------------------- latency

// scenarioFleetLatency: fan-out 1 on a fleet of 3 (the lane on one node,
// producers on all three, so two events in three are accepted on a node
// that does not deliver them). Capacity first (64 closed-loop producers;
// the lower of accepted/s and delivered/s), then open loops at 25, 50 and
// 90% of it.
func (h *harness) scenarioFleetLatency(ctx context.Context, name string) error {
	f, err := h.startFleet(ctx, name, fleetNodes, []subGroup{{1, benchType}}, fleetOpts{})
	if err != nil {
		return err
	}
	defer f.stop()
	// At rest first: what three idle nodes and the cluster cost.
	idle := h.idleFleet(ctx, f)
	h.rep.add(name, fmt.Sprintf("idle CPU over %s: 3 nodes, 1 lane", h.opts.idle), idle.nodes, "ms/s").
		note(fmt.Sprintf("NATS cluster %.0f ms/s beside them; 1 ms/s = 0.1%% of a core", idle.nats))
	cw := h.targetWindow(ctx, f.target, name+".capacity", loadSpec{Conc: ingestProducers, Body: 512}, winOpts{Receipt: true, Drain: h.drainTimeout()})
	capacity := min(cw.Load.PerSec, cw.DeliveriesPerSec)
	r := h.rep
	r.add(name, "capacity (events/s, fan-out 1, 3 nodes)", capacity, "/s").
		note(fmt.Sprintf("accepted %.0f/s, delivered %.0f/s; backlog drained in %.1f s; lane on %s",
			cw.Load.PerSec, cw.DeliveriesPerSec, cw.DrainSeconds, f.owners["s0"]))
	if capacity <= 0 {
		return errors.New("no capacity measured")
	}
	for _, pct := range []int{25, 50, 90} {
		if ctx.Err() != nil {
			break
		}
		wn := name + ".load" + strconv.Itoa(pct)
		if pct == 50 {
			wn = name
		}
		rate := capacity * float64(pct) / 100
		w := h.targetWindow(ctx, f.target, wn, loadSpec{Conc: openWorkers, Rate: rate, Body: 512, Grace: openGrace},
			winOpts{Receipt: true, Drain: h.drainTimeout()})
		rc := w.Receipt
		if rc == nil {
			rc = &latSummary{}
		}
		at := fmt.Sprintf(" at %d%% (%.0f/s)", pct, rate)
		p50 := r.add(name, "publish→receipt P50"+at, rc.P50, "ms").
			note(fmt.Sprintf("%d samples; delivered %.0f/s; CPU %.0f µs per delivery (nodes), NATS %.0f µs", rc.N, w.DeliveriesPerSec, w.CPUPerDelivUs, w.NATSPerDelivUs))
		p99 := r.add(name, "publish→receipt P99"+at, rc.P99, "ms").
			note(fmt.Sprintf("max %.1f ms; ingest 202 P50 %.2f, P99 %.2f ms%s", rc.Max, w.Load.Lat.P50, w.Load.Lat.P99, slipNote(w)))
		if pct == 50 && h.badgerLat50 != nil {
			p50.vsValue("Badger latency", h.badgerLat50.P50)
			p99.vsValue("Badger latency", h.badgerLat50.P99)
		}
		if rc.N == 0 {
			p50.fail("no deliveries recorded")
		}
	}
	return nil
}

// ---------------------------------------------------------------- takeover

// takeoverTrial is one SIGKILL of a lane owner under a steady stream.
type takeoverTrial struct {
	LeaseTTL     string            `json:"lease_ttl"`
	Victim       string            `json:"victim"`
	VictimLanes  []string          `json:"victim_lanes"`
	Lanes        []takeoverLane    `json:"lanes"`
	Rate         float64           `json:"rate_events_per_s"`
	Subs         int               `json:"subscriptions"`
	KillAt       float64           `json:"kill_at_s"` // into the load
	Accepted     int64             `json:"accepted"`
	Unique       int64             `json:"unique_deliveries"`
	Owed         int64             `json:"owed_deliveries"`
	Duplicates   int64             `json:"duplicates"`
	Lost         int64             `json:"lost"`
	DrainSeconds float64           `json:"drain_seconds"`
	OthersRate   float64           `json:"other_lanes_deliveries_per_s_during"` // lanes of the survivors, kill → last takeover
	OthersBefore float64           `json:"other_lanes_deliveries_per_s_before"`
	Owners       map[string]string `json:"owners_before"`
	OwnersAfter  map[string]string `json:"owners_after,omitempty"`
	Error        string            `json:"error,omitempty"`
}

// takeoverLane is one lane of the killed node.
type takeoverLane struct {
	Subscription string  `json:"subscription"`
	NewOwner     string  `json:"new_owner"`
	TakeoverS    float64 `json:"sigkill_to_first_delivery_s"` // -1: none seen
	GapS         float64 `json:"receiver_gap_s"`              // last delivery by the victim → first by the new owner
}

const (
	takeoverSubs = 6   // so that the victim owns some and the survivors the rest
	takeoverRate = 200 // events/s, each to every subscription
)

// scenarioFleetTakeover: three nodes, six subscriptions whose deliveries
// carry X-Node, a steady open loop to the two nodes that survive; the owner
// of s0 is SIGKILLed and the receiver times, for each lane it owned, the
// first delivery by another node. Once per lease_ttl: 3 s (the demo's)
// and, without -quick, the default of 10 s.
func (h *harness) scenarioFleetTakeover(ctx context.Context, name string) error {
	ttls := []time.Duration{3 * time.Second, 10 * time.Second}
	if h.opts.quick {
		ttls = ttls[:1]
	}
	var trials []*takeoverTrial
	var firstErr error
	for _, ttl := range ttls {
		if ctx.Err() != nil {
			break
		}
		tr, err := h.takeoverTrial(ctx, name, ttl)
		if err != nil {
			tr.Error = err.Error()
			if firstErr == nil {
				firstErr = fmt.Errorf("lease_ttl %s: %w", ttl, err)
			}
		}
		trials = append(trials, tr)
		h.takeoverRows(name, tr, ttl)
	}
	h.rep.Details[name] = map[string]any{"rate_events_per_s": takeoverRate, "subscriptions": takeoverSubs, "trials": trials}
	return firstErr
}

func (h *harness) takeoverTrial(ctx context.Context, name string, ttl time.Duration) (*takeoverTrial, error) {
	tr := &takeoverTrial{LeaseTTL: ttl.String(), Rate: takeoverRate, Subs: takeoverSubs}
	f, err := h.startFleet(ctx, fmt.Sprintf("%s.ttl-%s", name, yamlDur(ttl)), fleetNodes,
		[]subGroup{{takeoverSubs, benchType}}, fleetOpts{LeaseTTL: ttl, NodeHeader: true})
	if err != nil {
		return tr, err
	}
	defer f.stop()
	tr.Owners = f.owners
	tr.Victim = f.owners["s0"]
	var victim *sidecar
	var survivors []string
	for _, sc := range f.nodes {
		if sc.spec.Fleet.NodeID == tr.Victim {
			victim = sc
		} else {
			survivors = append(survivors, sc.ingest)
		}
	}
	if victim == nil {
		return tr, fmt.Errorf("owner %q of s0 is not a node", tr.Victim)
	}
	for i := range takeoverSubs {
		if s := "s" + strconv.Itoa(i); f.owners[s] == tr.Victim {
			tr.VictimLanes = append(tr.VictimLanes, s)
		}
	}
	nw := newNodeWatch()
	track := newIDTracker(time.Time{})
	h.recv.nodes.Store(nw)
	h.recv.track.Store(track)
	defer func() {
		h.recv.nodes.CompareAndSwap(nw, nil)
		h.recv.track.CompareAndSwap(track, nil)
	}()

	pre := 3 * time.Second
	if h.opts.quick {
		pre = 2 * time.Second
	}
	wait := ttl + 20*time.Second // for the new owners, after the kill
	stop := make(chan struct{})
	start := time.Now()
	spec := loadSpec{Addrs: survivors, Paths: []string{eventsPath}, Status: 202, Keys: true, KeyID: h.runID + "-" + h.nextID("k"),
		Conc: openWorkers, Rate: takeoverRate, Body: 512, Start: start, Dur: pre + wait + 2*time.Second, Grace: openGrace, Stop: stop}
	done := make(chan loadResult, 1)
	go func() { done <- runLoad(ctx, spec) }()

	sleepUntil(ctx, start.Add(pre))
	before := h.recv.snapshotPaths(takeoverSubs)
	killAt := time.Now()
	nw.setMark(killAt)
	victim.kill()
	tr.KillAt = killAt.Sub(start).Seconds()
	h.logf("  SIGKILL %s (owner of %s), lease_ttl %s", tr.Victim, strings.Join(tr.VictimLanes, ","), ttl)

	// Wait until every lane of the victim was delivered by another node.
	taken := func() bool {
		for _, s := range tr.VictimLanes {
			i, _ := strconv.Atoi(strings.TrimPrefix(s, "s"))
			ok := false
			for node, seen := range nw.get(i) {
				if node != tr.Victim && seen.AfterMark > 0 {
					ok = true
				}
			}
			if !ok {
				return false
			}
		}
		return true
	}
	waitFor(ctx, wait, taken)
	tookAll := time.Now()
	after := h.recv.snapshotPaths(takeoverSubs)
	// A second more of load, then stop it.
	sleepUntil(ctx, time.Now().Add(time.Second))
	close(stop)
	res := <-done
	tr.Accepted = res.OK

	// The lanes of the killed node.
	var others, othersN int64
	for i := range takeoverSubs {
		s := "s" + strconv.Itoa(i)
		if !slices.Contains(tr.VictimLanes, s) {
			others += after[i] - before[i]
			othersN++
			continue
		}
		seen := nw.get(i)
		l := takeoverLane{Subscription: s, TakeoverS: -1, GapS: -1}
		for node, x := range seen {
			if node == tr.Victim || x.AfterMark == 0 {
				continue
			}
			if t := x.FirstAfterMark.Sub(killAt).Seconds(); l.TakeoverS < 0 || t < l.TakeoverS {
				l.TakeoverS, l.NewOwner = t, node
				if v, ok := seen[tr.Victim]; ok {
					l.GapS = x.FirstAfterMark.Sub(v.LastBeforeMark).Seconds()
				}
			}
		}
		tr.Lanes = append(tr.Lanes, l)
	}
	if d := tookAll.Sub(killAt).Seconds(); d > 0 && othersN > 0 {
		tr.OthersRate = float64(others) / d
	}
	tr.OthersBefore = takeoverRate * float64(othersN)

	// Everything accepted must reach every subscription.
	tr.Owed = tr.Accepted * takeoverSubs
	ds := time.Now()
	waitFor(ctx, h.drainTimeout(), func() bool { return track.stats().Unique >= tr.Owed })
	tr.DrainSeconds = time.Since(ds).Seconds()
	st := track.stats()
	tr.Unique, tr.Duplicates = st.Unique, st.Duplicates
	tr.Lost = max(0, tr.Owed-st.Unique)
	if m, err := ownersOf(f.nodes[slices.IndexFunc(f.nodes, func(sc *sidecar) bool { return sc != victim })]); err == nil {
		tr.OwnersAfter = m
	}
	if !taken() {
		return tr, fmt.Errorf("lanes of %s not delivered by another node within %s of the SIGKILL", tr.Victim, wait)
	}
	return tr, nil
}

func (h *harness) takeoverRows(name string, tr *takeoverTrial, ttl time.Duration) {
	r := h.rep
	at := fmt.Sprintf(", lease_ttl %s", yamlDur(ttl))
	worst, gap := -1.0, -1.0
	var parts []string
	for _, l := range tr.Lanes {
		worst = max(worst, l.TakeoverS)
		gap = max(gap, l.GapS)
		parts = append(parts, fmt.Sprintf("%s→%s %.2f s", l.Subscription, l.NewOwner, l.TakeoverS))
	}
	row := r.add(name, "SIGKILL → first delivery by the new owner (slowest lane)"+at, worst, "s").
		want(onValue, "<=", ttl.Seconds()+2).
		note(fmt.Sprintf("%s owned %d of %d lanes: %s; bound = lease_ttl + 2 s (the crash soak's)",
			tr.Victim, len(tr.VictimLanes), tr.Subs, strings.Join(parts, ", ")))
	if tr.Error != "" || worst < 0 {
		row.fail(tr.Error)
	}
	r.add(name, "receiver gap on the moved lanes (last by old owner → first by new)"+at, gap, "s")
	r.add(name, "other lanes' deliveries/s while the lanes moved"+at, tr.OthersRate, "/s").vsValue("offered", tr.OthersBefore).
		note("the survivors' lanes, SIGKILL → last lane taken over")
	lost := r.add(name, "lost deliveries"+at, float64(tr.Lost), "").want(onValue, "<=", 0).
		note(fmt.Sprintf("%d events accepted × %d subscriptions = %d owed, %d unique delivered (drained %.1f s after the load)",
			tr.Accepted, tr.Subs, tr.Owed, tr.Unique, tr.DrainSeconds))
	if tr.Owed == 0 {
		lost.fail("no events accepted")
	}
	r.add(name, "duplicates"+at, float64(tr.Duplicates), "").note("deliveries in flight on the killed node, sent again: at-least-once")
}

// idleCPU is CPU ms per second at rest.
type idleCPU struct{ nodes, nats float64 }

// idleFleet measures f's nodes (summed) and the cluster with no load,
// over the idle window of lanes-50k.
func (h *harness) idleFleet(ctx context.Context, f *fleet) idleCPU {
	s0 := h.snapshotTarget(f.target)
	sleepUntil(ctx, s0.T.Add(h.opts.idle))
	s1 := h.snapshotTarget(f.target)
	secs := s1.T.Sub(s0.T).Seconds()
	return idleCPU{nodes: float64(s1.CPU-s0.CPU) / 1e6 / secs, nats: float64(s1.NATS-s0.NATS) / 1e6 / secs}
}
