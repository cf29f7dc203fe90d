package delivery

// Unit tests of the operational webhook's bookkeeping: coalescing windows
// driven by an explicit clock, the drop policy, the exclusion's cost. The
// end-to-end behaviour (real lanes, a real receiver) is operational_test.go.

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

// newTestOperational is an unstarted operational webhook with no store:
// enough for the bookkeeping, which appends nothing itself.
func newTestOperational(t *testing.T, now func() time.Time) *operational {
	t.Helper()
	return newOperational(&Subscription{URL: "http://127.0.0.1:1/ops"}, nil, nil, now, nil)
}

func deadAt(seq uint64, at time.Time, reason string) *queue.DeadLetter {
	return &queue.DeadLetter{Seq: seq, DeadAt: at, Reason: reason, LastStatus: 400}
}

// TestOperationalCoalescingWindows: the first dead letter after a quiet
// minute is due at once, the rest of the minute comes as one summary at
// its end, a quiet minute closes the window, and the counts add up.
func TestOperationalCoalescingWindows(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	o := newTestOperational(t, func() time.Time { return t0 })
	o.deadLetter("a", deadAt(1, t0, policy.ReasonRejected))
	first := o.due(t0, false)
	if len(first) != 1 || first[0].typ != typeDeadLetter {
		t.Fatalf("first dead letter: due %+v, want one dead_letter.created at once", first)
	}
	if d := first[0].data.(deadLetterData); d.Subscription != "a" || d.Count != 1 || d.FirstSeq != 1 || d.LastSeq != 1 {
		t.Fatalf("first event %+v", d)
	}
	for i := range 49 {
		reason := policy.ReasonRejected
		if i%2 == 0 {
			reason = policy.ReasonMaxAttempts
		}
		o.deadLetter("a", deadAt(uint64(2+i), t0.Add(time.Duration(i)*time.Second), reason))
	}
	if got := o.due(t0.Add(59*time.Second), false); len(got) != 0 {
		t.Fatalf("within the window: due %+v, want nothing", got)
	}
	sum := o.due(t0.Add(coalesceWindow), false)
	if len(sum) != 1 {
		t.Fatalf("end of the window: due %+v, want one summary", sum)
	}
	d := sum[0].data.(deadLetterData)
	if d.Count != 49 || d.FirstSeq != 2 || d.LastSeq != 50 || d.Reasons[policy.ReasonMaxAttempts] != 25 || d.Reasons[policy.ReasonRejected] != 24 {
		t.Fatalf("summary %+v: want 49 dead letters, seqs 2..50, 25 max_attempts and 24 rejected", d)
	}
	// A minute with none closes the episode; the next is sent at once.
	if got := o.due(t0.Add(2*coalesceWindow), false); len(got) != 0 || len(o.windows) != 0 {
		t.Fatalf("after a quiet minute: due %+v, windows %d; want none", got, len(o.windows))
	}
	t1 := t0.Add(3 * coalesceWindow)
	o.deadLetter("a", deadAt(51, t1, policy.ReasonRejected))
	if got := o.due(t1, false); len(got) != 1 || got[0].data.(deadLetterData).Count != 1 {
		t.Fatalf("after the episode: due %+v, want one event at once", got)
	}
}

// TestOperationalDeadLetterRangeOutOfOrder: a lane with several
// deliveries in flight dead-letters them in the order their answers come,
// not in seq order, and their DeadAt is read before the lane's lock, so
// neither arrives sorted. The event's seqs and times are the range the
// window's letters span, first never past last.
func TestOperationalDeadLetterRangeOutOfOrder(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	o := newTestOperational(t, func() time.Time { return t0 })
	for _, dl := range []struct {
		seq uint64
		at  time.Duration
	}{{5, 2 * time.Second}, {3, time.Second}, {7, 3 * time.Second}, {4, 0}} {
		o.deadLetter("a", deadAt(dl.seq, t0.Add(dl.at), policy.ReasonGone))
	}
	got := o.due(t0.Add(3*time.Second), false)
	if len(got) != 1 {
		t.Fatalf("due %+v, want one dead_letter.created", got)
	}
	d := got[0].data.(deadLetterData)
	if d.Count != 4 || d.FirstSeq != 3 || d.LastSeq != 7 || !d.FirstAt.Equal(t0) || !d.LastAt.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("event %+v: want 4 dead letters, seqs 3..7, from %v to %v", d, t0, t0.Add(3*time.Second))
	}
	// The next window's range starts afresh, not from the last one's.
	o.deadLetter("a", deadAt(9, t0.Add(5*time.Second), policy.ReasonGone))
	o.deadLetter("a", deadAt(8, t0.Add(4*time.Second), policy.ReasonGone))
	sum := o.due(t0.Add(coalesceWindow+3*time.Second), false)
	if len(sum) != 1 {
		t.Fatalf("end of the window: due %+v, want one summary", sum)
	}
	if d := sum[0].data.(deadLetterData); d.Count != 2 || d.FirstSeq != 8 || d.LastSeq != 9 ||
		!d.FirstAt.Equal(t0.Add(4*time.Second)) || !d.LastAt.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("summary %+v: want 2 dead letters, seqs 8..9", d)
	}
	o.quotaExceeded("q", 2, BacklogQuota{MaxEvents: 1}, t0.Add(time.Second))
	o.quotaExceeded("q", 3, BacklogQuota{MaxEvents: 1}, t0)
	q := o.due(t0.Add(time.Second), false)
	if len(q) != 1 {
		t.Fatalf("quota: due %+v, want one backlog_quota.exceeded", q)
	}
	if d := q[0].data.(quotaData); d.Count != 5 || !d.FirstAt.Equal(t0) || !d.LastAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("quota event %+v: want 5 from %v to %v", d, t0, t0.Add(time.Second))
	}
}

// TestOperationalQuotaCoalescing: quota passes add their counts into one
// window per subscription, and dead letters of the quota's reason are
// not reported a second time as dead_letter.created.
func TestOperationalQuotaCoalescing(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	o := newTestOperational(t, func() time.Time { return t0 })
	q := BacklogQuota{MaxEvents: 10}
	o.quotaExceeded("hole", 1000, q, t0)
	o.deadLetter("hole", deadAt(7, t0, policy.ReasonBacklogQuota))
	o.quotaExceeded("hole", 0, q, t0) // a pass with nothing over the quota
	got := o.due(t0, false)
	if len(got) != 1 || got[0].typ != typeQuota {
		t.Fatalf("due %+v, want one backlog_quota.exceeded", got)
	}
	if d := got[0].data.(quotaData); d.Count != 1000 || d.MaxEvents != 10 {
		t.Fatalf("first quota event %+v", d)
	}
	for range 30 {
		o.quotaExceeded("hole", 500, q, t0.Add(time.Second))
	}
	got = o.due(t0.Add(coalesceWindow), false)
	if len(got) != 1 || got[0].data.(quotaData).Count != 15000 {
		t.Fatalf("summary %+v, want one counting 15000", got)
	}
}

// TestOperationalNothingAboutItself: notices about the operational
// subscription are never made, and a nil operational webhook (none
// configured) takes every call.
func TestOperationalNothingAboutItself(t *testing.T) {
	now := time.Now()
	o := newTestOperational(t, func() time.Time { return now })
	o.paused(OperationalID, policy.PauseGone, pausedByEndpoint)
	o.deadLetter(OperationalID, deadAt(1, now, policy.ReasonRejected))
	o.quotaExceeded(OperationalID, 5, BacklogQuota{MaxEvents: 1}, now)
	if len(o.notices) != 0 || len(o.due(now, true)) != 0 {
		t.Fatal("a notice about the operational subscription itself")
	}
	var none *operational
	none.paused("a", "x", pausedByOperator)
	none.deadLetter("a", deadAt(1, now, policy.ReasonRejected))
	none.quotaExceeded("a", 1, BacklogQuota{}, now)
	none.start()
	none.stop()
	if subs, err := none.with(nil); err != nil || len(subs) != 0 {
		t.Fatalf("with of no webhook: %v, %v", subs, err)
	}
}

// TestOperationalDropsWhenFull: a full notice queue or window map drops
// and counts, and never waits.
func TestOperationalDropsWhenFull(t *testing.T) {
	now := time.Now()
	o := newTestOperational(t, func() time.Time { return now })
	for i := range noticeQueue + 5 {
		o.paused(fmt.Sprint("s", i), "x", pausedByOperator) // nobody drains: it must not block
	}
	if got := testutil.ToFloat64(o.dropped); got != 5 {
		t.Fatalf("dropped %v notices, want 5", got)
	}
	for i := range maxWindows + 3 {
		o.deadLetter(fmt.Sprint("s", i), deadAt(1, now, policy.ReasonRejected))
	}
	if got := testutil.ToFloat64(o.dropped); got != 8 {
		t.Fatalf("dropped %v, want 8 (3 past maxWindows)", got)
	}
	if len(o.windows) != maxWindows {
		t.Fatalf("%d windows, want maxWindows", len(o.windows))
	}
}

// TestOperationalWindowAfterClockStepBack: a window whose end lies
// further ahead than a window lasts (the clock stepped back) has ended.
func TestOperationalWindowAfterClockStepBack(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	o := newTestOperational(t, func() time.Time { return t0 })
	o.deadLetter("a", deadAt(1, t0, policy.ReasonRejected))
	o.due(t0, false)
	o.deadLetter("a", deadAt(2, t0, policy.ReasonRejected))
	if got := o.due(t0.Add(-time.Hour), false); len(got) != 1 {
		t.Fatalf("after a step back of an hour: due %+v, want the summary now", got)
	}
}

// TestOperationalExclusionAllocatesNothing: the type check on the hot
// paths (every lane's wants, every ingest request) allocates nothing.
func TestOperationalExclusionAllocatesNothing(t *testing.T) {
	typ, ops := []byte("geofence.enter"), []byte(typeBreakerClosed)
	var sink bool
	n := testing.AllocsPerRun(1000, func() {
		sink = hidden("billing", "geofence.enter") || !hidden("billing", typeDeadLetter) || hidden(OperationalID, typePaused)
		sink = sink || OperationalType(string(typ)) || !OperationalType(string(ops))
	})
	if n != 0 || sink {
		t.Fatalf("%v allocations per check (sink %v), want 0", n, sink)
	}
	evs := []*queue.Event{{Type: "a"}, {Type: typePaused}, {Type: "b"}}
	if kept := hideOperational("billing", evs); len(kept) != 2 || kept[0].Type != "a" || kept[1].Type != "b" || evs[2] != nil {
		t.Fatalf("hideOperational kept %v", kept)
	}
}
