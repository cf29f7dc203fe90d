package delivery

import (
	"errors"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

// skipCorrupt settles events the log cannot read back, met by nextInLog:
// each becomes a dead letter (reason corrupt) of this lane, and the lane
// goes on past them. Before, the read failed on every try and the lane
// stalled for good, holding every intact event behind it. An unreadable
// event's type and tenant are unknown, so every lane whose range holds it
// dead-letters it (an accepted event ends delivered or dead-lettered,
// never lost, even where a type filter cannot be judged); the letter carries no
// body, id or type, nothing of another tenant's event. It reports whether
// it settled err; the store has logged and counted the event once.
// l.mu is held.
func (l *lane) skipCorrupt(err error, limit uint64) bool {
	var ce *queue.CorruptEventError
	if !errors.As(err, &ce) || ce.Last < l.next {
		return false
	}
	now := l.e.now()
	for seq := max(ce.First, l.next); seq <= min(ce.Last, limit); seq++ {
		if _, ok := l.ahead[seq]; ok {
			// A retry record holds it: the retry settles it (missingReason).
			if delete(l.ahead, seq); len(l.ahead) == 0 {
				l.ahead = nil
			}
			continue
		}
		o := queue.Outcome{Kind: queue.DeadLettered, Subscription: l.id, Seq: seq, At: now,
			DeadLetter: newDeadLetter(l.id, l.sub.Tenant, &queue.Event{Seq: seq}, policy.ReasonCorrupt, 0, policy.Exchange{}, "", now)}
		if err := l.record(o); err != nil {
			l.e.log.Error("dead-letter unreadable event", "subscription", l.id, "seq", seq, "err", err)
			return false // read again, and try again, after the lane's wait
		}
		l.next = seq + 1
		l.resolved(nil, o)
		l.e.m.rejections.WithLabelValues(l.id, policy.ReasonCorrupt).Inc()
	}
	l.next = max(l.next, min(ce.Last, limit)+1)
	return true
}

// missingReason is the dead-letter reason of a retry whose event cannot be
// read: corrupt when the log holds it damaged, else event_missing.
func missingReason(err error) string {
	if errors.Is(err, queue.ErrCorrupt) {
		return policy.ReasonCorrupt
	}
	return reasonEventMissing
}
