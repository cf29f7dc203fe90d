package delivery

import (
	"math"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// TestTokenWaitIsBounded: the wake-up a lane arms for its rate limit lies
// in [minWake, maxWake] for any limit. 1s/1e-300 overflowed
// time.Duration, and the lane woke at once, for ever.
func TestTokenWaitIsBounded(t *testing.T) {
	tests := []struct {
		name  string
		limit rate.Limit
		want  time.Duration
	}{
		{"tiny", 1e-300, maxWake},
		{"smallest positive", math.SmallestNonzeroFloat64, maxWake},
		{"just under an hour apart", 1.0 / 3000, 3000 * time.Second},
		{"slower than an hour", 1.0 / 7200, maxWake},
		{"one a second", 1, time.Second},
		{"fast", 1e6, minWake},
		{"infinite", rate.Inf, minWake},
		{"zero", 0, maxWake},
		{"negative", -1, minWake},
		{"NaN", rate.Limit(math.NaN()), maxWake},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tokenWait(tt.limit)
			if got < minWake || got > maxWake {
				t.Fatalf("tokenWait(%g) = %v, outside [%v, %v]", float64(tt.limit), got, minWake, maxWake)
			}
			if d := got - tt.want; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("tokenWait(%g) = %v, want %v", float64(tt.limit), got, tt.want)
			}
		})
	}
}

// TestTinyRateWakesWithinBounds: a lane whose bucket is empty at a rate
// of 1e-300 a second arms one wake-up, within maxWake, from both of its
// rate gates (mayPass and admit), and that wake-up is not mistaken for a
// clock step (farAhead), which would make it due at once.
func TestTinyRateWakesWithinBounds(t *testing.T) {
	st := queuetest.MustOpen(t, "", badger.Options{})
	e := newEngine(st, nil, discardLogger(), time.Now, 4, 0, policy.BudgetConfig{})
	sub := testSub("a", "http://127.0.0.1:1")
	sub.Rate = RateLimit{PerSecond: 1e-300, Burst: 1}
	l := newLane(e, queue.Membership{Subscription: "a", From: 1}, sub)
	now := time.Now()
	if !l.limiter.AllowN(now, 1) {
		t.Fatal("the bucket starts without its burst")
	}
	check := func(gate string) {
		t.Helper()
		wait := time.Duration(l.timerAt - now.UnixNano())
		if l.timerAt == 0 || wait < minWake || wait > maxWake {
			t.Fatalf("%s armed a wake-up %v ahead (timerAt %d), want within [%v, %v]", gate, wait, l.timerAt, minWake, maxWake)
		}
		if l.dueBy(time.Unix(0, l.timerAt), now) {
			t.Fatalf("%s: the wake-up %v ahead counts as due now", gate, wait)
		}
		l.timerAt = 0
	}
	if l.mayPass(now) {
		t.Fatal("mayPass with an empty bucket")
	}
	check("mayPass")
	if _, ok := l.admit(now); ok {
		t.Fatal("admit with an empty bucket")
	}
	check("admit")
}
