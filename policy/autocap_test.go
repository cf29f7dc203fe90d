package policy_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// laneSim drives an AutoCap the way a lane does, on the fake clock: offered
// requests join a backlog, the lane dispatches from it while it has fewer
// than Limit() in flight, and each request completes after its latency.
type laneSim struct {
	clk *fakeClock
	ac  *policy.AutoCap

	perSecond int                       // offered load; 0 = always backlogged
	latency   func(n int) time.Duration // of the n-th dispatch

	owed     int64 // offered requests × 1s not yet whole (integer, no rounding drift)
	backlog  int
	inFlight []simRequest
	n        int // dispatches so far
}

type simRequest struct {
	due     time.Time
	latency time.Duration
}

func newLaneSim(cfg policy.AutoCapConfig, perSecond int, latency func(n int) time.Duration) *laneSim {
	clk := newFakeClock()
	return &laneSim{clk: clk, ac: policy.NewAutoCap(cfg, clk.Now), perSecond: perSecond, latency: latency}
}

func constant(d time.Duration) func(int) time.Duration { return func(int) time.Duration { return d } }

// run advances the clock by d in 1ms steps.
func (s *laneSim) run(d time.Duration) {
	const step = time.Millisecond
	for range d / step {
		s.clk.Advance(step)
		now := s.clk.Now()
		kept := s.inFlight[:0]
		for _, r := range s.inFlight {
			if now.Before(r.due) {
				kept = append(kept, r)
				continue
			}
			s.ac.Completed(r.latency, false)
		}
		s.inFlight = kept

		s.owed += int64(s.perSecond) * int64(step)
		s.backlog += int(s.owed / int64(time.Second))
		s.owed %= int64(time.Second)

		for (s.perSecond == 0 || s.backlog > 0) && len(s.inFlight) < s.ac.Limit() {
			lat := s.latency(s.n)
			s.n++
			s.backlog--
			s.ac.Dispatched()
			s.inFlight = append(s.inFlight, simRequest{due: now.Add(lat), latency: lat})
		}
	}
}

// limits runs the simulation for n intervals of d and returns Limit() at
// the end of each.
func (s *laneSim) limits(n int, d time.Duration) []int {
	out := make([]int, n)
	for i := range out {
		s.run(d)
		out[i] = s.ac.Limit()
	}
	return out
}

func TestAutoCapStart(t *testing.T) {
	tests := []struct {
		name string
		cfg  policy.AutoCapConfig
		want int
	}{
		{"defaults: min 1 + headroom 4", policy.AutoCapConfig{}, 5},
		{"negative fields mean defaults", policy.AutoCapConfig{Min: -1, Max: -1, Headroom: -1, Interval: -1}, 5},
		{"min 2", policy.AutoCapConfig{Min: 2}, 6},
		{"clamped to max", policy.AutoCapConfig{Min: 1, Max: 3}, 3},
		{"max below min is raised", policy.AutoCapConfig{Min: 100}, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := policy.NewAutoCap(tt.cfg, newFakeClock().Now).Limit(); got != tt.want {
				t.Errorf("Limit() = %d, want %d", got, tt.want)
			}
		})
	}
}

// A receiver that the lane keeps up with: the limit settles at
// ceil(λ·P99) + headroom and stays there.
func TestAutoCapConvergesSteadyReceiver(t *testing.T) {
	tests := []struct {
		name      string
		cfg       policy.AutoCapConfig
		perSecond int
		latency   func(n int) time.Duration
		want      int
	}{
		{"200/s at 50ms", policy.AutoCapConfig{}, 200, constant(50 * time.Millisecond), 10 + 4},
		{"1000/s at 20ms", policy.AutoCapConfig{}, 1000, constant(20 * time.Millisecond), 20 + 4},
		{"50/s at 100ms", policy.AutoCapConfig{}, 50, constant(100 * time.Millisecond), 5 + 4},
		{"300/s at 10ms, fraction rounds up", policy.AutoCapConfig{}, 300, constant(10 * time.Millisecond), 3 + 4},
		{"headroom 10", policy.AutoCapConfig{Headroom: 10}, 200, constant(50 * time.Millisecond), 10 + 10},
		{
			// The mean is about 24ms, but the cap is sized for the tail.
			"200/s, 2% at 200ms", policy.AutoCapConfig{}, 200,
			func(n int) time.Duration {
				if n%50 == 0 {
					return 200 * time.Millisecond
				}
				return 20 * time.Millisecond
			},
			40 + 4,
		},
		{"demand above max", policy.AutoCapConfig{Max: 10}, 200, constant(50 * time.Millisecond), 10},
		{"idle-ish lane held at min", policy.AutoCapConfig{Min: 8, Headroom: 2}, 20, constant(50 * time.Millisecond), 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newLaneSim(tt.cfg, tt.perSecond, tt.latency)
			s.run(10 * time.Second) // converge
			got := s.limits(20, 500*time.Millisecond)
			for i, c := range got {
				if c != tt.want {
					t.Fatalf("after convergence Limit() = %v (at %d), want %d throughout", got, i, tt.want)
				}
			}
		})
	}
}

// A lane with an endless backlog grows by headroom per interval, up to Max.
func TestAutoCapGrowsAdditivelyWhenBacklogged(t *testing.T) {
	tests := []struct {
		name string
		cfg  policy.AutoCapConfig
	}{
		{"defaults", policy.AutoCapConfig{}},
		{"headroom 2, max 30", policy.AutoCapConfig{Headroom: 2, Max: 30}},
		{"min 10, headroom 8, max 100", policy.AutoCapConfig{Min: 10, Headroom: 8, Max: 100}},
		{"interval 250ms", policy.AutoCapConfig{Interval: 250 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lo, hi, h := orDefault(tt.cfg.Min, 1), orDefault(tt.cfg.Max, 64), orDefault(tt.cfg.Headroom, 4)
			interval := orDefault(tt.cfg.Interval, time.Second)
			s := newLaneSim(tt.cfg, 0, constant(50*time.Millisecond))
			prev := s.ac.Limit()
			if prev != lo+h {
				t.Fatalf("start: Limit() = %d, want %d", prev, lo+h)
			}
			for i, c := range s.limits(2*(hi-lo)/h+4, interval) {
				if want := min(prev+h, hi); c != want {
					t.Fatalf("interval %d: Limit() = %d after %d, want %d", i+1, c, prev, want)
				}
				prev = c
			}
			if prev != hi {
				t.Errorf("final Limit() = %d, want max %d", prev, hi)
			}
		})
	}
}

// orDefault returns v, or def when v is zero (a config default).
func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

func TestAutoCapHalvesOnTimeout(t *testing.T) {
	tests := []struct {
		name string
		cfg  policy.AutoCapConfig
		want []int // Limit after each timeout, one Interval apart
	}{
		{"down to min 1", policy.AutoCapConfig{Headroom: 63}, []int{32, 16, 8, 4, 2, 1, 1}},
		{"not below min 3", policy.AutoCapConfig{Min: 3, Headroom: 61}, []int{32, 16, 8, 4, 3, 3}},
		{"odd limits round down", policy.AutoCapConfig{Headroom: 20}, []int{10, 5, 2, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			a := policy.NewAutoCap(tt.cfg, clk.Now)
			for i, want := range tt.want {
				a.Completed(10*time.Second, true)
				if got := a.Limit(); got != want {
					t.Fatalf("timeout %d: Limit() = %d, want %d", i+1, got, want)
				}
				// More timeouts within the interval: they came out of the
				// same window and halve nothing more.
				for range 10 {
					clk.Advance(99 * time.Millisecond)
					a.Completed(10*time.Second, true)
				}
				if got := a.Limit(); got != want {
					t.Fatalf("timeout %d: Limit() = %d after more timeouts within the interval, want %d", i+1, got, want)
				}
				clk.Advance(10 * time.Millisecond)
			}
		})
	}
}

// After a cut, the next derivation measures demand under the reduced limit
// instead of undoing the cut with the demand from before it.
func TestAutoCapCutIsNotUndone(t *testing.T) {
	s := newLaneSim(policy.AutoCapConfig{}, 0, constant(50*time.Millisecond))
	s.run(20 * time.Second)
	if c := s.ac.Limit(); c != 64 {
		t.Fatalf("backlogged lane: Limit() = %d, want max 64", c)
	}
	s.ac.Completed(5*time.Second, true)
	if c := s.ac.Limit(); c != 32 {
		t.Fatalf("Limit() = %d right after a timeout, want 32", c)
	}
	s.run(999 * time.Millisecond)
	if c := s.ac.Limit(); c != 32 {
		t.Errorf("Limit() = %d within the interval after the cut, want 32", c)
	}
	// The slow sample moved the P99 only a little; growth resumes from
	// the cut value.
	s.run(time.Millisecond)
	if c := s.ac.Limit(); c <= 32 || c > 32+4 {
		t.Errorf("Limit() = %d one interval after the cut, want in (32, 36]", c)
	}
}

// The P99 is over the last 256 completions (nearest rank, so the third
// largest of 256), and older ones leave the ring.
func TestAutoCapP99Ring(t *testing.T) {
	tests := []struct {
		name    string
		samples []time.Duration // oldest first
		want    int             // with 10 dispatches in 1s: ceil(10·P99) + 4
	}{
		{"one sample", durations(1, time.Second), 10 + 4},
		{"99 samples: the largest", append(durations(98, 10*time.Millisecond), time.Second), 10 + 4},
		{"100 samples: the second largest", append(durations(99, 10*time.Millisecond), time.Second), 1 + 4},
		{"256: third largest", append(durations(253, 10*time.Millisecond), durations(3, time.Second)...), 10 + 4},
		{"256: two slow are not the P99", append(durations(254, 10*time.Millisecond), durations(2, time.Second)...), 1 + 4},
		{"the oldest slow one left the ring", append(durations(3, time.Second), durations(256, 10*time.Millisecond)...), 1 + 4},
		{"the slow ones are still in the ring", append(durations(3, time.Second), durations(253, 10*time.Millisecond)...), 10 + 4},
		{"sub-microsecond counts as 0", durations(10, 999), 0 + 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			a := policy.NewAutoCap(policy.AutoCapConfig{}, clk.Now)
			for _, d := range tt.samples {
				a.Completed(d, false)
			}
			for range 10 {
				a.Dispatched()
			}
			clk.Advance(time.Second)
			if got := a.Limit(); got != tt.want {
				t.Errorf("Limit() = %d, want %d", got, tt.want)
			}
		})
	}
}

func durations(n int, d time.Duration) []time.Duration {
	s := make([]time.Duration, n)
	for i := range s {
		s[i] = d
	}
	return s
}

func TestAutoCapClamps(t *testing.T) {
	t.Run("huge demand stops at max", func(t *testing.T) {
		clk := newFakeClock()
		a := policy.NewAutoCap(policy.AutoCapConfig{Max: 50}, clk.Now)
		a.Completed(time.Hour, false)
		for range 1_000_000 {
			a.Dispatched()
		}
		clk.Advance(time.Second)
		if got := a.Limit(); got != 50 {
			t.Errorf("Limit() = %d, want max 50", got)
		}
	})
	t.Run("idle lane drops to min", func(t *testing.T) {
		clk := newFakeClock()
		a := policy.NewAutoCap(policy.AutoCapConfig{Min: 6, Headroom: 2}, clk.Now)
		a.Completed(time.Second, false)
		clk.Advance(time.Hour)
		if got := a.Limit(); got != 6 {
			t.Errorf("Limit() = %d, want min 6", got)
		}
	})
	t.Run("idle lane drops to headroom above min", func(t *testing.T) {
		clk := newFakeClock()
		a := policy.NewAutoCap(policy.AutoCapConfig{Min: 2, Headroom: 4}, clk.Now)
		a.Completed(time.Second, false)
		clk.Advance(time.Hour)
		if got := a.Limit(); got != 4 {
			t.Errorf("Limit() = %d, want headroom 4", got)
		}
	})
	t.Run("latency beyond the ring's range saturates", func(t *testing.T) {
		clk := newFakeClock()
		a := policy.NewAutoCap(policy.AutoCapConfig{Max: math.MaxInt}, clk.Now)
		a.Completed(math.MaxInt64, false)
		a.Dispatched()
		clk.Advance(time.Second)
		// 1/s × 71m34.967295s (2³² µs) = 4295 + 4.
		if got := a.Limit(); got != 4295+4 {
			t.Errorf("Limit() = %d, want 4299", got)
		}
	})
}

// Without a completed request there is no latency to go by: the limit
// keeps its starting value.
func TestAutoCapNoSamplesKeepsLimit(t *testing.T) {
	clk := newFakeClock()
	a := policy.NewAutoCap(policy.AutoCapConfig{}, clk.Now)
	for range 5 {
		for range 100 {
			a.Dispatched()
		}
		clk.Advance(time.Second)
		if got := a.Limit(); got != 5 {
			t.Fatalf("Limit() = %d before any completion, want 5", got)
		}
	}
}

// Limit derives at most once per Interval.
func TestAutoCapInterval(t *testing.T) {
	clk := newFakeClock()
	a := policy.NewAutoCap(policy.AutoCapConfig{}, clk.Now)
	a.Completed(100*time.Millisecond, false)
	for range 100 {
		a.Dispatched()
	}
	clk.Advance(time.Second - 1)
	if got := a.Limit(); got != 5 {
		t.Fatalf("Limit() = %d before the interval, want 5", got)
	}
	clk.Advance(1)
	if got := a.Limit(); got != 10+4 { // 100/s × 100ms
		t.Fatalf("Limit() = %d after the interval, want 14", got)
	}
	for range 1000 {
		a.Dispatched()
	}
	clk.Advance(500 * time.Millisecond)
	if got := a.Limit(); got != 14 {
		t.Errorf("Limit() = %d half an interval later, want 14 still", got)
	}
	clk.Advance(500 * time.Millisecond)
	if got := a.Limit(); got != 64 { // 1000/s × 100ms + 4, clamped
		t.Errorf("Limit() = %d one interval later, want max 64", got)
	}
}

func TestAutoCapConcurrent(t *testing.T) {
	clk := newFakeClock()
	a := policy.NewAutoCap(policy.AutoCapConfig{Min: 2, Max: 40, Interval: 10 * time.Millisecond}, clk.Now)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 3000 {
				switch {
				case g == 0:
					clk.Advance(time.Millisecond)
				case i%2 == 0:
					a.Dispatched()
				default:
					a.Completed(time.Duration(i)*time.Microsecond, i%500 == 1)
				}
				if c := a.Limit(); c < 2 || c > 40 {
					t.Errorf("Limit() = %d, want in [2, 40]", c)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestAutoCapAllocs(t *testing.T) {
	clk := newFakeClock()
	a := policy.NewAutoCap(policy.AutoCapConfig{}, clk.Now)
	for name, f := range map[string]func(){
		"Dispatched":        a.Dispatched,
		"Completed":         func() { a.Completed(30*time.Millisecond, false) },
		"Completed timeout": func() { clk.Advance(time.Second); a.Completed(5*time.Second, true) },
		"Limit":             func() { a.Limit() },
		"Limit deriving":    func() { clk.Advance(time.Second); a.Dispatched(); a.Limit() },
	} {
		if allocs := testing.AllocsPerRun(1000, f); allocs != 0 {
			t.Errorf("%s allocates %v times per run, want 0", name, allocs)
		}
	}
}

func TestAutoCapConfigValidate(t *testing.T) {
	with := func(f func(*policy.AutoCapConfig)) policy.AutoCapConfig {
		c := policy.AutoCapConfig{}.WithDefaults()
		f(&c)
		return c
	}
	tests := []struct {
		name    string
		cfg     policy.AutoCapConfig
		wantErr string
	}{
		{"defaults", policy.AutoCapConfig{}.WithDefaults(), ""},
		{"design example", policy.AutoCapConfig{Min: 2, Max: 64, Headroom: 4, Interval: time.Second}, ""},
		{"min equals max", with(func(c *policy.AutoCapConfig) { c.Min, c.Max = 8, 8 }), ""},
		{"min 64 with default max", policy.AutoCapConfig{Min: 64}.WithDefaults(), ""},
		{"max below default min", policy.AutoCapConfig{Max: 1}.WithDefaults(), ""},
		{"bounds, high", with(func(c *policy.AutoCapConfig) { c.Min, c.Max, c.Headroom = 10000, 10000, 1000 }), ""},
		{"zero value", policy.AutoCapConfig{}, "concurrency.max: 0: must be between 1 and 10000"},
		{"min above max", with(func(c *policy.AutoCapConfig) { c.Min, c.Max = 10, 5 }), "concurrency.min: 10: must not exceed concurrency.max (5)"},
		{"min above default max", policy.AutoCapConfig{Min: 100}.WithDefaults(), "concurrency.min: 100: must not exceed concurrency.max (64)"},
		{"min zero", with(func(c *policy.AutoCapConfig) { c.Min = 0 }), "concurrency.min: 0: must be between 1 and 10000"},
		{"min negative", with(func(c *policy.AutoCapConfig) { c.Min = -1 }), "concurrency.min: -1: must be between 1 and 10000"},
		{"max negative", with(func(c *policy.AutoCapConfig) { c.Max = -1 }), "concurrency.max: -1: must be between 1 and 10000"},
		{"max too big", with(func(c *policy.AutoCapConfig) { c.Max = 10001 }), "concurrency.max: 10001: must be between 1 and 10000"},
		{"headroom zero", with(func(c *policy.AutoCapConfig) { c.Headroom = 0 }), "concurrency.headroom: 0: must be between 1 and 1000"},
		{"headroom negative", with(func(c *policy.AutoCapConfig) { c.Headroom = -4 }), "concurrency.headroom: -4: must be between 1 and 1000"},
		{"headroom too big", with(func(c *policy.AutoCapConfig) { c.Headroom = 1001 }), "concurrency.headroom: 1001: must be between 1 and 1000"},
		{"interval negative", with(func(c *policy.AutoCapConfig) { c.Interval = -time.Second }), "interval: -1s: must be between 1ms and 1h0m0s"},
		{"interval in nanoseconds", with(func(c *policy.AutoCapConfig) { c.Interval = 1000 }), "interval: 1µs: must be between 1ms and 1h0m0s"},
		{"interval too long", with(func(c *policy.AutoCapConfig) { c.Interval = 2 * time.Hour }), "interval: 2h0m0s: must be between"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkValidate(t, tt.cfg.Validate(), tt.wantErr)
		})
	}
}

func TestValidateCap(t *testing.T) {
	for _, n := range []int{1, 16, policy.MaxConcurrency} {
		checkValidate(t, policy.ValidateCap(n), "")
	}
	checkValidate(t, policy.ValidateCap(0), "concurrency.max: 0: must be between 1 and 10000")
	checkValidate(t, policy.ValidateCap(-1), "concurrency.max: -1: must be between 1 and 10000")
	checkValidate(t, policy.ValidateCap(10001), "concurrency.max: 10001: must be between 1 and 10000")
}

func TestAutoCapConfigWithDefaults(t *testing.T) {
	want := policy.AutoCapConfig{Min: policy.DefaultAutoCapMin, Max: policy.DefaultAutoCapMax, Headroom: policy.DefaultAutoCapHeadroom, Interval: policy.DefaultAutoCapInterval}
	for _, c := range []policy.AutoCapConfig{{}, {Min: -1, Max: -1, Headroom: -1, Interval: -1}} {
		if got := c.WithDefaults(); got != want {
			t.Errorf("WithDefaults() = %+v, want %+v", got, want)
		}
	}
	set := policy.AutoCapConfig{Min: 3, Max: 5, Headroom: 1, Interval: time.Minute}
	if got := set.WithDefaults(); got != set {
		t.Errorf("WithDefaults changed set fields: %+v", got)
	}
}

func BenchmarkAutoCap(b *testing.B) {
	a := policy.NewAutoCap(policy.AutoCapConfig{}, nil)
	b.ReportAllocs()
	for b.Loop() {
		a.Limit()
		a.Dispatched()
		a.Completed(20*time.Millisecond, false)
	}
}
