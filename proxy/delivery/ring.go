package delivery

import (
	"sync"

	"github.com/sluicehq/sluice/queue"
)

// ring holds the most recently committed events in memory so that lanes
// that keep up deliver straight from the append, sharing one body slice per
// event, and only lanes that fall behind read pages from the log. It is
// bounded by count and bytes: a burst of large events evicts early rather
// than growing memory.
//
// The bytes include the renderings cached on the events it holds (body
// variants, variant.go; charge), not only the stored bodies: a
// subscription's variant is a tenant's choice, and with the bodies alone
// counted, n distinct variants let the ring hold n+1 times its bound
// (the tenant rule, docs/security.md: nothing a tenant sets may outgrow the operator's
// limits). Charging the ring, rather than not caching renderings past a
// budget, keeps "render once per event and variant": a ring
// full of rendered events holds fewer of them, which costs a lane that
// falls behind one more page read from the log, where an uncached
// rendering would cost every lane sending that variant its own rendering
// of every event, in CPU and garbage, exactly when memory is short.
type ring struct {
	mu    sync.RWMutex
	slots []*queue.Event
	// sizes[i] is what slots[i] is charged: its Size, plus its renderings
	// made while the ring held it. Eviction gives back exactly that.
	sizes    []int
	first    uint64 // lowest seq held; first > last when empty
	last     uint64
	bytes    int
	maxBytes int
}

func newRing(slots, maxBytes int, head uint64) *ring {
	return &ring{slots: make([]*queue.Event, slots), sizes: make([]int, slots), first: head + 1, last: head, maxBytes: maxBytes}
}

// put appends events, which continue the sequence contiguously.
func (r *ring) put(evs []*queue.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := uint64(len(r.slots))
	for _, ev := range evs {
		if ev.Seq != r.last+1 {
			// A gap (cannot happen with one committer) empties the ring:
			// lanes fall back to the log, which is always right.
			clear(r.slots)
			clear(r.sizes)
			r.first, r.bytes = ev.Seq, 0
		}
		size := ev.Size()
		for r.first <= r.last && (r.last+1-r.first >= n || r.bytes+size > r.maxBytes) {
			r.evictFirst()
		}
		i := ev.Seq % n
		r.slots[i], r.sizes[i] = ev, size
		r.last = ev.Seq
		r.bytes += size
	}
}

// evictFirst drops the oldest event. r.mu is held.
func (r *ring) evictFirst() {
	i := r.first % uint64(len(r.slots))
	r.bytes -= r.sizes[i]
	r.slots[i], r.sizes[i] = nil, 0
	r.first++
}

// charge adds n bytes cached on ev (a rendering) to the ring's account
// when the ring holds ev, and evicts the oldest events while the ring is
// over its bound (ev itself among them, when it is the oldest). It is
// called once per event and variant, never per delivery. An event the
// ring does not hold (read from the log, or evicted since a lane took it)
// is not charged: its renderings live only as long as the lanes holding
// it, which their pages and caps bound.
func (r *ring) charge(ev *queue.Event, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ev.Seq < r.first || ev.Seq > r.last {
		return
	}
	i := ev.Seq % uint64(len(r.slots))
	if r.slots[i] != ev {
		return // another copy of the event, read from the log
	}
	r.sizes[i] += n
	r.bytes += n
	for r.first <= r.last && r.bytes > r.maxBytes {
		r.evictFirst()
	}
}

// get returns the event with the given seq if the ring still holds it.
func (r *ring) get(seq uint64) (*queue.Event, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if seq < r.first || seq > r.last {
		return nil, false
	}
	return r.slots[seq%uint64(len(r.slots))], true
}
