package delivery

import (
	"math/bits"
	"time"

	"github.com/sluicehq/sluice/proxy/api"
)

// The dashboard's charts: per lane, deliveries/s, failures/s
// and the P99 of one exchange over the last seriesWindow, in memory only.
//
// Why 90 buckets of 10 s: 10 s shows when an incident started to within
// a poll or two, and 90 points draw a legible line in a small chart. A
// bucket is small because it keeps its P99, not its histogram: only the
// newest (open) bucket has one, and when a bucket closes its P99 is
// computed once and kept as a float32. A bucket is 12 B, the series
// 90 × 12 B + one 48-bucket histogram (192 B) + 16 B = 1,288 B per active
// lane, where a histogram per bucket would have cost 90 × 200 B.
const (
	seriesStep   = 10 * time.Second
	seriesLen    = 90
	seriesWindow = seriesStep * seriesLen // 15 minutes

	// The latency histogram: two buckets per octave of microseconds,
	// [2^k, 1.5·2^k) and [1.5·2^k, 2^(k+1)) for k from minOctave to
	// maxOctave-1 (128 µs to 2^30 µs ≈ 17.9 min), one below (0 to 128 µs)
	// and one above. An estimate lies in the bucket of the true value, so
	// it is off by less than that bucket's width: under 50% of its lower
	// bound (under 128 µs in the first), which a chart of P99 over time
	// can afford, and the bucket needs no logarithm to find.
	minOctave      = 7
	maxOctave      = 30
	latencyBuckets = 2 + 2*(maxOctave-minOctave)
)

// series is one lane's chart data, a ring of seriesLen buckets of
// seriesStep, the newest (head) at pos. Time is the engine's clock
// (Options.Now), so tests step it instead of sleeping. Not safe for
// concurrent use: the lane's mu guards it.
type series struct {
	head    int64 // number of the newest bucket: unix nanos / seriesStep
	pos     int   // index of the head in buckets
	latency [latencyBuckets]uint32
	buckets [seriesLen]seriesBucket
}

// seriesBucket counts the attempts of one step that were acknowledged
// (ok) and that failed (retried, dead-lettered, timed out); p99 is the
// P99 of their exchanges in milliseconds, set when the bucket closes (the
// head's is read from series.latency).
type seriesBucket struct {
	ok, failed uint32
	p99        float32
}

// bucketOf numbers the step that t falls in.
func bucketOf(t time.Time) int64 {
	n := t.UnixNano()
	b := n / int64(seriesStep)
	if n%int64(seriesStep) < 0 {
		b--
	}
	return b
}

func newSeries(now time.Time) series { return series{head: bucketOf(now)} }

// add counts one exchange of d that ended at now.
func (s *series) add(now time.Time, d time.Duration, failed bool) {
	s.rotate(bucketOf(now))
	b := &s.buckets[s.pos]
	if failed {
		b.failed++
	} else {
		b.ok++
	}
	s.latency[latencyBucket(d)]++
}

// rotate makes bucket b the head: the old head closes (its P99 is kept),
// and the buckets between are emptied, all of them after an idle window.
// An attempt that read the clock just before another one, a bucket
// earlier, counts in the head (finish reads the clock before it takes the
// lane's lock, so attempts arrive slightly out of order). An earlier b
// than that means the wall clock stepped back: the window is anchored at
// b again, keeping what it holds as the recent past, rather than counting
// everything in one bucket until the clock catches up.
func (s *series) rotate(b int64) {
	switch d := b - s.head; {
	case d > 0:
		s.buckets[s.pos].p99 = float32(quantileMS(&s.latency, 0.99))
		s.latency = [latencyBuckets]uint32{}
		for range min(d, seriesLen) {
			s.pos = (s.pos + 1) % seriesLen
			s.buckets[s.pos] = seriesBucket{}
		}
		s.head = b
	case d < -1:
		s.head = b
	}
}

// info fills in the window ending at now, oldest bucket first; s may be
// nil (a lane that made no attempt has only zeros). It rotates s to now,
// as an attempt at now would.
func (s *series) info(now time.Time, si *api.SeriesInfo) {
	head := bucketOf(now)
	if s != nil {
		s.rotate(head)
		head = s.head
	}
	si.StepSeconds = int(seriesStep / time.Second)
	si.Start = time.Unix(0, (head-seriesLen+1)*int64(seriesStep)).UTC()
	si.Deliveries = make([]float64, seriesLen)
	si.Failures = make([]float64, seriesLen)
	si.P99MS = make([]float64, seriesLen)
	if s == nil {
		return
	}
	step := seriesStep.Seconds()
	for i := range seriesLen {
		b := s.buckets[(s.pos+1+i)%seriesLen]
		si.Deliveries[i] = float64(b.ok) / step
		si.Failures[i] = float64(b.failed) / step
		si.P99MS[i] = float64(b.p99)
	}
	// The head is still filling: its rate is over the part of the step
	// that has passed (at least a second, so a bucket just begun does not
	// show one attempt as a burst).
	last := seriesLen - 1
	el := now.Sub(time.Unix(0, head*int64(seriesStep)))
	el = min(max(el, time.Second), seriesStep)
	hb := s.buckets[s.pos]
	si.Deliveries[last] = float64(hb.ok) / el.Seconds()
	si.Failures[last] = float64(hb.failed) / el.Seconds()
	si.P99MS[last] = quantileMS(&s.latency, 0.99)
}

// latencyBucket is the histogram bucket of an exchange that took d.
func latencyBucket(d time.Duration) int {
	us := d.Microseconds()
	if us < 1<<minOctave {
		return 0
	}
	k := bits.Len64(uint64(us)) - 1
	if k >= maxOctave {
		return latencyBuckets - 1
	}
	half := int(us>>(k-1)) & 1 // the bit after the top one: past 1.5·2^k
	return 1 + 2*(k-minOctave) + half
}

// latencyBounds is the range of bucket i in microseconds; the last one's
// is its lower bound twice (nothing is known above it).
func latencyBounds(i int) (lo, hi float64) {
	switch i {
	case 0:
		return 0, 1 << minOctave
	case latencyBuckets - 1:
		return 1 << maxOctave, 1 << maxOctave
	}
	base := float64(uint64(1) << (minOctave + (i-1)/2))
	if (i-1)%2 == 0 {
		return base, 1.5 * base
	}
	return 1.5 * base, 2 * base
}

// quantileMS estimates the q-quantile of h in milliseconds (0 when h is
// empty): the bucket that holds the rank, interpolated linearly in it.
func quantileMS(h *[latencyBuckets]uint32, q float64) float64 {
	var total uint64
	for _, c := range h {
		total += uint64(c)
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var cum float64
	for i, c := range h {
		if c == 0 {
			continue
		}
		if n := float64(c); cum+n >= rank {
			lo, hi := latencyBounds(i)
			return (lo + (rank-cum)/n*(hi-lo)) / 1000
		}
		cum += float64(c)
	}
	lo, _ := latencyBounds(latencyBuckets - 1) // not reached: rank ≤ total
	return lo / 1000
}
