package policy_test

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// Outcomes as Record arguments (failure, timeout).
type outcome struct{ failure, timeout bool }

var (
	serverError = outcome{failure: true}
	timedOut    = outcome{failure: true, timeout: true}
	success     = outcome{}
)

// record feeds n outcomes of non-probe requests, each first Allowed.
func record(t *testing.T, b *policy.Breaker, o outcome, n int) {
	t.Helper()
	for range n {
		if ok, probe := b.Allow(); !ok || probe {
			t.Fatalf("Allow() = %v, %v in state %v, want true, false", ok, probe, b.State())
		}
		b.Record(o.failure, o.timeout, false)
	}
}

// trip opens a default breaker with ConsecutiveTimeouts timeouts.
func trip(t *testing.T, b *policy.Breaker) {
	t.Helper()
	record(t, b, timedOut, policy.DefaultBreakerConsecutiveTimeouts)
	if s := b.State(); s != policy.BreakerOpen {
		t.Fatalf("State() = %v after %d timeouts, want open", s, policy.DefaultBreakerConsecutiveTimeouts)
	}
}

func TestBreakerStateString(t *testing.T) {
	tests := []struct {
		s     policy.BreakerState
		want  string
		gauge int
	}{
		{policy.BreakerClosed, "closed", 0},
		{policy.BreakerHalfOpen, "half_open", 1},
		{policy.BreakerOpen, "open", 2},
		{7, "BreakerState(7)", 7},
	}
	for _, tt := range tests {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
		if int(tt.s) != tt.gauge {
			t.Errorf("%v = %d, want gauge value %d", tt.s, int(tt.s), tt.gauge)
		}
	}
}

// Outcomes are fed in order: successes first, then failures, so the ratio
// is the highest at the end.
func TestBreakerFailureRatio(t *testing.T) {
	tests := []struct {
		name      string
		cfg       policy.BreakerConfig
		successes int
		failures  int
		want      policy.BreakerState
	}{
		{"19 failures below min requests", policy.BreakerConfig{}, 0, 19, policy.BreakerClosed},
		{"20 failures at min requests", policy.BreakerConfig{}, 0, 20, policy.BreakerOpen},
		{"half of 19 below min requests", policy.BreakerConfig{}, 10, 9, policy.BreakerClosed},
		{"exactly the ratio", policy.BreakerConfig{}, 10, 10, policy.BreakerOpen},
		{"just below the ratio", policy.BreakerConfig{}, 11, 10, policy.BreakerClosed},
		{"many requests, 40% failing", policy.BreakerConfig{}, 600, 400, policy.BreakerClosed},
		{"many requests, 50% failing", policy.BreakerConfig{}, 500, 500, policy.BreakerOpen},
		{"ratio 0.1", policy.BreakerConfig{FailureRatio: 0.1, MinRequests: 10}, 9, 1, policy.BreakerOpen},
		{"ratio 0.1 below", policy.BreakerConfig{FailureRatio: 0.1, MinRequests: 10}, 10, 1, policy.BreakerClosed},
		{"ratio 1 needs all failing", policy.BreakerConfig{FailureRatio: 1, MinRequests: 5}, 1, 30, policy.BreakerClosed},
		{"min requests 1", policy.BreakerConfig{MinRequests: 1}, 0, 1, policy.BreakerOpen},
		{"successes alone", policy.BreakerConfig{}, 1000, 0, policy.BreakerClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := policy.NewBreaker(tt.cfg, newFakeClock().Now)
			record(t, b, success, tt.successes)
			for range tt.failures {
				if ok, _ := b.Allow(); !ok {
					break
				}
				b.Record(true, false, false)
			}
			if got := b.State(); got != tt.want {
				t.Errorf("State() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBreakerWindowSlides(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBreaker(policy.BreakerConfig{}, clk.Now) // 10s in 1s buckets
	record(t, b, serverError, 15)
	clk.Advance(10 * time.Second) // the 15 failures leave the window
	record(t, b, serverError, 19)
	if s := b.State(); s != policy.BreakerClosed {
		t.Fatalf("State() = %v with 19 failures in the window, want closed", s)
	}
	clk.Advance(9 * time.Second) // still in the window
	record(t, b, success, 18)
	record(t, b, serverError, 1) // 20 of 38 failed
	if s := b.State(); s != policy.BreakerOpen {
		t.Errorf("State() = %v with 20 of 38 failed, want open", s)
	}
}

func TestBreakerConsecutiveTimeouts(t *testing.T) {
	tests := []struct {
		name string
		seq  []outcome
		want policy.BreakerState
	}{
		{"5 timeouts trip with 5 requests", []outcome{timedOut, timedOut, timedOut, timedOut, timedOut}, policy.BreakerOpen},
		{"4 timeouts do not", []outcome{timedOut, timedOut, timedOut, timedOut}, policy.BreakerClosed},
		{"a success resets the count", []outcome{timedOut, timedOut, timedOut, timedOut, success, timedOut, timedOut, timedOut, timedOut}, policy.BreakerClosed},
		{"5 after the reset trip", []outcome{timedOut, timedOut, timedOut, timedOut, success, timedOut, timedOut, timedOut, timedOut, timedOut}, policy.BreakerOpen},
		{"an error does not reset the count", []outcome{timedOut, timedOut, timedOut, serverError, timedOut, timedOut}, policy.BreakerOpen},
		{"errors are not timeouts", []outcome{serverError, serverError, serverError, serverError, serverError, serverError}, policy.BreakerClosed},
		{"timeouts trip among many successes", append(repeat(success, 100), timedOut, timedOut, timedOut, timedOut, timedOut), policy.BreakerOpen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := policy.NewBreaker(policy.BreakerConfig{}, newFakeClock().Now)
			for _, o := range tt.seq {
				record(t, b, o, 1)
			}
			if got := b.State(); got != tt.want {
				t.Errorf("State() = %v, want %v", got, tt.want)
			}
		})
	}
}

// A timeout is a failure even when the caller says only timeout.
func TestBreakerTimeoutImpliesFailure(t *testing.T) {
	b := policy.NewBreaker(policy.BreakerConfig{ConsecutiveTimeouts: 1000}, newFakeClock().Now)
	record(t, b, success, 10)
	record(t, b, outcome{timeout: true}, 10)
	if s := b.State(); s != policy.BreakerOpen {
		t.Errorf("State() = %v after 10 of 20 timed out, want open", s)
	}
}

func repeat(o outcome, n int) []outcome {
	s := make([]outcome, n)
	for i := range s {
		s[i] = o
	}
	return s
}

func TestBreakerCoolDownAndProbe(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBreaker(policy.BreakerConfig{}, clk.Now)
	if at := b.RetryAt(); !at.IsZero() {
		t.Errorf("closed: RetryAt() = %v, want zero", at)
	}
	record(t, b, serverError, 20)
	tripped := clk.Now()
	if s := b.State(); s != policy.BreakerOpen {
		t.Fatalf("State() = %v, want open", s)
	}
	if at, want := b.RetryAt(), tripped.Add(5*time.Second); !at.Equal(want) {
		t.Errorf("open: RetryAt() = %v, want %v", at, want)
	}

	clk.Advance(5*time.Second - 1)
	if ok, probe := b.Allow(); ok || probe {
		t.Fatalf("Allow() = %v, %v before the cool-down ended, want false, false", ok, probe)
	}
	clk.Advance(1)
	if s := b.State(); s != policy.BreakerOpen {
		t.Errorf("State() = %v before Allow, want open (Allow makes it half-open)", s)
	}
	if ok, probe := b.Allow(); !ok || !probe {
		t.Fatalf("Allow() = %v, %v after the cool-down, want true, true", ok, probe)
	}
	if s := b.State(); s != policy.BreakerHalfOpen {
		t.Errorf("State() = %v with a probe out, want half_open", s)
	}
	if at, want := b.RetryAt(), clk.Now().Add(policy.DefaultBreakerMaxCoolDown); !at.Equal(want) {
		t.Errorf("half-open: RetryAt() = %v, want the probe deadline %v", at, want)
	}
	for range 3 {
		clk.Advance(time.Second)
		if ok, probe := b.Allow(); ok || probe {
			t.Fatalf("Allow() = %v, %v with a probe out, want false, false", ok, probe)
		}
	}

	b.Record(false, false, true)
	if s := b.State(); s != policy.BreakerClosed {
		t.Fatalf("State() = %v after a successful probe, want closed", s)
	}
	if at := b.RetryAt(); !at.IsZero() {
		t.Errorf("closed again: RetryAt() = %v, want zero", at)
	}
	// The window was emptied: the 20 old failures, 8s old, do not count.
	record(t, b, serverError, 19)
	if s := b.State(); s != policy.BreakerClosed {
		t.Errorf("State() = %v with 19 failures since closing, want closed", s)
	}
	if n := b.Trips(); n != 1 {
		t.Errorf("Trips() = %d, want 1", n)
	}
}

func TestBreakerProbeFailureDoublesCoolDown(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBreaker(policy.BreakerConfig{CoolDown: 5 * time.Second, MaxCoolDown: time.Minute}, clk.Now)
	trip(t, b)
	wantCoolDowns := []time.Duration{
		5 * time.Second, // the first trip
		10 * time.Second, 20 * time.Second, 40 * time.Second,
		time.Minute, time.Minute, // capped
	}
	for i, want := range wantCoolDowns {
		if at := b.RetryAt().Sub(clk.Now()); at != want {
			t.Fatalf("open #%d: cool-down = %v, want %v", i+1, at, want)
		}
		if n := b.Trips(); n != int64(i+1) {
			t.Errorf("open #%d: Trips() = %d, want %d", i+1, n, i+1)
		}
		clk.Advance(want)
		ok, probe := b.Allow()
		if !ok || !probe {
			t.Fatalf("open #%d: Allow() = %v, %v after the cool-down, want a probe", i+1, ok, probe)
		}
		if i < len(wantCoolDowns)-1 {
			b.Record(true, false, true)
			if s := b.State(); s != policy.BreakerOpen {
				t.Fatalf("State() = %v after a failed probe, want open", s)
			}
		}
	}
	// A successful probe resets the cool-down to CoolDown.
	b.Record(false, false, true)
	trip(t, b)
	if at := b.RetryAt().Sub(clk.Now()); at != 5*time.Second {
		t.Errorf("after closing, the next trip's cool-down = %v, want 5s", at)
	}
	if n := b.Trips(); n != int64(len(wantCoolDowns)+1) {
		t.Errorf("Trips() = %d, want %d", n, len(wantCoolDowns)+1)
	}
}

// Requests that were in flight when the breaker tripped finish while it is
// open or half-open; they neither close nor re-open it.
func TestBreakerInFlightOutcomes(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBreaker(policy.BreakerConfig{}, clk.Now)
	// 30 requests start; 5 time out and trip the breaker.
	for range 30 {
		if ok, _ := b.Allow(); !ok {
			t.Fatal("Allow() = false while closed")
		}
	}
	for range 5 {
		b.Record(true, true, false)
	}
	retryAt := b.RetryAt()

	for range 10 { // in-flight successes while open
		b.Record(false, false, false)
	}
	if s, at := b.State(), b.RetryAt(); s != policy.BreakerOpen || !at.Equal(retryAt) {
		t.Errorf("after late successes: State() = %v, RetryAt() = %v; want open, %v", s, at, retryAt)
	}
	for range 5 { // more late timeouts while open do not trip it again
		b.Record(true, true, false)
	}
	if s, at, n := b.State(), b.RetryAt(), b.Trips(); s != policy.BreakerOpen || !at.Equal(retryAt) || n != 1 {
		t.Errorf("after late timeouts: State() = %v, RetryAt() = %v, Trips() = %d; want open, %v, 1", s, at, n, retryAt)
	}

	clk.Advance(5 * time.Second)
	if ok, probe := b.Allow(); !ok || !probe {
		t.Fatalf("Allow() = %v, %v, want a probe", ok, probe)
	}
	b.Record(false, false, false) // late success while half-open
	b.Record(true, true, false)   // late timeout while half-open
	if s := b.State(); s != policy.BreakerHalfOpen {
		t.Errorf("State() = %v after late outcomes, want half_open", s)
	}
	if ok, _ := b.Allow(); ok {
		t.Error("Allow() = true while the probe is out")
	}
	b.Record(true, true, true) // the probe fails
	if s, n := b.State(), b.Trips(); s != policy.BreakerOpen || n != 2 {
		t.Errorf("after the probe failed: State() = %v, Trips() = %d; want open, 2", s, n)
	}
}

// A probe that is never Recorded does not shut the lane forever: after
// MaxCoolDown the breaker admits another one.
func TestBreakerLostProbe(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBreaker(policy.BreakerConfig{}, clk.Now)
	trip(t, b)
	clk.Advance(5 * time.Second)
	if _, probe := b.Allow(); !probe {
		t.Fatal("no probe after the cool-down")
	}
	clk.Advance(policy.DefaultBreakerMaxCoolDown - 1)
	if ok, _ := b.Allow(); ok {
		t.Fatal("Allow() = true before the lost probe's deadline")
	}
	clk.Advance(1)
	if ok, probe := b.Allow(); !ok || !probe {
		t.Fatalf("Allow() = %v, %v at the lost probe's deadline, want a new probe", ok, probe)
	}
	if ok, _ := b.Allow(); ok {
		t.Fatal("Allow() = true with the new probe out")
	}
	b.Record(false, false, true)
	if s := b.State(); s != policy.BreakerClosed {
		t.Errorf("State() = %v, want closed", s)
	}
	// The lost probe turns up late: an ordinary outcome now.
	b.Record(true, true, true)
	if s := b.State(); s != policy.BreakerClosed {
		t.Errorf("State() = %v after a late probe outcome, want closed", s)
	}
}

func TestBreakerConcurrent(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBreaker(policy.BreakerConfig{MinRequests: 5, CoolDown: 10 * time.Millisecond, MaxCoolDown: time.Hour}, clk.Now)
	var probesOut atomic.Int32
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 3000 {
				if g == 0 {
					clk.Advance(time.Millisecond)
				}
				ok, probe := b.Allow()
				if !ok {
					continue
				}
				if probe {
					if n := probesOut.Add(1); n != 1 {
						t.Errorf("%d probes out at once", n)
						return
					}
					probesOut.Add(-1)
				}
				fail := (i+g)%4 != 0 // 75% failing
				b.Record(fail, fail && i%2 == 0, probe)
				_ = b.State()
				_ = b.RetryAt()
			}
		})
	}
	wg.Wait()
	if b.Trips() == 0 {
		t.Error("Trips() = 0, want the failures to trip the breaker")
	}
}

func TestBreakerAllocs(t *testing.T) {
	clk := newFakeClock()
	closed := policy.NewBreaker(policy.BreakerConfig{}, clk.Now)
	cycling := policy.NewBreaker(policy.BreakerConfig{MinRequests: 1, CoolDown: time.Second, MaxCoolDown: time.Second}, clk.Now)
	for name, f := range map[string]func(){
		"Allow":   func() { closed.Allow() },
		"Record":  func() { closed.Record(false, false, false) },
		"State":   func() { closed.State() },
		"RetryAt": func() { closed.RetryAt() },
		"trip and probe": func() {
			cycling.Record(true, false, false)
			clk.Advance(time.Second)
			_, probe := cycling.Allow()
			cycling.Record(false, false, probe)
		},
	} {
		if allocs := testing.AllocsPerRun(1000, f); allocs != 0 {
			t.Errorf("%s allocates %v times per run, want 0", name, allocs)
		}
	}
}

func TestBreakerConfigValidate(t *testing.T) {
	with := func(f func(*policy.BreakerConfig)) policy.BreakerConfig {
		c := policy.BreakerConfig{}.WithDefaults()
		f(&c)
		return c
	}
	tests := []struct {
		name    string
		cfg     policy.BreakerConfig
		wantErr string
	}{
		{"defaults", policy.BreakerConfig{}.WithDefaults(), ""},
		{"all set", policy.BreakerConfig{Window: 30 * time.Second, MinRequests: 10, FailureRatio: 0.25, ConsecutiveTimeouts: 3, CoolDown: time.Second, MaxCoolDown: time.Minute}, ""},
		{"cool-down equals max", with(func(c *policy.BreakerConfig) { c.CoolDown, c.MaxCoolDown = time.Minute, time.Minute }), ""},
		{"window bounds", with(func(c *policy.BreakerConfig) { c.Window = time.Second }), ""},
		{"window at most 10m", with(func(c *policy.BreakerConfig) { c.Window = 10 * time.Minute }), ""},
		{"zero value", policy.BreakerConfig{}, "breaker.failure_ratio: 0: must be greater than 0 and at most 1"},
		{"window zero", with(func(c *policy.BreakerConfig) { c.Window = 0 }), "breaker.window: 0s: must be between 1s and 10m0s"},
		{"window negative", with(func(c *policy.BreakerConfig) { c.Window = -1 }), "breaker.window: -1ns: must be between 1s and 10m0s"},
		{"window too long", with(func(c *policy.BreakerConfig) { c.Window = time.Hour }), "breaker.window: 1h0m0s: must be between 1s and 10m0s"},
		{"min requests zero", with(func(c *policy.BreakerConfig) { c.MinRequests = 0 }), "breaker.min_requests: 0: must be at least 1"},
		{"min requests negative", with(func(c *policy.BreakerConfig) { c.MinRequests = -1 }), "breaker.min_requests: -1: must be at least 1"},
		{"ratio zero", with(func(c *policy.BreakerConfig) { c.FailureRatio = 0 }), "breaker.failure_ratio: 0: must be greater than 0 and at most 1"},
		{"ratio above 1", with(func(c *policy.BreakerConfig) { c.FailureRatio = 1.01 }), "breaker.failure_ratio: 1.01: must be greater than 0 and at most 1"},
		{"ratio NaN", with(func(c *policy.BreakerConfig) { c.FailureRatio = math.NaN() }), "breaker.failure_ratio: NaN"},
		{"timeouts zero", with(func(c *policy.BreakerConfig) { c.ConsecutiveTimeouts = 0 }), "breaker.consecutive_timeouts: 0: must be at least 1"},
		{"timeouts negative", with(func(c *policy.BreakerConfig) { c.ConsecutiveTimeouts = -5 }), "breaker.consecutive_timeouts: -5: must be at least 1"},
		{"cool-down zero", with(func(c *policy.BreakerConfig) { c.CoolDown = 0 }), "breaker.cool_down: 0s: must be positive"},
		{"cool-down negative", with(func(c *policy.BreakerConfig) { c.CoolDown = -time.Second }), "breaker.cool_down: -1s: must be positive"},
		{"max cool-down zero", with(func(c *policy.BreakerConfig) { c.MaxCoolDown = 0 }), "breaker.max_cool_down: 0s: must be positive"},
		{"largest", with(func(c *policy.BreakerConfig) {
			c.MinRequests, c.ConsecutiveTimeouts, c.CoolDown, c.MaxCoolDown = 1_000_000, 10_000, time.Hour, 24*time.Hour
		}), ""},
		{"min requests too many", with(func(c *policy.BreakerConfig) { c.MinRequests = 1_000_001 }), "breaker.min_requests: 1000001: must be at most 1000000"},
		{"timeouts too many", with(func(c *policy.BreakerConfig) { c.ConsecutiveTimeouts = 10_001 }), "breaker.consecutive_timeouts: 10001: must be at most 10000"},
		{"cool-down in nanoseconds", with(func(c *policy.BreakerConfig) { c.CoolDown = 5 }), "breaker.cool_down: 5ns: must be at least 1ms"},
		{"cool-down too long", with(func(c *policy.BreakerConfig) { c.CoolDown, c.MaxCoolDown = 2*time.Hour, 2*time.Hour }), "breaker.cool_down: 2h0m0s: must be at most 1h0m0s"},
		{"max cool-down too long", with(func(c *policy.BreakerConfig) { c.MaxCoolDown = 25 * time.Hour }), "breaker.max_cool_down: 25h0m0s: must be at most 24h0m0s"},
		{"cool-down above max", with(func(c *policy.BreakerConfig) { c.CoolDown, c.MaxCoolDown = time.Minute, time.Second }), "breaker.cool_down: 1m0s: must not exceed breaker.max_cool_down (1s)"},
		{"cool-down above default max", with(func(c *policy.BreakerConfig) { c.CoolDown = time.Hour }), "breaker.cool_down: 1h0m0s: must not exceed breaker.max_cool_down (5m0s)"},
		{"max below default cool-down", with(func(c *policy.BreakerConfig) { c.MaxCoolDown = time.Second }), "breaker.cool_down: 5s: must not exceed breaker.max_cool_down (1s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkValidate(t, tt.cfg.Validate(), tt.wantErr)
		})
	}
}

func TestBreakerConfigWithDefaults(t *testing.T) {
	want := policy.BreakerConfig{Window: policy.DefaultBreakerWindow, MinRequests: policy.DefaultBreakerMinRequests,
		FailureRatio: policy.DefaultBreakerFailureRatio, ConsecutiveTimeouts: policy.DefaultBreakerConsecutiveTimeouts,
		CoolDown: policy.DefaultBreakerCoolDown, MaxCoolDown: policy.DefaultBreakerMaxCoolDown}
	neg := policy.BreakerConfig{Window: -1, MinRequests: -1, FailureRatio: math.NaN(), ConsecutiveTimeouts: -1, CoolDown: -1, MaxCoolDown: -1}
	for _, c := range []policy.BreakerConfig{{}, neg} {
		if got := c.WithDefaults(); got != want {
			t.Errorf("WithDefaults() = %+v, want %+v", got, want)
		}
	}
	set := policy.BreakerConfig{Window: time.Minute, MinRequests: 1, FailureRatio: 1, ConsecutiveTimeouts: 2, CoolDown: time.Second, MaxCoolDown: time.Second}
	if got := set.WithDefaults(); got != set {
		t.Errorf("WithDefaults changed set fields: %+v", got)
	}
}

func BenchmarkBreaker(b *testing.B) {
	br := policy.NewBreaker(policy.BreakerConfig{}, nil)
	b.ReportAllocs()
	for b.Loop() {
		if ok, probe := br.Allow(); ok {
			br.Record(false, false, probe)
		}
	}
}

// A lane asks its breaker before each request and reports every outcome.
// Against a black hole, five timeouts in a row open the breaker; the lane
// then dispatches nothing until RetryAt, when a single probe goes out.
func ExampleBreaker() {
	now := time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	breaker := policy.NewBreaker(policy.BreakerConfig{}, clock)

	for range 5 {
		if ok, probe := breaker.Allow(); ok {
			breaker.Record(true, true, probe) // timed out
		}
	}
	ok, _ := breaker.Allow()
	fmt.Println(breaker.State(), ok, "until", breaker.RetryAt().Sub(now))

	now = breaker.RetryAt()
	ok, probe := breaker.Allow()
	fmt.Println("probe:", ok, probe, breaker.State())
	breaker.Record(true, true, probe) // the probe timed out too
	fmt.Println(breaker.State(), "until", breaker.RetryAt().Sub(now))

	now = breaker.RetryAt()
	_, probe = breaker.Allow()
	breaker.Record(false, false, probe) // 2xx
	fmt.Println(breaker.State(), "after", breaker.Trips(), "trips")
	// Output:
	// open false until 5s
	// probe: true true half_open
	// open until 10s
	// closed after 2 trips
}
