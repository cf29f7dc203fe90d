package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/testbed"
)

// fastBreaker trips and recovers within a test's patience.
var fastBreaker = policy.BreakerConfig{MinRequests: 4, FailureRatio: 0.5, ConsecutiveTimeouts: 2, CoolDown: 50 * time.Millisecond, MaxCoolDown: 200 * time.Millisecond, Window: time.Second}

func startServerWith(t *testing.T, opts proxy.Options) *proxy.Server {
	t.Helper()
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	opts.Listen, opts.AdminListen, opts.Logger = "127.0.0.1:0", "-", quietLogger()
	opts.AllowPrivateTargets = true
	if opts.CursorInterval == 0 {
		opts.CursorInterval = 10 * time.Millisecond
	}
	s := proxy.New(opts)
	if err := s.Open(); err != nil {
		t.Fatalf("open server: %v", err)
	}
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })
	return s
}

// sampleMax records the highest value f returns until stop is closed.
func sampleMax(f func() int, stop <-chan struct{}) <-chan int {
	out := make(chan int, 1)
	go func() {
		m := 0
		for {
			m = max(m, f())
			select {
			case <-stop:
				out <- m
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return out
}

// TestBlackHoleAmongNineHealthy: one tenant's black hole never holds more
// than its cap, every healthy tenant gets every event, and the black hole's
// backlog is delivered once it answers again.
func TestBlackHoleAmongNineHealthy(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	tb.SetMode("/hole", testbed.ModeBlackhole)
	hole := sub("hole", tb.URL()+"/hole")
	hole.MaxConcurrency, hole.Timeout, hole.Retry = 4, 200*time.Millisecond, fastRetry(1000)
	hole.Breaker = fastBreaker
	subs := []*delivery.Subscription{hole}
	for i := range 9 {
		ok := sub(fmt.Sprintf("ok%d", i), fmt.Sprintf("%s/ok%d", tb.URL(), i))
		// A healthy lane's timeout is not under test. On a starved machine
		// (the race detector, a busy CI host) a 2 s exchange with the
		// in-process receiver can time out, and five in a row would open the
		// lane's breaker for reasons that have nothing to do with the hole.
		ok.Timeout = 15 * time.Second
		subs = append(subs, ok)
	}
	s := startServerWith(t, proxy.Options{Subscriptions: subs, RetryBudget: policy.BudgetConfig{MinPerSecond: 50}})
	stop := make(chan struct{})
	peak := sampleMax(func() int { return lane(s, "hole").InFlight }, stop)

	publish(t, s, "t", "e", 100)
	waitFor(t, tb, "every healthy tenant got every event", func(m map[string]testbed.PathStats) bool {
		for i := range 9 {
			if m[fmt.Sprintf("/ok%d", i)].Unique < 100 {
				return false
			}
		}
		return true
	})
	eventually(t, "the black hole's breaker opens", func() bool { return lane(s, "hole").Breaker == "open" })
	if l := lane(s, "hole"); l.Backlog < 80 {
		t.Fatalf("black hole lane %+v: its backlog should wait on disk", l)
	}
	tb.SetMode("/hole", testbed.ModeOK)
	waitFor(t, tb, "black hole's backlog delivered after recovery", uniqueAt("/hole", 100))
	close(stop)
	if p := <-peak; p > 4 {
		t.Fatalf("black hole lane held %d slots, cap 4", p)
	}
	for i := range 9 {
		if l := lane(s, fmt.Sprintf("ok%d", i)); l.Breaker != "closed" || l.ShortCircuit != 0 {
			t.Fatalf("healthy lane affected by the black hole: %+v", l)
		}
	}
}

func TestBreakerTripsProbesAndCloses(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	var requests atomic.Int64
	rcv, _, _ := scripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if failing.Load() {
			w.WriteHeader(503)
		}
	})
	bad := sub("bad", rcv.URL)
	bad.Breaker = fastBreaker
	bad.Breaker.CoolDown, bad.Breaker.MaxCoolDown = 300*time.Millisecond, time.Second
	bad.Retry = fastRetry(1000)
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{bad}, RetryBudget: policy.BudgetConfig{MinPerSecond: 1000}})
	publish(t, s, "t", "e", 20)
	eventually(t, "breaker open", func() bool { return lane(s, "bad").Breaker == "open" })
	// While open, nothing is sent: the count stays put until the probe.
	atOpen := requests.Load()
	eventually(t, "short circuits counted", func() bool { return lane(s, "bad").ShortCircuit > 0 })
	if l := lane(s, "bad"); l.InFlight > 1 {
		t.Fatalf("open breaker holds %d slots", l.InFlight)
	}
	failing.Store(false)
	eventually(t, "breaker closed after a probe", func() bool { return lane(s, "bad").Breaker == "closed" })
	eventually(t, "all delivered", func() bool { return lane(s, "bad").Delivered == 20 })
	if requests.Load() <= atOpen {
		t.Fatal("no probe was sent")
	}
}

// TestReloadKeepsAnOpenBreakerUnlessItsSettingsChange: a reload that leaves
// a subscription's breaker settings alone keeps its open breaker (a SIGHUP
// must not release a flood on a failing endpoint); new settings make a new
// breaker, closed.
func TestReloadKeepsAnOpenBreakerUnlessItsSettingsChange(t *testing.T) {
	tb := startTestbed(t, testbed.ModeFail)
	bad := sub("bad", tb.URL()+"/bad")
	bad.Breaker = fastBreaker
	bad.Breaker.CoolDown, bad.Breaker.MaxCoolDown = time.Hour, time.Hour // stays open for the test
	bad.Retry = fastRetry(1000)
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{bad}, RetryBudget: policy.BudgetConfig{MinPerSecond: 1000}})
	publish(t, s, "t", "e", 20)
	eventually(t, "breaker open", func() bool { return lane(s, "bad").Breaker == "open" })

	same := *bad
	if err := s.Reload([]*delivery.Subscription{&same}); err != nil {
		t.Fatal(err)
	}
	if l := lane(s, "bad"); l.Breaker != "open" {
		t.Fatalf("after a reload with the same breaker settings: %+v, want the breaker still open", l)
	}
	held := tb.Stats()["/bad"].Requests // open for an hour: no more requests until the next reload

	changed := *bad
	changed.Breaker.MinRequests, changed.Breaker.ConsecutiveTimeouts = 1<<30, 1<<30 // cannot trip
	if err := s.Reload([]*delivery.Subscription{&changed}); err != nil {
		t.Fatal(err)
	}
	if l := lane(s, "bad"); l.Breaker != "closed" {
		t.Fatalf("after a reload with new breaker settings: %+v, want a new, closed breaker", l)
	}
	eventually(t, "deliveries resume under the new breaker", func() bool { return tb.Stats()["/bad"].Requests > held })
}

func TestBacklogQuotaDeadLettersTheOldest(t *testing.T) {
	tb := startTestbed(t, testbed.ModeBlackhole)
	hole := sub("hole", tb.URL()+"/hole")
	hole.MaxConcurrency, hole.Timeout = 2, time.Minute
	hole.Backlog = delivery.BacklogQuota{MaxEvents: 10}
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{hole}})
	publish(t, s, "t", "e", 40)
	// 2 in flight, 10 may wait: the 28 oldest waiting are dead-lettered.
	eventually(t, "quota enforced", func() bool { return lane(s, "hole").QuotaDropped >= 28 })
	dls, err := s.DeadLetters("hole", 100)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range dls {
		if d.Reason == policy.ReasonBacklogQuota {
			n++
			if len(d.Body) == 0 {
				t.Fatalf("quota dead letter without body: %+v", d)
			}
		}
	}
	if l := lane(s, "hole"); uint64(n) != l.QuotaDropped || n != 28 {
		t.Fatalf("%d backlog_quota dead letters, lane counted %d; want 28", n, l.QuotaDropped)
	}
	// The oldest went: e-2 (after the two in flight) is dead, e-39 waits.
	if dls[0].EventID != "e-2" {
		t.Fatalf("first dead letter %s, want the oldest waiting e-2", dls[0].EventID)
	}
}

func TestRetryBudgetDefersDuringOutage(t *testing.T) {
	tb := startTestbed(t, testbed.ModeFail)
	var subs []*delivery.Subscription
	for i := range 3 {
		sb := sub(fmt.Sprintf("s%d", i), fmt.Sprintf("%s/s%d", tb.URL(), i))
		sb.Retry = fastRetry(1000)
		sb.Breaker = policy.BreakerConfig{MinRequests: 1 << 30, ConsecutiveTimeouts: 1 << 30} // isolate the budget
		subs = append(subs, sb)
	}
	budget := policy.BudgetConfig{Ratio: 0.1, MinPerSecond: 20, Window: time.Second}
	s := startServerWith(t, proxy.Options{Subscriptions: subs, RetryBudget: budget})
	publish(t, s, "t", "e", 30)
	// Sampled during the outage only. With no success in the window the
	// allowance is the floor, so retries may never pass it. After recovery
	// a snapshot can show more retries than allowed without any overspend:
	// successes that paid for retries leave the window before those
	// retries do (Budget.Available says so); admission is what is bounded.
	stop, sampled := make(chan struct{}), make(chan struct{})
	overspent := make(chan string, 1)
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if st := s.RetryBudget(); st.Retries > st.Allowed || st.Successes != 0 {
				select {
				case overspent <- fmt.Sprintf("%+v", st):
				default:
				}
			}
		}
	}()
	eventually(t, "retries deferred", func() bool {
		var d uint64
		for _, l := range s.Lanes() {
			d += l.Deferred
		}
		return d > 0
	})
	close(stop)
	<-sampled
	select {
	case st := <-overspent:
		t.Fatalf("retries exceeded the floor during the outage: %s", st)
	default:
	}
	tb.SetMode("", testbed.ModeOK)
	waitFor(t, tb, "everything delivered after recovery", accepted(30))
	for _, l := range s.Lanes() {
		if l.DeadLettered != 0 {
			t.Fatalf("lane %s dead-lettered %d: a spent budget defers, never drops", l.Subscription, l.DeadLettered)
		}
	}
}

func TestGonePausesTheSubscription(t *testing.T) {
	var requests atomic.Int64
	rcv, _, _ := scripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.WriteHeader(http.StatusGone)
		io.WriteString(w, "unsubscribed")
	})
	dir := t.TempDir()
	gone := sub("gone", rcv.URL)
	gone.MaxConcurrency = 1
	s := startServerWith(t, proxy.Options{DataDir: dir, Subscriptions: []*delivery.Subscription{gone}})
	publish(t, s, "t", "e", 5)
	eventually(t, "paused", func() bool { return lane(s, "gone").State == "paused" })
	if n := requests.Load(); n != 1 {
		t.Fatalf("%d requests after a 410, want 1", n)
	}
	dls, _ := s.DeadLetters("gone", 10)
	if len(dls) != 1 || dls[0].Reason != "gone" || dls[0].LastStatus != 410 {
		t.Fatalf("dead letters %+v", dls)
	}
	if l := lane(s, "gone"); l.Backlog != 4 || l.PausedBy == "" {
		t.Fatalf("lane %+v: the rest waits, with the reason recorded", l)
	}
	closeServer(t, s, time.Second)
	s = startServerWith(t, proxy.Options{DataDir: dir, Subscriptions: []*delivery.Subscription{sub("gone", rcv.URL)}})
	if l := lane(s, "gone"); l.State != "paused" {
		t.Fatalf("pause lost across a restart: %+v", l)
	}
}

func TestRateLimitHoldsBackBeforeASlot(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	limited := sub("slow", tb.URL()+"/slow")
	limited.Rate = delivery.RateLimit{PerSecond: 50, Burst: 1}
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{limited}})
	start := time.Now()
	publish(t, s, "t", "e", 20)
	waitFor(t, tb, "all delivered", uniqueAt("/slow", 20))
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("20 deliveries at 50/s took %v", el) // a lower bound: never flaky
	}
	eventually(t, "lane idle", func() bool { return lane(s, "slow").InFlight == 0 })
	if l := lane(s, "slow"); l.RateLimited == 0 {
		t.Fatalf("lane %+v: the limit never held a dispatch back", l)
	}
}

// TestAutoCapLaneDeliversWithinBounds: a lane with concurrency auto keeps
// its cap within [min, max] and delivers everything; the convergence itself
// is tested in policy with an injected clock.
func TestAutoCapLaneDeliversWithinBounds(t *testing.T) {
	tb := testbed.New(testbed.Options{Mode: testbed.ModeSlow, Delay: 20 * time.Millisecond})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	auto := sub("auto", tb.URL()+"/a")
	auto.Auto = &policy.AutoCapConfig{Min: 2, Max: 8, Headroom: 1, Interval: 50 * time.Millisecond}
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{auto}})
	stop := make(chan struct{})
	peak := sampleMax(func() int { return lane(s, "auto").InFlight }, stop)
	publish(t, s, "t", "e", 60)
	waitFor(t, tb, "all delivered", uniqueAt("/a", 60))
	close(stop)
	if p := <-peak; p > 8 || p < 2 {
		t.Fatalf("auto lane peaked at %d in flight, bounds [2, 8]", p)
	}
	if c := lane(s, "auto").Cap; c < 2 || c > 8 {
		t.Fatalf("auto cap %d outside [2, 8]", c)
	}
}

// TestRetryStormStaysWithinTheBudget: during a full outage, retries reaching
// the endpoints stay within the budget's floor per window (successes are
// zero), instead of multiplying the load; after recovery they are spread
// by jitter, and everything is delivered.
func TestRetryStormStaysWithinTheBudget(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	retriesAt := map[int64]int{} // 1 s bucket → retries received
	var afterRecovery []time.Time
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Attempt") != "1" {
			mu.Lock()
			retriesAt[time.Now().Unix()]++
			if !down.Load() {
				afterRecovery = append(afterRecovery, time.Now())
			}
			mu.Unlock()
		}
		if down.Load() {
			w.WriteHeader(503)
		}
	}))
	t.Cleanup(rcv.Close)
	var subs []*delivery.Subscription
	for i := range 4 {
		sb := sub(fmt.Sprintf("s%d", i), fmt.Sprintf("%s/s%d", rcv.URL, i))
		sb.Retry = fastRetry(1000)
		sb.Breaker = policy.BreakerConfig{MinRequests: 1 << 30, ConsecutiveTimeouts: 1 << 30} // isolate the budget
		subs = append(subs, sb)
	}
	const floor = 20
	s := startServerWith(t, proxy.Options{Subscriptions: subs, RetryBudget: policy.BudgetConfig{Ratio: 0.1, MinPerSecond: floor, Window: time.Second}})
	publish(t, s, "t", "e", 25)         // 100 deliveries, each retried every 5–20 ms without a budget
	time.Sleep(2500 * time.Millisecond) // the outage: a fixed span of wall time is the experiment itself
	mu.Lock()
	t.Logf("retries per second during the outage: %v (floor %d/s)", retriesAt, floor)
	for sec, n := range retriesAt {
		// A 1 s bucket can straddle two budget windows: at most twice the floor.
		if n > 2*floor {
			mu.Unlock()
			t.Fatalf("%d retries reached the endpoints in second %d; the budget allows %d per second with no successes", n, sec, floor)
		}
	}
	mu.Unlock()
	down.Store(false)
	eventually(t, "all delivered after recovery", func() bool {
		var n uint64
		for _, l := range s.Lanes() {
			n += l.Delivered
		}
		return n == 100
	})
	mu.Lock()
	defer mu.Unlock()
	buckets := map[int64]bool{}
	for _, at := range afterRecovery {
		buckets[at.UnixNano()/int64(100*time.Millisecond)] = true
	}
	if len(afterRecovery) > 20 && len(buckets) < 3 {
		t.Fatalf("%d retries after recovery arrived within %d 100 ms buckets: not spread", len(afterRecovery), len(buckets))
	}
}

// TestOpenBreakerSpendsNoRetryBudget: a lane whose breaker is open must not
// take retry tokens it cannot use; the budget is shared by every tenant.
func TestOpenBreakerSpendsNoRetryBudget(t *testing.T) {
	tb := startTestbed(t, testbed.ModeFail)
	bad := sub("bad", tb.URL()+"/bad")
	bad.Retry = fastRetry(1000)
	bad.Breaker = policy.BreakerConfig{MinRequests: 4, FailureRatio: 0.5, CoolDown: time.Minute, MaxCoolDown: time.Minute}
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{bad}, RetryBudget: policy.BudgetConfig{MinPerSecond: 1000}})
	publish(t, s, "t", "e", 20)
	eventually(t, "breaker open", func() bool { return lane(s, "bad").Breaker == "open" })
	before := s.RetryBudget().Retries
	publish(t, s, "t", "more", 50)     // every commit pumps the lane; its retries stay due
	time.Sleep(300 * time.Millisecond) // time for due retries to be tried, if the lane wrongly did
	if after := s.RetryBudget().Retries; after != before {
		t.Fatalf("an open breaker spent %d retry tokens", after-before)
	}
}
