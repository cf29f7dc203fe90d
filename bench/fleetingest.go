package main

// fleet-ingest and its baselines: the bare JetStream publisher (_jspub)
// on the same cluster.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Baselines of the fleet scenarios, measured inside fleet-ingest on the
// cluster the node uses, with the settings of the stream it created.
const (
	baseJSPublish = "jetstream-publish"        // 64 closed-loop async publishers
	baseJSWindow  = "jetstream-publish-window" // one publisher, jsWindow in flight
	baseJSFollow  = "jetstream-publish-follow" // 64 publishers, each waiting for an ordered consumer too
)

// jsEventHeaders are the headers the bare publisher adds besides
// Nats-Msg-Id, with values of the size sluice's append gives them, so that
// both publish messages of the same shape.
var jsEventHeaders = "Sluice-Type=bench.event;Sluice-Content-Type=application/json;Sluice-Accepted-At=1767225600123456789"

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
	args := []string{"_jspub", "-urls", strings.Join(f.nats.urls, ","), "-like", f.stream, "-stream", f.stream + "_BASE",
		"-publishers", strconv.Itoa(ingestProducers), "-window", strconv.Itoa(window), "-size", "512",
		"-headers", jsEventHeaders, "-key-prefix", h.runID + "-" + h.nextID("jspub"),
		"-warmup", h.opts.warmup.String(), "-duration", h.opts.duration.String(), "-nats-pid", strconv.Itoa(f.nats.pid),
		"-follow=" + strconv.FormatBool(follow)}
	var r jspubResult
	if err := h.runChildJSON(ctx, "jspub", "publisher", args, h.opts.warmup+h.opts.duration+90*time.Second, &r); err != nil {
		return nil, err
	}
	return &r, nil
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
