package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

func TestIngestContract(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	s := startServer(t, "", sub("a", tb.URL()+"/a"))

	code, first := post(t, s, "order.created", "ord-1", `{"x":1}`)
	if code != http.StatusAccepted || first.ID != "ord-1" || first.Seq == 0 || first.Duplicate {
		t.Fatalf("first post: %d %+v", code, first)
	}
	code, again := post(t, s, "order.created", "ord-1", `{"x":"different"}`)
	if code != http.StatusOK || !again.Duplicate || again.ID != "ord-1" || again.Seq != first.Seq {
		t.Fatalf("repeat post: %d %+v, want 200 duplicate seq %d", code, again, first.Seq)
	}
	code, gen := post(t, s, "order.created", "", `{}`)
	if code != http.StatusAccepted || len(gen.ID) != 26 {
		t.Fatalf("post without key: %d %+v, want a generated ULID", code, gen)
	}

	bad := []struct {
		name, method, path, key, body string
		want                          int
		errHas                        string
	}{
		{"bad type character", "POST", "/v1/events/bad%20type", "", "{}", 400, "invalid event type"},
		{"type starting with dot", "POST", "/v1/events/.hidden", "", "{}", 400, "must start with a letter or digit"},
		{"type too long", "POST", "/v1/events/" + strings.Repeat("a", 129), "", "{}", 400, "longer than 128"},
		{"empty type", "POST", "/v1/events/", "", "{}", 400, "empty"},
		{"bad key", "POST", "/v1/events/t", "has space", "{}", 400, "invalid Idempotency-Key"},
		{"key too long", "POST", "/v1/events/t", strings.Repeat("k", 201), "{}", 400, "longer than 200"},
		{"wrong path", "POST", "/v2/things", "", "{}", 404, "not found"},
		{"wrong method", "GET", "/v1/events/t", "", "", 405, "method not allowed"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, s.URL()+c.path, strings.NewReader(c.body))
			if c.key != "" {
				req.Header.Set("Idempotency-Key", c.key)
			}
			code, a := do(t, req)
			if code != c.want || !strings.Contains(a.Error, c.errHas) {
				t.Fatalf("%d %q, want %d with %q", code, a.Error, c.want, c.errHas)
			}
		})
	}
	t.Run("oversized body", func(t *testing.T) {
		// Raw TCP: the sidecar answers 413 from the Content-Length alone,
		// before the body is sent (a client that insists on writing it first
		// may see the connection closed instead).
		c, err := net.Dial("tcp", strings.TrimPrefix(s.URL(), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/events/t HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", proxy.DefaultMaxBodyBytes+1)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 413 || !strings.Contains(string(b), "max_body_bytes") || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%d %s %q", resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
	})
	// Rejected requests wrote nothing: only the two accepted events arrive.
	waitFor(t, tb, "two deliveries", uniqueAt("/a", 2))
	if st := tb.Stats()["/a"]; st.Requests != 2 {
		t.Fatalf("receiver got %d requests, want 2 (nothing from rejected input)", st.Requests)
	}
}

// TestOutboundHeadersAndSignature checks the exact outbound contract
// (the Standard Webhooks headers, sluice's own and the subscription's) on a
// raw net/http receiver.
func TestOutboundHeadersAndSignature(t *testing.T) {
	type got struct {
		h    http.Header
		body []byte
	}
	ch := make(chan got, 1)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ch <- got{r.Header.Clone(), b}
	}))
	defer rcv.Close()
	old := mustSecret("whsec_eCxlLjRJL5oBgslHKt2sqY8aF9JulKkM6ht+856VA7w=")
	sb := sub("billing", rcv.URL+"/hooks")
	sb.Secrets = []signing.Secret{testSecret, old}
	sb.Headers = map[string]string{"X-Tenant": "acme"}
	s := startServer(t, "", sb)

	body := `{"card":"4242","state":"shipped"}`
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/card.shipped", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/vnd.acme+json; charset=utf-8")
	req.Header.Set("Idempotency-Key", "evt_123")
	if code, a := do(t, req); code != 202 {
		t.Fatalf("post: %d %+v", code, a)
	}
	var g got
	select {
	case g = <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	if string(g.body) != body {
		t.Fatalf("body %q, want the exact bytes %q", g.body, body)
	}
	want := map[string]string{
		"Webhook-Id": "evt_123", "Idempotency-Key": "evt_123", "X-Event-Type": "card.shipped",
		"X-Attempt": "1", "Content-Type": "application/vnd.acme+json; charset=utf-8", "X-Tenant": "acme",
	}
	for k, v := range want {
		if g.h.Get(k) != v {
			t.Errorf("header %s = %q, want %q", k, g.h.Get(k), v)
		}
	}
	sig := g.h.Get("Webhook-Signature")
	if n := len(strings.Fields(sig)); n != 2 {
		t.Fatalf("signature %q has %d entries, want one per active secret", sig, n)
	}
	for _, k := range []signing.Secret{testSecret, old} {
		if err := signing.Verify([]signing.Secret{k}, g.h.Get("Webhook-Id"), g.h.Get("Webhook-Timestamp"), sig, g.body, time.Now(), signing.DefaultTolerance); err != nil {
			t.Errorf("verify with one of the rotated secrets: %v", err)
		}
	}
}

// TestFanOutDeliversEachEventToEachEntitledSubscription (invariants 1 and 2).
func TestFanOutDeliversEachEventToEachEntitledSubscription(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	s := startServer(t, "",
		sub("all", tb.URL()+"/all"),
		sub("enter", tb.URL()+"/enter", "geofence.enter"),
		sub("both", tb.URL()+"/both", "geofence.enter", "geofence.exit"),
		sub("none", tb.URL()+"/none", "billing.paid"),
	)
	enter := publish(t, s, "geofence.enter", "in", 40)
	exit := publish(t, s, "geofence.exit", "out", 30)
	other := publish(t, s, "fleet.ping", "ping", 10)
	// Repeats are no new deliveries: one event id, at most one delivery
	// per subscription.
	for _, id := range enter[:10] {
		if code, a := post(t, s, "geofence.enter", id, "{}"); code != http.StatusOK || !a.Duplicate {
			t.Fatalf("repeat of %s: %d %+v", id, code, a)
		}
	}

	waitFor(t, tb, "fan-out", func(m map[string]testbed.PathStats) bool {
		return m["/all"].Unique == 80 && m["/enter"].Unique == 40 && m["/both"].Unique == 70
	})
	eventually(t, "lanes idle", func() bool {
		for _, l := range s.Lanes() {
			if l.InFlight > 0 || l.Backlog > 0 {
				return false
			}
		}
		return true
	})
	st := tb.Stats()
	for _, p := range []string{"/all", "/enter", "/both"} {
		if st[p].Duplicates != 0 || st[p].BadSignatures != 0 || st[p].Unsigned != 0 {
			t.Errorf("%s: %+v", p, st[p])
		}
	}
	if _, ok := st["/none"]; ok {
		t.Errorf("subscription to billing.paid received %+v", st["/none"])
	}
	wantIDs := func(path string, groups ...[]string) {
		got := tb.IDs(path)
		want := slices.Concat(groups...)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s got %d ids, want %d", path, len(got), len(want))
		}
	}
	wantIDs("/all", enter, exit, other)
	wantIDs("/enter", enter)
	wantIDs("/both", enter, exit)
}

func TestRetry500Then200(t *testing.T) {
	// The receiver fails the first attempt of each event and accepts the
	// second. It keys on webhook-id, not on the request count (testbed's
	// ModeFlaky): with a cap of 1 the lane may send the next event while a
	// retry waits, so which request is odd depends on timing.
	var mu sync.Mutex
	seen := map[string]int{}
	var failed, accepted, again atomic.Int64
	rcv, _, _ := scripted(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		id := r.Header.Get("webhook-id")
		seen[id]++
		n := seen[id]
		mu.Unlock()
		switch n {
		case 1:
			failed.Add(1)
			w.WriteHeader(http.StatusInternalServerError)
		case 2:
			accepted.Add(1)
		default:
			again.Add(1) // a retry of an event already accepted
		}
	})
	sb := sub("flaky", rcv.URL)
	sb.MaxConcurrency = 1
	s := startServer(t, "", sb)
	publish(t, s, "t", "e", 5)
	eventually(t, "lane counts", func() bool { l := lane(s, "flaky"); return l.Delivered == 5 && l.Scheduled == 0 })
	if failed.Load() != 5 || accepted.Load() != 5 || again.Load() != 0 {
		t.Fatalf("receiver saw %d first-attempt failures, %d accepted retries, %d extra requests; want 5, 5, 0", failed.Load(), accepted.Load(), again.Load())
	}
	if l := lane(s, "flaky"); l.Retried != 5 || l.DeadLettered != 0 {
		t.Fatalf("lane %+v", l)
	}
}

// scripted is a receiver answering from a per-request script.
func scripted(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) (*httptest.Server, *[]time.Time, *[]http.Header) {
	var mu sync.Mutex
	var times []time.Time
	var hdrs []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		n := len(times)
		times = append(times, time.Now())
		hdrs = append(hdrs, r.Header.Clone())
		mu.Unlock()
		answer(n, w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &times, &hdrs
}

func TestRetryAfterIsHonoured(t *testing.T) {
	for _, c := range []struct {
		name  string
		value func() string
	}{
		{"seconds", func() string { return "1" }},
		{"http date", func() string { return time.Now().Add(2 * time.Second).UTC().Format(http.TimeFormat) }},
		{"absent", func() string { return "" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var answered atomic.Int64
			rcv, times, hdrs := scripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 0 {
					if v := c.value(); v != "" {
						w.Header().Set("Retry-After", v)
					}
					w.WriteHeader(http.StatusTooManyRequests)
					return
				}
				answered.Add(1)
			})
			rl := sub("rl", rcv.URL)
			rl.Retry.Backoff.Cap = 10 * time.Second // Retry-After is honoured up to the cap
			s := startServer(t, "", rl)
			publish(t, s, "t", "e", 1)
			eventually(t, "delivery after 429", func() bool { return lane(s, "rl").Delivered == 1 })
			gap := (*times)[1].Sub((*times)[0])
			if c.name != "absent" && gap < 900*time.Millisecond {
				t.Fatalf("retried after %v, before Retry-After allowed", gap)
			}
			if (*hdrs)[1].Get("X-Attempt") != "2" || (*hdrs)[1].Get("Webhook-Id") != (*hdrs)[0].Get("Webhook-Id") {
				t.Fatalf("retry headers %v", (*hdrs)[1])
			}
		})
	}
}

// TestTimeoutRetriesWithSameWebhookID: the receiver kept the event but
// answered too late; the retry carries the same webhook-id, so the receiver
// can deduplicate (delivery is at-least-once).
func TestTimeoutRetriesWithSameWebhookID(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	rcv, _, hdrs := scripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 0 {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	})
	sb := sub("slow", rcv.URL)
	sb.Timeout = 100 * time.Millisecond
	s := startServer(t, "", sb)
	publish(t, s, "t", "evt", 1)
	eventually(t, "delivered on retry", func() bool { return lane(s, "slow").Delivered == 1 })
	if a, b := (*hdrs)[0].Get("Webhook-Id"), (*hdrs)[1].Get("Webhook-Id"); a != "evt-0" || a != b {
		t.Fatalf("webhook-ids %q then %q", a, b)
	}
}

func TestInvariant5_RejectedDeliveryIsDeadLetteredWithReason(t *testing.T) {
	rcv, times, _ := scripted(t, func(n int, w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, "no such hook")
	})
	s := startServer(t, "", sub("gone", rcv.URL))
	publish(t, s, "card.shipped", "c", 3)
	eventually(t, "dead letters", func() bool { return lane(s, "gone").DeadLettered == 3 })
	dls, err := s.DeadLetters("gone", 10)
	if err != nil || len(dls) != 3 {
		t.Fatalf("dead letters %v %v", dls, err)
	}
	d := dls[0]
	if d.Reason != "rejected" || d.LastStatus != 404 || d.Attempts != 1 || d.EventID != "c-0" || d.Type != "card.shipped" ||
		!bytes.Equal(d.Body, []byte(`{"n":0}`)) || d.Response != "no such hook" {
		t.Fatalf("dead letter %+v body %q", d, d.Body)
	}
	if len(*times) != 3 {
		t.Fatalf("a 404 was retried: %d requests", len(*times))
	}
}

func TestRetriesExhaustedAreDeadLettered(t *testing.T) {
	rcv, _, _ := scripted(t, func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) })
	attempts := sub("attempts", rcv.URL+"/a")
	attempts.Retry = fastRetry(3)
	age := sub("age", rcv.URL+"/b")
	age.Retry = fastRetry(1000)
	age.Retry.MaxAge = 50 * time.Millisecond
	s := startServer(t, "", attempts, age)
	publish(t, s, "t", "e", 2)
	eventually(t, "both dead-lettered", func() bool {
		return lane(s, "attempts").DeadLettered == 2 && lane(s, "age").DeadLettered == 2
	})
	for sub, reason := range map[string]string{"attempts": "max_attempts", "age": "max_age"} {
		dls, _ := s.DeadLetters(sub, 10)
		for _, d := range dls {
			if d.Reason != reason || d.LastStatus != 503 {
				t.Errorf("%s: %+v, want reason %s", sub, d, reason)
			}
		}
		if l := lane(s, sub); l.Scheduled != 0 {
			t.Errorf("%s still has %d retries scheduled", sub, l.Scheduled)
		}
	}
	if dls, _ := s.DeadLetters("attempts", 10); dls[0].Attempts != 3 {
		t.Errorf("attempts = %d, want 3", dls[0].Attempts)
	}
}

// TestInvariant6_CapHoldsAgainstABlackHole: a black hole holds only its cap;
// the rest waits on disk; healthy subscriptions are not delayed; the backlog
// is delivered once the endpoint answers again.
func TestInvariant6_CapHoldsAgainstABlackHole(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	tb.SetMode("/hole", testbed.ModeBlackhole)
	hole := sub("hole", tb.URL()+"/hole")
	// The timeout outlasts the first check: once the sidecar gives up on a
	// request, the receiver notices the closed connection a little later,
	// and only the sidecar's own count is exact.
	hole.MaxConcurrency, hole.Timeout, hole.Retry = 3, 2*time.Second, fastRetry(1000)
	s := startServer(t, "", hole, sub("healthy", tb.URL()+"/ok"))
	var maxSeen atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stopSampling:
				return
			default:
			}
			if n := int64(lane(s, "hole").InFlight); n > maxSeen.Load() {
				maxSeen.Store(n)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	publish(t, s, "t", "e", 60)
	waitFor(t, tb, "healthy lane done", uniqueAt("/ok", 60))
	eventually(t, "black hole saturated", func() bool { return lane(s, "hole").InFlight == 3 })
	if l := lane(s, "hole"); l.Backlog < 57 {
		t.Fatalf("black hole lane %+v: backlog should wait on disk", l)
	}
	if m := tb.Stats()["/hole"].MaxInFlight; m > 3 {
		t.Fatalf("black hole saw %d concurrent requests, cap 3", m)
	}
	tb.SetMode("/hole", testbed.ModeOK)
	waitFor(t, tb, "backlog delivered", uniqueAt("/hole", 60))
	close(stopSampling)
	<-sampled
	if m := maxSeen.Load(); m != 3 {
		t.Fatalf("lane in flight peaked at %d, want the cap 3", m)
	}
}

// TestInvariant7_MembershipCutoffAcrossReload: a subscription added later
// gets only newer events; one removed still gets what it was owed, then
// retires.
func TestInvariant7_MembershipCutoffAcrossReload(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	tb.SetMode("/old", testbed.ModeFail)
	old := sub("old", tb.URL()+"/old")
	old.Retry = fastRetry(1000)
	s := startServer(t, "", old)
	before := publish(t, s, "t", "before", 10)

	if err := s.Reload([]*delivery.Subscription{old, sub("new", tb.URL()+"/new")}); err != nil {
		t.Fatal(err)
	}
	after := publish(t, s, "t", "after", 5)
	// Remove old while its endpoint still fails: it must not lose its due.
	if err := s.Reload([]*delivery.Subscription{sub("new", tb.URL()+"/new")}); err != nil {
		t.Fatal(err)
	}
	if l := lane(s, "old"); l.State != "draining" {
		t.Fatalf("removed lane state %q", l.State)
	}
	publish(t, s, "t", "later", 5)
	tb.SetMode("/old", testbed.ModeOK)
	waitFor(t, tb, "old drained, new delivered", func(m map[string]testbed.PathStats) bool {
		return m["/old"].Unique == 15 && m["/new"].Unique == 10
	})
	got := tb.IDs("/new")
	for _, id := range before {
		if slices.Contains(got, id) {
			t.Fatalf("subscription added later received older event %s", id)
		}
	}
	oldGot := tb.IDs("/old")
	for _, id := range slices.Concat(before, after) {
		if !slices.Contains(oldGot, id) {
			t.Fatalf("removed subscription lost %s", id)
		}
	}
	if slices.ContainsFunc(oldGot, func(id string) bool { return strings.HasPrefix(id, "later") }) {
		t.Fatal("removed subscription received an event accepted after its removal")
	}
	eventually(t, "drained lane retired", func() bool { return !hasLane(s, "old") })
}

// TestInvariant3_InFlightDeliveriesRunAgainAfterRestart: deliveries
// abandoned in flight at shutdown, and the backlog behind them, are
// delivered after a restart (invariants 1 and 3).
func TestInvariant3_InFlightDeliveriesRunAgainAfterRestart(t *testing.T) {
	dir := t.TempDir()
	tb := startTestbed(t, testbed.ModeBlackhole)
	hole := sub("s", tb.URL()+"/s")
	hole.MaxConcurrency, hole.Timeout = 4, time.Minute
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: dir, Sync: true,
		Subscriptions: []*delivery.Subscription{hole}, Logger: quietLogger()})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	ids := publish(t, s, "t", "r", 20)
	eventually(t, "4 in flight", func() bool { return lane(s, "s").InFlight == 4 })
	closeServer(t, s, 50*time.Millisecond) // abandons the 4 in flight
	tb.SetMode("", testbed.ModeOK)

	startServer(t, dir, sub("s", tb.URL()+"/s"))
	waitFor(t, tb, "all after restart", uniqueAt("/s", 20))
	got := tb.IDs("/s")
	for _, id := range ids {
		if !slices.Contains(got, id) {
			t.Fatalf("lost %s across restart", id)
		}
	}
}

// TestInvariant4_AcknowledgedDeliveriesAreNotRepeated: once an ACK is
// recorded (the cursor flushed), a restart does not deliver it again.
func TestInvariant4_AcknowledgedDeliveriesAreNotRepeated(t *testing.T) {
	dir := t.TempDir()
	tb := startTestbed(t, testbed.ModeOK)
	s := startServer(t, dir, sub("s", tb.URL()+"/s"))
	publish(t, s, "t", "a", 30)
	waitFor(t, tb, "delivered", uniqueAt("/s", 30))
	eventually(t, "cursor at head", func() bool { l := lane(s, "s"); return l.Backlog == 0 && l.InFlight == 0 })
	closeServer(t, s, time.Second)

	s = startServer(t, dir, sub("s", tb.URL()+"/s"))
	publish(t, s, "t", "fresh", 1)
	waitFor(t, tb, "fresh", uniqueAt("/s", 31))
	if st := tb.Stats()["/s"]; st.Duplicates != 0 || st.Requests != 31 {
		t.Fatalf("after a clean restart: %+v, want 31 requests and no duplicates", st)
	}
}

func TestShutdownAnswers503WhileDraining(t *testing.T) {
	tb := startTestbed(t, testbed.ModeBlackhole)
	hole := sub("a", tb.URL())
	hole.Timeout = time.Minute
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(),
		Subscriptions: []*delivery.Subscription{hole}, Logger: quietLogger()})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	publish(t, s, "t", "e", 1)
	eventually(t, "in flight", func() bool { return lane(s, "a").InFlight == 1 })
	closed := make(chan struct{})
	go func() { closeServer(t, s, 2*time.Second); close(closed) }()
	eventually(t, "503 during drain", func() bool {
		req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/t", strings.NewReader("{}"))
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("post during drain: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == 503 && resp.Header.Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
		return resp.StatusCode == 503
	})
	<-closed
}

// TestCloseShutsUnusedIngestConnections: a connection a producer opened and
// never used does not hold the drain. fasthttp counts such a connection as
// idle only 5 s after it opened, so the ingest shutdown used to wait for it
// until its 2 s bound and Close failed ("ingest shutdown: context deadline
// exceeded"), which made sluice exit 1 after a clean drain. Go's Transport
// leaves such spare connections behind now and then.
func TestCloseShutsUnusedIngestConnections(t *testing.T) {
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(), Logger: quietLogger()})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(s.URL(), "http://")
	spare, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer spare.Close()
	// One acceptor takes connections in order: once a later connection is
	// answered, the spare one has been accepted and is open on the server.
	publish(t, s, "t", "e", 1)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatalf("close with an unused ingest connection open: %v", err)
	}
	spare.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := spare.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the unused connection after Close: read %d bytes, %v; want it closed", n, err)
	}
}

// TestGlobalInFlightLimitStarvesNoLane: with a process-wide limit far below
// the sum of the caps, lanes wait for slots and every event still arrives.
func TestGlobalInFlightLimitStarvesNoLane(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	var subs []*delivery.Subscription
	for i := range 5 {
		subs = append(subs, sub(fmt.Sprintf("s%d", i), fmt.Sprintf("%s/s%d", tb.URL(), i)))
	}
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(),
		Subscriptions: subs, Logger: quietLogger(), MaxInFlight: 2})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	defer closeServer(t, s, 5*time.Second)
	publish(t, s, "t", "e", 50)
	waitFor(t, tb, "every lane delivered", func(m map[string]testbed.PathStats) bool {
		for i := range 5 {
			if m[fmt.Sprintf("/s%d", i)].Unique < 50 {
				return false
			}
		}
		return true
	})
}

func TestUnixSocketIngestWithMode(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	sock := filepath.Join(t.TempDir(), "ingest.sock")
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "unix://" + sock, SocketMode: 0o600, AdminListen: "-", DataDir: t.TempDir(),
		Logger: quietLogger(), Subscriptions: []*delivery.Subscription{sub("a", tb.URL()+"/a")}})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, time.Second) })
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %v mode %v", err, fi.Mode())
	}
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Post("http://sluice/v1/events/t", "application/json", strings.NewReader(`{"via":"unix"}`))
	if err != nil || resp.StatusCode != 202 {
		t.Fatalf("post over the socket: %v %v", resp, err)
	}
	resp.Body.Close()
	waitFor(t, tb, "delivered", uniqueAt("/a", 1))
}

// TestFreedSlotPassesOnWhenAWaitingLaneIsPaused: with one process-wide
// slot, lanes that waited for it and were paused meanwhile take nothing
// when woken; the freed slot must pass on to a lane that can use it. It
// went to one woken lane only, and the active lane stalled behind paused
// ones.
func TestFreedSlotPassesOnWhenAWaitingLaneIsPaused(t *testing.T) {
	gate := make(chan struct{})
	var held atomic.Int64
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held.Add(1)
		<-gate
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	tb := startTestbed(t, testbed.ModeOK)
	subs := []*delivery.Subscription{sub("holder", slow.URL)}
	for i := range 6 {
		subs = append(subs, sub(fmt.Sprintf("p%d", i), tb.URL()+fmt.Sprintf("/p%d", i)))
	}
	subs = append(subs, sub("active", tb.URL()+"/active"))
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(),
		Subscriptions: subs, Logger: quietLogger(), MaxInFlight: 1})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	defer closeServer(t, s, 5*time.Second)
	for i := range 6 {
		if err := s.Pause(fmt.Sprintf("p%d", i), "test"); err != nil {
			t.Fatal(err)
		}
	}
	// The holder takes the one slot and holds it; the others starve.
	if err := s.Pause("active", "test"); err != nil {
		t.Fatal(err)
	}
	publish(t, s, "t", "e", 1)
	eventually(t, "the holder holds the slot", func() bool { return held.Load() == 1 })
	for i := range 6 {
		s.Resume(fmt.Sprintf("p%d", i))
	}
	s.Resume("active")
	publish(t, s, "t", "f", 20)
	eventually(t, "lanes waiting for the slot", func() bool { return lane(s, "active").Backlog > 0 })
	for i := range 6 {
		s.Pause(fmt.Sprintf("p%d", i), "paused while waiting")
	}
	s.Pause("holder", "done holding") // its finish takes nothing more
	close(gate)
	waitFor(t, tb, "the active lane delivered everything", uniqueAt("/active", 21))
}
