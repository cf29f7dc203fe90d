package main

// The model of issue 14: what a platform past this machine takes with
// sluice, worked out at the end of every run from the per-core figures the
// run measured, so that it is re-derived whenever the code or the machine
// changes. Seed 000's platform: 25,000 triggers/s with a mean fan-out of
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

	"github.com/sluicehq/sluice/proxy"
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
	fleetRatio    float64 // Badger deliveries per sidecar CPU-second ÷ the 1-node fleet's (fleet-scale): what fleet mode costs per delivery
	followPerEv   float64 // µs of node CPU per event per node following the stream (fit over fleet-scale's 1, 2, 3 nodes)
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
	// fleet-scale: node CPU and NATS CPU per event at 1, 2, 3 nodes.
	var ns, nodeCPU, natsCPU []float64
	badger := h.windowNamed("fleet-scale.badger")
	for n := 1; n <= fleetNodes; n++ {
		w := h.windowNamed(fmt.Sprintf("fleet-scale.nodes-%d", n))
		if w == nil || w.Load.WinOK == 0 || w.CPUPerDelivUs == 0 {
			continue
		}
		ns = append(ns, float64(n))
		nodeCPU = append(nodeCPU, w.CPUPerEventUs)
		natsCPU = append(natsCPU, w.NATSPerEventUs)
		in.scaleNodes = append(in.scaleNodes, float64(n))
		in.scalePerCPU = append(in.scalePerCPU, 1e6/w.CPUPerDelivUs)
		if n == 1 && badger != nil && badger.CPUPerDelivUs > 0 {
			in.fleetRatio = w.CPUPerDelivUs / badger.CPUPerDelivUs
		}
	}
	if len(ns) >= 2 {
		_, in.followPerEv = fitLine(ns, nodeCPU)
		in.natsBase, in.natsPerNode = fitLine(ns, natsCPU)
		in.followPerEv = max(in.followPerEv, 0)
		in.natsPerNode = max(in.natsPerNode, 0)
		in.natsBase = max(in.natsBase, 0)
	}
	return in
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
	r.add(name, "Badger sidecars: cores for "+plat, badgerCores/modelUtilisation, "cores").
		note(fmt.Sprintf("%.0f deliveries/s × %.1f µs (fanout-40) = %.1f cores busy, at %.0f%% use; %.0f pods of %d cores",
			deliveries, in.cpuPerDeliv, badgerCores, modelUtilisation*100, math.Ceil(badgerCores/modelUtilisation/modelCoresPerPod), modelCoresPerPod))
	mem := in.rssPerSidecar * math.Ceil(badgerCores/modelUtilisation/modelCoresPerPod)
	lanes := in.heapPerLane * modelSubs
	r.add(name, "memory, all sidecars", (mem+lanes)/(1<<30), "GiB").
		note(fmt.Sprintf("RSS %.0f MiB per loaded sidecar (fanout-40) × pods + %d subscriptions × %.0f B per idle lane (lanes-50k)",
			in.rssPerSidecar/(1<<20), modelSubs, in.heapPerLane))
	if in.fleetRatio == 0 {
		r.Rows[len(r.Rows)-2].note("fleet rows need fleet-scale")
	} else {
		// Fleet nodes: the delivery cost scaled by what fleet mode costs
		// per delivery, plus every node following every event. With P
		// pods of C cores at use u: P·C·u = D·c·f + P·I·φ, so
		// P = D·c·f / (C·u − I·φ).
		busy := deliveries * in.cpuPerDeliv * in.fleetRatio / 1e6
		followCores := modelTriggers * in.followPerEv / 1e6 // per node
		room := modelCoresPerPod*modelUtilisation - followCores
		row := r.add(name, "fleet: sidecar cores for "+plat, 0, "cores")
		if room <= 0 {
			row.fail(fmt.Sprintf("following the stream alone (%.2f cores per node) fills a %d-core pod at %.0f%%: fleet mode does not scale past this without partitioned streams",
				followCores, modelCoresPerPod, modelUtilisation*100))
		} else {
			pods := math.Ceil(busy / room)
			row.Value = pods * modelCoresPerPod
			row.note(fmt.Sprintf("%.0f pods: deliveries %.1f cores busy (×%.2f fleet vs Badger per delivery, fleet-scale 1 node) + following %d events/s on every pod, %.2f cores each (%.1f µs per event per node, fit over fleet-scale)",
				pods, busy, in.fleetRatio, modelTriggers, followCores, in.followPerEv))
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
	cap := float64(proxy.DefaultMaxConnsPerHost)
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
