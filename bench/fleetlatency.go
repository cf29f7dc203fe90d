package main

// fleet-latency: idle CPU, capacity, then publish→receipt latency under load.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

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
		rc := receiptOf(w)
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
