package main

// fleet-fanout-10 and fleet-scale: fan-out 10 on a Badger node, then on fleets.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

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
