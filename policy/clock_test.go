package policy_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// Clock steps. The stateful policies take an injected clock, and an
// injected clock (like any time read back from disk) has no monotonic
// reading: a wall clock stepped back by NTP, a VM resumed from a snapshot
// or an operator's `date -s` reaches them unfiltered. These tests step the
// fake clock an hour back and forth in the middle of a window and check
// that a step back counts as no time (nothing minted, nothing stuck for the
// length of the step) and a step forward counts as elapsed time.

const step = time.Hour

func TestClockStepBudget(t *testing.T) {
	// Defaults: a 10 s window in 1 s buckets, a floor of 100 retries.
	const floor = 100
	window := policy.DefaultBudgetWindow
	tests := []struct {
		name string
		run  func(t *testing.T, clk *fakeClock, b *policy.Budget)
	}{
		{"back: what was spent stays spent", func(t *testing.T, clk *fakeClock, b *policy.Budget) {
			clk.Advance(3 * time.Second) // mid-window
			if got := spend(b, 1000); got != floor {
				t.Fatalf("spent %d, want the floor %d", got, floor)
			}
			clk.Advance(-step)
			if b.TryRetry() || b.TryRetryPaced() {
				t.Fatal("a retry was granted right after the clock stepped back")
			}
			if s := b.Stats(); s.Retries != floor || s.Available != 0 {
				t.Fatalf("Stats() = %+v after the step, want %d retries and nothing available", s, floor)
			}
		}},
		{"back: the spent retries age out one window later, not one hour", func(t *testing.T, clk *fakeClock, b *policy.Budget) {
			clk.Advance(3 * time.Second)
			spend(b, 1000)
			clk.Advance(-step)
			b.Stats() // the step is noticed here, as a lane's next call would
			clk.Advance(window - time.Second - 1)
			if b.TryRetry() {
				t.Fatal("a retry was granted less than a window after the spending")
			}
			// A window and a bucket after the step at most.
			clk.Advance(2*time.Second + 1)
			if got := spend(b, 1000); got != floor {
				t.Fatalf("a window after the step: %d retries, want %d (the budget must not stay locked for the step's hour)", got, floor)
			}
		}},
		{"back: earned successes stay earned, then age out", func(t *testing.T, clk *fakeClock, b *policy.Budget) {
			clk.Advance(3 * time.Second)
			successes(b, 1000) // ratio 0.1: 100 more retries
			clk.Advance(-step)
			if s := b.Stats(); s.Successes != 1000 || s.Allowed != floor+100 {
				t.Fatalf("Stats() = %+v after the step, want 1000 successes and %d allowed", s, floor+100)
			}
			clk.Advance(window + time.Second)
			if s := b.Stats(); s.Successes != 0 || s.Allowed != floor {
				t.Fatalf("Stats() = %+v a window after the step, want the successes aged out", s)
			}
		}},
		{"many steps back mint nothing", func(t *testing.T, clk *fakeClock, b *policy.Budget) {
			// Each step back re-anchors the window (and its pace slot); the
			// window's count still bounds what is granted.
			granted := 0
			for range 400 {
				clk.Advance(-step)
				clk.Advance(time.Millisecond)
				for b.TryRetryPaced() || b.TryRetry() {
					granted++
					if granted > 10*floor {
						t.Fatal("clock steps mint retries without bound")
					}
				}
			}
			// 400 steps back, 400 ms of time: one window's allowance.
			if granted != floor {
				t.Fatalf("granted %d retries across 400 steps back, want %d", granted, floor)
			}
		}},
		{"back, then forward again: the step forward counts as elapsed time", func(t *testing.T, clk *fakeClock, b *policy.Budget) {
			// After a step back the window forgets the old frame, so a clock
			// that returns to it has moved an hour forward: one fresh
			// window, as after any hour. (time.Now's monotonic reading
			// spares production this; an injected clock that flaps by an
			// hour earns one window's allowance per flap, never more.)
			granted := spend(b, 1000)
			clk.Advance(-step)
			granted += spend(b, 1000)
			clk.Advance(step)
			granted += spend(b, 1000)
			if granted != 2*floor {
				t.Fatalf("granted %d retries across a step back and forth, want %d", granted, 2*floor)
			}
		}},
		{"forward: like elapsed time", func(t *testing.T, clk *fakeClock, b *policy.Budget) {
			clk.Advance(3 * time.Second)
			successes(b, 1000)
			spend(b, 1000)
			clk.Advance(step)
			if s := b.Stats(); s.Successes != 0 || s.Retries != 0 || s.Allowed != floor || s.Available != 1 {
				t.Fatalf("Stats() = %+v after a step forward, want an empty window", s)
			}
			if got := spend(b, 1000); got != floor {
				t.Fatalf("after a step forward: %d retries, want %d", got, floor)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			tc.run(t, clk, policy.NewBudget(policy.BudgetConfig{}, clk.Now))
		})
	}
}

func TestClockStepBreaker(t *testing.T) {
	// Defaults: open for 5 s, doubling per failed probe up to 5 min; a 10 s
	// window that needs 20 outcomes at 50% failures to trip.
	cool := policy.DefaultBreakerCoolDown
	tests := []struct {
		name string
		run  func(t *testing.T, clk *fakeClock, b *policy.Breaker)
	}{
		{"back while open: the cool-down still ends a cool-down from the step", func(t *testing.T, clk *fakeClock, b *policy.Breaker) {
			trip(t, b)
			clk.Advance(2 * time.Second) // mid cool-down
			clk.Advance(-step)
			if ok, _ := b.Allow(); ok {
				t.Fatal("Allow() = true right after the step: the cool-down was skipped")
			}
			if at, now := b.RetryAt(), clk.Now(); at.Sub(now) > cool || !at.After(now) {
				t.Fatalf("RetryAt() is %v from now after the step, want within (0, %v]", at.Sub(now), cool)
			}
			clk.Advance(cool)
			if ok, probe := b.Allow(); !ok || !probe {
				t.Fatalf("Allow() = %v, %v a cool-down after the step, want the probe (not an hour later)", ok, probe)
			}
		}},
		{"back while open after failed probes: the longer cool-down is kept", func(t *testing.T, clk *fakeClock, b *policy.Breaker) {
			trip(t, b)
			for range 2 { // 5 s, then 10 s, now 20 s
				clk.Advance(b.RetryAt().Sub(clk.Now()))
				if _, probe := b.Allow(); !probe {
					t.Fatal("no probe after the cool-down")
				}
				b.Record(true, false, true)
			}
			clk.Advance(-step)
			if ok, _ := b.Allow(); ok { // the lane's next pump notices the step
				t.Fatal("Allow() = true right after the step")
			}
			clk.Advance(4*cool - 1)
			if ok, _ := b.Allow(); ok {
				t.Fatal("Allow() = true before the 20 s cool-down ended")
			}
			clk.Advance(1)
			if ok, probe := b.Allow(); !ok || !probe {
				t.Fatalf("Allow() = %v, %v 20 s after the step, want the probe", ok, probe)
			}
		}},
		{"back while half-open with a lost probe: a new probe after MaxCoolDown", func(t *testing.T, clk *fakeClock, b *policy.Breaker) {
			trip(t, b)
			clk.Advance(cool)
			if _, probe := b.Allow(); !probe {
				t.Fatal("no probe after the cool-down")
			}
			clk.Advance(-step) // the probe is never Recorded
			if at, now := b.RetryAt(), clk.Now(); at.Sub(now) > policy.DefaultBreakerMaxCoolDown {
				t.Fatalf("RetryAt() is %v from now while half-open, want at most MaxCoolDown", at.Sub(now))
			}
			clk.Advance(policy.DefaultBreakerMaxCoolDown)
			if ok, probe := b.Allow(); !ok || !probe {
				t.Fatalf("Allow() = %v, %v MaxCoolDown after the step, want a new probe", ok, probe)
			}
		}},
		{"back while closed: old failures age out a window later", func(t *testing.T, clk *fakeClock, b *policy.Breaker) {
			clk.Advance(3 * time.Second)
			record(t, b, outcome{failure: true}, policy.DefaultBreakerMinRequests-1) // one short of tripping
			clk.Advance(-step)
			b.Allow()
			b.Record(false, false, false) // an outcome notices the step
			clk.Advance(policy.DefaultBreakerWindow + time.Second)
			b.Record(true, false, false)
			if s := b.State(); s != policy.BreakerClosed {
				t.Fatalf("State() = %v: failures from before the step still counted a window after it", s)
			}
		}},
		{"forward while open: half-open at once", func(t *testing.T, clk *fakeClock, b *policy.Breaker) {
			trip(t, b)
			clk.Advance(time.Second)
			clk.Advance(step)
			if ok, probe := b.Allow(); !ok || !probe {
				t.Fatalf("Allow() = %v, %v after a step past the cool-down, want the probe", ok, probe)
			}
			if s := b.State(); s != policy.BreakerHalfOpen {
				t.Fatalf("State() = %v, want half_open", s)
			}
			b.Record(false, false, true)
			if s := b.State(); s != policy.BreakerClosed {
				t.Fatalf("State() = %v after a good probe, want closed", s)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			tc.run(t, clk, policy.NewBreaker(policy.BreakerConfig{}, clk.Now))
		})
	}
}

func TestClockStepAutoCap(t *testing.T) {
	cfg := policy.AutoCapConfig{Min: 1, Max: 64, Headroom: 4, Interval: time.Second}
	// steady feeds one Interval of demand at perSecond with a 100 ms
	// latency and returns the limit derived at its end: ceil(λ·0.1 s) + 4.
	steady := func(clk *fakeClock, a *policy.AutoCap, perSecond int) int {
		for range perSecond {
			a.Dispatched()
			a.Completed(100*time.Millisecond, false)
		}
		clk.Advance(cfg.Interval)
		return a.Limit()
	}
	tests := []struct {
		name string
		run  func(t *testing.T, clk *fakeClock, a *policy.AutoCap)
	}{
		{"back: the limit keeps following demand", func(t *testing.T, clk *fakeClock, a *policy.AutoCap) {
			if got := steady(clk, a, 100); got != 14 {
				t.Fatalf("steady 100/s: limit %d, want 14", got)
			}
			clk.Advance(cfg.Interval / 2)
			clk.Advance(-step)
			if got := a.Limit(); got != 14 {
				t.Fatalf("limit %d right after the step, want it kept at 14", got)
			}
			if got := steady(clk, a, 300); got != 34 {
				t.Fatalf("demand tripled after the step: limit %d, want 34 (not frozen until the clock catches up)", got)
			}
		}},
		{"back: a timeout still halves the limit an Interval later", func(t *testing.T, clk *fakeClock, a *policy.AutoCap) {
			steady(clk, a, 300) // 34
			a.Completed(time.Second, true)
			if got := a.Limit(); got != 17 {
				t.Fatalf("limit %d after a timeout, want 17", got)
			}
			clk.Advance(-step)
			a.Completed(time.Second, true) // within an Interval of the last cut, as far as anyone can tell
			clk.Advance(cfg.Interval)
			a.Completed(time.Second, true)
			if got := a.Limit(); got > 8 {
				t.Fatalf("limit %d after a timeout an Interval past the step, want it halved from 17", got)
			}
		}},
		{"forward: one derivation sees a quiet hour, the next the demand", func(t *testing.T, clk *fakeClock, a *policy.AutoCap) {
			steady(clk, a, 100)
			for range 100 {
				a.Dispatched()
			}
			clk.Advance(step)
			got := a.Limit()
			if got < cfg.Min || got > 14 {
				t.Fatalf("limit %d after an hour's step, want it in [%d, 14]: the step reads as an idle hour", got, cfg.Min)
			}
			if got := steady(clk, a, 100); got != 14 {
				t.Fatalf("limit %d an Interval after the step, want 14 again", got)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			tc.run(t, clk, policy.NewAutoCap(cfg, clk.Now))
		})
	}
}

// TestClockSkewRetryAfterDate: an HTTP-date Retry-After is read against our
// own clock, so a skew between the endpoint's clock and ours shifts the
// wait by the skew. RetryPolicy.Next keeps it within the backoff cap when
// we are behind, and falls back to the backoff when we are ahead.
func TestClockSkewRetryAfterDate(t *testing.T) {
	server := time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)               // the endpoint's clock
	header := server.Add(2 * time.Minute).Format("Mon, 02 Jan 2006 15:04:05 GMT") // IMF-fixdate: "come back in 2 minutes"
	p := policy.RetryPolicy{MaxAttempts: 8, MaxAge: 24 * time.Hour, Backoff: policy.Backoff{Base: time.Second, Cap: 10 * time.Minute, Rand: fixed(0.5)}}
	tests := []struct {
		name     string
		ours     time.Duration // our clock minus the endpoint's
		parsed   time.Duration
		wantWait time.Duration // due - now from Next after the first failure
	}{
		{"in step", 0, 2 * time.Minute, 2 * time.Minute},
		{"we are a minute behind", -time.Minute, 3 * time.Minute, 3 * time.Minute},
		{"we are an hour behind: capped", -time.Hour, time.Hour + 2*time.Minute, 10 * time.Minute},
		{"we are a minute ahead", time.Minute, time.Minute, time.Minute},
		{"we are an hour ahead: the date is past, back off", time.Hour, 0, 500 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := server.Add(tc.ours)
			d, ok := policy.ParseRetryAfter(header, now)
			if !ok || d != tc.parsed {
				t.Fatalf("ParseRetryAfter(%q) at %v = %v, %v; want %v, true", header, tc.ours, d, ok, tc.parsed)
			}
			due, reason, ok := p.Next(1, now, now, d)
			if !ok || reason != "" {
				t.Fatalf("Next: %q, %v; want a retry", reason, ok)
			}
			if wait := due.Sub(now); wait != tc.wantWait {
				t.Fatalf("retry due in %v, want %v", wait, tc.wantWait)
			}
		})
	}
}
