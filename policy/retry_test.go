package policy_test

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// fixed returns a Rand that always yields r.
func fixed(r float64) func() float64 { return func() float64 { return r } }

// justBelowOne is the largest float64 below 1, the top of Rand's range.
var justBelowOne = math.Nextafter(1, 0)

func TestBackoffDelay(t *testing.T) {
	std := policy.Backoff{Base: time.Second, Cap: time.Hour}
	with := func(b policy.Backoff, r float64) policy.Backoff { b.Rand = fixed(r); return b }
	tests := []struct {
		name    string
		backoff policy.Backoff
		attempt int
		want    time.Duration
	}{
		// Rand = 0: the bottom of the window.
		{"r=0 attempt 1", with(std, 0), 1, 0},
		{"r=0 attempt 10", with(std, 0), 10, 0},
		{"r=0 attempt 100", with(std, 0), 100, 0},

		// Rand = 0.5: half the window, which doubles per attempt.
		{"r=.5 attempt 1", with(std, 0.5), 1, 500 * time.Millisecond},
		{"r=.5 attempt 2", with(std, 0.5), 2, time.Second},
		{"r=.5 attempt 3", with(std, 0.5), 3, 2 * time.Second},
		{"r=.5 attempt 4", with(std, 0.5), 4, 4 * time.Second},
		{"r=.5 attempt 12", with(std, 0.5), 12, 1024 * time.Second},
		{"r=.5 attempt 13 capped", with(std, 0.5), 13, 30 * time.Minute},
		{"r=.5 attempt 63", with(std, 0.5), 63, 30 * time.Minute},
		{"r=.5 attempt 64", with(std, 0.5), 64, 30 * time.Minute},
		{"r=.5 attempt 100 no overflow", with(std, 0.5), 100, 30 * time.Minute},
		{"r=.5 attempt MaxInt", with(std, 0.5), math.MaxInt, 30 * time.Minute},

		// Rand just below 1: just below the window's top, never at it.
		{"r≈1 attempt 1", with(std, justBelowOne), 1, time.Second - 1},
		{"r≈1 attempt 3", with(std, justBelowOne), 3, 4*time.Second - 1},
		{"r≈1 attempt 100", with(std, justBelowOne), 100, time.Hour - 1},

		// attempt below 1 counts as 1.
		{"attempt 0", with(std, 0.5), 0, 500 * time.Millisecond},
		{"attempt negative", with(std, 0.5), -7, 500 * time.Millisecond},

		// Odd configurations.
		{"cap below base", with(policy.Backoff{Base: 10 * time.Second, Cap: time.Second}, 0.5), 1, 500 * time.Millisecond},
		{"cap equals base", with(policy.Backoff{Base: time.Second, Cap: time.Second}, 0.5), 5, 500 * time.Millisecond},
		{"zero value means defaults", with(policy.Backoff{}, 0.5), 1, 500 * time.Millisecond},
		{"zero cap means 1h", with(policy.Backoff{Base: time.Second}, 0.5), 100, 30 * time.Minute},
		{"negative base means 1s", with(policy.Backoff{Base: -time.Second, Cap: time.Hour}, 0.5), 2, time.Second},
		{"1ns base", with(policy.Backoff{Base: 1, Cap: time.Millisecond}, 0.5), 11, 512},
		{
			"uncapped in practice: largest duration",
			with(policy.Backoff{Base: time.Hour, Cap: math.MaxInt64}, justBelowOne), 100,
			math.MaxInt64 - 1023, // (1-2⁻⁵³)·2⁶³, exact in float64
		},
		{"huge base doubled", with(policy.Backoff{Base: math.MaxInt64 / 2, Cap: math.MaxInt64}, 0.5), 2, 1 << 62},
		{"huge base would overflow", with(policy.Backoff{Base: math.MaxInt64 / 2, Cap: math.MaxInt64}, 0.5), 3, 1 << 62},

		// A misbehaving Rand stays inside the window.
		{"r=1", with(std, 1), 1, time.Second - 1},
		{"r=2", with(std, 2), 3, 4*time.Second - 1},
		{"r=-0.5", with(std, -0.5), 3, 0},
		{"r=NaN", with(std, math.NaN()), 3, 0},
		{"r=+Inf", with(std, math.Inf(1)), 100, time.Hour - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.backoff.Delay(tt.attempt); got != tt.want {
				t.Errorf("Delay(%d) = %v (%d), want %v (%d)", tt.attempt, got, int64(got), tt.want, int64(tt.want))
			}
		})
	}
}

// With the default math/rand/v2 source every delay stays inside its window.
func TestBackoffDelayNilRandBounds(t *testing.T) {
	b := policy.Backoff{Base: time.Second, Cap: time.Hour}
	for attempt := 1; attempt <= 70; attempt++ {
		ceil := time.Hour
		if attempt <= 12 {
			ceil = time.Second << (attempt - 1)
		}
		for range 200 {
			if d := b.Delay(attempt); d < 0 || d >= ceil {
				t.Fatalf("Delay(%d) = %v, want in [0, %v)", attempt, d, ceil)
			}
		}
	}
}

func TestDefaultRetryPolicy(t *testing.T) {
	p := policy.DefaultRetryPolicy()
	if p.MaxAttempts != 8 || p.MaxAge != 24*time.Hour || p.Backoff.Base != time.Second || p.Backoff.Cap != time.Hour || p.Backoff.Rand != nil {
		t.Errorf("DefaultRetryPolicy() = %+v", p)
	}
}

func TestRetryPolicyNext(t *testing.T) {
	first := time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)
	half := policy.RetryPolicy{
		MaxAttempts: 8,
		MaxAge:      24 * time.Hour,
		Backoff:     policy.Backoff{Base: time.Second, Cap: time.Hour, Rand: fixed(0.5)},
	}
	withMax := func(p policy.RetryPolicy, n int) policy.RetryPolicy { p.MaxAttempts = n; return p }
	withAge := func(p policy.RetryPolicy, d time.Duration) policy.RetryPolicy { p.MaxAge = d; return p }

	tests := []struct {
		name       string
		policy     policy.RetryPolicy
		attempt    int
		now        time.Time
		retryAfter time.Duration
		wantDue    time.Time // zero when !wantOK
		wantReason string
		wantOK     bool
	}{
		// Backoff schedule.
		{name: "first failure", policy: half, attempt: 1, now: first.Add(2 * time.Second),
			wantDue: first.Add(2*time.Second + 500*time.Millisecond), wantOK: true},
		{name: "third failure", policy: half, attempt: 3, now: first.Add(10 * time.Second),
			wantDue: first.Add(12 * time.Second), wantOK: true},
		{name: "last retry allowed", policy: half, attempt: 7, now: first.Add(time.Minute),
			wantDue: first.Add(time.Minute + 32*time.Second), wantOK: true},

		// Max attempts.
		{name: "attempt equals max", policy: half, attempt: 8, now: first.Add(time.Minute),
			wantReason: policy.ReasonMaxAttempts},
		{name: "attempt beyond max", policy: half, attempt: 9, now: first.Add(time.Minute),
			wantReason: policy.ReasonMaxAttempts},
		{name: "max 1 means no retries", policy: withMax(half, 1), attempt: 1, now: first,
			wantReason: policy.ReasonMaxAttempts},
		{name: "max attempts checked before max age", policy: half, attempt: 8, now: first.Add(48 * time.Hour),
			wantReason: policy.ReasonMaxAttempts},

		// Max age.
		{name: "backoff crosses max age", policy: half, attempt: 1, now: first.Add(24*time.Hour - 100*time.Millisecond),
			wantReason: policy.ReasonMaxAge},
		{name: "due exactly at max age", policy: half, attempt: 1, now: first.Add(24*time.Hour - 500*time.Millisecond),
			wantDue: first.Add(24 * time.Hour), wantOK: true},
		{name: "already past max age", policy: half, attempt: 2, now: first.Add(25 * time.Hour),
			wantReason: policy.ReasonMaxAge},
		{name: "short max age", policy: withAge(half, 10*time.Second), attempt: 4, now: first.Add(7 * time.Second),
			wantReason: policy.ReasonMaxAge},

		// Retry-After replaces the jittered backoff, capped at Backoff.Cap.
		{name: "retry-after honoured", policy: half, attempt: 1, now: first, retryAfter: 30 * time.Second,
			wantDue: first.Add(30 * time.Second), wantOK: true},
		{name: "retry-after shorter than backoff", policy: half, attempt: 6, now: first, retryAfter: time.Second,
			wantDue: first.Add(time.Second), wantOK: true},
		{name: "retry-after capped at cap", policy: half, attempt: 1, now: first, retryAfter: 5 * time.Hour,
			wantDue: first.Add(time.Hour), wantOK: true},
		{name: "retry-after beyond max age, capped within it", policy: half, attempt: 1, now: first.Add(time.Minute), retryAfter: 30 * time.Hour,
			wantDue: first.Add(time.Hour + time.Minute), wantOK: true},
		{name: "retry-after beyond max age", policy: half, attempt: 2, now: first.Add(23*time.Hour + 30*time.Minute), retryAfter: 45 * time.Minute,
			wantReason: policy.ReasonMaxAge},
		{name: "capped retry-after beyond max age", policy: half, attempt: 2, now: first.Add(23*time.Hour + 30*time.Minute), retryAfter: 72 * time.Hour,
			wantReason: policy.ReasonMaxAge},
		{name: "saturated retry-after", policy: half, attempt: 1, now: first, retryAfter: math.MaxInt64,
			wantDue: first.Add(time.Hour), wantOK: true},
		{name: "negative retry-after means none", policy: half, attempt: 1, now: first, retryAfter: -time.Minute,
			wantDue: first.Add(500 * time.Millisecond), wantOK: true},

		// Zero fields mean the defaults.
		{name: "zero policy: 7 failures retried", policy: policy.RetryPolicy{Backoff: policy.Backoff{Rand: fixed(0.5)}}, attempt: 7, now: first,
			wantDue: first.Add(32 * time.Second), wantOK: true},
		{name: "zero policy: 8 failures dead", policy: policy.RetryPolicy{Backoff: policy.Backoff{Rand: fixed(0.5)}}, attempt: 8, now: first,
			wantReason: policy.ReasonMaxAttempts},
		{name: "zero policy: 24h max age", policy: policy.RetryPolicy{Backoff: policy.Backoff{Rand: fixed(0)}}, attempt: 1, now: first.Add(24*time.Hour + 1),
			wantReason: policy.ReasonMaxAge},
		{name: "zero policy: cap 1h on retry-after", policy: policy.RetryPolicy{}, attempt: 1, now: first, retryAfter: 2 * time.Hour,
			wantDue: first.Add(time.Hour), wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			due, reason, ok := tt.policy.Next(tt.attempt, first, tt.now, tt.retryAfter)
			if ok != tt.wantOK || reason != tt.wantReason || !due.Equal(tt.wantDue) {
				t.Errorf("Next(%d, first, first+%v, %v) = %v, %q, %v; want %v, %q, %v",
					tt.attempt, tt.now.Sub(first), tt.retryAfter,
					due, reason, ok, tt.wantDue, tt.wantReason, tt.wantOK)
			}
		})
	}
}

func TestBackoffDelayAllocs(t *testing.T) {
	b := policy.DefaultRetryPolicy().Backoff
	allocs := testing.AllocsPerRun(100, func() {
		b.Delay(3)
		b.Delay(100)
	})
	if allocs != 0 {
		t.Errorf("Delay allocates %v times per run, want 0", allocs)
	}
}

func BenchmarkBackoffDelay(b *testing.B) {
	b.Run("math/rand/v2", func(b *testing.B) {
		bo := policy.Backoff{Base: time.Second, Cap: time.Hour}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			bo.Delay(i%16 + 1)
		}
	})
	b.Run("injected", func(b *testing.B) {
		bo := policy.Backoff{Base: time.Second, Cap: time.Hour, Rand: fixed(0.5)}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			bo.Delay(i%16 + 1)
		}
	})
}

func BenchmarkRetryPolicyNext(b *testing.B) {
	p := policy.DefaultRetryPolicy()
	first := time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)
	now := first.Add(time.Minute)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p.Next(i%7+1, first, now, 0)
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	with := func(f func(*policy.RetryPolicy)) policy.RetryPolicy {
		p := policy.DefaultRetryPolicy()
		f(&p)
		return p
	}
	tests := []struct {
		name    string
		p       policy.RetryPolicy
		wantErr string
	}{
		{"defaults", policy.DefaultRetryPolicy(), ""},
		{"one attempt", with(func(p *policy.RetryPolicy) { p.MaxAttempts = 1 }), ""},
		{"a hundred attempts", with(func(p *policy.RetryPolicy) { p.MaxAttempts = 100 }), ""},
		{"base equals cap", with(func(p *policy.RetryPolicy) { p.Backoff.Base = time.Hour }), ""},
		{"zero value", policy.RetryPolicy{}, "retry.max_attempts: 0: must be between 1 and 100"},
		{"too many attempts", with(func(p *policy.RetryPolicy) { p.MaxAttempts = 101 }), "retry.max_attempts: 101: must be between 1 and 100"},
		{"max age zero", with(func(p *policy.RetryPolicy) { p.MaxAge = 0 }), "retry.max_age: 0s: must be positive"},
		{"base negative", with(func(p *policy.RetryPolicy) { p.Backoff.Base = -time.Second }), "retry.base: -1s: must be positive"},
		{"cap zero", with(func(p *policy.RetryPolicy) { p.Backoff.Cap = 0 }), "retry.cap: 0s: must be positive"},
		{"longest", with(func(p *policy.RetryPolicy) {
			p.MaxAge, p.Backoff.Base, p.Backoff.Cap = 720*time.Hour, 24*time.Hour, 24*time.Hour
		}), ""},
		{"shortest", with(func(p *policy.RetryPolicy) {
			p.MaxAge, p.Backoff.Base, p.Backoff.Cap = time.Second, time.Millisecond, time.Millisecond
		}), ""},
		{"max age too long", with(func(p *policy.RetryPolicy) { p.MaxAge = 721 * time.Hour }), "retry.max_age: 721h0m0s: must be at most 720h0m0s"},
		{"max age under a second", with(func(p *policy.RetryPolicy) { p.MaxAge = time.Millisecond }), "retry.max_age: 1ms: must be at least 1s"},
		{"base in nanoseconds", with(func(p *policy.RetryPolicy) { p.Backoff.Base = 999 * time.Microsecond }), "retry.base: 999µs: must be at least 1ms"},
		{"cap too long", with(func(p *policy.RetryPolicy) { p.Backoff.Cap = 25 * time.Hour }), "retry.cap: 25h0m0s: must be at most 24h0m0s"},
		{"base above cap", with(func(p *policy.RetryPolicy) { p.Backoff.Base = 2 * time.Hour }), "retry.base: 2h0m0s: must not exceed retry.cap (1h0m0s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkValidate(t, tt.p.Validate(), tt.wantErr)
		})
	}
}

func TestRetryPolicyWithDefaults(t *testing.T) {
	rnd := fixed(0.5)
	got := policy.RetryPolicy{MaxAttempts: -1, Backoff: policy.Backoff{Cap: -1, Rand: rnd}}.WithDefaults()
	if got.MaxAttempts != policy.DefaultMaxAttempts || got.MaxAge != policy.DefaultMaxAge ||
		got.Backoff.Base != policy.DefaultBase || got.Backoff.Cap != policy.DefaultCap || got.Backoff.Rand == nil {
		t.Errorf("WithDefaults() = %+v", got)
	}
	set := policy.RetryPolicy{MaxAttempts: 2, MaxAge: time.Minute, Backoff: policy.Backoff{Base: time.Millisecond, Cap: time.Second}}
	if got := set.WithDefaults(); got.MaxAttempts != 2 || got.MaxAge != time.Minute || got.Backoff.Base != time.Millisecond || got.Backoff.Cap != time.Second {
		t.Errorf("WithDefaults changed set fields: %+v", got)
	}
}
