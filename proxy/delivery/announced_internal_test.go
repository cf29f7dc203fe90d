package delivery

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// windowEndpoint enforces a real limit: n requests per fixed window of
// one second, 429 past it. With announce, every answer says how many are
// left and when the window resets, in the form header names
// ("x-ratelimit": X-RateLimit-Remaining and -Reset; "ratelimit": the
// IETF structured RateLimit field); "" says nothing.
func windowEndpoint(t *testing.T, n int, announce string) (url string, acked, limited *atomic.Int64) {
	acked, limited = new(atomic.Int64), new(atomic.Int64)
	var mu sync.Mutex
	var windowStart time.Time
	used := 0
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		now := time.Now()
		if start := now.Truncate(time.Second); start.After(windowStart) {
			windowStart, used = start, 0
		}
		used++
		left := max(n-used, 0)
		// Whole seconds to the reset, rounded up: never early.
		reset := int(math.Ceil(windowStart.Add(time.Second).Sub(now).Seconds()))
		over := used > n
		mu.Unlock()
		switch announce {
		case "x-ratelimit":
			w.Header().Set("X-RateLimit-Remaining", fmt.Sprint(left))
			w.Header().Set("X-RateLimit-Reset", fmt.Sprint(reset))
		case "ratelimit":
			w.Header().Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=%d`, left, reset))
		}
		if over {
			limited.Add(1)
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		acked.Add(1)
	}))
	t.Cleanup(rcv.Close)
	return rcv.URL, acked, limited
}

// TestAnnouncedLimitHoldsTheLane: against an endpoint that enforces 5
// requests a second, a lane that reads the endpoint's announced limit
// waits for the reset instead of spending attempts on 429s; the same
// endpoint saying nothing gets many. Nothing is lost either way.
func TestAnnouncedLimitHoldsTheLane(t *testing.T) {
	const events, perSecond = 15, 5
	run := func(t *testing.T, announce string) (limited int64, held uint64) {
		url, acked, lim := windowEndpoint(t, perSecond, announce)
		sub := testSub("a", url)
		sub.MaxConcurrency = 1
		sub.Retry = policy.RetryPolicy{MaxAttempts: 1000, MaxAge: time.Hour, Backoff: policy.Backoff{Base: 5 * time.Millisecond, Cap: 20 * time.Millisecond}}
		s := startWith(t, nil, sub)
		for i := range events {
			ingestOne(t, s, fmt.Sprintf("e-%d", i))
		}
		awaitLong(t, "every event acknowledged", func() bool { return acked.Load() >= events })
		l := laneOf(s, "a")
		if l.Delivered != events || l.DeadLettered != 0 {
			t.Fatalf("delivered %d, dead-lettered %d; want %d and 0", l.Delivered, l.DeadLettered, events)
		}
		return lim.Load(), l.EndpointHeld
	}
	for _, announce := range []string{"x-ratelimit", "ratelimit"} {
		t.Run(announce, func(t *testing.T) {
			limited, held := run(t, announce)
			if limited != 0 {
				t.Errorf("the endpoint answered 429 %d times to a lane told its limit", limited)
			}
			if held == 0 {
				t.Error("the lane never held a dispatch back for the announced limit")
			}
		})
	}
	t.Run("silent endpoint", func(t *testing.T) {
		// The control: the same limit, unannounced, is met with 429s (14
		// to dozens, by where the one-second windows fall).
		limited, _ := run(t, "")
		t.Logf("the silent endpoint answered 429 %d times", limited)
		if limited == 0 {
			t.Error("the silent endpoint never answered 429: the test does not tell the two apart")
		}
	})
}

// awaitLong is testwait.Await for a condition a real clock paces (the
// endpoint's one-second windows): up to a minute.
func awaitLong(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // the endpoint's counts have no notification
	}
}

// TestNoteAnnounced: what holds a lane and for how long, on an injected
// clock. Only "none left" with a reset holds; a reset past an hour holds
// an hour; a shorter reset never shortens a hold already longer; the hold
// ends at its time, and at once when the clock stepped back past it.
func TestNoteAnnounced(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	s := openTestServer(t, Options{Subscriptions: []*Subscription{testSub("a", "http://127.0.0.1:9/")}, Now: func() time.Time { return now }}, nil)
	l := s.d.lane("a")
	note := func(remaining int64, reset time.Duration) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.noteAnnounced(result{announced: policy.Announced{Remaining: remaining, Reset: reset, Source: "X-RateLimit-Remaining"}, announcedOK: true}, now)
	}
	until := func() time.Time {
		l.mu.Lock()
		defer l.mu.Unlock()
		if h := l.hold(); h != nil {
			return h.until
		}
		return time.Time{}
	}
	note(3, time.Minute)
	note(0, 0)
	if !until().IsZero() {
		t.Fatalf("held until %v by some left, or none left with a reset now", until())
	}
	note(0, 24*time.Hour)
	if got, want := until(), now.Add(maxAnnouncedHold); !got.Equal(want) {
		t.Fatalf("a day's reset holds until %v, want %v (an hour at a time)", got, want)
	}
	note(0, time.Second)
	if got, want := until(), now.Add(maxAnnouncedHold); !got.Equal(want) {
		t.Fatalf("a shorter reset moved the hold to %v, want it kept at %v", got, want)
	}
	l.mu.Lock()
	held, after := l.holding(now.Add(maxAnnouncedHold-time.Nanosecond)), l.holding(now.Add(maxAnnouncedHold))
	l.mu.Unlock()
	if !held || after {
		t.Fatalf("holding just before the end %v, at the end %v; want true, false", held, after)
	}
	if st := laneOf(s, "a"); st.HeldUntil == nil || !st.HeldUntil.Equal(now.Add(maxAnnouncedHold)) || st.HeldBy != "X-RateLimit-Remaining" {
		t.Fatalf("status held_until %v by %q", st.HeldUntil, st.HeldBy)
	}
	// The clock stepped back two hours: the hold lies further ahead than
	// any hold can, and ends rather than lasting two hours more.
	l.mu.Lock()
	stepped := l.holding(now.Add(-2 * time.Hour))
	l.mu.Unlock()
	if stepped || !until().IsZero() {
		t.Fatalf("after the clock stepped back: holding %v, until %v; want false and no hold", stepped, until())
	}
}
