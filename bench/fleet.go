package main

// The fleet scenarios (targets in bench/README.md): sluice nodes in
// fleet mode (log.backend: jetstream) on an embedded 3-node JetStream
// cluster that runs in a child process of its own (_nats), against a bare
// JetStream publisher on the same cluster and against one Badger node on
// the same machine, in the same run.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"
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

// fleetScenarios are opt-in: -scenarios fleet selects them all.
var fleetScenarios = []string{"fleet-ingest", "sidecar-fleet", "fleet-fanout-10", "fleet-latency", "fleet-takeover", "fleet-scale"}

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
