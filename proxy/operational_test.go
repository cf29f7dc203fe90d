package proxy_test

// The operational webhook end to end: real lanes over a real Badger log,
// real testbed receivers that verify signatures, and the events sluice
// sends about its subscriptions.

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// opsSecret signs the operational webhook's deliveries; the subscriptions'
// endpoints use testSecret, so a receiver that verifies one refuses the
// other's.
var opsSecret = mustSecret("whsec_vcVH0CIyDrfveu79dLt4f1/8ZQB8Kjm+9C7+gfQqovU=")

// received is one accepted, correctly signed delivery.
type received struct {
	Path, ID, EventType, Attempt string
	Body                         string
	// The operational event's body, when it is one.
	Type      string         `json:"type"`
	Timestamp string         `json:"timestamp"`
	Data      map[string]any `json:"data"`
}

func (r received) subscription() string { s, _ := r.Data["subscription"].(string); return s }

// recorder is a testbed that verifies signatures with one secret and
// keeps every delivery it accepted, once per path and webhook-id.
type recorder struct {
	tb *testbed.Server
	// refuse, while positive, is a status answered instead of accepting
	// (the endpoint is down); failNext answers that many requests 503.
	refuse   atomic.Int64
	failNext atomic.Int64

	mu   sync.Mutex
	got  []received
	seen map[string]bool
}

func newRecorder(t *testing.T, secret signing.Secret) *recorder {
	t.Helper()
	r := &recorder{seen: map[string]bool{}}
	r.tb = testbed.New(testbed.Options{Secrets: []signing.Secret{secret}, Hook: r.hook})
	if err := r.tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.tb.Close() })
	return r
}

func (r *recorder) hook(req testbed.Request, status int) int {
	if status/100 != 2 {
		return status // a bad signature (401), or the mode's failure
	}
	if s := r.refuse.Load(); s > 0 {
		return int(s)
	}
	if r.failNext.Add(-1) >= 0 {
		return http.StatusServiceUnavailable
	}
	d := received{Path: string(req.Path()), ID: string(req.Header("webhook-id")),
		EventType: string(req.Header("X-Event-Type")), Attempt: string(req.Header("X-Attempt")), Body: string(req.Body())}
	json.Unmarshal(req.Body(), &d) // a producer's body may be anything
	r.mu.Lock()
	defer r.mu.Unlock()
	if k := d.Path + " " + d.ID; !r.seen[k] {
		r.seen[k] = true
		r.got = append(r.got, d)
	}
	return status
}

func (r *recorder) url(path string) string { return r.tb.URL() + path }

// all returns the deliveries accepted on path, in order of arrival.
func (r *recorder) all(path string) []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []received
	for _, d := range r.got {
		if d.Path == path {
			out = append(out, d)
		}
	}
	return out
}

// events returns the operational events of typ about sub.
func (r *recorder) events(typ, sub string) []received {
	var out []received
	for _, d := range r.all("/ops") {
		if d.Type == typ && d.subscription() == sub {
			out = append(out, d)
		}
	}
	return out
}

// await waits for an operational event of typ about sub for which match
// (nil: any) holds, and returns it.
func (r *recorder) await(t *testing.T, typ, sub string, match func(received) bool) received {
	t.Helper()
	var found received
	eventually(t, typ+" about "+sub, func() bool {
		for _, d := range r.events(typ, sub) {
			if match == nil || match(d) {
				found = d
				return true
			}
		}
		return false
	})
	return found
}

// opsWebhook is the operational webhook at r's /ops, retrying quickly.
func opsWebhook(r *recorder) *delivery.Subscription {
	return &delivery.Subscription{URL: r.url("/ops"), Secrets: []signing.Secret{opsSecret}, Timeout: 2 * time.Second, Retry: fastRetry(5)}
}

// checkOpsBodies fails if an operational event names an endpoint or a
// secret, or came unsigned, or is not the Standard Webhooks shape.
func checkOpsBodies(t *testing.T, r *recorder, urls ...string) {
	t.Helper()
	for _, d := range r.all("/ops") {
		if strings.Contains(d.Body, "://") || strings.Contains(d.Body, "whsec_") {
			t.Errorf("operational event %s carries a URL or a secret: %s", d.ID, d.Body)
		}
		for _, u := range urls {
			if pu, err := url.Parse(u); err == nil && strings.Contains(d.Body, pu.Host) {
				t.Errorf("operational event %s names the endpoint's host %s: %s", d.ID, pu.Host, d.Body)
			}
		}
		if _, err := time.Parse(time.RFC3339, d.Timestamp); err != nil || d.Type != d.EventType || d.subscription() == "" {
			t.Errorf("operational event %s: type %q (header %q), timestamp %q, data %v", d.ID, d.Type, d.EventType, d.Timestamp, d.Data)
		}
	}
	if st := r.tb.Stats()["/ops"]; st.BadSignatures != 0 || st.Unsigned != 0 {
		t.Errorf("operational endpoint saw %d bad and %d unsigned requests", st.BadSignatures, st.Unsigned)
	}
}

// counter is the value of a counter series in reg (0 when absent).
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
			if label == "" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestOperationalPaused: a 410 pauses a subscription and an operator
// pauses another; the operational endpoint receives a signed
// subscription.paused for each, naming the subscription, never its URL.
func TestOperationalPaused(t *testing.T) {
	ops := newRecorder(t, opsSecret)
	gone, asked, _ := scripted(t, func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusGone) })
	ep := startTestbed(t, testbed.ModeOK)
	reg := prometheus.NewRegistry()
	// One delivery at a time, so that exactly one meets the 410: with
	// more in flight, how many the endpoint answers before the pause
	// depends on how fast the publishes outrun the first answer, and
	// each answered 410 is a dead letter of its own.
	goneSub := sub("gone", gone.URL)
	goneSub.MaxConcurrency = 1
	s := startServerWith(t, proxy.Options{Registry: reg, OperationalWebhook: opsWebhook(ops),
		Subscriptions: []*delivery.Subscription{goneSub, sub("other", ep.URL()+"/other")}})
	ids := publish(t, s, "t", "e", 3)

	ev := ops.await(t, "subscription.paused", "gone", nil)
	if ev.Data["reason"] != policy.PauseGone || ev.Data["paused_by"] != "endpoint" {
		t.Fatalf("paused by the 410: %s", ev.Body)
	}
	dl := ops.await(t, "dead_letter.created", "gone", nil)
	first, err := s.Event(ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if dl.Data["count"] != 1.0 || dl.Data["reasons"].(map[string]any)["gone"] != 1.0 || dl.Data["last_status"] != 410.0 ||
		dl.Data["first_seq"] != float64(first.Seq) || dl.Data["last_seq"] != float64(first.Seq) {
		t.Fatalf("dead letter of the 410 to %s (seq %d): %s", ids[0], first.Seq, dl.Body)
	}
	if err := s.Pause("other", "maintenance until 14:00"); err != nil {
		t.Fatal(err)
	}
	ev = ops.await(t, "subscription.paused", "other", nil)
	if ev.Data["reason"] != "maintenance until 14:00" || ev.Data["paused_by"] != "operator" || ev.EventType != "subscription.paused" {
		t.Fatalf("paused by an operator: %s (X-Event-Type %s)", ev.Body, ev.EventType)
	}
	checkOpsBodies(t, ops, gone.URL, ep.URL())
	// The pause holds the other two: never sent, so never dead letters.
	if l := lane(s, "gone"); len(*asked) != 1 || l.DeadLettered != 1 {
		t.Fatalf("the paused endpoint was asked %d times and %d events dead-lettered, want 1 each", len(*asked), l.DeadLettered)
	}
	if n := counter(t, reg, "sluice_operational_events_total", "type", "subscription.paused"); n != 2 {
		t.Fatalf("sluice_operational_events_total{type=subscription.paused} = %v, want 2", n)
	}
	if n := counter(t, reg, "sluice_operational_events_dropped_total", "", ""); n != 0 {
		t.Fatalf("%v operational events dropped", n)
	}
}

// TestOperationalBreaker: a failing endpoint opens its subscription's
// breaker (breaker_opened, once, however often its probes fail), and
// once it heals a probe closes it (breaker_closed).
func TestOperationalBreaker(t *testing.T) {
	ops := newRecorder(t, opsSecret)
	ep := startTestbed(t, testbed.ModeOK)
	ep.SetMode("/bad", testbed.ModeFail)
	bad := sub("bad", ep.URL()+"/bad")
	bad.Breaker = fastBreaker
	bad.Retry = policy.RetryPolicy{MaxAttempts: 1000, MaxAge: time.Hour, Backoff: policy.Backoff{Base: 5 * time.Millisecond, Cap: 20 * time.Millisecond}}
	s := startServerWith(t, proxy.Options{OperationalWebhook: opsWebhook(ops), Subscriptions: []*delivery.Subscription{bad}})
	publish(t, s, "t", "e", 10)

	opened := ops.await(t, "subscription.breaker_opened", "bad", nil)
	if opened.Data["state"] != "open" || opened.Data["last_status"] != 500.0 {
		t.Fatalf("breaker_opened: %s", opened.Body)
	}
	// Let a few probes fail: a re-open is no news.
	eventually(t, "probes failed", func() bool { return ep.Stats()["/bad"].Requests >= 8 })
	ep.SetMode("/bad", testbed.ModeOK)
	closed := ops.await(t, "subscription.breaker_closed", "bad", nil)
	if closed.Data["state"] != "closed" {
		t.Fatalf("breaker_closed: %s", closed.Body)
	}
	waitFor(t, ep, "the backlog delivered after the heal", uniqueAt("/bad", 10))
	if o, c := len(ops.events("subscription.breaker_opened", "bad")), len(ops.events("subscription.breaker_closed", "bad")); o != 1 || c != 1 {
		t.Fatalf("%d breaker_opened and %d breaker_closed, want one each", o, c)
	}
	if !(opened.Timestamp <= closed.Timestamp) {
		t.Fatalf("opened at %s, closed at %s", opened.Timestamp, closed.Timestamp)
	}
	checkOpsBodies(t, ops, ep.URL())
}

// TestOperationalDeadLettersCoalesced: 50 dead letters within a minute
// make one dead_letter.created at once and one summary when the minute
// (of the injected clock) ends; their counts add up to 50.
func TestOperationalDeadLettersCoalesced(t *testing.T) {
	clk := newStepClock(0)
	ops := newRecorder(t, opsSecret)
	rej, _, _ := scripted(t, func(n int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadRequest) })
	rejecting := sub("rej", rej.URL)
	rejecting.MaxConcurrency = 1 // dead letters in seq order, for the seqs below
	s := startServerWith(t, proxy.Options{Now: clk.Now, OperationalWebhook: opsWebhook(ops),
		Subscriptions: []*delivery.Subscription{rejecting}})
	ids := publish(t, s, "t", "e", 50)
	eventually(t, "50 dead letters", func() bool { return lane(s, "rej").DeadLettered == 50 })
	ops.await(t, "dead_letter.created", "rej", nil) // the first, at once
	clk.Step(time.Minute + time.Second)             // the window ends

	total := func() (n float64) {
		for _, d := range ops.events("dead_letter.created", "rej") {
			n += d.Data["count"].(float64)
		}
		return n
	}
	eventually(t, "dead letters counted", func() bool { return total() >= 50 })
	evs := ops.events("dead_letter.created", "rej")
	if n := total(); n != 50 || len(evs) > 2 {
		t.Fatalf("%d events counting %v dead letters, want at most 2 counting 50", len(evs), n)
	}
	for _, d := range evs {
		if r := d.Data["reasons"].(map[string]any); len(r) != 1 || r["rejected"] != d.Data["count"] || d.Data["last_status"] != 400.0 {
			t.Fatalf("dead_letter.created %s", d.Body)
		}
	}
	// The operational events take seqs among the producer's: ask the log.
	seqOf := func(id string) float64 {
		st, err := s.Event(id)
		if err != nil {
			t.Fatal(err)
		}
		return float64(st.Seq)
	}
	if first, last := evs[0].Data["first_seq"], evs[len(evs)-1].Data["last_seq"]; first != seqOf(ids[0]) || last != seqOf(ids[49]) {
		t.Fatalf("seqs %v..%v, want those of the first and the last event", first, last)
	}
	checkOpsBodies(t, ops, rej.URL)
}

// TestOperationalBacklogQuota: events the backlog quota dead-letters at
// a black hole are reported as backlog_quota.exceeded with their count,
// not one dead_letter.created each.
func TestOperationalBacklogQuota(t *testing.T) {
	ops := newRecorder(t, opsSecret)
	ep := startTestbed(t, testbed.ModeOK)
	ep.SetMode("/hole", testbed.ModeBlackhole)
	hole := sub("hole", ep.URL()+"/hole")
	hole.MaxConcurrency, hole.Timeout = 2, time.Minute
	hole.Backlog = delivery.BacklogQuota{MaxEvents: 3}
	s := startServerWith(t, proxy.Options{OperationalWebhook: opsWebhook(ops), Subscriptions: []*delivery.Subscription{hole}})
	publish(t, s, "t", "e", 10)
	eventually(t, "quota enforced", func() bool { return lane(s, "hole").QuotaDropped == 5 })
	total := func() (n float64) {
		for _, d := range ops.events("backlog_quota.exceeded", "hole") {
			n += d.Data["count"].(float64)
		}
		return n
	}
	eventually(t, "the rejections reported", func() bool { return total() >= 5 })
	ev := ops.events("backlog_quota.exceeded", "hole")[0]
	if n := total(); n != 5 || ev.Data["max_events"] != 3.0 {
		t.Fatalf("backlog_quota.exceeded counting %v, want 5: %s", n, ev.Body)
	}
	if d := ops.events("dead_letter.created", "hole"); len(d) != 0 {
		t.Fatalf("quota rejections also reported as dead_letter.created: %s", d[0].Body)
	}
	ep.SetMode("/hole", testbed.ModeOK)
	ep.Release() // the held requests end, and their retries are answered
	checkOpsBodies(t, ops, ep.URL())
}

// TestOperationalNotForOtherSubscriptions: a subscription for every type
// ("*"), one listing operational types exactly and one with a pattern
// over them never receive operational events, whether a lane keeps up
// (events from memory) or reads its backlog from the log after a
// restart; the ledger lists only the operational subscription for them.
func TestOperationalNotForOtherSubscriptions(t *testing.T) {
	ops := newRecorder(t, opsSecret)
	ep := newRecorder(t, testSecret)
	dir := t.TempDir()
	subs := func() []*delivery.Subscription {
		return []*delivery.Subscription{
			sub("all", ep.url("/all")),
			sub("exact", ep.url("/exact"), "subscription.paused", "dead_letter.created", "t"),
			sub("pattern", ep.url("/pattern"), "subscription.*", "t"),
			sub("victim", ep.url("/victim")),
		}
	}
	open := func() *proxy.Server {
		return startServerWith(t, proxy.Options{DataDir: dir, OperationalWebhook: opsWebhook(ops), Subscriptions: subs()})
	}
	s := open()
	// Keeping up: the lanes see the operational event in the ring.
	if err := s.Pause("victim", "first"); err != nil {
		t.Fatal(err)
	}
	first := ops.await(t, "subscription.paused", "victim", nil)
	publish(t, s, "t", "a", 3)
	waitFor(t, ep.tb, "the producer's events", func(m map[string]testbed.PathStats) bool {
		return m["/all"].Unique >= 3 && m["/exact"].Unique >= 3 && m["/pattern"].Unique >= 3
	})
	// Behind: paused, so the operational events about them wait in the
	// log; after a restart the ring is empty and they read the log.
	for _, id := range []string{"all", "exact", "pattern"} {
		if err := s.Pause(id, "hold"); err != nil {
			t.Fatal(err)
		}
	}
	var later []received
	for _, id := range []string{"all", "exact", "pattern"} {
		later = append(later, ops.await(t, "subscription.paused", id, nil))
	}
	publish(t, s, "t", "b", 2)
	closeServer(t, s, 5*time.Second)
	s = open()
	for _, id := range []string{"all", "exact", "pattern"} {
		if err := s.Resume(id); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, ep.tb, "the backlog", func(m map[string]testbed.PathStats) bool {
		return m["/all"].Unique >= 5 && m["/exact"].Unique >= 5 && m["/pattern"].Unique >= 5
	})
	for _, opsEv := range append(later, first) {
		st, err := s.Event(opsEv.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Deliveries) != 1 || st.Deliveries[0].Subscription != delivery.OperationalID {
			t.Fatalf("ledger of operational event %s: %+v, want the operational subscription alone", opsEv.ID, st.Deliveries)
		}
		eventually(t, "the lanes past the operational event", func() bool {
			for _, id := range []string{"all", "exact", "pattern"} {
				if lane(s, id).Cursor < st.Seq {
					return false
				}
			}
			return true
		})
	}
	for _, path := range []string{"/all", "/exact", "/pattern"} {
		for _, d := range ep.all(path) {
			if d.EventType != "t" {
				t.Errorf("%s received an event of type %s: %s", path, d.EventType, d.Body)
			}
		}
	}
}

// TestOperationalTypesReservedAtIngest: a producer may not post an event
// of an operational type, configured or not; the 400 names the type.
func TestOperationalTypesReservedAtIngest(t *testing.T) {
	s := startServer(t, "")
	for _, typ := range []string{"subscription.paused", "subscription.breaker_opened", "subscription.breaker_closed", "dead_letter.created", "backlog_quota.exceeded"} {
		code, a := post(t, s, typ, "", "{}")
		if code != http.StatusBadRequest || !strings.Contains(a.Error, typ) || !strings.Contains(a.Error, "reserved for sluice's operational webhook") {
			t.Errorf("POST %s: %d %q, want 400 naming the type as reserved", typ, code, a.Error)
		}
	}
	if code, _ := post(t, s, "subscription.paused.v2", "", "{}"); code != http.StatusAccepted {
		t.Errorf("POST subscription.paused.v2: %d, want 202: only the exact types are reserved", code)
	}
}

// TestOperationalEndpointDown: the operational endpoint failing (503) is
// retried by its lane like any endpoint; failing for good, its lane
// dead-letters and trips its breaker, and sluice sends nothing about the
// operational subscription itself.
func TestOperationalEndpointDown(t *testing.T) {
	ops := newRecorder(t, opsSecret)
	ep := startTestbed(t, testbed.ModeOK)
	hook := opsWebhook(ops)
	hook.Retry = fastRetry(3)
	hook.Breaker = fastBreaker
	reg := prometheus.NewRegistry()
	s := startServerWith(t, proxy.Options{Registry: reg, OperationalWebhook: hook, Subscriptions: []*delivery.Subscription{sub("x", ep.URL()+"/x")}})

	ops.failNext.Store(2)
	if err := s.Pause("x", "r1"); err != nil {
		t.Fatal(err)
	}
	if ev := ops.await(t, "subscription.paused", "x", nil); ev.Attempt != "3" {
		t.Fatalf("delivered at attempt %s, want 3 (two 503s retried)", ev.Attempt)
	}

	ops.refuse.Store(http.StatusServiceUnavailable)
	for _, reason := range []string{"r2", "r3", "r4", "r5", "r6", "r7"} {
		if err := s.Pause("x", reason); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the operational lane dead-letters, its breaker open", func() bool {
		l := lane(s, delivery.OperationalID)
		return l.DeadLettered > 0 && l.Breaker != "closed"
	})
	ops.refuse.Store(0)
	if err := s.Pause("x", "final"); err != nil {
		t.Fatal(err)
	}
	ops.await(t, "subscription.paused", "x", func(d received) bool { return d.Data["reason"] == "final" })
	eventually(t, "the operational lane settled", func() bool {
		l := lane(s, delivery.OperationalID)
		return l.InFlight == 0 && l.Scheduled == 0 && l.Backlog == 0
	})
	for _, d := range ops.all("/ops") {
		if d.subscription() == delivery.OperationalID {
			t.Errorf("an event about the operational subscription itself: %s", d.Body)
		}
	}
	for _, typ := range []string{"dead_letter.created", "subscription.breaker_opened", "subscription.breaker_closed"} {
		if n := counter(t, reg, "sluice_operational_events_total", "type", typ); n != 0 {
			t.Errorf("%v %s events appended; the only failures were the operational endpoint's own", n, typ)
		}
	}
	checkOpsBodies(t, ops, ep.URL())
}

// TestOperationalSurvivesReload: a reload of the file's subscriptions
// never removes the operational webhook, and a file may not use its id.
func TestOperationalSurvivesReload(t *testing.T) {
	ops := newRecorder(t, opsSecret)
	ep := startTestbed(t, testbed.ModeOK)
	s := startServerWith(t, proxy.Options{OperationalWebhook: opsWebhook(ops), Subscriptions: []*delivery.Subscription{sub("a", ep.URL()+"/a")}})
	if err := s.Reload([]*delivery.Subscription{sub("b", ep.URL()+"/b")}); err != nil {
		t.Fatal(err)
	}
	if l := lane(s, delivery.OperationalID); l.State != "active" || l.ManagedBy != api.ManagedByFile || l.Tenant != "" {
		t.Fatalf("operational lane after a reload: %+v", l)
	}
	if err := s.Reload([]*delivery.Subscription{sub(delivery.OperationalID, ep.URL()+"/c")}); err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("reload naming %s: %v, want refused as reserved", delivery.OperationalID, err)
	}
	if err := s.Pause("b", "after the reload"); err != nil {
		t.Fatal(err)
	}
	ops.await(t, "subscription.paused", "b", nil)
}
