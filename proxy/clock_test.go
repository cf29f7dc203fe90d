package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// stepClock is a wall clock that runs with real time and can be stepped
// back or forward, as NTP, a VM restore or an operator's `date -s` steps
// a host's clock. Its readings carry no monotonic part (Round(0)), like
// the due times of the durable retry records, so the sidecar sees the
// step everywhere it reads the clock. Safe for concurrent use.
type stepClock struct{ off atomic.Int64 }

func (c *stepClock) Now() time.Time             { return time.Now().Add(time.Duration(c.off.Load())).Round(0) }
func (c *stepClock) Step(d time.Duration)       { c.off.Add(int64(d)) }
func newStepClock(off time.Duration) *stepClock { c := &stepClock{}; c.Step(off); return c }

// TestClockStepBackDoesNotStallRetries: a retry is scheduled (a durable
// record with a wall-clock due time), then the wall clock steps back an
// hour. The retry must go out about when it was due, not an hour later.
func TestClockStepBackDoesNotStallRetries(t *testing.T) {
	clk := newStepClock(0)
	var attempts atomic.Int64
	var lastAttempt atomic.Value // X-Attempt of the latest request
	rcv, _, _ := scripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		lastAttempt.Store(r.Header.Get("X-Attempt"))
		if n == 0 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	sb := sub("s", rcv.URL)
	sb.Retry = policy.RetryPolicy{MaxAttempts: 5, MaxAge: 24 * time.Hour, Backoff: policy.Backoff{Base: time.Second, Cap: 2 * time.Second}}
	reg := prometheus.NewRegistry()
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb}, Now: clk.Now, Registry: reg})
	publish(t, s, "t", "e", 1)
	eventually(t, "the retry scheduled", func() bool { return lane(s, "s").Scheduled == 1 })
	clk.Step(-time.Hour)
	// Due 2 s after the failure; the 20 s of eventually is the generous
	// "does not wait out the step" bound.
	eventually(t, "the retry delivered despite the step back", func() bool { return lane(s, "s").Delivered == 1 })
	if n := attempts.Load(); n != 2 {
		t.Fatalf("%d attempts, want 2", n)
	}
	if l := lane(s, "s"); l.Scheduled != 0 || l.DeadLettered != 0 {
		t.Fatalf("lane %+v after the retry", l)
	}
	if a := lastAttempt.Load(); a != "2" {
		t.Fatalf("second request X-Attempt %q, want 2", a)
	}
	// Accepted an hour "later" than it was acknowledged: the accepted→ACK
	// latency must not go negative.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "sluice_delivery_latency_seconds" {
			for _, m := range mf.GetMetric() {
				found = true
				if h := m.GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() < 0 {
					t.Fatalf("latency histogram after the step back: %d samples, sum %v; want 1, not negative", h.GetSampleCount(), h.GetSampleSum())
				}
			}
		}
	}
	if !found {
		t.Fatal("no sluice_delivery_latency_seconds series")
	}
}

// TestClockStepForwardReleasesRetriesPacedByTheBudget: retries parked for
// an hour by Retry-After become due together when the wall clock steps
// forward past them; the shared retry budget paces them instead of letting
// them out in one burst, and none is dropped.
func TestClockStepForwardReleasesRetriesPacedByTheBudget(t *testing.T) {
	const n = 8
	clk := newStepClock(0)
	var firstFailed sync.Map // webhook-id → true once its first attempt was refused
	rcv, _, _ := scripted(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Webhook-Id")
		if _, seen := firstFailed.LoadOrStore(id, true); !seen && strings.HasPrefix(id, "e-") {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	sb := sub("s", rcv.URL)
	sb.Retry = policy.RetryPolicy{MaxAttempts: 5, MaxAge: 24 * time.Hour, Backoff: policy.Backoff{Base: time.Second, Cap: time.Hour}}
	sb.Breaker = policy.BreakerConfig{MinRequests: 1 << 30, ConsecutiveTimeouts: 1 << 30} // isolate the budget
	budget := policy.BudgetConfig{Ratio: 0.1, MinPerSecond: 4, Window: time.Second}
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb}, Now: clk.Now, RetryBudget: budget})
	publish(t, s, "t", "e", n)
	eventually(t, "every first attempt refused for an hour", func() bool { return lane(s, "s").Scheduled == n })

	stop := make(chan struct{})
	overspent := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if st := s.RetryBudget(); st.Retries > st.Allowed {
				select {
				case overspent <- fmt.Sprintf("%+v", st):
				default:
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	clk.Step(time.Hour + time.Minute)
	// Traffic goes on: the next commit pumps the lane, which finds every
	// parked retry due at once.
	publish(t, s, "t", "nudge", 1)
	eventually(t, "every retry delivered", func() bool { return lane(s, "s").Delivered == n+1 })
	close(stop)
	<-done
	select {
	case st := <-overspent:
		t.Fatalf("the released retries overspent the budget: %s", st)
	default:
	}
	if l := lane(s, "s"); l.Deferred == 0 || l.DeadLettered != 0 || l.Scheduled != 0 {
		t.Fatalf("lane %+v: want some retries deferred by the budget, none dead-lettered or left", l)
	}
}

// TestClockSignatureCarriesTheWallClock: webhook-timestamp is the sidecar's
// wall clock (Options.Now) in unix seconds, whatever the skew; a receiver
// that checks it against its own clock with the default tolerance (the
// testbed, like the Standard Webhooks libraries) accepts a skew inside the
// tolerance and refuses one beyond it — which the sidecar treats as a
// rejection, not something to retry.
func TestClockSignatureCarriesTheWallClock(t *testing.T) {
	for _, c := range []struct {
		name   string
		skew   time.Duration
		accept bool
	}{
		{"in step", 0, true},
		{"4 minutes ahead", 4 * time.Minute, true},
		{"4 minutes behind", -4 * time.Minute, true},
		{"an hour ahead", time.Hour, false},
		{"an hour behind", -time.Hour, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := newStepClock(c.skew)
			type seen struct{ ts, id string }
			got := make(chan seen, 1)
			raw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				select {
				case got <- seen{r.Header.Get(signing.HeaderTimestamp), r.Header.Get(signing.HeaderID)}:
				default:
				}
			}))
			t.Cleanup(raw.Close)
			tb := startTestbed(t, testbed.ModeOK) // verifies with time.Now and signing.DefaultTolerance
			verified := sub("verified", tb.URL()+"/v")
			verified.Retry = fastRetry(3)
			s := startServerWith(t, proxy.Options{Now: clk.Now, Subscriptions: []*delivery.Subscription{sub("raw", raw.URL), verified}})

			before := clk.Now().Unix()
			publish(t, s, "t", "e", 1)
			var g seen
			select {
			case g = <-got:
			case <-time.After(20 * time.Second):
				t.Fatal("no delivery")
			}
			after := clk.Now().Unix()
			ts, err := strconv.ParseInt(g.ts, 10, 64)
			if err != nil || ts < before || ts > after {
				t.Fatalf("webhook-timestamp %q, want the injected clock's unix seconds in [%d, %d] (real time %d)", g.ts, before, after, time.Now().Unix())
			}

			if c.accept {
				waitFor(t, tb, "the verified delivery", uniqueAt("/v", 1))
				if st := tb.Stats()["/v"]; st.BadSignatures != 0 {
					t.Fatalf("skew %v inside the tolerance refused: %+v", c.skew, st)
				}
				return
			}
			eventually(t, "the refused delivery dead-lettered", func() bool { return lane(s, "verified").DeadLettered == 1 })
			st := tb.Stats()["/v"]
			if st.BadSignatures != 1 || st.Accepted != 0 || st.Statuses[http.StatusUnauthorized] != 1 {
				t.Fatalf("skew %v beyond the tolerance: receiver stats %+v, want one refused request", c.skew, st)
			}
			dls, err := s.DeadLetters("verified", 10)
			if err != nil || len(dls) != 1 || dls[0].Reason != policy.ReasonRejected || dls[0].LastStatus != http.StatusUnauthorized {
				t.Fatalf("dead letters %+v, %v: want one rejected with 401", dls, err)
			}
		})
	}
}
