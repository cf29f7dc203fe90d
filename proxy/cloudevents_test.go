package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/signing"
)

// CloudEvents deliveries, end to end, read by a receiver built on the
// official CloudEvents Go SDK: an event posted plainly arrives with derived
// attributes, one posted as a CloudEvent with its own (its original id,
// not the log's key), in binary and in structured mode, each request
// verified with the Standard Webhooks signature beside it (sluice's
// verifier and the official library), on both log backends; body
// variants, retries and replays carry the same attributes and bytes.

// ceSource is the configured source of the tests' derived events.
const ceSource = "//fleet.example.com/sluice"

// ceHit is one request as the ceReceiver got it.
type ceHit struct {
	path, webhookID, attempt, replay, contentType string
	body                                          []byte
	header                                        http.Header
	mode                                          binding.Encoding
	event                                         *cloudevent.Event // nil when the SDK found no CloudEvent
	sdkErr                                        error
}

// ceReceiver is an endpoint built as a Go receiver of sluice's
// CloudEvents deliveries is: it checks the Standard Webhooks signature of
// the body as received, then hands the request to the CloudEvents SDK's
// HTTP binding.
type ceReceiver struct {
	*httptest.Server
	mu     sync.Mutex
	got    []ceHit
	answer func(h ceHit) int // nil: 200
}

func startCEReceiver(t *testing.T) *ceReceiver {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(testSecret.Encode())
	if err != nil {
		t.Fatal(err)
	}
	rc := &ceReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		// Both verifiers, over the bytes received: sluice's and the
		// official library's.
		if err := signing.Verify([]signing.Secret{testSecret}, r.Header.Get(signing.HeaderID), r.Header.Get(signing.HeaderTimestamp),
			r.Header.Get(signing.HeaderSignature), body, time.Now(), signing.DefaultTolerance); err != nil {
			t.Errorf("%s: signature: %v", r.URL.Path, err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if err := wh.Verify(body, r.Header); err != nil {
			t.Errorf("%s: the official Standard Webhooks library: %v", r.URL.Path, err)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		msg := cehttp.NewMessageFromHttpRequest(r)
		h := ceHit{path: r.URL.Path, webhookID: r.Header.Get(signing.HeaderID), attempt: r.Header.Get("X-Attempt"),
			replay: r.Header.Get(delivery.HeaderReplay), contentType: r.Header.Get("Content-Type"), body: body,
			header: r.Header.Clone(), mode: msg.ReadEncoding()}
		h.event, h.sdkErr = binding.ToEvent(r.Context(), msg)
		if h.sdkErr == nil {
			h.sdkErr = h.event.Validate()
		}
		rc.mu.Lock()
		rc.got = append(rc.got, h)
		answer := rc.answer
		rc.mu.Unlock()
		status := http.StatusOK
		if answer != nil {
			status = answer(h)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *ceReceiver) answerWith(f func(h ceHit) int) {
	rc.mu.Lock()
	rc.answer = f
	rc.mu.Unlock()
}

// at returns the requests to path, in order.
func (rc *ceReceiver) at(path string) []ceHit {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []ceHit
	for _, h := range rc.got {
		if h.path == path {
			out = append(out, h)
		}
	}
	return out
}

// byID returns the requests to path of the event webhookID, in order.
func (rc *ceReceiver) byID(path, webhookID string) []ceHit {
	var out []ceHit
	for _, h := range rc.at(path) {
		if h.webhookID == webhookID {
			out = append(out, h)
		}
	}
	return out
}

func ceSub(id, url, format string) *delivery.Subscription {
	s := sub(id, url)
	s.Format = format
	return s
}

// wantCE checks that h is a CloudEvent in mode with these attributes and
// data, read by the SDK.
func wantCE(t *testing.T, h ceHit, mode binding.Encoding, id, source, typ, contentType string, data []byte) {
	t.Helper()
	if h.sdkErr != nil || h.event == nil {
		t.Fatalf("%s %s: the SDK reads no CloudEvent: %v (Content-Type %s, body %s)", h.path, h.webhookID, h.sdkErr, h.contentType, h.body)
	}
	ev := h.event
	if h.mode != mode {
		t.Errorf("%s %s: %v mode, want %v", h.path, h.webhookID, h.mode, mode)
	}
	if ev.SpecVersion() != "1.0" || ev.ID() != id || ev.Source() != source || ev.Type() != typ || ev.DataContentType() != contentType {
		t.Errorf("%s %s: the SDK reads specversion %q, id %q, source %q, type %q, datacontenttype %q; want 1.0, %q, %q, %q, %q",
			h.path, h.webhookID, ev.SpecVersion(), ev.ID(), ev.Source(), ev.Type(), ev.DataContentType(), id, source, typ, contentType)
	}
	if !bytes.Equal(ev.Data(), data) {
		t.Errorf("%s %s: data %q, want %q", h.path, h.webhookID, ev.Data(), data)
	}
}

// TestCloudEventsDerived: events posted plainly reach binary and
// structured subscriptions as CloudEvents the SDK reads, with the derived
// attributes (id the event id, type, the configured source, time the
// acceptance), the data as stored (JSON as JSON, other bytes base64 in
// structured mode) or as the subscription's body variant; a retry carries
// the same attributes and bytes; the Standard Webhooks subscription
// beside them gets the stored bytes and no ce- header; every request
// verifies.
func TestCloudEventsDerived(t *testing.T) {
	rc := startCEReceiver(t)
	fields := mustVariant(t, policy.VariantSpec{Fields: []string{"data.id"}})
	binVariant := ceSub("bin-fields", rc.URL+"/bin-fields", delivery.FormatCloudEventsBinary)
	binVariant.Variant = fields
	strVariant := ceSub("str-fields", rc.URL+"/str-fields", delivery.FormatCloudEventsStructured)
	strVariant.Variant = mustVariant(t, policy.VariantSpec{Fields: []string{"data.id"}})
	subs := []*delivery.Subscription{
		ceSub("std", rc.URL+"/std", ""),
		ceSub("bin", rc.URL+"/bin", delivery.FormatCloudEventsBinary),
		ceSub("str", rc.URL+"/str", delivery.FormatCloudEventsStructured),
		binVariant, strVariant,
	}
	// The structured lane's first attempt of each event fails: its retry
	// must send the same bytes.
	rc.answerWith(func(h ceHit) int {
		if h.path == "/str" && h.attempt == "1" {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(),
		Subscriptions: subs, Logger: quietLogger(), CursorInterval: 10 * time.Millisecond, CloudEventsSource: ceSource})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })

	events := []struct{ id, typ, contentType, body string }{
		{"ev-json", "geofence.enter", "application/json", `{"data":{"id":7,"depot":"B"}}`},
		{"ev-vnd", "geofence.exit", "application/vnd.fleet+json", `{"data":{"id":8}}`},
		{"ev-text", "note.added", "text/plain; charset=utf-8", "depot B, \"gate\" 3\n"},
	}
	before := time.Now()
	for _, e := range events {
		postAs(t, s, e.typ, e.id, e.contentType, e.body)
	}
	after := time.Now()
	eventually(t, "every delivery", func() bool {
		for _, sb := range subs {
			l := lane(s, sb.ID)
			if sb.Variant == nil && l.Delivered != uint64(len(events)) {
				return false
			}
			// The text body is no JSON: a variant cannot render it.
			if sb.Variant != nil && (l.Delivered != uint64(len(events)-1) || l.DeadLettered != 1) {
				return false
			}
		}
		return true
	})

	for _, e := range events {
		std := rc.byID("/std", e.id)
		if len(std) != 1 || string(std[0].body) != e.body || std[0].contentType != e.contentType {
			t.Fatalf("std %s: %+v", e.id, std)
		}
		for name := range std[0].header {
			if strings.HasPrefix(strings.ToLower(name), "ce-") {
				t.Errorf("std %s: header %s on a Standard Webhooks delivery", e.id, name)
			}
		}
		if std[0].sdkErr == nil {
			t.Errorf("std %s: the SDK reads a CloudEvent in a Standard Webhooks delivery: %v", e.id, std[0].event)
		}

		bin := rc.byID("/bin", e.id)
		if len(bin) != 1 {
			t.Fatalf("bin %s: %d requests", e.id, len(bin))
		}
		wantCE(t, bin[0], binding.EncodingBinary, e.id, ceSource, e.typ, e.contentType, []byte(e.body))
		if string(bin[0].body) != e.body {
			t.Errorf("bin %s: body %q, want the stored bytes", e.id, bin[0].body)
		}
		at := bin[0].event.Time()
		if at.Before(before) || at.After(after) || at.Location() != time.UTC {
			t.Errorf("bin %s: time %v, want the acceptance, between %v and %v, in UTC", e.id, at, before, after)
		}

		str := rc.byID("/str", e.id)
		if len(str) != 2 || str[0].attempt != "1" || str[1].attempt != "2" || !bytes.Equal(str[0].body, str[1].body) {
			t.Fatalf("str %s: %d requests, want a failed first attempt and a retry of the same bytes: %+v", e.id, len(str), str)
		}
		data := []byte(e.body)
		wantCE(t, str[1], binding.EncodingStructured, e.id, ceSource, e.typ, e.contentType, data)
		if str[1].contentType != cloudevents.ContentTypeStructured || !str[1].event.Time().Equal(at) {
			t.Errorf("str %s: Content-Type %s, time %v; want %s and the binary delivery's %v", e.id, str[1].contentType, str[1].event.Time(), cloudevents.ContentTypeStructured, at)
		}
		// JSON data stays JSON; other data, and +json types the SDK
		// would misread, go base64.
		if wantRaw := e.contentType == "application/json"; strings.Contains(string(str[1].body), `"data":`+e.body) != wantRaw ||
			strings.Contains(string(str[1].body), `"data_base64":`) == wantRaw {
			t.Errorf("str %s: %s", e.id, str[1].body)
		}

		// Variants: the fields of a JSON body, application/json; a body
		// that is no JSON cannot be rendered for them.
		if e.id == "ev-text" {
			continue
		}
		want, err := fields.Render(e.typ, time.Time{}, []byte(e.body))
		if err != nil {
			t.Fatal(err)
		}
		bv := rc.byID("/bin-fields", e.id)
		if len(bv) != 1 {
			t.Fatalf("bin-fields %s: %d requests", e.id, len(bv))
		}
		wantCE(t, bv[0], binding.EncodingBinary, e.id, ceSource, e.typ, "application/json", want)
		sv := rc.byID("/str-fields", e.id)
		if len(sv) != 1 {
			t.Fatalf("str-fields %s: %d requests", e.id, len(sv))
		}
		wantCE(t, sv[0], binding.EncodingStructured, e.id, ceSource, e.typ, "application/json", want)
		if !strings.HasSuffix(string(sv[0].body), `,"datacontenttype":"application/json","data":`+string(want)+`}`) {
			t.Errorf("str-fields %s: %s", e.id, sv[0].body)
		}
	}
}

// ceServer opens a sidecar over dir with the default CloudEvents source.
func ceServer(t *testing.T, dir string, subs ...*delivery.Subscription) *proxy.Server {
	t.Helper()
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: dir,
		Subscriptions: subs, Logger: quietLogger(), CursorInterval: 10 * time.Millisecond})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })
	return s
}

// postedAttrs are the attributes of an event posted as a CloudEvent, as
// the log keeps them (the required ones, then the others by name):
// extensions of each JSON type among them.
const postedAttrs = `{"specversion":"1.0","id":"order-7","source":"https://shop.example/orders","type":"order.created",` +
	`"dataschema":"https://shop.example/schemas/order","priority":3,"region":"eu-west","subject":"orders/7","time":"2026-03-04T05:06:07.5Z","traced":true}`

// postedEvent is what the log keeps of the CloudEvent postCloudEvent
// posts: its id is the log's key of the CloudEvent, not its id.
func postedEvent() *queue.Event {
	return &queue.Event{ID: cloudevents.Key("https://shop.example/orders", "order-7"), Type: "order.created", ContentType: "application/json",
		Body: []byte(`{"order":7,"total":"12.50"}`), CloudEvent: postedAttrs}
}

// postCloudEvent posts postedEvent as a producer would: in structured
// mode, to POST /v1/events.
func postCloudEvent(t *testing.T, s *proxy.Server) {
	t.Helper()
	ev := postedEvent()
	body := postedAttrs[:len(postedAttrs)-1] + `,"datacontenttype":"application/json","data":` + string(ev.Body) + `}`
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/cloudevents+json")
	if code, a := do(t, req); code != http.StatusAccepted || a.ID != ev.ID {
		t.Fatalf("posting the CloudEvent: %d %+v", code, a)
	}
}

// checkPosted checks the deliveries of postedEvent to the bin and str
// subscriptions: the attributes as posted, its original id, the log's key
// as webhook-id.
func checkPosted(t *testing.T, bin, str ceHit) {
	t.Helper()
	ev := postedEvent()
	for _, h := range []ceHit{bin, str} {
		if h.webhookID != ev.ID {
			t.Errorf("%s: webhook-id %s, want the log's key %s", h.path, h.webhookID, ev.ID)
		}
	}
	wantCE(t, bin, binding.EncodingBinary, "order-7", "https://shop.example/orders", "order.created", "application/json", ev.Body)
	wantCE(t, str, binding.EncodingStructured, "order-7", "https://shop.example/orders", "order.created", "application/json", ev.Body)
	wantTime := time.Date(2026, 3, 4, 5, 6, 7, 500_000_000, time.UTC)
	for _, h := range []ceHit{bin, str} {
		e := h.event
		if e == nil {
			return
		}
		if e.Subject() != "orders/7" || !e.Time().Equal(wantTime) || e.DataSchema() != "https://shop.example/schemas/order" ||
			fmt.Sprint(e.Extensions()["priority"]) != "3" || fmt.Sprint(e.Extensions()["traced"]) != "true" || e.Extensions()["region"] != "eu-west" {
			t.Errorf("%s: the SDK reads %s", h.path, e)
		}
	}
	// Binary mode: one header per attribute, numbers and booleans as text.
	for name, want := range map[string]string{"Ce-Priority": "3", "Ce-Traced": "true", "Ce-Subject": "orders/7", "Ce-Id": "order-7"} {
		if got := bin.header.Get(name); got != want {
			t.Errorf("bin: %s = %q, want %q", name, got, want)
		}
	}
	// Structured mode: the attributes as the log keeps them, spliced.
	if want := postedAttrs[:len(postedAttrs)-1] + `,"datacontenttype":"application/json","data":` + string(ev.Body) + `}`; string(str.body) != want {
		t.Errorf("str body\n got %s\nwant %s", str.body, want)
	}
}

// TestCloudEventsPosted: an event kept with the attributes it was posted
// with reaches binary and structured subscriptions with them (its own
// id, source, subject, time, dataschema and extensions), and a plain event
// beside it with derived ones under the default source, on both log
// backends.
func TestCloudEventsPosted(t *testing.T) {
	for _, backend := range []string{"badger", "jetstream"} {
		t.Run(backend, func(t *testing.T) {
			rc := startCEReceiver(t)
			subs := []*delivery.Subscription{
				ceSub("bin", rc.URL+"/bin", delivery.FormatCloudEventsBinary),
				ceSub("str", rc.URL+"/str", delivery.FormatCloudEventsStructured),
			}
			var s *proxy.Server
			if backend == "badger" {
				s = ceServer(t, t.TempDir(), subs...)
			} else {
				s = newFleet(t).node("n1", subs...)
			}
			postCloudEvent(t, s)
			postAs(t, s, "geofence.enter", "plain-1", "application/json", `{"id":1}`)
			eventually(t, "the deliveries", func() bool { return lane(s, "bin").Delivered == 2 && lane(s, "str").Delivered == 2 })

			key := postedEvent().ID
			bin, str := rc.byID("/bin", key), rc.byID("/str", key)
			if len(bin) != 1 || len(str) != 1 {
				t.Fatalf("%d and %d deliveries of the posted event", len(bin), len(str))
			}
			checkPosted(t, bin[0], str[0])
			for _, path := range []string{"/bin", "/str"} {
				plain := rc.byID(path, "plain-1")
				if len(plain) != 1 {
					t.Fatalf("%s: %d deliveries of the plain event", path, len(plain))
				}
				mode := map[string]binding.Encoding{"/bin": binding.EncodingBinary, "/str": binding.EncodingStructured}[path]
				wantCE(t, plain[0], mode, "plain-1", cloudevents.DefaultSource, "geofence.enter", "application/json", []byte(`{"id":1}`))
			}
		})
	}
}

// TestCloudEventsReplay: dead letters of both kinds of event, replayed by
// another process, carry the attributes and bytes of their first attempt
// (the letter keeps the posted attributes; the derived ones come from
// what the letter keeps of the event), marked as a replay.
func TestCloudEventsReplay(t *testing.T) {
	rc := startCEReceiver(t)
	rc.answerWith(func(ceHit) int { return http.StatusNotFound }) // dead-letter at once
	subs := func() []*delivery.Subscription {
		return []*delivery.Subscription{
			ceSub("bin", rc.URL+"/bin", delivery.FormatCloudEventsBinary),
			ceSub("str", rc.URL+"/str", delivery.FormatCloudEventsStructured),
		}
	}
	dir := t.TempDir()
	s := ceServer(t, dir, subs()...)
	postCloudEvent(t, s)
	postAs(t, s, "geofence.exit", "plain-2", "text/plain", "gate 4")
	eventually(t, "the dead letters", func() bool { return lane(s, "bin").DeadLettered == 2 && lane(s, "str").DeadLettered == 2 })
	letters := map[string][]*queue.DeadLetter{}
	for _, id := range []string{"bin", "str"} {
		dls, err := s.DeadLetters(id, 10)
		if err != nil || len(dls) != 2 {
			t.Fatalf("%s dead letters: %v %v", id, dls, err)
		}
		if dls[0].CloudEvent != postedAttrs || dls[1].CloudEvent != "" {
			t.Errorf("%s: the letters keep attributes %q and %q", id, dls[0].CloudEvent, dls[1].CloudEvent)
		}
		letters[id] = dls
	}
	closeServer(t, s, time.Second)

	rc.answerWith(nil)
	s = ceServer(t, dir, subs()...)
	for id, dls := range letters {
		for _, dl := range dls {
			if r, err := s.Replay(id, dl.Seq, false); err != nil || !r.Replayed {
				t.Fatalf("replay %s %d: %+v %v", id, dl.Seq, r, err)
			}
		}
	}
	eventually(t, "the replays", func() bool { return len(rc.at("/bin")) == 4 && len(rc.at("/str")) == 4 })
	for _, id := range []string{postedEvent().ID, "plain-2"} {
		for _, path := range []string{"/bin", "/str"} {
			hits := rc.byID(path, id)
			if len(hits) != 2 || hits[1].replay != "true" || !bytes.Equal(hits[0].body, hits[1].body) {
				t.Fatalf("%s %s: %+v, want a replay of the same bytes", path, id, hits)
			}
			a, b := hits[0], hits[1]
			if a.event == nil || b.event == nil {
				t.Fatalf("%s %s: the SDK reads no CloudEvent: %v %v", path, id, a.sdkErr, b.sdkErr)
			}
			if a.event.String() != b.event.String() {
				t.Errorf("%s %s: the replay reads\n%s\nthe first attempt\n%s", path, id, b.event, a.event)
			}
		}
	}
	checkPosted(t, rc.byID("/bin", postedEvent().ID)[1], rc.byID("/str", postedEvent().ID)[1])
	plain := rc.byID("/str", "plain-2")[1]
	wantCE(t, plain, binding.EncodingStructured, "plain-2", cloudevents.DefaultSource, "geofence.exit", "text/plain", []byte("gate 4"))
}
