package main

import (
	"context"
	"fmt"
)

// Batch ingest: batchSize events per request (NDJSON, POST /v1/events),
// batchProducers requests in flight. 16 × 100 = 1,600 events in flight
// stays well inside the ingest gate's 4,096 (past it the sidecar sheds
// with 503s, which would measure the gate, not the batches); the single
// posts use ingestProducers (64), as ingest-fsync does.
const (
	batchSize      = 100
	batchProducers = 16
)

// scenarioIngestBatch: one sidecar without subscriptions (durability
// durability), loaded first by 64 closed-loop producers of single posts
// (name+".single", the figure ingest-fsync reports), then by 16 of
// batches of 100; events/s of the batches ÷ the single posts' (target
// ≥ 5×), both through the same sidecar in the same run, and each against
// the bare Badger group commit.
func (h *harness) scenarioIngestBatch(ctx context.Context, name, durability string) error {
	sc, err := h.start(ctx, sidecarSpec{Name: name, Durability: durability})
	if err != nil {
		return err
	}
	defer h.stopSidecar(sc)
	single := h.sidecarWindow(ctx, sc, name+".single", loadSpec{Conc: ingestProducers, Body: 512}, winOpts{})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	w := h.sidecarWindow(ctx, sc, name, loadSpec{Conc: batchProducers, Body: 512, Batch: batchSize}, winOpts{})

	r := h.rep
	app := h.base[baseAppender]
	if durability != "fsync" {
		app = h.base[baseAppenderAsync]
	}
	label := fmt.Sprintf("events/s, batches of %d (%d producers, 512 B)", batchSize, batchProducers)
	row := r.add(name, label, w.Load.PerSec, "/s").vsValue("single posts", single.Load.PerSec).
		note(fmt.Sprintf("%.0f batches/s", w.Load.PerSec/batchSize))
	if durability == "fsync" {
		row.want(onRatio, ">=", 5)
	}
	if w.Load.BadStatus > 0 || w.Load.Errors > 0 {
		row.note(fmt.Sprintf("%d batches refused (%d 503), %d transport errors", w.Load.BadStatus, w.Load.Status503, w.Load.Errors))
	}
	r.add(name, fmt.Sprintf("requests/s, single posts (%d producers, 512 B)", ingestProducers), single.Load.PerSec, "/s").
		vs(app, func(b *baselineResult) float64 { return b.PerSec })
	r.add(name, "events/s, batches, vs the bare Badger group commit", w.Load.PerSec, "/s").
		vs(app, func(b *baselineResult) float64 { return b.PerSec })
	r.add(name, "batch P50 / P99 (202, whole batch)", w.Load.Lat.P50, "ms").note(fmt.Sprintf("P99 %.2f ms", w.Load.Lat.P99))
	r.add(name, "sidecar CPU per event, batches", w.CPUPerEventUs, "µs").vsValue("single posts", single.CPUPerEventUs).
		note(fmt.Sprintf("%.2f cores busy", w.CPUCores))
	r.add(name, "sidecar allocated per event, batches", w.BytesPerEvent, "B").vsValue("single posts", single.BytesPerEvent).
		note(fmt.Sprintf("%.1f allocs (single posts %.1f)", w.AllocsPerEvent, single.AllocsPerEvent))
	return nil
}
