package delivery

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

// held reports the events the ring holds and the bytes it charges them.
func (r *ring) held() (events, bytes int) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.first > r.last {
		return 0, r.bytes
	}
	return int(r.last + 1 - r.first), r.bytes
}

// sum is what the ring should be charging: the sizes of the slots it
// holds, added up independently of r.bytes.
func (r *ring) sum() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := 0
	for s := r.first; s <= r.last && r.first <= r.last; s++ {
		n += r.sizes[s%uint64(len(r.slots))]
	}
	return n
}

func ringEvent(seq uint64, bodyBytes int) *queue.Event {
	body := `{"data":{"id":"` + fmt.Sprint(seq) + `","pad":"` + strings.Repeat("x", bodyBytes) + `"}}`
	return &queue.Event{Seq: seq, ID: fmt.Sprint("ev", seq), Type: "t", AcceptedAt: time.Unix(1, 0), Body: []byte(body)}
}

// TestRingChargesRenderings: the renderings of body variants cached on
// the events the ring holds count against its byte bound, so that a ring
// of events rendered for several variants holds fewer events, never
// several times its bound.
func TestRingChargesRenderings(t *testing.T) {
	const budget = 64 << 10
	e := &engine{feed: &feed{ring: newRing(1024, budget, 0)}}
	r := e.feed.ring
	var subs []*Subscription
	for i := range 4 {
		// Each variant keeps the whole payload under another envelope
		// or path set, so each rendering is about as large as the body.
		spec := policy.VariantSpec{Envelope: policy.EnvelopeStandardWebhooks}
		if i > 0 {
			spec.Fields = []string{"data", fmt.Sprint("extra", i)}
		}
		v, err := policy.ParseVariant(spec)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, &Subscription{ID: fmt.Sprint("s", i), Variant: v})
	}

	// Unrendered, 8 KiB events: the ring holds 7 of them (64 KiB).
	var evs []*queue.Event
	for seq := uint64(1); seq <= 16; seq++ {
		ev := ringEvent(seq, 8<<10)
		evs = append(evs, ev)
		r.put([]*queue.Event{ev})
	}
	n, bytes := r.held()
	if bytes > budget || n < 6 {
		t.Fatalf("unrendered: ring holds %d events in %d bytes (bound %d)", n, bytes, budget)
	}
	before := n

	// Every lane renders the newest events it holds, as lanes that keep
	// up do: four renderings of about a body each per event.
	for _, ev := range evs[len(evs)-before:] {
		for _, sub := range subs {
			if _, err := e.render(sub, ev); err != nil {
				t.Fatal(err)
			}
		}
		if _, bytes := r.held(); bytes > budget {
			t.Fatalf("after rendering seq %d the ring charges %d bytes, over its bound %d", ev.Seq, bytes, budget)
		}
	}
	n, bytes = r.held()
	if n >= before || n > 2 {
		t.Errorf("rendered for 4 variants, the ring still holds %d events (%d before rendering); want about a fifth", n, before)
	}
	if got := r.sum(); got != bytes {
		t.Errorf("ring charges %d bytes, its slots add up to %d", bytes, got)
	}
	// What a held event is charged includes its renderings.
	last := evs[len(evs)-1]
	r.mu.RLock()
	charged := r.sizes[last.Seq%uint64(len(r.slots))]
	r.mu.RUnlock()
	if charged < 4*len(last.Body) {
		t.Errorf("the newest event, rendered four times, is charged %d bytes; its body alone is %d", charged, len(last.Body))
	}

	// A rendering shared by every lane sending it is charged once.
	_, bytes = r.held()
	if _, err := e.render(subs[0], last); err != nil {
		t.Fatal(err)
	}
	if _, again := r.held(); again != bytes {
		t.Errorf("rendering a cached variant again moved the charge from %d to %d bytes", bytes, again)
	}

	// A copy of an event read from the log, or an event evicted before a
	// lane rendered it, is not the ring's to charge.
	copyOf := ringEvent(last.Seq, 8<<10)
	old := evs[0]
	for _, ev := range []*queue.Event{copyOf, old} {
		if _, err := e.render(subs[1], ev); err != nil {
			t.Fatal(err)
		}
	}
	if _, after := r.held(); after != bytes {
		t.Errorf("renderings of events the ring does not hold moved its charge from %d to %d bytes", bytes, after)
	}

	// New events take the room back as the rendered ones leave.
	for seq := uint64(17); seq <= 40; seq++ {
		r.put([]*queue.Event{ringEvent(seq, 8<<10)})
	}
	n, bytes = r.held()
	if n < before || bytes > budget || r.sum() != bytes {
		t.Errorf("after new unrendered events: %d events in %d bytes (slots add up to %d), want %d events within %d", n, bytes, r.sum(), before, budget)
	}
}

// BenchmarkRingRenderedHeap measures what the ring keeps in memory when
// 80 events of 1 MiB are each rendered for 6 distinct variants that keep
// the whole payload (the security review's case): the events it holds,
// the bytes it charges and the heap they keep, against its 64 MiB bound.
// Reported, not asserted: go test -run XXX -bench RingRenderedHeap ./proxy/
func BenchmarkRingRenderedHeap(b *testing.B) {
	var subs []*Subscription
	for i := range 6 {
		v, err := policy.ParseVariant(policy.VariantSpec{Fields: []string{"data", fmt.Sprint("x", i)}})
		if err != nil {
			b.Fatal(err)
		}
		subs = append(subs, &Subscription{ID: fmt.Sprint("s", i), Variant: v})
	}
	pad := strings.Repeat("x", 1<<20-30)
	for range b.N {
		e := &engine{feed: &feed{ring: newRing(ringSlots, 64<<20, 0)}}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for seq := uint64(1); seq <= 80; seq++ {
			ev := &queue.Event{Seq: seq, ID: fmt.Sprint("ev", seq), Type: "t", AcceptedAt: time.Unix(1, 0), Body: []byte(`{"data":{"pad":"` + pad + `"}}`)}
			e.feed.ring.put([]*queue.Event{ev})
			for _, sub := range subs {
				if _, err := e.render(sub, ev); err != nil {
					b.Fatal(err)
				}
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		n, bytes := e.feed.ring.held()
		b.ReportMetric(float64(n), "events-held")
		b.ReportMetric(float64(bytes)/(1<<20), "MiB-charged")
		b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/(1<<20), "MiB-heap")
		runtime.KeepAlive(e)
	}
}
