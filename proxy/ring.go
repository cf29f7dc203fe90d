package proxy

import (
	"sync"

	"github.com/sluicehq/sluice/queue"
)

// ring holds the most recently committed events in memory so that lanes
// that keep up deliver straight from the append, sharing one body slice per
// event, and only lanes that fall behind read pages from the log. It is
// bounded by count and bytes: a burst of large events evicts early rather
// than growing memory.
type ring struct {
	mu       sync.RWMutex
	slots    []*queue.Event
	first    uint64 // lowest seq held; first > last when empty
	last     uint64
	bytes    int
	maxBytes int
}

func newRing(slots, maxBytes int, head uint64) *ring {
	return &ring{slots: make([]*queue.Event, slots), first: head + 1, last: head, maxBytes: maxBytes}
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
			r.first, r.bytes = ev.Seq, 0
		}
		for r.first <= r.last && (r.last+1-r.first >= n || r.bytes+ev.Size() > r.maxBytes) {
			i := r.first % n
			r.bytes -= r.slots[i].Size()
			r.slots[i] = nil
			r.first++
		}
		r.slots[ev.Seq%n] = ev
		r.last = ev.Seq
		r.bytes += ev.Size()
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
