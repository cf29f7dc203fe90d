package delivery

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

// A lane's cursor and the backlog past it: counting the backlog cheaply,
// the backlog quota, draining.

// laneMemo is what a lane remembers so that periodic reads cost what
// changed, not the whole backlog.
type laneMemo struct {
	// Of the events in [next, backlogTo], backlogN match a filtered lane's
	// types: the backlog quota counts only what was appended since, not
	// the whole backlog every second.
	backlogTo uint64
	backlogN  int64
	// When the event oldestSeq (the one just past the cursor) was
	// accepted: a scrape reads the log only for lanes whose cursor moved
	// since the last one.
	oldestSeq uint64
	oldestAt  int64
	// ord is the per-key ordering state of an ordered lane (ordering.go);
	// here, not in lane, which is at its 384-byte size class.
	ord *ordering
	// held is the endpoint's own announced limit (lane_gates.go), made
	// when a response first says it takes no more.
	held *endpointHold
	// lettersAtTrim is the lane's dead-letter count at its last trim
	// (trimLetters, tenant.go).
	lettersAtTrim uint64
}

// memoized returns l.memo, made on first use. l.mu is held.
func (l *lane) memoized() *laneMemo {
	if l.memo == nil {
		l.memo = &laneMemo{}
	}
	return l.memo
}

// took notes that a matching event left the part of the log past next
// (backlogN counts only that part). l.mu is held.
func (l *lane) took(seq uint64) {
	if m := l.memo; m != nil && seq <= m.backlogTo && m.backlogN > 0 {
		m.backlogN--
	}
}

// waiting counts the entitled events past next, up to limit: arithmetic
// for a lane of all types; for a filtered one, backlogN brought up to date
// by counting only the events appended since it was last brought up to
// date. l.mu is held.
func (l *lane) waiting(limit uint64) (int64, error) {
	if limit < l.next {
		return 0, nil
	}
	if l.match == nil {
		return int64(limit - l.next + 1), nil
	}
	m := l.memoized()
	if m.backlogTo+1 < l.next {
		m.backlogTo, m.backlogN = l.next-1, 0 // nothing counted is past next
	}
	if limit > m.backlogTo {
		n, err := l.e.store.CountEvents(m.backlogTo+1, limit, l.match, math.MaxInt-1)
		if err != nil {
			return 0, err
		}
		m.backlogTo, m.backlogN = limit, m.backlogN+int64(n)
	}
	return m.backlogN, nil
}

// updateCursor moves the cursor over resolved deliveries.
func (l *lane) updateCursor() {
	i := 0
	for i < len(l.window) && l.window[i].done {
		i++
	}
	if i > 0 {
		l.window = append(l.window[:0], l.window[i:]...)
	}
	c := l.next - 1
	if len(l.buf) > 0 {
		c = l.buf[0].Seq - 1
	}
	if len(l.window) > 0 {
		c = min(c, l.window[0].seq-1)
	}
	if f, ok := l.parkedFloor(); ok {
		c = min(c, f-1) // a parked event is unresolved (ordering.go)
	}
	if c > l.cursor {
		l.cursor = c
		if !l.dirty {
			l.dirty = true
			l.e.dirty.mark(l)
		}
	}
}

// enforceQuota dead-letters the oldest waiting events past the backlog
// quota (reason backlog_quota), whatever the breaker or the cap say: a
// black-holed lane must not grow without bound. Events already in flight or
// scheduled for retry are not counted.
func (l *lane) enforceQuota(now time.Time) {
	e := l.e
	l.mu.Lock()
	defer l.mu.Unlock()
	// l.sub is read under mu: Reload replaces it (setPolicies, under mu)
	// while this runs on the maintenance goroutine.
	q := l.sub.Backlog
	if q.MaxEvents <= 0 && q.MaxAge <= 0 {
		return
	}
	if l.foreign {
		return // its owner enforces it
	}
	var excess int64
	if q.MaxEvents > 0 {
		n, err := l.waiting(l.limitSeq())
		if err != nil {
			e.log.Error("count backlog", "subscription", l.id, "err", err)
			return
		}
		excess = n + int64(len(l.buf)) + int64(l.parkedCount()) - q.MaxEvents
	}
	rejected := l.quotaRejections.Load()
	// An ordered lane's parked events are its oldest waiting (ordering.go).
	ok := l.quotaParked(now, q, &excess)
	for ok {
		ev := l.nextFresh()
		if ev == nil {
			break
		}
		old := q.MaxAge > 0 && now.Sub(ev.AcceptedAt) > q.MaxAge
		if excess <= 0 && !old {
			l.unread(ev)
			break
		}
		o := queue.Outcome{Kind: queue.DeadLettered, Subscription: l.id, Seq: ev.Seq, At: now,
			DeadLetter: newDeadLetter(l.id, l.sub.Tenant, ev, policy.ReasonBacklogQuota, 0, policy.Exchange{}, "", now)}
		if err := l.record(o); err != nil {
			e.log.Error("dead-letter over quota", "subscription", l.id, "seq", ev.Seq, "err", err)
			l.unread(ev)
			break
		}
		l.resolved(nil, o)
		l.quotaRejections.Add(1)
		e.m.rejections.WithLabelValues(l.id, policy.ReasonBacklogQuota).Inc()
		excess--
	}
	e.ops.quotaExceeded(l.id, l.quotaRejections.Load()-rejected, q, now)
	l.updateCursor()
}

// drained reports whether a lane that left has resolved everything it was
// entitled to, retries included.
func (l *lane) drainedLocked() bool {
	return l.left && l.cursor >= l.until && l.inFlight == 0 && len(l.retrying) == 0 && len(l.unrecorded) == 0 && l.nextDue.IsZero()
}
