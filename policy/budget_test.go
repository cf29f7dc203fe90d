package policy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// fakeClock is a clock that moves only when told. It is safe for
// concurrent use and Now does not allocate, so it can drive AllocsPerRun
// and -race tests. The Budget, Breaker and AutoCap tests share it.
type fakeClock struct {
	base time.Time
	off  atomic.Int64 // nanoseconds since base
}

func newFakeClock() *fakeClock {
	return &fakeClock{base: time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time          { return c.base.Add(time.Duration(c.off.Load())) }
func (c *fakeClock) Advance(d time.Duration) { c.off.Add(int64(d)) }

// spend calls TryRetry until it fails (at most limit times) and returns how
// many retries it got.
func spend(b *policy.Budget, limit int) int {
	n := 0
	for n < limit && b.TryRetry() {
		n++
	}
	return n
}

func successes(b *policy.Budget, n int) {
	for range n {
		b.Success()
	}
}

func TestBudgetFloor(t *testing.T) {
	tests := []struct {
		name string
		cfg  policy.BudgetConfig
		want int // MinPerSecond × window seconds
	}{
		{"defaults", policy.BudgetConfig{}, 100},
		{"negative fields mean defaults", policy.BudgetConfig{Ratio: -1, MinPerSecond: -1, Window: -time.Second}, 100},
		{"NaN means default", policy.BudgetConfig{Ratio: math.NaN(), MinPerSecond: math.NaN()}, 100},
		{"2/s over 5s", policy.BudgetConfig{MinPerSecond: 2, Window: 5 * time.Second}, 10},
		{"fractional rate", policy.BudgetConfig{MinPerSecond: 0.5}, 5},
		{"long window, a bucket per second", policy.BudgetConfig{MinPerSecond: 1, Window: 30 * time.Second}, 30},
		{"sub-second window", policy.BudgetConfig{MinPerSecond: 100, Window: 500 * time.Millisecond}, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			b := policy.NewBudget(tt.cfg, clk.Now)
			if got := spend(b, 10*tt.want+10); got != tt.want {
				t.Errorf("retries allowed without successes = %d, want %d", got, tt.want)
			}
			if b.TryRetry() {
				t.Error("TryRetry() = true after the floor was spent")
			}
			s := b.Stats()
			if s.Successes != 0 || s.Retries != int64(tt.want) || s.Allowed != int64(tt.want) || s.Available != 0 {
				t.Errorf("Stats() = %+v, want 0 successes, %d retries of %d allowed, 0 available", s, tt.want, tt.want)
			}
		})
	}
}

func TestBudgetRatio(t *testing.T) {
	tests := []struct {
		name      string
		cfg       policy.BudgetConfig
		successes int
		want      int
	}{
		{"1000 successes at 10%", policy.BudgetConfig{}, 1000, 100 + 100},
		{"9 successes earn no whole retry", policy.BudgetConfig{}, 9, 100},
		{"10 successes earn one", policy.BudgetConfig{}, 10, 101},
		{"ratio 0.29 rounds right", policy.BudgetConfig{Ratio: 0.29, MinPerSecond: 1, Window: time.Second}, 100, 29 + 1},
		{"ratio 1", policy.BudgetConfig{Ratio: 1, MinPerSecond: 1}, 50, 50 + 10},
		{"ratio 0.5", policy.BudgetConfig{Ratio: 0.5, MinPerSecond: 1}, 1000, 500 + 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := policy.NewBudget(tt.cfg, newFakeClock().Now)
			successes(b, tt.successes)
			if s := b.Stats(); s.Allowed != int64(tt.want) {
				t.Errorf("Stats().Allowed = %d, want %d", s.Allowed, tt.want)
			}
			if got := spend(b, 10*tt.want); got != tt.want {
				t.Errorf("retries allowed after %d successes = %d, want %d", tt.successes, got, tt.want)
			}
		})
	}
}

// Successes keep earning retries after the floor is spent.
func TestBudgetSuccessesRefill(t *testing.T) {
	b := policy.NewBudget(policy.BudgetConfig{}, newFakeClock().Now)
	if got := spend(b, 1000); got != 100 {
		t.Fatalf("floor = %d, want 100", got)
	}
	for i := range 5 {
		successes(b, 10)
		if !b.TryRetry() {
			t.Fatalf("round %d: TryRetry() = false after 10 more successes", i)
		}
		if b.TryRetry() {
			t.Fatalf("round %d: 10 successes paid for two retries", i)
		}
	}
}

// Successes and retries leave the window one bucket (a tenth of it) at a
// time as the clock moves.
func TestBudgetWindowSlides(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBudget(policy.BudgetConfig{}, clk.Now) // 100 floor, 10s, 1s buckets

	// 10 retries in each of the first ten seconds spend the floor.
	for s := range 10 {
		if got := spend(b, 10); got != 10 {
			t.Fatalf("second %d: got %d retries, want 10", s, got)
		}
		clk.Advance(time.Second)
	}
	// Now at 10s: second 0 has left the window, so its 10 retries are free
	// again, and no more.
	if got := spend(b, 100); got != 10 {
		t.Errorf("at 10s: %d retries, want the 10 of the bucket that left", got)
	}
	clk.Advance(time.Second - 1)
	if b.TryRetry() {
		t.Error("at 11s-1ns: TryRetry() = true before the next bucket left")
	}
	clk.Advance(1)
	if got := spend(b, 100); got != 10 {
		t.Errorf("at 11s: %d retries, want 10", got)
	}
	// After a full idle window everything is free.
	clk.Advance(10 * time.Second)
	if s := b.Stats(); s.Retries != 0 || s.Allowed != 100 || s.Available != 1 {
		t.Errorf("after an idle window Stats() = %+v, want nothing spent", s)
	}

	// Successes age the same way: 1000 at once pay 100 retries until
	// their bucket leaves, 10s later.
	successes(b, 1000)
	clk.Advance(10*time.Second - 1)
	if s := b.Stats(); s.Successes != 1000 || s.Allowed != 200 {
		t.Errorf("just before the successes age out Stats() = %+v, want 1000 successes, 200 allowed", s)
	}
	clk.Advance(1)
	if s := b.Stats(); s.Successes != 0 || s.Allowed != 100 {
		t.Errorf("after the successes aged out Stats() = %+v, want 0 successes, 100 allowed", s)
	}
}

func TestBudgetLongIdleAndClockSteps(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBudget(policy.BudgetConfig{}, clk.Now)
	spend(b, 100)
	clk.Advance(1000 * time.Hour)
	if got := spend(b, 1000); got != 100 {
		t.Errorf("after a long idle: %d retries, want 100", got)
	}
	// A clock stepped back counts into the newest bucket; nothing is lost
	// or freed early.
	clk.Advance(-time.Hour)
	if b.TryRetry() {
		t.Error("TryRetry() = true after the clock went back")
	}
	if s := b.Stats(); s.Retries != 100 {
		t.Errorf("Stats().Retries = %d after the clock went back, want 100", s.Retries)
	}
	clk.Advance(time.Hour + 10*time.Second)
	if got := spend(b, 1000); got != 100 {
		t.Errorf("a window after the step: %d retries, want 100", got)
	}
}

func TestBudgetAvailable(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBudget(policy.BudgetConfig{}, clk.Now)
	check := func(step string, want float64) {
		t.Helper()
		if got := b.Available(); math.Abs(got-want) > 1e-12 {
			t.Errorf("%s: Available() = %v, want %v", step, got, want)
		}
		if got := b.Stats().Available; math.Abs(got-want) > 1e-12 {
			t.Errorf("%s: Stats().Available = %v, want %v", step, got, want)
		}
	}
	check("new", 1)
	successes(b, 1000)
	check("successes alone", 1)
	clk.Advance(5 * time.Second)
	spend(b, 50)
	check("50 of 200 spent", 0.75)
	spend(b, 100)
	check("150 of 200 spent", 0.25)
	spend(b, 1000)
	check("all spent", 0)

	// The successes leave the window while the retries they paid for stay:
	// 200 spent of 100 allowed is empty, not negative.
	clk.Advance(5 * time.Second)
	if s := b.Stats(); s.Successes != 0 || s.Retries != 200 || s.Allowed != 100 {
		t.Fatalf("Stats() = %+v, want 0 successes, 200 retries, 100 allowed", s)
	}
	check("successes aged out", 0)
	clk.Advance(5 * time.Second)
	check("everything aged out", 1)
}

func TestBudgetStatsJSON(t *testing.T) {
	b := policy.NewBudget(policy.BudgetConfig{}, newFakeClock().Now)
	successes(b, 20)
	spend(b, 51)
	got, err := json.Marshal(b.Stats())
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"successes":20,"retries":51,"allowed":102,"available":0.5}`
	if string(got) != want {
		t.Errorf("json = %s, want %s", got, want)
	}
}

// Concurrent callers never get more retries than the window allows, and
// the race detector finds nothing while the clock moves underneath them.
func TestBudgetConcurrent(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBudget(policy.BudgetConfig{}, clk.Now)

	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { successes(b, 100) })
	}
	wg.Wait()
	var granted atomic.Int64
	for range 10 {
		wg.Go(func() {
			for range 50 {
				if b.TryRetry() {
					granted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := granted.Load(); got != 200 {
		t.Errorf("granted %d retries concurrently, want exactly 200", got)
	}

	// Mixed traffic with a moving clock.
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				switch {
				case g == 0 && i%10 == 0:
					clk.Advance(100 * time.Millisecond)
				case i%3 == 0:
					b.TryRetry()
				default:
					b.Success()
				}
				if a := b.Available(); a < 0 || a > 1 {
					t.Errorf("Available() = %v, want 0..1", a)
					return
				}
				b.Stats()
			}
		})
	}
	wg.Wait()
}

func TestBudgetAllocs(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBudget(policy.BudgetConfig{}, clk.Now)
	for name, f := range map[string]func(){
		"Success":   b.Success,
		"TryRetry":  func() { b.TryRetry() },
		"Available": func() { b.Available() },
		"Stats":     func() { b.Stats() },
		"rotating":  func() { clk.Advance(300 * time.Millisecond); b.Success(); b.TryRetry() },
	} {
		if allocs := testing.AllocsPerRun(1000, f); allocs != 0 {
			t.Errorf("%s allocates %v times per run, want 0", name, allocs)
		}
	}
}

func TestBudgetConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     policy.BudgetConfig
		wantErr string // the message; "" means valid
	}{
		{"defaults", policy.BudgetConfig{}.WithDefaults(), ""},
		{"design values", policy.BudgetConfig{Ratio: 0.1, MinPerSecond: 10, Window: 10 * time.Second}, ""},
		{"bounds, low", policy.BudgetConfig{Ratio: math.SmallestNonzeroFloat64, MinPerSecond: 0.001, Window: time.Second}, ""},
		{"bounds, high", policy.BudgetConfig{Ratio: 1, MinPerSecond: 1e6, Window: 10 * time.Minute}, ""},
		// Zero is not "the default" here: the loader refuses an explicit
		// ratio: 0 with this message.
		{"zero ratio", policy.BudgetConfig{MinPerSecond: 10, Window: time.Second}, "retry_budget.ratio: 0: must be above 0 and at most 1"},
		{"zero value", policy.BudgetConfig{}, "retry_budget.ratio: 0: must be above 0 and at most 1"},
		{"ratio above 1", withBudget(func(c *policy.BudgetConfig) { c.Ratio = 1.5 }), "retry_budget.ratio: 1.5: must be above 0 and at most 1"},
		{"ratio negative", withBudget(func(c *policy.BudgetConfig) { c.Ratio = -0.1 }), "retry_budget.ratio: -0.1: must be above 0"},
		{"ratio NaN", withBudget(func(c *policy.BudgetConfig) { c.Ratio = math.NaN() }), "retry_budget.ratio: NaN: must be above 0 and at most 1"},
		{"floor zero", withBudget(func(c *policy.BudgetConfig) { c.MinPerSecond = 0 }), "retry_budget.min_per_second: 0: must be above 0 and at most 1000000"},
		{"floor negative", withBudget(func(c *policy.BudgetConfig) { c.MinPerSecond = -1 }), "retry_budget.min_per_second: -1: must be above 0"},
		{"floor infinite", withBudget(func(c *policy.BudgetConfig) { c.MinPerSecond = math.Inf(1) }), "retry_budget.min_per_second: +Inf"},
		{"floor huge", withBudget(func(c *policy.BudgetConfig) { c.MinPerSecond = 2e6 }), "retry_budget.min_per_second: 2e+06: must be above 0 and at most 1000000"},
		{"window zero", withBudget(func(c *policy.BudgetConfig) { c.Window = 0 }), "retry_budget.window: 0s: must be between 1s and 10m0s"},
		{"window negative", withBudget(func(c *policy.BudgetConfig) { c.Window = -time.Second }), "retry_budget.window: -1s: must be between 1s and 10m0s"},
		{"window in nanoseconds", withBudget(func(c *policy.BudgetConfig) { c.Window = 10 }), "retry_budget.window: 10ns: must be between 1s and 10m0s"},
		{"window too long", withBudget(func(c *policy.BudgetConfig) { c.Window = 11 * time.Minute }), "retry_budget.window: 11m0s: must be between 1s and 10m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkValidate(t, tt.cfg.Validate(), tt.wantErr)
		})
	}
}

// withBudget returns the default BudgetConfig changed by f.
func withBudget(f func(*policy.BudgetConfig)) policy.BudgetConfig {
	c := policy.BudgetConfig{}.WithDefaults()
	f(&c)
	return c
}

func TestBudgetConfigWithDefaults(t *testing.T) {
	want := policy.BudgetConfig{Ratio: policy.DefaultBudgetRatio, MinPerSecond: policy.DefaultBudgetMinPerSecond, Window: policy.DefaultBudgetWindow}
	for _, c := range []policy.BudgetConfig{{}, {Ratio: -1, MinPerSecond: -1, Window: -1}, {Ratio: math.NaN(), MinPerSecond: math.NaN()}, {Ratio: math.Inf(1)}} {
		if got := c.WithDefaults(); got != want {
			t.Errorf("%+v.WithDefaults() = %+v, want %+v", c, got, want)
		}
	}
	set := policy.BudgetConfig{Ratio: 0.5, MinPerSecond: 2, Window: time.Minute}
	if got := set.WithDefaults(); got != set {
		t.Errorf("WithDefaults changed set fields: %+v", got)
	}
	if got := (policy.BudgetConfig{MinPerSecond: 5e6}).WithDefaults().MinPerSecond; got != 1e6 {
		t.Errorf("MinPerSecond 5e6 → %v, want capped at 1e6", got)
	}
}

// checkValidate checks a Validate result against a wanted message
// substring ("" = no error). Errors must be a *FieldError wrapping
// ErrInvalidConfig, whose Field and Value start the message.
func checkValidate(t *testing.T, err error, wantErr string) {
	t.Helper()
	if wantErr == "" {
		if err != nil {
			t.Errorf("Validate() = %v, want nil", err)
		}
		return
	}
	var fe *policy.FieldError
	if !errors.Is(err, policy.ErrInvalidConfig) || !errors.As(err, &fe) {
		t.Fatalf("Validate() = %v, want a *FieldError wrapping ErrInvalidConfig", err)
	}
	if want := fmt.Sprintf("invalid configuration: %s: %v: %s", fe.Field, fe.Value, fe.Reason); err.Error() != want {
		t.Errorf("Validate() = %q, want %q", err, want)
	}
	if !strings.Contains(err.Error(), wantErr) {
		t.Errorf("Validate() = %q, want it to contain %q", err, wantErr)
	}
}

func BenchmarkBudget(b *testing.B) {
	bud := policy.NewBudget(policy.BudgetConfig{}, nil)
	b.Run("Success", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			bud.Success()
		}
	})
	b.Run("TryRetry", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			bud.TryRetry()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				if i%10 == 0 {
					bud.TryRetry()
				} else {
					bud.Success()
				}
			}
		})
	})
}

// The delivery engine asks the shared budget before it schedules a retry.
// When the budget says no, the retry is deferred, never dropped: an empty
// budget is the system working. The clock is fixed here so that the output
// is too.
func ExampleBudget() {
	now := time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	budget := policy.NewBudget(policy.BudgetConfig{Ratio: 0.1, MinPerSecond: 1, Window: 10 * time.Second}, clock)

	for range 200 { // 2xx and 4xx answers
		budget.Success()
	}
	retried, deferred := 0, 0
	for range 50 { // 5xx answers
		if budget.TryRetry() {
			retried++ // schedule with RetryPolicy.Next
		} else {
			deferred++ // reschedule past the window; keep the delivery
		}
	}
	s := budget.Stats()
	fmt.Printf("retried %d, deferred %d\n", retried, deferred)
	fmt.Printf("allowed %d = 10%% of %d successes + 1/s × 10s\n", s.Allowed, s.Successes)
	fmt.Printf("available %.2f\n", budget.Available())

	now = now.Add(10 * time.Second) // the window slides past all of it
	fmt.Printf("10s later: available %.2f, allowed %d\n", budget.Available(), budget.Stats().Allowed)
	// Output:
	// retried 30, deferred 20
	// allowed 30 = 10% of 200 successes + 1/s × 10s
	// available 0.00
	// 10s later: available 1.00, allowed 10
}

// TestBudgetPacesRetriesAcrossTheWindow: a burst gets one 250 ms slot's
// share of the allowance, not the whole window's at once (a full outage
// must not release a window's worth of retries in its first moment), and
// the window total still holds.
func TestBudgetPacesRetriesAcrossTheWindow(t *testing.T) {
	clk := newFakeClock()
	b := policy.NewBudget(policy.BudgetConfig{Ratio: 0.1, MinPerSecond: 10, Window: 10 * time.Second}, clk.Now)
	successes(b, 10000) // allowance: 1000 + 100 over the window
	paced := func() int {
		n := 0
		for n < 5000 && b.TryRetryPaced() {
			n++
		}
		return n
	}
	if b.Pace() != 250*time.Millisecond {
		t.Fatalf("pace %v", b.Pace())
	}
	if got := paced(); got != 28 { // ceil(1100 × 0.25 s / 10 s)
		t.Fatalf("a burst got %d retries, want one slot's share, 28", got)
	}
	clk.Advance(b.Pace())
	if got := paced(); got != 28 {
		t.Fatalf("the next slot gave %d, want 28", got)
	}
	total := 56
	for range 38 { // the rest of the window's 40 slots: the successes stay in it
		clk.Advance(b.Pace())
		total += paced()
	}
	if total != 1100 {
		t.Fatalf("a whole window of paced retries = %d, want the allowance 1100", total)
	}
	if b.TryRetry() {
		t.Fatal("the window's allowance was exceeded")
	}
}
