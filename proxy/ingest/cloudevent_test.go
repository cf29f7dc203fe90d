package ingest_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// ingestOnLog serves ingest on a loopback port over a real Badger log
// (fsync), and returns its URL and the log.
func ingestOnLog(t *testing.T) (string, *badger.Log) {
	t.Helper()
	q := queuetest.MustOpen(t, "", badger.Options{Sync: true})
	return serve(t, ingest.Config{Reserved: func(typ []byte) bool { return strings.HasPrefix(string(typ), "sluice.") }}, q), q
}

type answer struct {
	ID        string `json:"id"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
	Error     string `json:"error"`
}

func send(t *testing.T, url, body string, hdr ...string) (int, answer) {
	t.Helper()
	resp, a := postAs[answer](t, url, body, hdr...)
	return resp.StatusCode, a
}

// TestCloudEventIngest: a CloudEvent posted in binary mode (to
// /v1/events, or to /v1/events/{its type}) and in structured mode is
// stored with its type, data, content type and attributes; its log id is
// its source and id together, so a repeat is a duplicate and the same id
// from another source is not.
func TestCloudEventIngest(t *testing.T) {
	base, q := ingestOnLog(t)
	binary := func(id, source string) []string {
		return []string{"Content-Type", "application/json", "ce-specversion", "1.0", "ce-id", id, "ce-source", source,
			"ce-type", "geofence.entered", "ce-subject", "vehicle-17", "ce-partitionkey", "vehicle-17", "Sluice-Tenant", "acme"}
	}
	code, a := send(t, base+"/v1/events", `{"v":1}`, binary("e-1", "/fleet/a")...)
	if code != http.StatusAccepted || a.ID != cloudevents.Key("/fleet/a", "e-1") {
		t.Fatalf("binary mode: %d %+v", code, a)
	}
	ev, err := q.Event(a.Seq)
	if err != nil {
		t.Fatal(err)
	}
	wantAttrs := `{"specversion":"1.0","id":"e-1","source":"/fleet/a","type":"geofence.entered","partitionkey":"vehicle-17","subject":"vehicle-17"}` // the rest as sent: Go sorts its headers
	if ev.Type != "geofence.entered" || string(ev.Body) != `{"v":1}` || ev.ContentType != "application/json" || ev.CloudEvent != wantAttrs ||
		ev.OrderingKey != "vehicle-17" || ev.Tenant != "acme" {
		t.Errorf("stored %+v", ev)
	}
	if code, d := send(t, base+"/v1/events", `{"v":1}`, binary("e-1", "/fleet/a")...); code != http.StatusOK || !d.Duplicate || d.Seq != a.Seq {
		t.Errorf("the same source and id again: %d %+v, want a duplicate of seq %d", code, d, a.Seq)
	}
	if code, o := send(t, base+"/v1/events/geofence.entered", `{"v":2}`, binary("e-1", "/fleet/b")...); code != http.StatusAccepted || o.Seq == a.Seq {
		t.Errorf("the same id from another source, on the type's path: %d %+v", code, o)
	}

	structured := `{"specversion":"1.0","id":"s-1","source":"urn:billing","type":"invoice.paid","time":"2026-12-05T17:31:00Z",` +
		`"datacontenttype":"application/json","data":{"amount":42},"comexampleext":5}`
	code, s := send(t, base+"/v1/events", structured, "Content-Type", "application/cloudevents+json; charset=utf-8")
	if code != http.StatusAccepted {
		t.Fatalf("structured mode: %d %+v", code, s)
	}
	if ev, err = q.Event(s.Seq); err != nil {
		t.Fatal(err)
	}
	if ev.Type != "invoice.paid" || string(ev.Body) != `{"amount":42}` || ev.ContentType != "application/json" || ev.ID != cloudevents.Key("urn:billing", "s-1") ||
		ev.CloudEvent != `{"specversion":"1.0","id":"s-1","source":"urn:billing","type":"invoice.paid","comexampleext":5,"time":"2026-12-05T17:31:00Z"}` {
		t.Errorf("stored %+v", ev)
	}
	if code, d := send(t, base+"/v1/events", structured, "Content-Type", "application/cloudevents+json"); code != http.StatusOK || d.Seq != s.Seq {
		t.Errorf("structured repeat: %d %+v", code, d)
	}
}

// TestCloudEventRefusals: a malformed CloudEvent is a 400 naming the
// attribute or header, and nothing is appended.
func TestCloudEventRefusals(t *testing.T) {
	base, q := ingestOnLog(t)
	ce := func(extra ...string) []string {
		return append([]string{"ce-specversion", "1.0", "ce-id", "1", "ce-source", "/s", "ce-type", "t.a"}, extra...)
	}
	without := func(name string) []string {
		h := ce()
		for i := 0; i < len(h); i += 2 {
			if h[i] == name {
				return append(h[:i:i], h[i+2:]...)
			}
		}
		return h
	}
	for _, c := range []struct {
		path, body string
		hdr        []string
		want       string
	}{
		{"/v1/events", "{}", without("ce-type"), "attribute ce-type: required"},
		{"/v1/events", "{}", without("ce-id"), "attribute ce-id: required"},
		{"/v1/events", "{}", without("ce-source"), "attribute ce-source: required"},
		{"/v1/events", "{}", []string{"ce-specversion", "0.3", "ce-id", "1", "ce-source", "/s", "ce-type", "t"}, "attribute ce-specversion"},
		{"/v1/events", "{}", ce("ce-time", "noon"), "attribute ce-time"},
		{"/v1/events", "{}", ce("Idempotency-Key", "k"), "send no Idempotency-Key"},
		{"/v1/events", "{}", ce("Ordering-Key", "a", "ce-partitionkey", "b"), "Ordering-Key header and the partitionkey attribute differ"},
		{"/v1/events", "{}", []string{"ce-specversion", "1.0", "ce-id", "1", "ce-source", "/s", "ce-type", "bad type!"}, "attribute type: an event type"},
		{"/v1/events", "{}", []string{"ce-specversion", "1.0", "ce-id", "1", "ce-source", "/s", "ce-type", "sluice.delivery.failed"}, "reserved"},
		{"/v1/events/t.b", "{}", ce(), `attribute type: "t.a" differs from the path's type "t.b"`},
		{"/v1/events", "{}", ce("Sluice-Tenant", "Not A Tenant"), "invalid Sluice-Tenant"},
		{"/v1/events", `{"specversion":"1.0","id":"1","source":"/s","type":"t.a","data":`, []string{"Content-Type", "application/cloudevents+json"}, "invalid CloudEvent: invalid JSON"},
		{"/v1/events", `{"specversion":"1.0","id":"1","source":"/s"}`, []string{"Content-Type", "application/cloudevents+json"}, "attribute type: required"},
		{"/v1/events", `{"specversion":"1.0","id":"1","source":"/s","type":"t.a"}`, []string{"Content-Type", "application/cloudevents+json", "ce-id", "2"}, "send no ce-* headers"},
		{"/v1/events", `{}`, []string{"Content-Type", "application/json"}, "POST /v1/events takes a CloudEvent"},
	} {
		code, a := send(t, base+c.path, c.body, c.hdr...)
		if code/100 != 4 || !strings.Contains(a.Error, c.want) {
			t.Errorf("%s %v: %d %q, want a 4xx containing %q", c.path, c.hdr, code, a.Error, c.want)
		}
	}
	if h := q.Head(); h != 0 {
		t.Errorf("refused events appended: head %d", h)
	}
}

// TestCloudEventDocExamples posts docs/cloudevents.md's curl examples, as
// written, to ingest over a real log: each is accepted, with its type.
func TestCloudEventDocExamples(t *testing.T) {
	blocks := regexp.MustCompile("(?s)```\n(curl .*?)```").FindAllStringSubmatch(docPage(t, "cloudevents.md"), -1)
	if len(blocks) != 2 {
		t.Fatalf("docs/cloudevents.md has %d curl examples, want the two modes'", len(blocks))
	}
	base, q := ingestOnLog(t)
	for _, b := range blocks {
		cmd := b[1]
		url := regexp.MustCompile(`http://127\.0\.0\.1:8700(/\S+)`).FindStringSubmatch(cmd)
		data := regexp.MustCompile(`--data '([^']*)'`).FindStringSubmatch(cmd)
		if url == nil || data == nil {
			t.Fatalf("example without a URL or --data:\n%s", cmd)
		}
		var hdr []string
		for _, h := range regexp.MustCompile(`-H '([^:']+): ([^']*)'`).FindAllStringSubmatch(cmd, -1) {
			hdr = append(hdr, h[1], h[2])
		}
		code, a := send(t, base+url[1], data[1], hdr...)
		if code != http.StatusAccepted {
			t.Fatalf("example answered %d %+v:\n%s", code, a, cmd)
		}
		ev, err := q.Event(a.Seq)
		if err != nil || ev.CloudEvent == "" || (ev.Type != "geofence.enter" && ev.Type != "invoice.paid") {
			t.Errorf("example stored %+v, %v", ev, err)
		}
	}
}
