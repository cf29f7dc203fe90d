package main

import (
	"math"
	"strings"
	"testing"
)

func TestFitLine(t *testing.T) {
	a, b := fitLine([]float64{1, 2, 3}, []float64{5, 7, 9})
	if math.Abs(a-3) > 1e-9 || math.Abs(b-2) > 1e-9 {
		t.Errorf("fit of y = 3 + 2x: a %v, b %v", a, b)
	}
	if a, b := fitLine([]float64{2, 2}, []float64{4, 6}); a != 5 || b != 0 {
		t.Errorf("fit over one x: a %v, b %v, want the mean and no slope", a, b)
	}
}

// TestModelFromWindows feeds the model windows of known figures and checks
// what it derives from them.
func TestModelFromWindows(t *testing.T) {
	h := &harness{rep: newReport(&options{})}
	h.rep.Windows = []*window{
		{Name: "fanout-40", CPUPerDelivUs: 10, RSSEnd: 100 << 20},
		// Nodes: 10 µs per delivery, 20 µs per event ingested, 20 µs per
		// event per node following; NATS 50 + 10·n µs per event.
		{Name: "fleet-scale.nodes-1", CPUPerDelivUs: 10, CPUms: 140, Deliveries: 10000, NATSPerEventUs: 60, Load: loadResult{WinOK: 1000}},
		{Name: "fleet-scale.nodes-2", CPUPerDelivUs: 10, CPUms: 140, Deliveries: 8000, NATSPerEventUs: 70, Load: loadResult{WinOK: 1000}},
		{Name: "fleet-scale.nodes-3", CPUPerDelivUs: 12.5, CPUms: 360, Deliveries: 20000, NATSPerEventUs: 80, Load: loadResult{WinOK: 2000}},
	}
	h.addModel()
	got := map[string]*row{}
	for _, x := range h.rep.Rows {
		got[x.Metric] = x
	}
	find := func(prefix string) *row {
		for m, x := range got {
			if strings.HasPrefix(m, prefix) {
				return x
			}
		}
		t.Fatalf("no row %q in %v", prefix, h.rep.Rows)
		return nil
	}
	// 1e6 deliveries/s × 10 µs = 10 cores busy, at 60%: 16.7 cores.
	if x := find("Badger sidecars: cores"); math.Abs(x.Value-10/0.6) > 1e-6 {
		t.Errorf("Badger cores %v, want %v", x.Value, 10/0.6)
	}
	// Following: 25,000 × 20 µs = 0.5 cores per node; room 2·0.6 − 0.5 =
	// 0.7 cores per pod for 10 + 0.5 cores of deliveries and ingest: 15
	// pods, 30 cores.
	if x := find("fleet: sidecar cores"); x.Value != 30 {
		t.Errorf("fleet cores %v (%s), want 30", x.Value, x.Note)
	}
	// NATS: 25,000 × (50 + 10·15) µs = 5 cores.
	if x := find("JetStream cluster"); math.Abs(x.Value-5) > 1e-6 {
		t.Errorf("NATS cores %v, want 5", x.Value)
	}
	if x := find("linearity"); math.Abs(x.Value-1.25) > 1e-9 || x.Pass == nil {
		t.Errorf("linearity %v (pass %v), want 1.25 with a target", x.Value, x.Pass)
	}
	if x := find("deliveries/s one node sends to one host answering in 50 ms"); x.Value != 64/0.05 {
		t.Errorf("per-host rate %v, want %v", x.Value, 64/0.05)
	}
}
