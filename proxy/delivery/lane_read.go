package delivery

import (
	"slices"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/queue"
)

// What a lane reads next: its entitled events, from the ring or the log.

// pageSize is how many events a lane that fell behind reads from the log at
// a time. Bodies read from disk are per lane, so this bounds a lagging
// lane's memory (with its cap).
const pageSize = 64

// wants reports whether the lane takes events of tenant ("" for a
// platform event) and type typ: its entitlement (feed.entitlement), as the
// log applies it through l.match. It scans the (short) type list instead
// of calling match where it can, whose []byte arguments would cost an
// allocation per event per filtered lane on the hot path.
func (l *lane) wants(tenant, typ string) bool {
	if hidden(l.id, typ) { // operational events are the operational lane's (operational.go)
		return false
	}
	if l.match == nil {
		return true
	}
	if l.sub.Tenant != "" || l.sub.typePatterns() {
		// match does not keep its arguments: views of the strings' bytes
		// are safe and cost no allocation.
		return l.match(unsafe.Slice(unsafe.StringData(tenant), len(tenant)), unsafe.Slice(unsafe.StringData(typ), len(typ)))
	}
	return slices.Contains(l.sub.Types, typ)
}

// limitSeq is the last seq this lane may consume now.
func (l *lane) limitSeq() uint64 {
	h := l.e.feed.head.Load()
	if l.left {
		return min(h, l.until)
	}
	return h
}

// nextFresh returns the next entitled event not yet dispatched. An event
// whose first attempt already failed before a restart is passed over: its
// retry record delivers it (a delivery is in flight in one place at a
// time), and the
// cursor may move past it, since it is resolved.
func (l *lane) nextFresh() *queue.Event {
	for {
		ev := l.nextInLog()
		if ev == nil || l.ahead == nil {
			return ev
		}
		if _, ok := l.ahead[ev.Seq]; !ok {
			return ev
		}
		delete(l.ahead, ev.Seq)
		if len(l.ahead) == 0 {
			l.ahead = nil
		}
	}
}

// nextInLog returns the next entitled event past l.next, from the in-memory
// ring when the lane keeps up, else from the log a page at a time.
func (l *lane) nextInLog() *queue.Event {
	for {
		if len(l.buf) > 0 {
			ev := l.buf[0]
			l.buf[0] = nil
			l.buf = l.buf[1:]
			if l.sub.Tenant != "" && !l.e.feed.entitled(l.sub.Tenant, ev.Tenant, ev.Type) {
				// Read before the subscription moved to this tenant: the
				// cursor passes it, as a filtered event: a tenant's
				// subscription receives only its tenant's events.
				continue
			}
			return ev
		}
		limit := l.limitSeq()
		if l.next > limit {
			return nil
		}
		if l.match != nil && !l.e.feed.seenSince(l.sub.Types, l.next) {
			// None of this lane's types was committed since it last
			// looked: skip to the head without reading a thing.
			l.next = limit + 1
			return nil
		}
		if ev, ok := l.e.feed.ring.get(l.next); ok {
			l.next++
			if l.wants(ev.Tenant, ev.Type) {
				l.took(ev.Seq)
				if l.sub.passes(ev) {
					return ev
				}
				// Filtered out: resolved for this lane, as an event of
				// another type is (the cursor passes it).
			}
			continue
		}
		evs, next, err := l.e.store.Events(l.next, limit, pageSize, l.match)
		if err != nil && l.skipCorrupt(err, limit) {
			continue
		}
		if err != nil {
			l.e.log.Error("read log", "subscription", l.id, "seq", l.next, "err", err)
			l.e.timers.add(l, l.e.now().Add(time.Second))
			return nil
		}
		l.next = max(next, l.next)
		for _, ev := range evs {
			l.took(ev.Seq)
		}
		evs = hideOperational(l.id, evs) // as wants does (operational.go)
		if l.sub.Filter != nil {
			kept := evs[:0]
			for _, ev := range evs {
				if l.sub.passes(ev) {
					kept = append(kept, ev)
				}
			}
			clear(evs[len(kept):])
			evs = kept
		}
		l.buf = evs
		if len(evs) == 0 && l.next > limit {
			return nil
		}
	}
}
