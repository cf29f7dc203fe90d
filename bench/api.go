package main

// The api scenario ("Speed"): subscriptions created through the
// admin API (POST /v1/subscriptions) instead of the config file.
//
//   - Creates: a sidecar (fsync) with no subscriptions; 10,000 creates
//     (1,000 with -quick) from 8 concurrent clients. A create writes the
//     subscription's membership and syncs the log before its 201 (an event
//     accepted after the 201 is owed to it), and creates take one lock, so
//     their rate is compared with the bare cost of a sync on the same file
//     system, measured in the same run just before and after: write+fsync
//     of 128 bytes at offset 0 of a file, one writer (and 8, for context).
//   - Restart with those subscriptions (fsync): start-up, then GET
//     /v1/subscriptions must list every one, and one event must reach
//     every lane of the sample (below) and no other.
//   - Start-up with 50,000 API subscriptions (5,000 with -quick): a data
//     dir seeded through the API by a sidecar with durability async (the
//     seed only has to be fast; its creates/s are reported as context),
//     stopped with SIGTERM, then a sidecar with fsync on that data dir:
//     process start → /readyz against a 0-subscription start of the same
//     run and, when lanes-50k ran before in the same invocation with as
//     many lanes, its start with file subscriptions; live heap per lane
//     once quiet; the same list and delivery checks.
//
// Subscription i is "a<i>", posts to the receiver's /s<i> and takes
// benchType when i is a multiple of apiSample (the sample the delivery
// check looks at), idleType otherwise.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/proxy/api"
)

const (
	apiClients = 8   // concurrent clients of the create phases
	apiSample  = 100 // every apiSample-th subscription takes benchType
	// fsyncBytes is what each bare write+fsync writes, at offset 0.
	fsyncBytes = 128
)

func (h *harness) scenarioAPI(ctx context.Context, name string) error {
	r := h.rep
	creates, many := 10000, 50000
	fsyncWin := 2 * time.Second
	if h.opts.quick {
		creates, many, fsyncWin = 1000, 5000, 500*time.Millisecond
	}

	// The 0-subscription start, the baseline of the start-up rows, and its
	// heap for the per-lane figure.
	empty, m0, err := h.emptyIdle(ctx, name)
	if err != nil {
		return err
	}

	// Creates, fsync, bracketed by the bare fsync baseline.
	fsDir := filepath.Join(h.tmp, h.nextID(name+"-fsync"))
	defer os.RemoveAll(fsDir)
	fsBefore, err := measureFsync(ctx, fsDir, 1, fsyncWin)
	if err != nil {
		return fmt.Errorf("fsync baseline: %w", err)
	}
	dirA := filepath.Join(h.tmp, h.nextID(name+".creates")+"-data")
	defer os.RemoveAll(dirA)
	sc, err := h.start(ctx, sidecarSpec{Name: name + ".creates", Durability: "fsync", DataDir: dirA})
	if err != nil {
		return err
	}
	cr, err := h.createPhase(ctx, sc, name+".creates", creates)
	h.stopSidecar(sc)
	if err != nil {
		return err
	}
	fsAfter, err := measureFsync(ctx, fsDir, 1, fsyncWin)
	if err != nil {
		return fmt.Errorf("fsync baseline: %w", err)
	}
	fs8, err := measureFsync(ctx, fsDir, apiClients, fsyncWin)
	if err != nil {
		return fmt.Errorf("fsync baseline: %w", err)
	}
	fsRate := (fsBefore.perSec + fsAfter.perSec) / 2
	r.add(name, fmt.Sprintf("bare write+fsync of %d B on the data dir's file system, 1 writer", fsyncBytes), fsRate, "/s").
		note(fmt.Sprintf("before the creates %.0f/s (P50 %.2f ms, P99 %.2f ms), after %.0f/s (P50 %.2f ms, P99 %.2f ms)",
			fsBefore.perSec, fsBefore.lat.P50, fsBefore.lat.P99, fsAfter.perSec, fsAfter.lat.P50, fsAfter.lat.P99))
	r.add(name, fmt.Sprintf("bare write+fsync, %d writers (a file each)", apiClients), fs8.perSec, "/s").vsValue("1 writer", fsRate).
		note(fmt.Sprintf("P50 %.2f ms, P99 %.2f ms: what the file system gives concurrent syncs", fs8.lat.P50, fs8.lat.P99))
	cr.rows(r, name, fmt.Sprintf("creates/s, %d subscriptions, %d clients, fsync", creates, apiClients)).
		vsValue("fsyncs/s, 1 writer", fsRate)
	if cr.syncs > 0 {
		r.add(name, "log syncs per create (fsync)", cr.syncs/float64(cr.ok), "").
			note(fmt.Sprintf("mean sync %.2f ms (sluice_queue_sync_duration_seconds, 2 msyncs each: WAL and value log); syncing %.0f%% of the phase's wall time",
				cr.syncSecs/cr.syncs*1e3, 100*cr.syncSecs/cr.secs))
	}

	// Restart on the fsync-created data dir.
	if ctx.Err() == nil {
		sc, err := h.start(ctx, sidecarSpec{Name: name + ".restart", Durability: "fsync", DataDir: dirA})
		if err != nil {
			return fmt.Errorf("restart with %d API subscriptions: %w", creates, err)
		}
		r.add(name, fmt.Sprintf("start-up (process start → /readyz), %d API subscriptions", creates), sc.ready.Seconds(), "s").
			vsValue("0 subscriptions", empty.ready.Seconds())
		err = h.checkAPI(ctx, sc, name, creates)
		h.stopSidecar(sc)
		if err != nil {
			return err
		}
	}

	// Seed many through the API with durability async, then start on them.
	dirB := filepath.Join(h.tmp, h.nextID(name+".seed")+"-data")
	defer os.RemoveAll(dirB)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	seed, err := h.start(ctx, sidecarSpec{Name: name + ".seed", Durability: "async", DataDir: dirB})
	if err != nil {
		return err
	}
	sr, err := h.createPhase(ctx, seed, name+".seed", many)
	h.stopSidecar(seed)
	if err != nil {
		return err
	}
	sr.rows(r, name, fmt.Sprintf("creates/s, seeding %d subscriptions, %d clients, durability async", many, apiClients)).
		vsValue("fsync creates", cr.perSec()).note("the seed of the start-up below; async so that it is quick (no sync before the 201)")
	if ctx.Err() != nil {
		return ctx.Err()
	}
	fileRestart, err := h.fileRestart(ctx, name+".file", many)
	if err != nil {
		return err
	}
	sc, err = h.start(ctx, sidecarSpec{Name: name, Durability: "fsync", DataDir: dirB})
	label := fmt.Sprintf("%d API subscriptions", many)
	if errors.Is(err, errNotReady) {
		r.add(name, "start-up (process start → /readyz), "+label, h.opts.startTimeout.Seconds(), "s").
			fail(fmt.Sprintf("not ready within %s (-start-timeout); the value is that lower bound", h.opts.startTimeout))
		return err
	}
	if err != nil {
		return err
	}
	defer h.stopSidecar(sc)
	row := r.add(name, "start-up (process start → /readyz), "+label, sc.ready.Seconds(), "s")
	note := fmt.Sprintf("0 subscriptions: %.3f s", empty.ready.Seconds())
	if file := h.sidecarRecord("lanes-50k", many); file != nil {
		row.vsValue(fmt.Sprintf("%d file subscriptions", many), file.ReadySeconds)
	} else {
		row.vsValue("0 subscriptions", empty.ready.Seconds())
		note = fmt.Sprintf("lanes-50k with %d lanes did not run in this invocation", many)
	}
	row.note(note)
	r.add(name, "  the same vs a restart with as many file subscriptions", sc.ready.Seconds(), "s").
		vsValue("file, memberships on disk", fileRestart.Seconds()).
		note("lanes-50k starts on an empty data dir, writing every membership; this restart finds them written, like the API's")
	m1, err := h.idleState(ctx, sc, h.opts.idle)
	if err != nil {
		return err
	}
	tail := r.add(name, "start-up tail: /readyz → quiet, heap stable", m1.tail.Seconds(), "s").
		note(fmt.Sprintf("CPU quiet after %.1f s (%.2f s of CPU)", m1.cpuQuiet.Seconds(), m1.tailCPU.Seconds()))
	if !m1.quiet {
		tail.fail(fmt.Sprintf("CPU or heap still moving after %s", h.opts.settle))
	}
	perLane := (float64(m1.heap.HeapAlloc) - float64(m0.heap.HeapAlloc)) / float64(many)
	heap := r.add(name, "live heap per API lane (quiet, after GC)", perLane, "B").
		note(fmt.Sprintf("heap %.1f → %.1f MiB vs 0 subscriptions; at /readyz %.0f B per lane", mib(m0.heap.HeapAlloc), mib(m1.heap.HeapAlloc),
			(float64(m1.heapReady.HeapAlloc)-float64(m0.heapReady.HeapAlloc))/float64(many)))
	if fe, ok := r.Extra["lanes-50k.heap_quiet_empty_bytes"]; ok && h.sidecarRecord("lanes-50k", many) != nil {
		heap.vsValue("file lane (lanes-50k)", (r.Extra["lanes-50k.heap_quiet_lanes_bytes"]-fe)/float64(many))
	}
	r.add(name, fmt.Sprintf("idle CPU over %s, %s (quiet)", h.opts.idle, label), m1.idle, "ms/s").vsValue("0 subscriptions", m0.idle).
		note(fmt.Sprintf("resolution %s ms/s", fmtNum(1e3/clockTicks/h.opts.idle.Seconds())))
	if h.opts.profileDir != "" {
		if err := sc.profile(filepath.Join(h.opts.profileDir, name+".idle.cpu.pprof"), 10); err != nil {
			h.logf("  %s: idle cpu profile: %v", name, err)
		}
	}
	for k, v := range map[string]float64{
		"creates_per_s": cr.perSec(), "creates_seconds": cr.secs, "create_p50_ms": cr.lat.P50, "create_p99_ms": cr.lat.P99,
		"fsyncs_per_s": fsRate, "fsyncs_per_s_8_writers": fs8.perSec, "seed_creates_per_s": sr.perSec(),
		"ready_seconds": sc.ready.Seconds(), "ready_empty_seconds": empty.ready.Seconds(),
		"heap_quiet_empty_bytes": float64(m0.heap.HeapAlloc), "heap_quiet_lanes_bytes": float64(m1.heap.HeapAlloc),
	} {
		r.Extra[name+"."+k] = v
	}
	return h.checkAPI(ctx, sc, name, many)
}

// sidecarRecord returns the record of the stopped sidecar called name with
// n subscriptions, if the run has one.
func (h *harness) sidecarRecord(name string, n int) *sidecarRecord {
	for _, s := range h.rep.Sidecars {
		if s.Name == name && s.Subscriptions == n && s.ReadySeconds > 0 {
			return s
		}
	}
	return nil
}

// apiClient is a client of sc's admin API for the scenario: no retries,
// long attempts (the list of 50,000 lanes is tens of MiB), and as many
// idle connections as it has callers, so concurrent creates keep theirs
// (http.DefaultTransport keeps 2 per host).
func apiClient(sc *sidecar, conns int) (*client.Client, error) {
	return client.New(sc.admin, client.Options{
		RetryMax: -1, AttemptTimeout: 2 * time.Minute, MaxResponseBytes: 1 << 30,
		Transport: &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute},
	})
}

// apiDoc is subscription i as POST /v1/subscriptions takes it.
func (h *harness) apiDoc(i int) json.RawMessage {
	typ := idleType
	if i%apiSample == 0 {
		typ = benchType
	}
	return json.RawMessage(fmt.Sprintf(`{"id":"a%d","url":"%s/s%d","secret":%q,"types":[%q],"concurrency":{"max":%d}}`,
		i, h.recv.url(), i, benchSecret, typ, laneCap))
}

// createResult is one create phase.
type createResult struct {
	n, ok, errs int
	firstErr    string
	secs        float64
	lat         latSummary
	cpu         time.Duration // the sidecar's
	syncs       float64       // log syncs over the phase
	syncSecs    float64       // their total duration
}

func (c *createResult) perSec() float64 {
	if c.secs <= 0 {
		return 0
	}
	return float64(c.ok) / c.secs
}

// rows adds the phase's rows; the first (creates/s) is returned.
func (c *createResult) rows(r *report, scenario, metric string) *row {
	first := r.add(scenario, metric, c.perSec(), "/s").
		note(fmt.Sprintf("%d created in %.1f s", c.ok, c.secs))
	if c.errs > 0 {
		first.fail(fmt.Sprintf("%d of %d creates failed, first: %s", c.errs, c.n, c.firstErr))
	}
	r.add(scenario, "  create latency P50 (201)", c.lat.P50, "ms").
		note(fmt.Sprintf("P90 %.2f ms, P99 %.2f ms, max %.1f ms", c.lat.P90, c.lat.P99, c.lat.Max))
	r.add(scenario, "  create latency P99", c.lat.P99, "ms")
	if c.ok > 0 {
		r.add(scenario, "  sidecar CPU per create", float64(c.cpu.Microseconds())/float64(c.ok), "µs").
			note(fmt.Sprintf("%.2f cores busy", c.cpu.Seconds()/c.secs))
	}
	return first
}

// createPhase creates subscriptions a0 .. a<n-1> through sc's API from
// apiClients clients, measuring each create's latency, the sidecar's CPU
// and its log syncs. With -profile it takes a CPU profile of the first
// seconds (DIR/<phase>.cpu.pprof).
func (h *harness) createPhase(ctx context.Context, sc *sidecar, phase string, n int) (*createResult, error) {
	c, err := apiClient(sc, apiClients)
	if err != nil {
		return nil, err
	}
	res := &createResult{n: n}
	var prof sync.WaitGroup
	if h.opts.profileDir != "" {
		secs := 3 // about the length of a phase (10,000 fsync or 50,000 async creates)
		if h.opts.quick {
			secs = 1
		}
		prof.Go(func() {
			if err := sc.profile(filepath.Join(h.opts.profileDir, phase+".cpu.pprof"), secs); err != nil {
				h.logf("  %s: cpu profile: %v", phase, err)
			}
		})
	}
	syncNames := []string{"sluice_queue_sync_duration_seconds_count", "sluice_queue_sync_duration_seconds_sum"}
	m0, _ := sc.metricValues(syncNames...)
	cpu0, err := procCPU(sc.pid)
	if err != nil {
		return nil, err
	}
	var (
		next    atomic.Int64
		mu      sync.Mutex
		lat     []int64
		errOnce sync.Once
	)
	start := time.Now()
	var wg sync.WaitGroup
	for range apiClients {
		wg.Go(func() {
			mine := make([]int64, 0, n/apiClients+1)
			var ok, errs int
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					break
				}
				doc := h.apiDoc(i)
				t0 := time.Now()
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				_, err := c.CreateSubscription(cctx, doc)
				cancel()
				if err != nil {
					errs++
					errOnce.Do(func() { res.firstErr = err.Error() })
					continue
				}
				mine = append(mine, int64(time.Since(t0)))
				ok++
			}
			mu.Lock()
			lat = append(lat, mine...)
			res.ok += ok
			res.errs += errs
			mu.Unlock()
		})
	}
	wg.Wait()
	res.secs = time.Since(start).Seconds()
	cpu1, err := procCPU(sc.pid)
	if err != nil {
		return nil, err
	}
	m1, _ := sc.metricValues(syncNames...)
	res.cpu = cpu1 - cpu0
	res.syncs, res.syncSecs = m1[0]-m0[0], m1[1]-m0[1]
	res.lat = summarize(lat)
	prof.Wait()
	c.CloseIdleConnections()
	h.logf("  %s: %d created in %.1f s (%.0f/s; P50 %.2f ms, P99 %.2f ms), %d errors", phase, res.ok, res.secs,
		res.perSec(), res.lat.P50, res.lat.P99, res.errs)
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, nil
}

// checkAPI checks sc after a restart: GET /v1/subscriptions lists a0 ..
// a<n-1>, all managed by the API, and one event of benchType reaches every
// lane of the sample and no other. Each check is a row with a target.
func (h *harness) checkAPI(ctx context.Context, sc *sidecar, scenario string, n int) error {
	r := h.rep
	c, err := apiClient(sc, 1)
	if err != nil {
		return err
	}
	defer c.CloseIdleConnections()
	t0 := time.Now()
	list, err := c.Subscriptions(ctx)
	if err != nil {
		return fmt.Errorf("list after the restart: %w", err)
	}
	listSecs := time.Since(t0).Seconds()
	listed, wrong := 0, 0
	for _, l := range list.Subscriptions {
		if !strings.HasPrefix(l.Subscription, "a") {
			continue
		}
		if l.ManagedBy == api.ManagedByAPI {
			listed++
		} else {
			wrong++
		}
	}
	lr := r.add(scenario, fmt.Sprintf("  GET /v1/subscriptions after the restart lists, of %d", n), float64(listed), "").
		want(onValue, ">=", float64(n)).note(fmt.Sprintf("answered in %.2f s", listSecs))
	if wrong > 0 {
		lr.fail(fmt.Sprintf("%d not managed by the API", wrong))
	}

	// One event; the sample lanes must each get it, the others nothing.
	sample := make([]int, 0, n/apiSample+1)
	for i := 0; i < n; i += apiSample {
		sample = append(sample, i)
	}
	before := h.recv.snapshotPaths(n)
	body := []byte(`{"check":"api","n":` + fmt.Sprint(n) + `}`)
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodPost, "http://"+sc.ingest+eventsPath, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", h.runID+"-"+h.nextID("api-check"))
	resp, err := sc.http.Do(req)
	if err != nil {
		return fmt.Errorf("publish the check event: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("publish the check event: status %d", resp.StatusCode)
	}
	sent := time.Now()
	got := func() int {
		k := 0
		for _, i := range sample {
			if h.recv.tb.Accepted(pathName(i)) > before[i] {
				k++
			}
		}
		return k
	}
	waitFor(ctx, h.drainTimeout(), func() bool { return got() == len(sample) })
	took := time.Since(sent)
	k := got()
	time.Sleep(200 * time.Millisecond) // let strays, if any, arrive
	after := h.recv.snapshotPaths(n)
	var stray int64
	for i := range after {
		if i%apiSample != 0 {
			stray += after[i] - before[i]
		}
	}
	dr := r.add(scenario, fmt.Sprintf("  sample lanes that got 1 event after the restart, of %d", len(sample)), float64(k), "").
		want(onValue, ">=", float64(len(sample))).
		note(fmt.Sprintf("every %dth subscription takes %s; the last in %.2f s; %d deliveries to the %d other lanes", apiSample, benchType,
			took.Seconds(), stray, n-len(sample)))
	if stray > 0 {
		dr.fail("deliveries to lanes of another type")
	}
	if listed < n || k < len(sample) || stray > 0 || wrong > 0 {
		h.logf("  %s: listed %d of %d (%d not the API's), delivered to %d of %d sample lanes, %d strays", sc.spec.Name, listed, n, wrong,
			k, len(sample), stray)
	}
	return nil
}

// fsyncResult is the bare sync baseline.
type fsyncResult struct {
	perSec float64
	lat    latSummary
}

// measureFsync writes fsyncBytes at offset 0 of a file and fsyncs it, in
// a loop for dur, from writers goroutines with a file each, in dir (on
// the file system of the sidecars' data dirs).
func measureFsync(ctx context.Context, dir string, writers int, dur time.Duration) (fsyncResult, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fsyncResult{}, err
	}
	buf := bytes.Repeat([]byte("s"), fsyncBytes)
	var (
		mu    sync.Mutex
		lat   []int64
		first error
	)
	start := time.Now()
	end := start.Add(dur)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			var mine []int64
			err := func() error {
				f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("sync-%d", w)), os.O_RDWR|os.O_CREATE, 0o644)
				if err != nil {
					return err
				}
				defer f.Close()
				for ctx.Err() == nil && time.Now().Before(end) {
					t0 := time.Now()
					if _, err := f.WriteAt(buf, 0); err != nil {
						return err
					}
					if err := f.Sync(); err != nil {
						return err
					}
					mine = append(mine, int64(time.Since(t0)))
				}
				return nil
			}()
			mu.Lock()
			lat = append(lat, mine...)
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	if first != nil {
		return fsyncResult{}, first
	}
	n := len(lat)
	return fsyncResult{perSec: float64(n) / el, lat: summarize(lat)}, ctx.Err()
}

// fileRestart starts a sidecar with n subscriptions from its config file
// (1% of them bench.event, as lanes-50k), stops it, and starts it again on
// the same data dir: the start-up of file subscriptions whose memberships
// are on disk, as an API subscription's always are after its create.
func (h *harness) fileRestart(ctx context.Context, name string, n int) (time.Duration, error) {
	dir := filepath.Join(h.tmp, h.nextID(name)+"-data")
	defer os.RemoveAll(dir)
	active := max(1, n/100)
	spec := sidecarSpec{Name: name, Durability: "fsync", Subs: []subGroup{{active, benchType}, {n - active, idleType}}, DataDir: dir}
	first, err := h.start(ctx, spec)
	if err != nil {
		return 0, fmt.Errorf("file subscriptions: %w", err)
	}
	h.stopSidecar(first)
	spec.Name = name + ".restart"
	sc, err := h.start(ctx, spec)
	if err != nil {
		return 0, fmt.Errorf("file subscriptions, restart: %w", err)
	}
	h.stopSidecar(sc)
	return sc.ready, nil
}
