package delivery

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/queue"
)

// TestFormatSnapshotKeepsFormat: a removed subscription drains in its
// format, from the membership's snapshot; a Standard Webhooks one's
// snapshot says nothing of it, as those written before formats existed.
func TestFormatSnapshotKeepsFormat(t *testing.T) {
	for _, format := range []string{FormatCloudEventsBinary, FormatCloudEventsStructured, FormatStandardWebhooks, ""} {
		s := (&Subscription{ID: "x", URL: "http://x", Format: format}).WithDefaults()
		snap := encodeSnapshot(s)
		if strings.Contains(string(snap), `"format"`) != (s.formatName() != "") {
			t.Errorf("format %q: snapshot %s", format, snap)
		}
		got, err := decodeSnapshot("x", snap)
		if err != nil || got.formatName() != s.formatName() {
			t.Errorf("format %q: the snapshot gives %q, %v", format, got.Format, err)
		}
	}
}

// TestFormatRendersOncePerEvent: subscriptions of one format and variant
// share one rendering of an event (the same bytes, not equal copies):
// the binary headers once per event whatever the variant, the structured
// body once per variant; the Standard Webhooks body is the stored slice.
func TestFormatRendersOncePerEvent(t *testing.T) {
	e := &engine{now: time.Now, ceSource: "/test"}
	fields := func() *policy.Variant {
		v, err := policy.ParseVariant(policy.VariantSpec{Fields: []string{"a"}})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	mk := func(format string, v *policy.Variant) *Subscription {
		return &Subscription{ID: "s", Format: format, Variant: v}
	}
	str1, str2, strV1, strV2 := mk(FormatCloudEventsStructured, nil), mk(FormatCloudEventsStructured, nil),
		mk(FormatCloudEventsStructured, fields()), mk(FormatCloudEventsStructured, fields())
	bin1, binV := mk(FormatCloudEventsBinary, nil), mk(FormatCloudEventsBinary, fields())
	std := mk("", nil)
	ev := &queue.Event{ID: "e1", Type: "t", ContentType: "application/json", AcceptedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Body: []byte(`{"a":1,"b":2}`)}

	pay := func(s *Subscription) ([]byte, string, cloudevents.Headers) {
		if _, err := e.render(s, ev); err != nil { // the lane renders first
			t.Fatal(err)
		}
		b, ct, h, err := e.payload(&job{sub: s, ev: ev})
		if err != nil {
			t.Fatal(err)
		}
		return b, ct, h
	}
	same := func(a, b []byte) bool { return len(a) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b) }

	b1, ct, h1 := pay(str1)
	b2, _, _ := pay(str2)
	if !same(b1, b2) || ct != cloudevents.ContentTypeStructured || h1 != nil {
		t.Errorf("structured: two renderings (%p, %p), Content-Type %s, headers %q", b1, b2, ct, h1)
	}
	if want := `{"specversion":"1.0","id":"e1","source":"/test","type":"t","time":"2026-01-02T03:04:05.000000006Z","datacontenttype":"application/json","data":{"a":1,"b":2}}`; string(b1) != want {
		t.Errorf("structured body\n got %s\nwant %s", b1, want)
	}
	v1, _, _ := pay(strV1)
	v2, _, _ := pay(strV2)
	if !same(v1, v2) || same(v1, b1) || !strings.HasSuffix(string(v1), `"data":{"a":1}}`) {
		t.Errorf("structured with a variant: %s and %s, shared %v", v1, v2, same(v1, v2))
	}
	bb, bct, bh1 := pay(bin1)
	vb, vct, bh2 := pay(binV)
	if !same(bb, ev.Body) || bct != "application/json" || !same(bh1, bh2) || string(vb) != `{"a":1}` || vct != policy.VariantContentType {
		t.Errorf("binary: body %s (%s), variant %s (%s), headers shared %v", bb, bct, vb, vct, same(bh1, bh2))
	}
	got := map[string]string{}
	for k, v := range bh1.All() {
		got[string(k)] = string(v)
	}
	if len(got) != 5 || got["Ce-Id"] != "e1" || got["Ce-Source"] != "/test" || got["Ce-Type"] != "t" || got["Ce-Time"] != "2026-01-02T03:04:05.000000006Z" || got["Ce-Specversion"] != "1.0" {
		t.Errorf("binary headers %v", got)
	}
	if sb, sct, sh := pay(std); !same(sb, ev.Body) || sct != "application/json" || sh != nil {
		t.Errorf("standard-webhooks: %s %s %q", sb, sct, sh)
	}
}

// TestFormatDamagedAttributesAreDeadLettered: attributes no receiver
// would take (a damaged record: ingest checks what it keeps) dead-letter
// the event for the CloudEvents subscriptions with reason variant_failed
// and the attribute named, without an HTTP request; the Standard Webhooks
// subscription delivers it.
func TestFormatDamagedAttributesAreDeadLettered(t *testing.T) {
	var requests atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if strings.HasPrefix(string(ctx.Path()), "/ce") {
			requests.Add(1)
		}
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	url := "http://" + ln.Addr().String()
	_, base, ev := deliverFixture(t, url, 10)
	mk := func(id, format string) *Subscription {
		return &Subscription{ID: id, URL: url + "/" + id, Secrets: base.Secrets, Timeout: 5 * time.Second, Format: format}
	}
	s := newTestServer(Options{DataDir: t.TempDir(), AllowPrivateTargets: true,
		Subscriptions: []*Subscription{mk("ce-bin", FormatCloudEventsBinary), mk("ce-str", FormatCloudEventsStructured), mk("std", "")}})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(t.Context()) })
	ev.CloudEvent = `{"specversion":"1.0","id":"a","type":"t"}` // no source
	if _, _, err := s.q.Append(ev); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the outcomes", 10*time.Second, func() bool {
		return laneOf(s, "ce-bin").DeadLettered == 1 && laneOf(s, "ce-str").DeadLettered == 1 && laneOf(s, "std").Delivered == 1
	})
	for _, id := range []string{"ce-bin", "ce-str"} {
		dls, err := s.q.DeadLetters(id, "", 0, 10)
		if err != nil || len(dls) != 1 {
			t.Fatalf("%s: %v %v", id, dls, err)
		}
		if dl := dls[0]; dl.Reason != policy.ReasonVariantFailed || dl.Attempts != 0 || dl.LastError != "CloudEvent attribute source: missing" || dl.CloudEvent != ev.CloudEvent {
			t.Errorf("%s: dead letter %+v", id, dl)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("%d requests to the CloudEvents subscriptions", n)
	}
	var ae *cloudevents.AttrError
	if _, err := (&engine{ceSource: "/s"}).render(&Subscription{Format: FormatCloudEventsBinary}, ev); !errors.As(err, &ae) || ae.Attr != "source" {
		t.Errorf("render: %v", err)
	}
}

// TestDeliverFormatsAllocateNothing: once the event is rendered (the lane
// renders it before the attempt), a CloudEvents delivery allocates no
// more than a Standard Webhooks one: nothing (the structured body is the
// one rendering, the ce- headers are copied from theirs).
func TestDeliverFormatsAllocateNothing(t *testing.T) {
	if testwait.RaceEnabled() {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	for _, format := range []string{FormatCloudEventsBinary, FormatCloudEventsStructured} {
		t.Run(format, func(t *testing.T) {
			e, sub, ev := deliverFixture(t, deliverReceiver(t), 900)
			e.ceSource = cloudevents.DefaultSource
			sub.Format = format
			if _, err := e.render(sub, ev); err != nil {
				t.Fatal(err)
			}
			if n := allocsPerDelivery(t, e, sub, ev); n != 0 {
				t.Errorf("%.0f allocations per delivery, want 0", n)
			}
		})
	}
}

// TestStructuredKeysBounded: however many variants come and go, the cache
// of structured rendering keys stops growing at its bound, and the key of
// a variant past it is still the right one.
func TestStructuredKeysBounded(t *testing.T) {
	for i := range maxStructuredKeys + 50 {
		v := `{"n":` + strconv.Itoa(i) + `}`
		if k := structuredKey(v); k != ceStructuredKey+v {
			t.Fatalf("structuredKey(%s) = %s", v, k)
		}
	}
	n := 0
	structuredKeys.Range(func(any, any) bool { n++; return true })
	if n > maxStructuredKeys || int(structuredCount.Load()) != n {
		t.Errorf("%d keys cached (count %d), bound %d", n, structuredCount.Load(), maxStructuredKeys)
	}
}
