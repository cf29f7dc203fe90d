package delivery

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// fakeAttempt is one finished attempt of l at now, as finish notes it.
func fakeAttempt(l *lane, seq uint64, attempt int, took time.Duration, res result, now time.Time) {
	j := &job{lane: l, ev: &queue.Event{Seq: seq, ID: fmt.Sprintf("e-%d", seq)}, attempt: attempt, started: now.Add(-took)}
	rs := policy.Resolution{Outcome: res.Outcome}
	l.noteAttempt(j, res, rs, now)
}

func ack() result { return result{Exchange: policy.Exchange{Outcome: policy.Ack, Status: 200}} }

// TestAttemptLaneStaysInItsSizeClass: the attempt log adds one pointer to
// the lane and no more; 50,000 idle lanes must fit (docs/benchmarks.md,
// lanes-50k: the struct is kept in the 384-byte size class).
func TestAttemptLaneStaysInItsSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(lane{}); n > 384 {
		t.Fatalf("sizeof(lane) = %d B; want at most 384 (its size class)", n)
	}
	if n := unsafe.Sizeof(attemptRecord{}); n != 64 {
		t.Errorf("sizeof(attemptRecord) = %d B; the memory documented on activity assumes 64", n)
	}
	if n := unsafe.Sizeof(activity{}); n != 3344 {
		t.Errorf("sizeof(activity) = %d B; the memory documented on activity says 3,344", n)
	}
}

// TestAttemptLogOrderAndBound: the log keeps the last 32 attempts, newest
// first, whatever number were made, with what each came to.
func TestAttemptLogOrderAndBound(t *testing.T) {
	l := &lane{}
	t0 := time.Unix(1_700_000_000, 0)
	for i := 1; i <= 45; i++ {
		res := ack()
		if i%5 == 0 {
			res = result{Exchange: policy.Exchange{Outcome: policy.Retry, Status: 503}, snippet: "busy"}
		}
		fakeAttempt(l, uint64(i), 1, time.Duration(i)*time.Millisecond, res, t0.Add(time.Duration(i)*time.Second))
	}
	got := l.activity.recent()
	if len(got) != attemptLogSize {
		t.Fatalf("%d attempts kept of 45; want %d", len(got), attemptLogSize)
	}
	for i, a := range got {
		seq := uint64(45 - i)
		if a.Seq != seq || a.EventID != fmt.Sprintf("e-%d", seq) || !a.At.Equal(t0.Add(time.Duration(seq)*time.Second)) {
			t.Fatalf("attempt %d: %+v; want seq %d, newest first", i, a, seq)
		}
		if a.DurationMS != float64(seq) {
			t.Errorf("attempt seq %d took %v ms; want %d", seq, a.DurationMS, seq)
		}
		want := api.AttemptInfo{Status: 200, Outcome: "ack"}
		if seq%5 == 0 {
			want = api.AttemptInfo{Status: 503, Outcome: "retry", Response: "busy"}
		}
		if a.Status != want.Status || a.Outcome != want.Outcome || a.Response != want.Response || a.Attempt != 1 {
			t.Errorf("attempt seq %d: %+v; want %+v", seq, a, want)
		}
	}
	// Fewer than the ring holds: just those.
	l2 := &lane{}
	fakeAttempt(l2, 7, 3, time.Millisecond, result{Exchange: policy.Exchange{Outcome: policy.Retry, Failure: policy.FailTimeout}}, t0)
	fakeAttempt(l2, 8, 1, time.Millisecond, result{Exchange: policy.Exchange{Outcome: policy.DeadLetter, Status: 404}, snippet: "no"}, t0)
	got = l2.activity.recent()
	if len(got) != 2 || got[0].Seq != 8 || got[0].Outcome != "dead_letter" || got[1].Outcome != "timeout" ||
		got[1].Error != "timeout" || got[1].Status != 0 || got[1].Attempt != 3 {
		t.Fatalf("two attempts: %+v", got)
	}
}

// TestAttemptLogIdleLaneAllocatesNothing: a lane that never made an
// attempt has no activity, and reading its (empty) attempts and series
// does not make one; its first attempt does.
func TestAttemptLogIdleLaneAllocatesNothing(t *testing.T) {
	url, _ := endpoint(t, http.StatusOK)
	busy, idle := testSub("busy", url), testSub("idle", url)
	idle.Types = []string{"never"}
	s := openTestServer(t, Options{Subscriptions: []*Subscription{busy, idle}}, nil)
	for i := range 3 {
		ingestOne(t, s, fmt.Sprintf("e-%d", i))
	}
	testwait.Await(t, "three deliveries", func() bool { return laneOf(s, "busy").Delivered == 3 })
	for _, f := range []func(string) error{
		func(id string) error { _, err := s.Attempts(id); return err },
		func(id string) error { _, err := s.Series(id); return err },
	} {
		if err := f("idle"); err != nil {
			t.Fatal(err)
		}
	}
	if al, _ := s.Attempts("idle"); al.Attempts == nil || len(al.Attempts) != 0 {
		t.Errorf("idle lane's attempts %#v; want an empty list, not null", al.Attempts)
	}
	has := func(id string) bool {
		l := s.d.lane(id)
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.activity != nil
	}
	if has("idle") {
		t.Error("an idle lane has an activity after its attempts and series were read")
	}
	if !has("busy") {
		t.Error("a lane that delivered has no activity")
	}
	if al, _ := s.Attempts("busy"); len(al.Attempts) != 3 || al.Attempts[0].Seq != 3 || al.Attempts[0].Outcome != "ack" {
		t.Errorf("busy lane's attempts %+v", al.Attempts)
	}
}

// TestSeriesRotation: with the clock stepped, not slept: attempts count in
// the bucket of their time, a bucket closes when the next begins, and
// after 15 minutes without attempts everything has left the window.
func TestSeriesRotation(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0) // a multiple of 10 s
	sr := newSeries(t0)
	for i := range 20 {
		sr.add(t0.Add(time.Duration(i)*100*time.Millisecond), 10*time.Millisecond, false) // 20 ok in [t0, t0+2s)
	}
	for range 5 {
		sr.add(t0.Add(35*time.Second), 10*time.Millisecond, true) // 5 failed in the bucket at t0+30s
	}
	var si api.SeriesInfo
	sr.info(t0.Add(35*time.Second), &si)
	if si.StepSeconds != 10 || len(si.Deliveries) != seriesLen || len(si.Failures) != seriesLen || len(si.P99MS) != seriesLen {
		t.Fatalf("series shape: step %d, lengths %d %d %d", si.StepSeconds, len(si.Deliveries), len(si.Failures), len(si.P99MS))
	}
	last := seriesLen - 1
	if want := t0.Add(30*time.Second - seriesWindow + seriesStep); !si.Start.Equal(want) {
		t.Errorf("start %v; want %v (the window ends with the bucket at t0+30s)", si.Start, want)
	}
	if si.Deliveries[last-3] != 2 || si.Deliveries[last-2] != 0 || si.Deliveries[last-1] != 0 {
		t.Errorf("deliveries/s %v; want 2 in the bucket of t0 (20 in 10 s), none after", si.Deliveries[last-4:])
	}
	// The head bucket is 5 s old: 5 failures in 5 s.
	if si.Failures[last] != 1 || si.Deliveries[last] != 0 {
		t.Errorf("head bucket: %v failures/s, %v deliveries/s; want 1 and 0", si.Failures[last], si.Deliveries[last])
	}
	if p := si.P99MS[last-3]; p < 8 || p > 12.3 {
		t.Errorf("closed bucket's P99 %v ms; want about 10 (its histogram bucket [8.19, 12.29] ms)", p)
	}
	if si.P99MS[last] == 0 || si.P99MS[last-1] != 0 {
		t.Errorf("P99 of the head %v, of the empty bucket before %v", si.P99MS[last], si.P99MS[last-1])
	}

	// 14 minutes later the first bucket is still in the window, at its start.
	sr.info(t0.Add(14*time.Minute+50*time.Second), &si)
	if si.Deliveries[0] != 2 || si.Failures[3] != 0.5 {
		t.Errorf("at t0+14m50s: first bucket %v deliveries/s, t0+30s %v failures/s; want 2 and 0.5", si.Deliveries[0], si.Failures[3])
	}
	// 15 minutes after t0 it has left; after an idle 15 minutes, all has.
	sr.info(t0.Add(15*time.Minute), &si)
	if si.Deliveries[0] != 0 || si.Failures[2] != 0.5 {
		t.Errorf("at t0+15m: %v, %v; want the bucket of t0 gone and t0+30s's failures at index 2", si.Deliveries[0], si.Failures[2])
	}
	sr.add(t0.Add(time.Hour), time.Millisecond, false)
	sr.info(t0.Add(time.Hour), &si)
	var sum float64
	for i := range seriesLen {
		sum += si.Deliveries[i] + si.Failures[i]
	}
	if sum != si.Deliveries[last] || si.Deliveries[last] != 1 {
		t.Errorf("after an idle hour: %v", si.Deliveries)
	}
}

// TestSeriesClockStepBack: a wall clock stepped back an hour re-anchors
// the window at the new time, keeping what it held, instead of counting
// every attempt of that hour in one bucket; an attempt that read the clock
// a bucket before the last one (finish reads it before the lane's lock)
// counts in the newest bucket.
func TestSeriesClockStepBack(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	sr := newSeries(t0)
	sr.add(t0.Add(10*time.Second), time.Millisecond, false)
	sr.add(t0.Add(9*time.Second), time.Millisecond, false) // late by a bucket
	var si api.SeriesInfo
	sr.info(t0.Add(15*time.Second), &si)
	if si.Deliveries[seriesLen-1] != 0.4 || si.Deliveries[seriesLen-2] != 0 {
		t.Fatalf("two attempts across a bucket edge, out of order: %v; want both in the head (2 in 5 s)", si.Deliveries[seriesLen-2:])
	}
	back := t0.Add(-time.Hour)
	sr.add(back, time.Millisecond, true)
	sr.add(back.Add(10*time.Second), time.Millisecond, true)
	sr.info(back.Add(15*time.Second), &si)
	if si.Deliveries[seriesLen-2] != 0.2 || si.Failures[seriesLen-2] != 0.1 || si.Failures[seriesLen-1] != 0.2 {
		t.Fatalf("after the step back: deliveries %v failures %v", si.Deliveries[seriesLen-3:], si.Failures[seriesLen-3:])
	}
}

// TestSeriesP99WithinABucketsErrorBound: the P99 estimate lies in the
// histogram bucket of the true P99, for spreads from sub-millisecond to
// beyond the last bucket.
func TestSeriesP99WithinABucketsErrorBound(t *testing.T) {
	for _, c := range []struct {
		name string
		d    func(i int) time.Duration // the i-th of n exchanges
		n    int
	}{
		{"1..1000 ms", func(i int) time.Duration { return time.Duration(i+1) * time.Millisecond }, 1000},
		{"fast with a slow 2%", func(i int) time.Duration {
			if i%50 == 0 {
				return 3 * time.Second
			}
			return 400 * time.Microsecond
		}, 5000},
		{"all 50 µs", func(int) time.Duration { return 50 * time.Microsecond }, 100},
		{"one of 7 s", func(int) time.Duration { return 7 * time.Second }, 1},
		{"over the top", func(int) time.Duration { return time.Hour }, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			var h [latencyBuckets]uint32
			ds := make([]time.Duration, c.n)
			for i := range c.n {
				ds[i] = c.d(i)
				h[latencyBucket(ds[i])]++
			}
			slices.Sort(ds)
			truth := ds[int(math.Ceil(0.99*float64(c.n)))-1] // nearest rank
			lo, hi := latencyBounds(latencyBucket(truth))
			got := quantileMS(&h, 0.99)
			if got < lo/1000 || got > hi/1000 {
				t.Fatalf("P99 %v ms; the true P99 %v lies in [%v, %v] ms", got, truth, lo/1000, hi/1000)
			}
		})
	}
	// Every duration lands in a bucket whose bounds hold it.
	for _, d := range []time.Duration{0, 127 * time.Microsecond, 128 * time.Microsecond, 191 * time.Microsecond,
		192 * time.Microsecond, 255 * time.Microsecond, time.Millisecond, 3 * time.Second, 17 * time.Minute, 2 * time.Hour} {
		i := latencyBucket(d)
		lo, hi := latencyBounds(i)
		us := float64(d.Microseconds())
		if i < 0 || i >= latencyBuckets || us < lo || (us >= hi && i != latencyBuckets-1) {
			t.Errorf("%v in bucket %d [%v, %v) µs", d, i, lo, hi)
		}
	}
}

// BenchmarkAttemptNoteAck is the attempt log's cost on the ACK path: the
// ring slot and the series bucket are reused, so it allocates nothing.
func BenchmarkAttemptNoteAck(b *testing.B) {
	l := &lane{}
	ev := &queue.Event{Seq: 1, ID: "01HZX3J6W1E8W2Q9K0M7S5T4VB"}
	now := time.Unix(1_700_000_000, 0)
	j := &job{lane: l, ev: ev, attempt: 1, started: now}
	res := ack()
	rs := policy.Resolution{Outcome: policy.Ack}
	l.noteAttempt(j, res, rs, now) // the one allocation, outside the loop
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		l.noteAttempt(j, res, rs, now.Add(time.Duration(i)*time.Millisecond))
	}
}
