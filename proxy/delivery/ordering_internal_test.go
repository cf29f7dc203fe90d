package delivery

// Per-key ordering, over real Badger and real loopback
// endpoints. The receiver (orderRecv) checks every request as it arrives:
// no two requests of one key in flight at once, and never event i+1 of a
// key before event i was acknowledged (or refused for good).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

// orderBody is the body of test event i of key k.
func orderBody(k string, i int) string { return fmt.Sprintf(`{"k":%q,"i":%d}`, k, i) }

// orderRecv is a receiver that checks per-key order.
type orderRecv struct {
	t    *testing.T
	srv  *httptest.Server
	hold time.Duration // each request is held this long, so overlaps show
	// answer decides the status of one request (0 or 2xx: ack); nil acks
	// everything.
	answer func(k string, i, attempt int, replay bool) int
	// retryAfter, when set, goes with every 503 (set before traffic).
	retryAfter string

	mu        sync.Mutex
	resolved  map[string]int   // key → last index acknowledged or refused (404), -1 before
	order     map[string][]int // key → indexes in the order they were first resolved
	inFlight  map[string]int
	cur, peak int // requests in flight at once, any key
	requests  int
	replays   []http.Header // headers of deliveries marked X-Sluice-Replay
	headers   map[string]http.Header
	dups      int // requests of an index already resolved
	problems  []string
}

func newOrderRecv(t *testing.T, hold time.Duration, answer func(k string, i, attempt int, replay bool) int) *orderRecv {
	r := &orderRecv{t: t, hold: hold, answer: answer, resolved: map[string]int{}, order: map[string][]int{},
		inFlight: map[string]int{}, headers: map[string]http.Header{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *orderRecv) problemf(format string, args ...any) {
	if len(r.problems) < 10 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

func (r *orderRecv) serve(w http.ResponseWriter, req *http.Request) {
	var b struct {
		K string `json:"k"`
		I int    `json:"i"`
	}
	body, _ := io.ReadAll(req.Body)
	if err := json.Unmarshal(body, &b); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	attempt, _ := strconv.Atoi(req.Header.Get("X-Attempt"))
	replay := req.Header.Get(HeaderReplay) == "true"
	k := b.K
	r.mu.Lock()
	r.requests++
	r.headers[fmt.Sprintf("%s/%d", k, b.I)] = req.Header.Clone()
	if replay {
		r.replays = append(r.replays, req.Header.Clone())
	}
	last, seen := r.resolved[k]
	if !seen {
		last = -1
	}
	ordered := k != "" && !replay
	if ordered {
		if got := req.Header.Get(HeaderOrderingKey); got != k {
			r.problemf("%s/%d: Ordering-Key %q", k, b.I, got)
		}
		if r.inFlight[k] > 0 {
			r.problemf("%s/%d: sent while another request of the key was in flight", k, b.I)
		}
		if b.I > last+1 {
			r.problemf("%s/%d: sent before %d was acknowledged (last resolved %d)", k, b.I, b.I-1, last)
		}
		if b.I <= last {
			r.dups++
		}
		r.inFlight[k]++
	}
	r.cur++
	r.peak = max(r.peak, r.cur)
	r.mu.Unlock()

	time.Sleep(r.hold) // the endpoint's latency
	status := http.StatusOK
	if r.answer != nil {
		if s := r.answer(k, b.I, attempt, replay); s != 0 {
			status = s
		}
	}

	r.mu.Lock()
	r.cur--
	if ordered {
		r.inFlight[k]--
		if (status/100 == 2 || status == http.StatusNotFound) && b.I == last+1 {
			if cur, ok := r.resolved[k]; !ok || cur < b.I {
				r.resolved[k] = b.I
				r.order[k] = append(r.order[k], b.I)
			}
		}
	}
	r.mu.Unlock()
	if status == http.StatusServiceUnavailable && r.retryAfter != "" {
		w.Header().Set("Retry-After", r.retryAfter)
	}
	w.WriteHeader(status)
}

// check fails the test on any problem seen, and checks that each of keys
// resolved indexes 0..n-1 in order.
func (r *orderRecv) check(keys []string, n int) {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.problems {
		r.t.Error(p)
	}
	for _, k := range keys {
		got := r.order[k]
		if len(got) != n {
			r.t.Errorf("key %s: resolved %v, want 0..%d", k, got, n-1)
			continue
		}
		for i, v := range got {
			if v != i {
				r.t.Errorf("key %s: resolved in the order %v", k, got)
				break
			}
		}
	}
}

// resolvedAll reports whether each of keys resolved 0..n-1, or a problem
// was seen (an event out of order is never resolved: the test would only
// time out).
func (r *orderRecv) resolvedAll(keys []string, n int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.problems) > 0 {
		return true
	}
	for _, k := range keys {
		if last, ok := r.resolved[k]; !ok || last < n-1 {
			return false
		}
	}
	return true
}

// openOrdered opens a sidecar on dir (a new temp dir if "") that the test
// closes (also at cleanup).
func openOrdered(t *testing.T, dir string, opts Options, subs ...*Subscription) *Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	opts.Listen, opts.AdminListen, opts.DataDir, opts.Subscriptions = "127.0.0.1:0", "-", dir, subs
	opts.Logger, opts.CursorInterval, opts.AllowPrivateTargets = discardLogger(), 10*time.Millisecond, true
	if testing.Verbose() {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	s := newTestServer(opts)
	if err := s.Open(); err != nil {
		t.Fatalf("open server: %v", err)
	}
	t.Cleanup(func() { closeWithin(t, s, 5*time.Second) })
	return s
}

func closeWithin(t *testing.T, s *Server, grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Errorf("close: %v", err)
	}
}

func orderedSub(id, url, mode string) *Subscription {
	return &Subscription{ID: id, URL: url, Timeout: 2 * time.Second, MaxConcurrency: 16, Ordering: mode,
		Retry: policy.RetryPolicy{MaxAttempts: 20, MaxAge: time.Hour, Backoff: policy.Backoff{Base: 2 * time.Millisecond, Cap: 10 * time.Millisecond}}}
}

// postKeyed posts one event with an Ordering-Key (none if key is "").
func postKeyed(t *testing.T, s *Server, key, body string) uint64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/t", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Ordering-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a struct{ Seq uint64 }
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("ingest %s: %d %v", body, resp.StatusCode, err)
	}
	return a.Seq
}

// produceKeyed posts n events of each key, each key's in order, keys from
// several producers at once.
func produceKeyed(t *testing.T, s *Server, keys []string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	const producers = 8
	for p := range producers {
		wg.Go(func() {
			for i := range n {
				for j := p; j < len(keys); j += producers {
					postKeyed(t, s, keys[j], orderBody(keys[j], i))
				}
			}
		})
	}
	wg.Wait()
}

func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling the sidecar's or the receiver's state
	}
}

func orderLane(s *Server, id string) *lane { return s.d.lane(id) }

// flakyAnswer fails about one attempt in three with 503 (and now and then
// a 500), deterministically per (key, index, attempt), never a fifth.
func flakyAnswer(k string, i, attempt int, replay bool) int {
	if attempt >= 5 {
		return 0
	}
	h := fnvHash(fmt.Sprintf("%s/%d/%d", k, i, attempt))
	switch h % 6 {
	case 0, 1:
		return http.StatusServiceUnavailable
	case 2:
		if h%5 == 0 {
			return http.StatusInternalServerError
		}
	}
	return 0
}

func fnvHash(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

func keysN(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// TestOrderingKeyStrictPerKeyWithRetries: 40 keys of 15 events each, an
// endpoint that fails about a third of the attempts (retries), a cap of
// 16. Per key the receiver never has two requests in flight, never gets
// event i+1 before event i was acknowledged, and acknowledges 0..14 in
// order; keys ran in parallel; events without a key went unordered; the
// lane forgot every key once all resolved.
func TestOrderingKeyStrictPerKeyWithRetries(t *testing.T) {
	recv := newOrderRecv(t, time.Millisecond, flakyAnswer)
	s := openOrdered(t, "", Options{Sync: false, RetryBudget: policy.BudgetConfig{Ratio: 1, MinPerSecond: 10000}}, orderedSub("o", recv.srv.URL, OrderingKey))
	keys := keysN("key-", 40)
	const n = 15
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 30 {
			postKeyed(t, s, "", orderBody("", i)) // unordered
		}
	})
	began := time.Now()
	produceKeyed(t, s, keys, n)
	wg.Wait()
	t.Logf("produced in %v", time.Since(began))
	waitUntil(t, "every key resolved", 60*time.Second, func() bool { return recv.resolvedAll(keys, n) })
	t.Logf("resolved in %v", time.Since(began))
	recv.check(keys, n)
	recv.mu.Lock()
	peak, dups := recv.peak, recv.dups
	unkeyed := 0
	for id := range recv.headers {
		if strings.HasPrefix(id, "/") {
			unkeyed++
		}
	}
	recv.mu.Unlock()
	if peak < 2 {
		t.Errorf("at most %d request in flight at once: keys did not run in parallel", peak)
	}
	if dups > 0 {
		t.Errorf("%d requests of events already acknowledged, without a crash", dups)
	}
	if unkeyed != 30 {
		t.Errorf("%d events without a key delivered, want 30", unkeyed)
	}
	l := orderLane(s, "o")
	waitUntil(t, "the lane to forget its keys", 10*time.Second, func() bool {
		st := l.status()
		return st.Ordering != nil && st.Ordering.ActiveKeys == 0 && st.Ordering.Parked == 0 && st.InFlight == 0
	})
	if st := l.status(); st.Retried == 0 || st.Ordering.Mode != OrderingKey {
		t.Errorf("status %+v, ordering %+v: want retries, mode key", st, st.Ordering)
	}
}

// TestOrderingFIFO: one key for the whole subscription, keyed or not: one
// request in flight at a time, everything resolved in seq order, retries
// holding back everything after them.
func TestOrderingFIFO(t *testing.T) {
	var mu sync.Mutex
	var got []int
	busy := atomic.Int32{}
	overlap := atomic.Bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if busy.Add(1) > 1 {
			overlap.Store(true)
		}
		defer busy.Add(-1)
		var b struct{ I int }
		body, _ := io.ReadAll(req.Body)
		json.Unmarshal(body, &b)
		attempt, _ := strconv.Atoi(req.Header.Get("X-Attempt"))
		time.Sleep(200 * time.Microsecond)
		if flakyAnswer("fifo", b.I, attempt, false) != 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		mu.Lock()
		got = append(got, b.I)
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	s := openOrdered(t, "", Options{RetryBudget: policy.BudgetConfig{Ratio: 1, MinPerSecond: 10000}}, orderedSub("f", srv.URL, OrderingFIFO))
	const n = 120
	for i := range n {
		key := []string{"a", "b", "", "c"}[i%4] // keys do not matter to fifo
		postKeyed(t, s, key, orderBody(key, i))
	}
	waitUntil(t, "all delivered", 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= n })
	mu.Lock()
	defer mu.Unlock()
	for i, v := range got {
		if v != i {
			t.Fatalf("fifo delivered %v, not in acceptance order", got)
		}
	}
	if overlap.Load() {
		t.Error("two requests of a fifo subscription in flight at once")
	}
}

// blackHole accepts connections and never answers.
func blackHole(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	done := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				go func() { <-done; c.Close() }()
				io.Copy(io.Discard, c)
			})
		}
	}()
	t.Cleanup(func() { ln.Close(); close(done); conns.Wait() })
	return "http://" + ln.Addr().String()
}

// appendMany appends n events to s's log from 16 goroutines, as ingest
// does once a POST passed its checks; ev(i) names the ordering key and
// body of event i. Per-key order is not kept: callers use one event per
// key per call.
func appendMany(t *testing.T, s *Server, n int, ev func(i int) (key, body string)) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				key, body := ev(i)
				e := &queue.Event{ID: fmt.Sprintf("%s-%d", key, time.Now().UnixNano()), Type: "t", ContentType: "application/json",
					AcceptedAt: time.Now(), Body: []byte(body), OrderingKey: key}
				if _, _, err := s.q.Append(e); err != nil {
					t.Errorf("append: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestOrderingBlackHoleManyKeysBoundedMemory: 10,000 keys at a black hole
// (every attempt times out; the breaker never opens; retries back off for
// an hour). Each key's first event goes out and is scheduled for retry,
// which holds the key; of their second events the lane parks 1,024 and
// then stops reading (head-of-line): the rest wait on disk, not in memory.
func TestOrderingBlackHoleManyKeysBoundedMemory(t *testing.T) {
	const keys = 10_000
	sb := orderedSub("bh", blackHole(t), OrderingKey)
	sb.Timeout, sb.MaxConcurrency = 20*time.Millisecond, 256
	sb.Retry = policy.RetryPolicy{MaxAttempts: 20, MaxAge: 24 * time.Hour, Backoff: policy.Backoff{Base: time.Hour, Cap: time.Hour}}
	sb.Breaker = policy.BreakerConfig{MinRequests: 1 << 30, FailureRatio: 1, ConsecutiveTimeouts: 1 << 30}
	// A spent budget defers retries: the few that full jitter makes due
	// early stay on disk too.
	reg := prometheus.NewRegistry()
	s := openOrdered(t, "", Options{MaxConnsPerHost: 256, RetryBudget: policy.BudgetConfig{Ratio: 0.001, MinPerSecond: 0.001}, Registry: reg}, sb)
	pad := strings.Repeat("x", 2048)
	began := time.Now()
	// Appended straight to the log (what ingest does after its checks),
	// which is many times quicker than 20,000 POSTs under -race.
	appendMany(t, s, keys, func(i int) (string, string) {
		return fmt.Sprintf("k%d", i), fmt.Sprintf(`{"k":"k%d","i":0,"pad":%q}`, i, pad)
	})
	t.Logf("round 1 appended in %v", time.Since(began))
	l := orderLane(s, "bh")
	waitUntil(t, "every key's first event scheduled for retry", 60*time.Second, func() bool {
		return l.scheduled.Load() >= keys
	})
	t.Logf("round 1 timed out in %v", time.Since(began))
	appendMany(t, s, keys, func(i int) (string, string) {
		return fmt.Sprintf("k%d", i), fmt.Sprintf(`{"k":"k%d","i":1,"pad":%q}`, i, pad)
	})
	waitUntil(t, "the lane to stop at the parked bound", 30*time.Second, func() bool {
		st := l.status()
		return st.Ordering != nil && st.Ordering.Blocked
	})
	t.Logf("blocked in %v", time.Since(began))
	time.Sleep(100 * time.Millisecond) // it must stay there
	l.mu.Lock()
	o := l.ordState()
	active, parked, buf, next, cursor := len(o.keys), len(o.parked), len(l.buf), l.next, l.cursor
	var held int
	for _, ev := range l.buf {
		held += ev.Size()
	}
	firstParked := o.parked[0].seq
	l.mu.Unlock()
	head := s.d.feed.head.Load()
	t.Logf("head %d, cursor %d, next %d, active keys %d, parked %d, buffered %d events (%d B)", head, cursor, next, active, parked, buf, held)
	if active != keys {
		t.Errorf("%d active keys, want %d (each held by its retry)", active, keys)
	}
	if parked != maxParked {
		t.Errorf("%d parked events, want the bound %d", parked, maxParked)
	}
	if buf > pageSize || held > pageSize*(len(pad)+200) {
		t.Errorf("%d events (%d B) read ahead in memory; want at most a page (%d)", buf, held, pageSize)
	}
	if unread := head - (next - 1); unread < keys-maxParked-pageSize {
		t.Errorf("only %d events left unread on disk: the lane read the backlog into memory", unread)
	}
	if cursor != firstParked-1 {
		t.Errorf("cursor %d, want just below the first parked event %d", cursor, firstParked)
	}
	rs, err := s.q.Retries("bh", 1<<30)
	if err != nil || len(rs) != keys {
		t.Errorf("%d retry records on disk (%v), want %d", len(rs), err, keys)
	}
	// The gauges say the same.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"sluice_lane_ordering_active_keys": keys, "sluice_lane_ordering_parked_events": maxParked, "sluice_lane_ordering_blocked": 1}
	for _, mf := range mfs {
		if w, ok := want[mf.GetName()]; ok {
			if got := mf.GetMetric()[0].GetGauge().GetValue(); got != w {
				t.Errorf("%s = %v, want %v", mf.GetName(), got, w)
			}
			delete(want, mf.GetName())
		}
	}
	if len(want) > 0 {
		t.Errorf("gauges missing: %v", want)
	}
}

// TestOrderingRestartKeepsOrder: a Close while one key's event is held in
// flight (its delivery abandoned), another's is scheduled for retry with
// the cursor past it, and later events of both wait; after reopening the
// same data dir every key still resolves in order, and an event accepted
// after the restart still waits for its key's retry from before it.
func TestOrderingRestartKeepsOrder(t *testing.T) {
	dir := t.TempDir()
	release := make(chan struct{})
	var released atomic.Bool
	failB := atomic.Bool{}
	failB.Store(true)
	recv := newOrderRecv(t, 0, func(k string, i, attempt int, replay bool) int {
		switch {
		case k == "held" && i == 0 && !released.Load():
			<-release // held past the shutdown grace: abandoned
			return http.StatusServiceUnavailable
		case k == "retry" && i == 0 && failB.Load():
			return http.StatusServiceUnavailable
		}
		return 0
	})
	t.Cleanup(func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	})
	// retry/0's retry is due a second after its failure (Retry-After):
	// after the restart.
	recv.retryAfter = "1"
	mk := func() *Subscription { // one per server: a Subscription belongs to the server it is given to
		sb := orderedSub("o", recv.srv.URL, OrderingKey)
		sb.Retry.Backoff = policy.Backoff{Base: time.Second, Cap: time.Second}
		return sb
	}
	s := openOrdered(t, dir, Options{Sync: true}, mk())
	postKeyed(t, s, "retry", orderBody("retry", 0))
	l := orderLane(s, "o")
	waitUntil(t, "retry/0 scheduled for retry", 10*time.Second, func() bool { return l.scheduled.Load() == 1 })
	postKeyed(t, s, "held", orderBody("held", 0))
	waitUntil(t, "held/0 in flight", 10*time.Second, func() bool { return l.status().InFlight == 1 })
	for i := 1; i < 4; i++ {
		postKeyed(t, s, "held", orderBody("held", i))
	}
	postKeyed(t, s, "free", orderBody("free", 0))
	waitUntil(t, "free/0 delivered and held/1-3 parked", 10*time.Second, func() bool {
		st := l.status()
		return recv.resolvedAll([]string{"free"}, 1) && st.Ordering.Parked == 3
	})
	closeWithin(t, s, 100*time.Millisecond) // held/0 is abandoned
	released.Store(true)
	close(release)
	failB.Store(false)
	waitUntil(t, "the abandoned request to end", 5*time.Second, func() bool {
		recv.mu.Lock()
		defer recv.mu.Unlock()
		return recv.inFlight["held"] == 0
	})

	// The restart: retry/0's key is held by its record below the cursor;
	// retry/1, accepted now, must wait for it.
	s = openOrdered(t, dir, Options{Sync: true}, mk())
	postKeyed(t, s, "retry", orderBody("retry", 1))
	waitUntil(t, "everything resolved", 20*time.Second, func() bool {
		return recv.resolvedAll([]string{"retry"}, 2) && recv.resolvedAll([]string{"held"}, 4)
	})
	recv.check([]string{"retry"}, 2)
	recv.check([]string{"held"}, 4)
}

// TestOrderingReplayGoesAlone: an event refused for good (404) is
// dead-lettered, which frees its key's next event; its replay goes out on
// its own, marked X-Sluice-Replay, while the key's later events run.
// Ordinary deliveries carry Ordering-Key and no replay mark.
func TestOrderingReplayGoesAlone(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	recv := newOrderRecv(t, 0, func(k string, i, attempt int, replay bool) int {
		if k == "a" && i == 0 && refuse.Load() {
			return http.StatusNotFound
		}
		return 0
	})
	s := openOrdered(t, "", Options{Sync: true}, orderedSub("o", recv.srv.URL, OrderingKey))
	seq0 := postKeyed(t, s, "a", orderBody("a", 0))
	postKeyed(t, s, "a", orderBody("a", 1))
	waitUntil(t, "a/1 after a/0's dead letter", 10*time.Second, func() bool { return recv.resolvedAll([]string{"a"}, 2) })
	recv.mu.Lock()
	h := recv.headers["a/1"]
	recv.mu.Unlock()
	if h.Get(HeaderReplay) != "" || h.Get(HeaderOrderingKey) != "a" {
		t.Errorf("a/1 headers: %s %q, %s %q; want no replay mark and the key", HeaderReplay, h.Get(HeaderReplay), HeaderOrderingKey, h.Get(HeaderOrderingKey))
	}
	refuse.Store(false)
	res, err := s.Replay("o", seq0, false)
	if err != nil || !res.Replayed {
		t.Fatalf("replay: %+v %v", res, err)
	}
	waitUntil(t, "the replay", 10*time.Second, func() bool { recv.mu.Lock(); defer recv.mu.Unlock(); return len(recv.replays) == 1 })
	recv.mu.Lock()
	rh := recv.replays[0]
	recv.mu.Unlock()
	if rh.Get(HeaderReplay) != "true" || rh.Get("webhook-id") == "" {
		t.Errorf("replay headers %v", rh)
	}
	recv.check([]string{"a"}, 2)
	dl, err := s.q.DeadLetter("o", seq0)
	if err != nil || dl.DeliveredAt.IsZero() || dl.OrderingKey != "a" {
		t.Errorf("dead letter after its replay: %+v %v", dl, err)
	}
}

// TestOrderingQuotaDeadLettersParkedFirst: a key held by a retry, five
// later events parked behind it, a backlog quota of two events: the
// quota dead-letters the three oldest waiting (parked) events, which are
// never sent; when the retry succeeds, the two left follow it in order.
func TestOrderingQuotaDeadLettersParkedFirst(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	recv := newOrderRecv(t, 0, func(k string, i, attempt int, replay bool) int {
		if i == 0 && fail.Load() {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	sb := orderedSub("o", recv.srv.URL, OrderingKey)
	sb.Backlog = BacklogQuota{MaxEvents: 2}
	sb.Retry.Backoff = policy.Backoff{Base: 20 * time.Millisecond, Cap: 20 * time.Millisecond}
	sb.Retry.MaxAttempts = 1000
	s := openOrdered(t, "", Options{Sync: true}, sb)
	var seqs []uint64
	for i := range 6 {
		seqs = append(seqs, postKeyed(t, s, "a", orderBody("a", i)))
	}
	l := orderLane(s, "o")
	waitUntil(t, "three dead-lettered by the quota", 10*time.Second, func() bool { return l.quotaRejections.Load() == 3 })
	if st := l.status(); st.Ordering.Parked != 2 {
		t.Errorf("parked %d after the quota, want 2", st.Ordering.Parked)
	}
	fail.Store(false)
	waitUntil(t, "the rest delivered", 10*time.Second, func() bool {
		recv.mu.Lock()
		defer recv.mu.Unlock()
		return len(recv.order["a"]) == 1 && recv.headers["a/5"] != nil
	})
	recv.mu.Lock()
	defer recv.mu.Unlock()
	for _, i := range []int{1, 2, 3} {
		if recv.headers[fmt.Sprintf("a/%d", i)] != nil {
			t.Errorf("a/%d was sent after the quota dead-lettered it", i)
		}
		dl, err := s.q.DeadLetter("o", seqs[i])
		if err != nil || dl.Reason != policy.ReasonBacklogQuota {
			t.Errorf("a/%d: dead letter %+v %v, want reason %s", i, dl, err, policy.ReasonBacklogQuota)
		}
	}
	for _, p := range recv.problems {
		if !strings.Contains(p, "sent before") { // a/4 follows a/0: 1-3 were dead-lettered
			t.Error(p)
		}
	}
}

// TestOrderingReload: a reload that changes other settings keeps the held
// keys and the parked events; one that turns ordering off sends the
// parked events at once, behind nothing; turning it back on rebuilds the
// held keys from the retry schedule.
func TestOrderingReload(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	recv := newOrderRecv(t, 0, func(k string, i, attempt int, replay bool) int {
		if i == 0 && fail.Load() {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	mk := func(mode string, hdr string) *Subscription {
		sb := orderedSub("o", recv.srv.URL, mode)
		sb.Headers = map[string]string{"X-Version": hdr}
		sb.Retry.Backoff = policy.Backoff{Base: 20 * time.Millisecond, Cap: 20 * time.Millisecond}
		sb.Retry.MaxAttempts = 1000
		return sb
	}
	s := openOrdered(t, "", Options{Sync: true}, mk(OrderingKey, "1"))
	for i := range 4 {
		postKeyed(t, s, "a", orderBody("a", i))
	}
	l := orderLane(s, "o")
	waitUntil(t, "a/1-3 parked", 10*time.Second, func() bool { st := l.status(); return st.Ordering != nil && st.Ordering.Parked == 3 })
	if err := s.Reload([]*Subscription{mk(OrderingKey, "2")}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // retries run meanwhile; nothing else may go
	if st := l.status(); st.Ordering.Parked != 3 || st.Ordering.ActiveKeys != 1 {
		t.Fatalf("after a reload keeping the mode: %+v", st.Ordering)
	}
	recv.mu.Lock()
	if n := len(recv.headers); n != 1 {
		t.Errorf("%d events sent while a/0 retries, want only a/0", n)
	}
	recv.mu.Unlock()

	// Off: the parked ones go now, while a/0 still retries.
	if err := s.Reload([]*Subscription{mk(OrderingNone, "3")}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a/1-3 sent with ordering off", 10*time.Second, func() bool {
		recv.mu.Lock()
		defer recv.mu.Unlock()
		return recv.headers["a/3"] != nil
	})
	if st := l.status(); st.Ordering != nil {
		t.Errorf("ordering state %+v after it was turned off and drained", st.Ordering)
	}

	// On again: a/0's retry holds the key; a/4 waits for it.
	if err := s.Reload([]*Subscription{mk(OrderingKey, "4")}); err != nil {
		t.Fatal(err)
	}
	postKeyed(t, s, "a", orderBody("a", 4))
	waitUntil(t, "a/4 parked behind a/0's retry", 10*time.Second, func() bool {
		st := l.status()
		return st.Ordering != nil && st.Ordering.Parked == 1 && st.Ordering.ActiveKeys == 1
	})
	recv.mu.Lock()
	early := recv.headers["a/4"] != nil
	recv.mu.Unlock()
	if early {
		t.Error("a/4 sent while a/0 was still retrying")
	}
	fail.Store(false)
	waitUntil(t, "a/4 after a/0", 10*time.Second, func() bool {
		recv.mu.Lock()
		defer recv.mu.Unlock()
		return recv.headers["a/4"] != nil
	})
	if st := l.status(); st.Ordering.ActiveKeys != 0 {
		waitUntil(t, "the key forgotten", 5*time.Second, func() bool { return l.status().Ordering.ActiveKeys == 0 })
	}
}

// TestOrderingStateTransitions drives the ordering state alone: holders,
// parking, release to ready, the quota's drop of a ready event (which
// frees its key's next), and the events without a key.
func TestOrderingStateTransitions(t *testing.T) {
	o := &ordering{mode: OrderingKey, keys: map[string]*orderKey{}}
	ev := func(seq uint64, key string) *queue.Event {
		return &queue.Event{Seq: seq, OrderingKey: key, AcceptedAt: time.Unix(int64(seq), 0)}
	}
	if _, gated := o.gate(""); gated {
		t.Fatal("an event without a key is gated under ordering: key")
	}
	o.hold("a", 1)
	o.park(o.keys["a"], ev(2, "a"))
	o.park(o.keys["a"], ev(3, "a"))
	o.hold("b", 4)
	if o.release("a", 99) || len(o.ready) != 0 {
		t.Fatal("a seq that holds nothing released a key")
	}
	if !o.release("a", 1) || len(o.ready) != 1 || o.ready[0] != 2 || o.keys["a"].seq != 2 {
		t.Fatalf("after a/1 resolved: ready %v, key %+v", o.ready, o.keys["a"])
	}
	// The quota drops the ready a/2: a/3 is next.
	if !o.dropParked(o.parked[0]) || len(o.ready) != 1 || o.ready[0] != 3 || len(o.parked) != 1 {
		t.Fatalf("after the quota dropped ready a/2: ready %v, parked %v", o.ready, o.parked)
	}
	o.ready = nil
	o.unpark(3)
	if o.release("a", 3); o.keys["a"] != nil {
		t.Fatalf("key a kept after its last event resolved: %+v", o.keys["a"])
	}
	if o.release("b", 4); len(o.keys) != 0 {
		t.Fatalf("keys left: %v", o.keys)
	}
	// Several holders (retries from before ordering was on): the key is
	// free only once all resolved.
	o.hold("c", 10)
	o.hold("c", 11)
	o.park(o.keys["c"], ev(12, "c"))
	if o.release("c", 11) || o.release("c", 99) {
		t.Fatal("released with a holder left")
	}
	if !o.release("c", 10) || o.ready[0] != 12 {
		t.Fatalf("c/12 not ready after both holders resolved: %v", o.ready)
	}
	f := &ordering{mode: OrderingFIFO}
	if k, gated := f.gate(""); !gated || k != "" {
		t.Fatal("fifo does not gate an event without a key under the one key")
	}
}

// TestOrderingSnapshotKeepsMode: a removed subscription drains with its
// snapshot's settings, the ordering mode among them.
func TestOrderingSnapshotKeepsMode(t *testing.T) {
	for _, mode := range []string{OrderingKey, OrderingFIFO, ""} {
		s := &Subscription{ID: "x", URL: "http://x", Ordering: mode}
		got, err := decodeSnapshot("x", encodeSnapshot(s))
		if err != nil || got.orderingMode() != mode {
			t.Errorf("mode %q: snapshot gives %q, %v", mode, got.Ordering, err)
		}
	}
}
