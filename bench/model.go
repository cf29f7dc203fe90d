package main

// The model: what a platform past this machine takes with
// sluice, worked out at the end of every run from the per-core figures the
// run measured, so that it is re-derived whenever the code or the machine
// changes. The platform sluice is sized for: 25,000 triggers/s with a mean fan-out of
// 40, i.e. 1,000,000 deliveries/s, to endpoints it does not own.
//
// The model is linear in the deliveries except for one term: in fleet mode
// every node follows the whole stream (each event reaches every node, which
// decodes it and offers it to the lanes it owns), so the nodes' cost of
// following grows with the node count. The run measures that term from
// fleet-scale (1, 2 and 3 nodes) and the model solves for it; the same
// windows show whether the rest is linear (sluice CPU per delivery flat in
// the node count).

import (
	"fmt"
	"math"
	"strings"

	"github.com/sluicehq/sluice/proxy/egress"
)

// The platform and the assumptions of the model. The endpoint latencies
// are what remote HTTPS endpoints answer in (the harness's receiver is on
// loopback and answers in well under a millisecond, so it cannot measure
// them).
const (
	modelTriggers    = 25_000 // events/s ingested
	modelFanout      = 40     // mean deliveries per event
	modelCoresPerPod = 2      // cores of each sidecar's node
	modelUtilisation = 0.6    // the share of a core the model lets sluice use (headroom for bursts and retries)
	modelSubs        = 50_000 // subscriptions, for memory (the lanes-50k scale)
	modelReplicas    = 3      // JetStream R3
)

var modelLatencies = []float64{0.05, 0.25} // s: a quick and a slow endpoint

// modelInputs are the figures of this run the model needs; zero when the
// scenario that measures it did not run.
type modelInputs struct {
	cpuPerDeliv   float64 // µs of sidecar CPU per delivery, fan-out 40, Badger (ingest included)
	rssPerSidecar float64 // bytes, the fan-out-40 sidecar's RSS at the end of its window
	heapPerLane   float64 // bytes of live heap per idle lane (lanes-50k)
	// The fleet nodes' CPU, fit over fleet-scale's 1, 2 and 3 nodes as
	// CPU = perDeliv·deliveries + perEvent·events + followPerEv·events·nodes:
	// delivering, ingesting, and every node following every event.
	fleetPerDeliv float64 // µs per delivery
	fleetPerEvent float64 // µs per event ingested (by whichever node took it)
	followPerEv   float64 // µs per event per node following the stream
	natsBase      float64 // µs of NATS cluster CPU per event (R3), with no follower (fit)
	natsPerNode   float64 // µs of NATS cluster CPU per event per following node (fit)
	eventBytes    float64 // bytes of one stored message (fleet-ingest's stream)
	scaleNodes    []float64
	scalePerCPU   []float64 // deliveries per sidecar CPU-second at each node count
}

func (h *harness) windowNamed(name string) *window {
	for _, w := range h.rep.Windows {
		if w.Name == name && len(w.Errors) == 0 {
			return w
		}
	}
	return nil
}

func (r *report) rowValue(scenario, metricPrefix string) float64 {
	for _, x := range r.Rows {
		if x.Scenario == scenario && strings.HasPrefix(x.Metric, metricPrefix) {
			return x.Value
		}
	}
	return 0
}

func (h *harness) modelInputs() modelInputs {
	var in modelInputs
	if w := h.windowNamed("fanout-40"); w != nil {
		in.cpuPerDeliv = w.CPUPerDelivUs
		in.rssPerSidecar = float64(w.RSSEnd)
	}
	in.heapPerLane = h.rep.rowValue("lanes-50k", "live heap per idle lane")
	in.eventBytes = h.rep.Extra["fleet-ingest.stream_bytes_per_msg"]
	// fleet-scale: node CPU and NATS CPU at 1, 2, 3 nodes. The nodes'
	// CPU per event alone would not do: how far the lanes kept up differs
	// between the windows, so deliveries per event do too.
	var natsCPU []float64
	var x [][3]float64
	var y []float64
	for n := 1; n <= fleetNodes; n++ {
		w := h.windowNamed(fmt.Sprintf("fleet-scale.nodes-%d", n))
		if w == nil || w.Load.WinOK == 0 || w.Deliveries == 0 {
			continue
		}
		e := float64(w.Load.WinOK)
		natsCPU = append(natsCPU, w.NATSPerEventUs)
		x = append(x, [3]float64{float64(w.Deliveries), e, e * float64(n)})
		y = append(y, w.CPUms*1e3)
		in.scaleNodes = append(in.scaleNodes, float64(n))
		in.scalePerCPU = append(in.scalePerCPU, 1e6/w.CPUPerDelivUs)
	}
	ns := in.scaleNodes
	if len(ns) >= 3 {
		if b, ok := leastSquares3(x, y); ok && b[0] > 0 {
			in.fleetPerDeliv, in.fleetPerEvent, in.followPerEv = b[0], max(b[1], 0), max(b[2], 0)
		}
	}
	if len(ns) >= 2 {
		in.natsBase, in.natsPerNode = fitLine(ns, natsCPU)
		in.natsPerNode = max(in.natsPerNode, 0)
		in.natsBase = max(in.natsBase, 0)
	}
	return in
}

// leastSquares3 fits y = b·x over three regressors, solving the normal
// equations by Cramer's rule; false when they are singular.
func leastSquares3(x [][3]float64, y []float64) ([3]float64, bool) {
	var a [3][3]float64
	var v [3]float64
	for i := range x {
		for j := range 3 {
			v[j] += x[i][j] * y[i]
			for k := range 3 {
				a[j][k] += x[i][j] * x[i][k]
			}
		}
	}
	det := func(m [3][3]float64) float64 {
		return m[0][0]*(m[1][1]*m[2][2]-m[1][2]*m[2][1]) -
			m[0][1]*(m[1][0]*m[2][2]-m[1][2]*m[2][0]) +
			m[0][2]*(m[1][0]*m[2][1]-m[1][1]*m[2][0])
	}
	d := det(a)
	if d == 0 || math.IsNaN(d) {
		return [3]float64{}, false
	}
	var b [3]float64
	for k := range 3 {
		m := a
		for j := range 3 {
			m[j][k] = v[j]
		}
		b[k] = det(m) / d
	}
	return b, true
}

// fitLine is the least-squares line y = a + b·x.
func fitLine(x, y []float64) (a, b float64) {
	n := float64(len(x))
	var sx, sy, sxx, sxy float64
	for i := range x {
		sx += x[i]
		sy += y[i]
		sxx += x[i] * x[i]
		sxy += x[i] * y[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return sy / n, 0
	}
	b = (n*sxy - sx*sy) / d
	return (sy - b*sx) / n, b
}

// addModel adds the model's rows, each naming the inputs it used; a row
// whose input the run did not measure says which scenario measures it.
func (h *harness) addModel() {
	in := h.modelInputs()
	r := h.rep
	const name = "model"
	deliveries := float64(modelTriggers * modelFanout)
	plat := fmt.Sprintf("%d triggers/s × fan-out %d", modelTriggers, modelFanout)
	if in.cpuPerDeliv == 0 {
		if h.log != nil {
			h.logf("model: not worked out, it needs fanout-40 (sidecar CPU per delivery)")
		}
		return
	}
	// Badger sidecars: every delivery costs what fan-out 40 costs per
	// delivery here (its ingest share included).
	badgerCores := deliveries * in.cpuPerDeliv / 1e6
	badgerPods := math.Ceil(badgerCores / modelUtilisation / modelCoresPerPod)
	cores := r.add(name, "Badger sidecars: cores for "+plat, badgerCores/modelUtilisation, "cores").
		note(fmt.Sprintf("%.0f deliveries/s × %.1f µs (fanout-40) = %.1f cores busy, at %.0f%% use; %.0f pods of %d cores",
			deliveries, in.cpuPerDeliv, badgerCores, modelUtilisation*100, badgerPods, modelCoresPerPod))
	mem := in.rssPerSidecar * badgerPods
	lanes := in.heapPerLane * modelSubs
	r.add(name, "memory, all sidecars", (mem+lanes)/(1<<30), "GiB").
		note(fmt.Sprintf("RSS %.0f MiB per loaded sidecar (fanout-40) × pods + %d subscriptions × %.0f B per idle lane (lanes-50k)",
			in.rssPerSidecar/(1<<20), modelSubs, in.heapPerLane))
	if in.fleetPerDeliv == 0 {
		cores.note("fleet rows need fleet-scale")
	} else {
		// Fleet nodes: delivering and ingesting as fit, plus every node
		// following every event. With P pods of C cores at use u:
		// P·C·u = D·a + I·c + P·I·φ, so P = (D·a + I·c) / (C·u − I·φ).
		busy := (deliveries*in.fleetPerDeliv + modelTriggers*in.fleetPerEvent) / 1e6
		followCores := modelTriggers * in.followPerEv / 1e6 // per node
		room := modelCoresPerPod*modelUtilisation - followCores
		row := r.add(name, "fleet: sidecar cores for "+plat, 0, "cores")
		if room <= 0 {
			row.fail(fmt.Sprintf("following the stream alone (%.2f cores per node) fills a %d-core pod at %.0f%%: fleet mode does not scale past this without partitioned streams",
				followCores, modelCoresPerPod, modelUtilisation*100))
		} else {
			pods := math.Ceil(busy/room - 1e-9) // not a pod more for a rounding error
			row.Value = pods * modelCoresPerPod
			row.note(fmt.Sprintf("%.0f pods: %.1f cores busy delivering and ingesting (%.1f µs per delivery, %.1f µs per event) + following %d events/s on every pod, %.2f cores each (%.1f µs per event per node); fit over fleet-scale's 1-3 nodes",
				pods, busy, in.fleetPerDeliv, in.fleetPerEvent, modelTriggers, followCores, in.followPerEv))
			if in.natsBase > 0 || in.natsPerNode > 0 {
				nats := modelTriggers * (in.natsBase + in.natsPerNode*pods) / 1e6
				perServer := nats / modelReplicas
				r.add(name, fmt.Sprintf("JetStream cluster (R%d) for %d ingests/s", modelReplicas, modelTriggers), nats, "cores").
					note(fmt.Sprintf("%.1f µs per event + %.1f µs per event per following node (fit over fleet-scale) × %.0f nodes; %.1f cores per server of %d; every server sends each event to the nodes it serves",
						in.natsBase, in.natsPerNode, pods, perServer, modelReplicas))
				if in.eventBytes > 0 {
					r.add(name, "JetStream bytes: stored per second, each replica", modelTriggers*in.eventBytes/(1<<20), "MiB/s").
						note(fmt.Sprintf("%.0f B per stored event (fleet-ingest's stream); out to the nodes %.0f MiB/s in all",
							in.eventBytes, modelTriggers*in.eventBytes*pods/(1<<20)))
				}
			}
		}
	}
	// Sockets: by Little's law a host answering in L seconds holds
	// rate × L connections; one sluice process caps them per host.
	cap := float64(egress.DefaultMaxConnsPerHost)
	for _, l := range modelLatencies {
		r.add(name, fmt.Sprintf("deliveries/s one node sends to one host answering in %.0f ms", l*1e3), cap/l, "/s").
			note(fmt.Sprintf("max_conns_per_host %d ÷ latency (Little's law); a host past this takes more of its subscriptions' lanes on other nodes, or a higher cap", int(cap)))
	}
	if n := len(in.scaleNodes); n >= 2 {
		var parts []string
		lo, hi := math.Inf(1), 0.0
		for i := range in.scaleNodes {
			parts = append(parts, fmt.Sprintf("%.0f nodes %.0f/s", in.scaleNodes[i], in.scalePerCPU[i]))
			lo, hi = min(lo, in.scalePerCPU[i]), max(hi, in.scalePerCPU[i])
		}
		r.add(name, "linearity: deliveries per sidecar CPU-second, most ÷ least over 1–3 nodes", hi/lo, "×").
			want(onValue, "<=", 1.25).
			note(strings.Join(parts, ", ") + " (fleet-scale); the model assumes this flat")
	}
}
