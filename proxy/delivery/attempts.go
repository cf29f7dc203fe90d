package delivery

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
)

// The attempt log: every node shows what its lanes' last
// attempts came to, for an operator or a tenant asking "what did my
// endpoint answer?" without reading logs. In memory only; a restart
// forgets it.

// attemptLogSize is how many attempts each lane remembers.
const attemptLogSize = 32

// activity is what a lane did recently: its last attemptLogSize attempts
// and its charts' series (series.go). A lane has none until its first
// attempt (lane.activity is nil: 50,000 idle lanes cost one nil pointer
// each), then exactly one, never grown or freed while the lane lives:
// each attempt overwrites the oldest slot and an ACK allocates nothing.
// The lane's mu guards it (finish holds it anyway when it records).
//
// Memory per active lane: 3,344 B in the 3,456-byte size class (the ring
// 32 × 64 B, the series 1,288 B, the count 8 B), plus the strings it
// keeps alive: the event ids, shared with the events (up to 200 B each,
// usually a ULID's 26), and the response snippets of failed attempts (up
// to snippetBytes each, never for an ACK), so at most about 18 KiB for a
// lane whose last 32 attempts all failed with long answers and long ids.
type activity struct {
	n        uint64 // attempts recorded; the next goes in slot n % attemptLogSize
	attempts [attemptLogSize]attemptRecord
	series   series
}

// attemptRecord is one attempt, 64 B.
type attemptRecord struct {
	at       int64 // unix nanos, the engine's clock
	seq      uint64
	duration time.Duration
	eventID  string
	response string // the first snippetBytes of a failed answer
	attempt  int32
	status   uint16 // 0: no answer
	outcome  attemptOutcome
	failure  policy.Failure
}

// attemptOutcome is what became of the delivery after an attempt, in the
// words of sluice_delivery_attempts_total's outcome label.
type attemptOutcome uint8

const (
	attemptAck attemptOutcome = iota
	attemptRetry
	attemptTimeout // retried after a timeout
	attemptDeadLetter
)

var attemptOutcomeWords = [...]string{outcomeAck, outcomeRetry, outcomeTimeout, outcomeDeadLetter}

// attemptOutcomeOf is what the attempt that came to res, resolved as rs,
// did to its delivery: the attempt log's and the attempt span's word.
func attemptOutcomeOf(res result, rs policy.Resolution) attemptOutcome {
	switch {
	case rs.Outcome == policy.Ack:
		return attemptAck
	case rs.Outcome == policy.Retry && res.Timeout():
		return attemptTimeout
	case rs.Outcome == policy.Retry:
		return attemptRetry
	}
	return attemptDeadLetter
}

// noteAttempt records one attempt in the lane's activity, made here on
// the lane's first attempt. It is called by finish, the one place every
// attempt's outcome arrives, with l.mu held.
func (l *lane) noteAttempt(j *job, res result, rs policy.Resolution, now time.Time) {
	a := l.activity
	if a == nil {
		a = &activity{series: newSeries(now)}
		l.activity = a
	}
	oc := attemptOutcomeOf(res, rs)
	d := now.Sub(j.started)
	a.attempts[a.n%attemptLogSize] = attemptRecord{
		at: now.UnixNano(), seq: j.ev.Seq, duration: d, eventID: j.ev.ID, response: res.snippet,
		attempt: int32(min(j.attempt, math.MaxInt32)), status: uint16(min(max(res.Status, 0), math.MaxUint16)),
		outcome: oc, failure: res.Failure,
	}
	a.n++
	a.series.add(now, d, oc != attemptAck)
}

// recent returns the remembered attempts, newest first.
func (a *activity) recent() []api.AttemptInfo {
	n := int(min(a.n, attemptLogSize))
	out := make([]api.AttemptInfo, 0, n)
	for i := range n {
		r := &a.attempts[(a.n-1-uint64(i))%attemptLogSize]
		out = append(out, api.AttemptInfo{
			At: time.Unix(0, r.at).UTC(), Seq: r.seq, EventID: r.eventID, Attempt: int(r.attempt),
			Status: int(r.status), DurationMS: float64(r.duration) / float64(time.Millisecond),
			Outcome: attemptOutcomeWords[r.outcome], Error: r.failure.String(), Response: r.response,
		})
	}
	return out
}

// Attempts returns the last attempts this node made for subscription id,
// newest first (at most 32); false when no lane has the id. In fleet
// mode Owner names the node that delivers the lane: a node that does not
// own it has only the attempts it made while it did, if any.
func (d *Dispatcher) Attempts(id string) (api.AttemptList, bool) {
	l := d.lane(id)
	if l == nil {
		return api.AttemptList{}, false
	}
	out := api.AttemptList{Subscription: id, Owner: d.owner(l), Attempts: []api.AttemptInfo{}}
	l.mu.Lock()
	if a := l.activity; a != nil {
		out.Attempts = a.recent()
	}
	l.mu.Unlock()
	return out, true
}

// Series returns the last 15 minutes of subscription id's deliveries/s,
// failures/s and exchange P99 on this node, in 90 buckets of 10 s, oldest
// first; the newest is the one still filling. Owner is as for Attempts.
func (d *Dispatcher) Series(id string) (api.SeriesInfo, bool) {
	l := d.lane(id)
	if l == nil {
		return api.SeriesInfo{}, false
	}
	out := api.SeriesInfo{Subscription: id, Owner: d.owner(l)}
	now := l.e.now()
	l.mu.Lock()
	var sr *series
	if a := l.activity; a != nil {
		sr = &a.series
	}
	sr.info(now, &out)
	l.mu.Unlock()
	return out, true
}

// owner is the node delivering l in fleet mode, "" otherwise.
func (d *Dispatcher) owner(l *lane) string {
	f := d.fleet
	if f == nil {
		return ""
	}
	if l.isForeign() {
		return f.Owner(l.id)
	}
	return f.NodeID()
}
