package proxy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
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

// Body variants, end to end: every lane of a variant gets the
// same bytes, rendered once per event, signed as received; a body that
// does not render is dead-lettered without an attempt; a replay sends the
// same bytes again; the snapshot keeps a removed subscription's variant.

// variantHit is one webhook request as the variantReceiver got it.
type variantHit struct {
	path, id, contentType, attempt string
	body                           []byte
	status                         int // the testbed's answer before the hook: 401 for a bad signature
}

// variantReceiver is a verifying testbed (testSecret) that records every request
// and answers what answer says (nil: the testbed's own answer).
type variantReceiver struct {
	*testbed.Server
	mu     sync.Mutex
	got    []variantHit
	answer atomic.Pointer[func(r variantHit) int]
}

func startVariantReceiver(t *testing.T) *variantReceiver {
	t.Helper()
	rc := &variantReceiver{}
	rc.Server = testbed.New(testbed.Options{Secrets: []signing.Secret{testSecret}, Hook: func(r testbed.Request, status int) int {
		got := variantHit{path: string(r.Path()), id: string(r.Header(signing.HeaderID)), contentType: string(r.Header("Content-Type")),
			attempt: string(r.Header("X-Attempt")), body: bytes.Clone(r.Body()), status: status}
		rc.mu.Lock()
		rc.got = append(rc.got, got)
		rc.mu.Unlock()
		if f := rc.answer.Load(); f != nil && status != http.StatusUnauthorized {
			return (*f)(got)
		}
		return status
	}})
	if err := rc.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	return rc
}

func (rc *variantReceiver) answerWith(f func(r variantHit) int) { rc.answer.Store(&f) }

// at returns the requests to path, in order.
func (rc *variantReceiver) at(path string) []variantHit {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []variantHit
	for _, r := range rc.got {
		if r.path == path {
			out = append(out, r)
		}
	}
	return out
}

func (rc *variantReceiver) all() []variantHit {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]variantHit(nil), rc.got...)
}

func mustVariant(t *testing.T, spec policy.VariantSpec) *policy.Variant {
	t.Helper()
	v, err := policy.ParseVariant(spec)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// postAs posts body with a content type, failing on any non-202.
func postAs(t *testing.T, s *proxy.Server, typ, key, contentType, body string) ingestAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/"+typ, strings.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Idempotency-Key", key)
	code, a := do(t, req)
	if code != http.StatusAccepted {
		t.Fatalf("post %s: %d %+v", key, code, a)
	}
	return a
}

// series is the value of the series of name whose labels include all of
// labels (name, value pairs); 0 when there is none.
func series(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
				}
				if !found {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func variantServer(t *testing.T, dir string, reg *prometheus.Registry, subs ...*delivery.Subscription) *proxy.Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: dir, Sync: true,
		Subscriptions: subs, Logger: quietLogger(), CursorInterval: 10 * time.Millisecond, Registry: reg})
	if err := s.Open(); err != nil {
		t.Fatalf("open server: %v", err)
	}
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })
	return s
}

// envelopeTime is the timestamp of a Standard Webhooks envelope.
func envelopeTime(t *testing.T, body []byte) time.Time {
	t.Helper()
	var env struct {
		Timestamp time.Time `json:"timestamp"`
	}
	if err := json.Unmarshal(body, &env); err != nil || env.Timestamp.IsZero() {
		t.Fatalf("no envelope timestamp in %s: %v", body, err)
	}
	return env.Timestamp
}

// TestVariantFanOutRendersOncePerVariant: 120 lanes over 3 variants (and
// 3 lanes of the stored bytes) render 3 bodies per event, not 120; every
// lane of a variant receives the same bytes, which are the variant's
// rendering of the stored body, as application/json, and verify against
// the subscription's secret; the stored bytes go out as before.
func TestVariantFanOutRendersOncePerVariant(t *testing.T) {
	specs := []policy.VariantSpec{
		{Envelope: policy.EnvelopeStandardWebhooks},
		{Fields: []string{"data.id", "data.depot"}},
		{Envelope: policy.EnvelopeStandardWebhooks, Fields: []string{"data.id"}},
	}
	const perVariant, raw, events = 40, 3, 25
	rc := startVariantReceiver(t)
	var subs []*delivery.Subscription
	variants := make([]*policy.Variant, len(specs))
	for i, spec := range specs {
		variants[i] = mustVariant(t, spec)
		for j := range perVariant {
			sb := sub(fmt.Sprintf("v%d-%d", i, j), fmt.Sprintf("%s/v%d/%d", rc.URL(), i, j))
			sb.Variant = mustVariant(t, spec) // parsed per subscription, as the config does: equal keys, not one pointer
			subs = append(subs, sb)
		}
	}
	for j := range raw {
		subs = append(subs, sub(fmt.Sprintf("raw-%d", j), fmt.Sprintf("%s/raw/%d", rc.URL(), j)))
	}
	reg := prometheus.NewRegistry()
	s := variantServer(t, "", reg, subs...)

	stored := map[string]string{}
	for i := range events {
		id := fmt.Sprintf("e-%d", i)
		stored[id] = fmt.Sprintf(`{"type":"geofence.enter","data":{"depot":"D%d","speed":%d,"id":%d,"driver":"x<&>"}}`, i%3, 40+i, i)
		postAs(t, s, "geofence.enter", id, "application/vnd.fleet+json", stored[id])
	}
	want := int64(events * len(subs))
	eventually(t, "every delivery", func() bool { return rc.Totals().Accepted >= want })

	if n := series(t, reg, "sluice_body_renders_total", "result", "ok"); n != float64(len(specs)*events) {
		t.Errorf("sluice_body_renders_total{result=ok} = %v, want %d: one per event and variant", n, len(specs)*events)
	}
	if n := series(t, reg, "sluice_body_renders_total", "result", "failed"); n != 0 {
		t.Errorf("sluice_body_renders_total{result=failed} = %v", n)
	}
	all := rc.all()
	if int64(len(all)) != want {
		t.Fatalf("%d requests, want %d", len(all), want)
	}
	sent := map[string][]byte{} // variant index / event id → the bytes every lane of it got
	for _, r := range all {
		if r.status != http.StatusOK {
			t.Fatalf("%s %s: the testbed answered %d (signature over the bytes received)", r.path, r.id, r.status)
		}
		if strings.HasPrefix(r.path, "/raw/") {
			if string(r.body) != stored[r.id] || r.contentType != "application/vnd.fleet+json" {
				t.Fatalf("%s %s: %s (%s), want the stored bytes and content type", r.path, r.id, r.body, r.contentType)
			}
			continue
		}
		vi := r.path[2] - '0'
		if r.contentType != "application/json" {
			t.Fatalf("%s: Content-Type %q", r.path, r.contentType)
		}
		k := fmt.Sprintf("%d/%s", vi, r.id)
		if prev, ok := sent[k]; ok {
			if !bytes.Equal(prev, r.body) {
				t.Fatalf("%s %s: %s, another lane of the variant got %s", r.path, r.id, r.body, prev)
			}
			continue
		}
		sent[k] = r.body
		at := time.Time{}
		if specs[vi].Envelope != "" {
			at = envelopeTime(t, r.body)
		}
		wantBody, err := variants[vi].Render("geofence.enter", at, []byte(stored[r.id]))
		if err != nil || !bytes.Equal(wantBody, r.body) {
			t.Fatalf("%s %s: got %s, want %s (%v)", r.path, r.id, r.body, wantBody, err)
		}
	}
	if len(sent) != len(specs)*events {
		t.Fatalf("%d distinct renderings received, want %d", len(sent), len(specs)*events)
	}
	for path, st := range rc.Stats() {
		if st.BadSignatures != 0 || st.Unsigned != 0 {
			t.Fatalf("%s: %d bad signatures, %d unsigned", path, st.BadSignatures, st.Unsigned)
		}
	}
}

// TestVariantFailedIsDeadLetteredWithoutAnAttempt: a body a JSON variant
// cannot render is dead-lettered with reason variant_failed, the error
// naming where it stops being JSON, without an HTTP request, and the
// dead letter keeps the stored body; the lane of the stored bytes and the
// valid events are not affected.
func TestVariantFailedIsDeadLetteredWithoutAnAttempt(t *testing.T) {
	rc := startVariantReceiver(t)
	fields := sub("fields", rc.URL()+"/fields")
	fields.Variant = mustVariant(t, policy.VariantSpec{Fields: []string{"data.id"}})
	env := sub("env", rc.URL()+"/env")
	env.Variant = mustVariant(t, policy.VariantSpec{Envelope: policy.EnvelopeStandardWebhooks})
	reg := prometheus.NewRegistry()
	s := variantServer(t, "", reg, fields, env, sub("raw", rc.URL()+"/raw"))

	bodies := []struct{ id, contentType, body, lastError string }{
		{"form", "application/x-www-form-urlencoded", "depot=A&id=1", "body variant: body is not valid JSON at its top level (byte "},
		{"broken", "application/json", `{"data":{"id":1,"depot":}}`, "body variant: body is not valid JSON at data.depot (byte 24)"},
		{"good", "application/json", `{"data":{"id":2,"depot":"B"}}`, ""},
	}
	for _, b := range bodies {
		postAs(t, s, "t", b.id, b.contentType, b.body)
	}
	waitFor(t, rc.Server, "the raw lane", uniqueAt("/raw", 3))
	eventually(t, "the dead letters", func() bool { return lane(s, "fields").DeadLettered == 2 && lane(s, "env").DeadLettered == 2 })
	// The receiver counts before its answer reaches sluice: await the ACKs.
	eventually(t, "the good event", func() bool { return lane(s, "fields").Delivered == 1 && lane(s, "env").Delivered == 1 })

	for _, id := range []string{"fields", "env"} {
		if got := rc.at("/" + id); len(got) != 1 || got[0].id != "good" {
			t.Errorf("%s received %d requests (%+v), want only the good event", id, len(got), got)
		}
		if l := lane(s, id); l.Attempts != 1 || l.Delivered != 1 {
			t.Errorf("%s: %d attempts, %d delivered; want the good event's only", id, l.Attempts, l.Delivered)
		}
		dls, err := s.DeadLetters(id, 10)
		if err != nil || len(dls) != 2 {
			t.Fatalf("%s dead letters: %v %v", id, dls, err)
		}
		for i, dl := range dls {
			b := bodies[i]
			if dl.EventID != b.id || dl.Reason != policy.ReasonVariantFailed || dl.Attempts != 0 || dl.LastStatus != 0 ||
				!strings.HasPrefix(dl.LastError, b.lastError) || string(dl.Body) != b.body || dl.Type != "t" || dl.ContentType != b.contentType || dl.AcceptedAt.IsZero() {
				t.Errorf("%s dead letter %d: %+v (body %q), want %s dead-lettered variant_failed with %q", id, i, dl, dl.Body, b.id, b.lastError)
			}
		}
		for _, metric := range []string{"sluice_lane_rejections_total", "sluice_dead_letters_total"} {
			if n := series(t, reg, metric, "subscription", id, "reason", policy.ReasonVariantFailed); n != 2 {
				t.Errorf("%s{subscription=%s,reason=variant_failed} = %v, want 2", metric, id, n)
			}
		}
		if n := series(t, reg, "sluice_delivery_attempts_total", "subscription", id, "outcome", "dead_letter"); n != 0 {
			t.Errorf("%s: %v attempts counted dead_letter, want none", id, n)
		}
	}
	if ok, failed := series(t, reg, "sluice_body_renders_total", "result", "ok"), series(t, reg, "sluice_body_renders_total", "result", "failed"); ok != 2 || failed != 4 {
		t.Errorf("renders: %v ok, %v failed; want 2 and 4", ok, failed)
	}
	st, err := s.Event("broken")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range st.Deliveries {
		if want := map[string]string{"fields": "dead_lettered", "env": "dead_lettered", "raw": "delivered"}[d.Subscription]; d.State != want {
			t.Errorf("ledger of broken: %s is %s, want %s", d.Subscription, d.State, want)
		}
	}
}

// TestVariantReplaySendsTheSameBytes: a dead letter replayed after a
// restart (the event read back from the log, rendered by another
// process) sends the bytes its first attempt sent, byte for byte, signed;
// after the subscription's variant changed, a replay renders with the
// current variant.
func TestVariantReplaySendsTheSameBytes(t *testing.T) {
	rc := startVariantReceiver(t)
	rc.answerWith(func(variantHit) int { return http.StatusNotFound }) // dead-letter at once
	spec := policy.VariantSpec{Envelope: policy.EnvelopeStandardWebhooks, Fields: []string{"data.id", "data.depot"}}
	mk := func(spec policy.VariantSpec) *delivery.Subscription {
		a := sub("a", rc.URL()+"/a")
		a.Variant = mustVariant(t, spec)
		return a
	}
	dir := t.TempDir()
	s := startAdminServer(t, dir, "", mk(spec))
	const stored = `{"data":{"id":7,"depot":"B","driver":"x"},"extra":[1,2]}`
	a := postAs(t, s, "geofence.exit", "ev-1", "application/json", stored)
	eventually(t, "dead letter", func() bool { return lane(s, "a").DeadLettered == 1 })
	first := rc.at("/a")
	if len(first) != 1 || first[0].status != http.StatusOK {
		t.Fatalf("first attempt: %+v", first)
	}
	b1 := first[0].body
	closeServer(t, s, time.Second)

	// Another process, the same variant: the same bytes.
	rc.answerWith(func(variantHit) int { return http.StatusOK })
	s = startAdminServer(t, dir, "", mk(spec))
	if r, err := s.Replay("a", a.Seq, false); err != nil || !r.Replayed {
		t.Fatalf("replay: %+v %v", r, err)
	}
	eventually(t, "the replay", func() bool { return len(rc.at("/a")) == 2 })
	replayed := rc.at("/a")[1]
	if replayed.status != http.StatusOK || !bytes.Equal(replayed.body, b1) || replayed.contentType != "application/json" {
		t.Fatalf("replay sent %s (%d, %s), the first attempt %s", replayed.body, replayed.status, replayed.contentType, b1)
	}
	if want := `{"type":"geofence.exit","timestamp":"`; !strings.HasPrefix(string(b1), want) || !strings.HasSuffix(string(b1), `"data":{"data":{"depot":"B","id":7}}}`) {
		t.Fatalf("first attempt sent %s", b1)
	}
	// The receiver counts before its answer reaches sluice: await the ACK.
	eventually(t, "the replay's ACK", func() bool {
		dls, err := s.DeadLetters("a", 1)
		return err == nil && len(dls) == 1 && !dls[0].DeliveredAt.IsZero()
	})
	closeServer(t, s, time.Second)

	// The variant changed: a replay sends what the subscription asks for now.
	now := policy.VariantSpec{Envelope: policy.EnvelopeStandardWebhooks}
	s = startAdminServer(t, dir, "", mk(now))
	if r, err := s.Replay("a", a.Seq, true); err != nil || !r.Replayed {
		t.Fatalf("forced replay: %+v %v", r, err)
	}
	eventually(t, "the second replay", func() bool { return len(rc.at("/a")) == 3 })
	b3 := rc.at("/a")[2].body
	want, err := mustVariant(t, now).Render("geofence.exit", envelopeTime(t, b1), []byte(stored))
	if err != nil || !bytes.Equal(b3, want) || rc.at("/a")[2].status != http.StatusOK {
		t.Fatalf("replay with the new variant sent %s, want %s (%v)", b3, want, err)
	}
}

// TestVariantSurvivesInTheSnapshot: a subscription removed from the
// config while it still owes events drains them with its variant after a
// restart, from the membership's snapshot.
func TestVariantSurvivesInTheSnapshot(t *testing.T) {
	rc := startVariantReceiver(t)
	gone := sub("gone", rc.URL()+"/gone")
	gone.Variant = mustVariant(t, policy.VariantSpec{Fields: []string{"n"}})
	gone.Paused = true // owes what it is sent while paused
	dir := t.TempDir()
	s := startServer(t, dir, gone)
	for i := range 3 {
		postAs(t, s, "t", fmt.Sprintf("e-%d", i), "application/json", fmt.Sprintf(`{"n":%d,"secret":"s"}`, i))
	}
	closeServer(t, s, time.Second)

	s = startServer(t, dir, sub("other", rc.URL()+"/other"))
	waitFor(t, rc.Server, "the drain", uniqueAt("/gone", 3))
	for _, r := range rc.at("/gone") {
		var i int
		fmt.Sscanf(r.id, "e-%d", &i)
		if r.status != http.StatusOK || r.contentType != "application/json" || string(r.body) != fmt.Sprintf(`{"n":%d}`, i) {
			t.Errorf("drained %s: %s (%d, %s), want the variant", r.id, r.body, r.status, r.contentType)
		}
	}
}

// TestVariantFailedOnRetry: a retry whose body the subscription's variant
// (changed by a reload since the first attempt) cannot render is
// dead-lettered variant_failed, counting the attempt made, without
// another request; its retry record is resolved.
func TestVariantFailedOnRetry(t *testing.T) {
	rc := startVariantReceiver(t)
	// 429 with Retry-After: 1 (the testbed's): the retry is due a second
	// later, whatever the jitter, long after the reload.
	rc.answerWith(func(variantHit) int { return http.StatusTooManyRequests })
	mk := func(v *policy.Variant) *delivery.Subscription {
		a := sub("a", rc.URL()+"/a")
		a.Retry = policy.RetryPolicy{MaxAttempts: 5, MaxAge: time.Hour, Backoff: policy.Backoff{Base: time.Minute, Cap: time.Minute}}
		a.Variant = v
		return a
	}
	s := startServer(t, "", mk(nil))
	postAs(t, s, "t", "plain", "text/plain", "not json")
	eventually(t, "a retry scheduled", func() bool { return lane(s, "a").Scheduled == 1 })
	if err := s.Reload([]*delivery.Subscription{mk(mustVariant(t, policy.VariantSpec{Envelope: policy.EnvelopeStandardWebhooks}))}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the dead letter", func() bool { return lane(s, "a").DeadLettered == 1 })
	dls, err := s.DeadLetters("a", 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters: %v %v", dls, err)
	}
	if dl := dls[0]; dl.Reason != policy.ReasonVariantFailed || dl.Attempts != 1 || !strings.Contains(dl.LastError, "at its top level") || string(dl.Body) != "not json" {
		t.Fatalf("dead letter %+v", dl)
	}
	if l := lane(s, "a"); l.Scheduled != 0 || l.Attempts != 1 {
		t.Fatalf("lane after: %+v", l)
	}
	if n := len(rc.at("/a")); n > 1 {
		t.Fatalf("%d requests, want the first attempt only", n)
	}
}
