package cloudevents_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/proxy/cloudevents"
)

// headers turns name/value pairs into ParseBinary's visitor.
func headers(kv ...string) func(func(name, value []byte)) {
	return func(fn func(name, value []byte)) {
		for i := 0; i < len(kv); i += 2 {
			fn([]byte(kv[i]), []byte(kv[i+1]))
		}
	}
}

// TestParseBinary: the ce-* headers become the attributes, in the order
// they came, with names lower-cased and values percent-decoded; other
// headers are not attributes; the body is the data.
func TestParseBinary(t *testing.T) {
	ev, err := cloudevents.ParseBinary(headers(
		"Content-Type", "application/json",
		"Ce-Specversion", "1.0",
		"ce-id", "A234-1234-1234",
		"CE-SOURCE", "https://example.com/fleet",
		"ce-type", "geofence.entered",
		"ce-time", "2026-12-05T17:31:00Z",
		"ce-subject", "vehicle%2017%20%E2%9C%93",
		"ce-partitionkey", "vehicle-17",
		"ce-comexampleext", `a "quoted" %25 value`,
		"X-Other", "not an attribute",
	), "application/json", []byte(`{"v":17}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"specversion":"1.0","id":"A234-1234-1234","source":"https://example.com/fleet","type":"geofence.entered","time":"2026-12-05T17:31:00Z",` +
		`"subject":"vehicle 17 ✓","partitionkey":"vehicle-17","comexampleext":"a \"quoted\" % value"}`
	if ev.Attrs != want {
		t.Errorf("attrs\n got %s\nwant %s", ev.Attrs, want)
	}
	if ev.ID != "A234-1234-1234" || ev.Source != "https://example.com/fleet" || ev.Type != "geofence.entered" ||
		ev.PartitionKey != "vehicle-17" || ev.ContentType != "application/json" || string(ev.Data) != `{"v":17}` {
		t.Errorf("event = %+v", ev)
	}
	if !json.Valid([]byte(ev.Attrs)) {
		t.Errorf("attrs are not JSON: %s", ev.Attrs)
	}
}

// TestParseStructured: the JSON members but data, data_base64 and
// datacontenttype are kept, the required ones first, then by name; data is JSON for a JSON type, a
// string's text otherwise, or data_base64 decoded.
func TestParseStructured(t *testing.T) {
	for _, c := range []struct {
		name, body, attrs, ct, data string
	}{
		{"json data", `{"flag":true,"specversion":"1.0","id":"1","source":"/s","type":"t.a","datacontenttype":"application/json","data":{"n": [1, 2]},"ext1":7}`,
			`{"specversion":"1.0","id":"1","source":"/s","type":"t.a","ext1":7,"flag":true}`, "application/json", `{"n": [1, 2]}`},
		{"no datacontenttype: JSON", `{"specversion":"1.0","id":"2","source":"/s","type":"t.a","data":"text"}`,
			`{"specversion":"1.0","id":"2","source":"/s","type":"t.a"}`, "application/json", `"text"`},
		{"text data", `{"specversion":"1.0","id":"3","source":"/s","type":"t.a","datacontenttype":"text/plain","data":"line\n"}`,
			`{"specversion":"1.0","id":"3","source":"/s","type":"t.a"}`, "text/plain", "line\n"},
		{"base64 data", `{"specversion":"1.0","id":"4","source":"/s","type":"t.a","data_base64":"AAEC/w=="}`,
			`{"specversion":"1.0","id":"4","source":"/s","type":"t.a"}`, "application/octet-stream", "\x00\x01\x02\xff"},
		{"no data, null attribute", `{"specversion":"1.0","id":"5","source":"/s","type":"t.a","subject":null}`,
			`{"specversion":"1.0","id":"5","source":"/s","type":"t.a"}`, "", ""},
		{"+json type", `{"specversion":"1.0","id":"6","source":"/s","type":"t.a","datacontenttype":"application/vnd.x+json; charset=utf-8","data":"s"}`,
			`{"specversion":"1.0","id":"6","source":"/s","type":"t.a"}`, "application/vnd.x+json; charset=utf-8", `"s"`},
	} {
		ev, err := cloudevents.ParseStructured([]byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if ev.Attrs != c.attrs || ev.ContentType != c.ct || string(ev.Data) != c.data {
			t.Errorf("%s:\n got %s %q %q\nwant %s %q %q", c.name, ev.Attrs, ev.ContentType, ev.Data, c.attrs, c.ct, c.data)
		}
	}
}

// TestParseRefusals: every malformed event is refused naming the
// attribute at fault.
func TestParseRefusals(t *testing.T) {
	ok := `"specversion":"1.0","id":"1","source":"/s","type":"t.a"`
	for _, c := range []struct{ body, attr string }{
		{`{"id":"1","source":"/s","type":"t.a"}`, "specversion"},
		{`{"specversion":"0.3","id":"1","source":"/s","type":"t.a"}`, "specversion"},
		{`{"specversion":1.0,"id":"1","source":"/s","type":"t.a"}`, "specversion"},
		{`{"specversion":"1.0","source":"/s","type":"t.a"}`, "id"},
		{`{"specversion":"1.0","id":"","source":"/s","type":"t.a"}`, "id"},
		{`{"specversion":"1.0","id":"1","type":"t.a"}`, "source"},
		{`{"specversion":"1.0","id":"1","source":"/s"}`, "type"},
		{`{` + ok + `,"time":"yesterday"}`, "time"},
		{`{` + ok + `,"dataschema":"relative/path"}`, "dataschema"},
		{`{` + ok + `,"Bad-Name":"x"}`, "Bad-Name"},
		{`{` + ok + `,"ext":{"nested":1}}`, "ext"},
		{`{` + ok + `,"data":1,"data_base64":"AA=="}`, "data_base64"},
		{`{` + ok + `,"data_base64":"!!"}`, "data_base64"},
		{`{` + ok + `,"ext":"` + strings.Repeat("x", cloudevents.MaxAttrsBytes) + `"}`, "attributes"},
	} {
		_, err := cloudevents.ParseStructured([]byte(c.body))
		var ae *cloudevents.AttrError
		if !errors.As(err, &ae) || ae.Attr != c.attr {
			t.Errorf("%s: err = %v, want one naming %s", c.body[:min(len(c.body), 90)], err, c.attr)
		}
	}
	for _, body := range []string{``, `[]`, `{"specversion":"1.0"`, `{` + ok + `} {}`, `{` + ok + `,"data":}`} {
		if _, err := cloudevents.ParseStructured([]byte(body)); err == nil {
			t.Errorf("%q accepted", body)
		}
	}
	for _, c := range []struct {
		h    []string
		attr string
	}{
		{[]string{"ce-specversion", "1.0", "ce-id", "1", "ce-source", "/s"}, "ce-type"},
		{[]string{"ce-specversion", "1.0", "ce-id", "1", "ce-source", "/s", "ce-type", "t", "ce-subject", "50%"}, "ce-subject"},
		{[]string{"ce-specversion", "1.0", "ce-id", "1", "ce-source", "/s", "ce-type", "t", "ce-datacontenttype", "a/b"}, "ce-datacontenttype"},
		{[]string{"ce-specversion", "1.0", "ce-id", "1", "ce-source", "/s", "ce-type", "t", "ce-data", "x"}, "ce-data"},
		{[]string{"ce-specversion", "1.0", "ce-id", "1", "ce-source", "/s", "ce-type", "t", "ce-x", "%FF"}, "ce-x"},
		{[]string{"ce-specversion", "1.0", "ce-id", "1", "ce-id", "2", "ce-source", "/s", "ce-type", "t"}, "ce-id"},
	} {
		_, err := cloudevents.ParseBinary(headers(c.h...), "", nil)
		var ae *cloudevents.AttrError
		if !errors.As(err, &ae) || ae.Attr != c.attr {
			t.Errorf("%v: err = %v, want one naming %s", c.h, err, c.attr)
		}
	}
}

// TestParseBatch: a batch is every event or none, and an error names the
// event by its index.
func TestParseBatch(t *testing.T) {
	evs, err := cloudevents.ParseBatch([]byte(` [ {"specversion":"1.0","id":"1","source":"/s","type":"t.a","data":{"n":1}},
		{"specversion":"1.0","id":"2","source":"/s","type":"t.b"} ] `))
	if err != nil || len(evs) != 2 || evs[0].ID != "1" || string(evs[0].Data) != `{"n":1}` || evs[1].Type != "t.b" {
		t.Fatalf("ParseBatch = %+v, %v", evs, err)
	}
	if evs, err := cloudevents.ParseBatch([]byte(`[]`)); err != nil || len(evs) != 0 {
		t.Errorf("empty batch = %v, %v", evs, err)
	}
	_, err = cloudevents.ParseBatch([]byte(`[{"specversion":"1.0","id":"1","source":"/s","type":"t.a"},{"specversion":"1.0","id":"2","source":"/s"}]`))
	var be *cloudevents.BatchError
	var ae *cloudevents.AttrError
	if !errors.As(err, &be) || be.Index != 1 || !errors.As(err, &ae) || ae.Attr != "type" {
		t.Errorf("second event without a type: %v", err)
	}
	for _, body := range []string{`{}`, `[1]`, `[{"specversion":"1.0","id":"1","source":"/s","type":"t.a"}`, `[] []`} {
		if _, err := cloudevents.ParseBatch([]byte(body)); err == nil {
			t.Errorf("%q accepted", body)
		}
	}
}

// TestKey: a CloudEvent's log id depends on its source and id together,
// and is a valid Idempotency-Key.
func TestKey(t *testing.T) {
	a, b, c := cloudevents.Key("/a", "1"), cloudevents.Key("/a1", ""), cloudevents.Key("/b", "1")
	if a == b || a == c || a != cloudevents.Key("/a", "1") {
		t.Errorf("keys %s %s %s", a, b, c)
	}
	if len(a) > 200 || !strings.HasPrefix(a, "ce_") || strings.Trim(a[3:], "0123456789abcdefghjkmnpqrstvwxyz") != "" {
		t.Errorf("key %q", a)
	}
}

// FuzzParseStructured: whatever the body, ParseStructured fails cleanly
// or returns an event with its required attributes whose Attrs is a JSON
// object that reads back to the same event (less its data).
func FuzzParseStructured(f *testing.F) {
	f.Add(`{"specversion":"1.0","id":"1","source":"/s","type":"t.a","data":{"n":1},"x":1}`)
	f.Add(`{"specversion":"1.0","id":"1","source":"/s","type":"t.a","data_base64":"AAE=","datacontenttype":"a/b"}`)
	f.Add(`{"specversion":"1.0","id":"\u00e9\"","source":"urn:x","type":"t","subject":"a\\b"}`)
	f.Fuzz(func(t *testing.T, body string) {
		ev, err := cloudevents.ParseStructured([]byte(body))
		if err != nil {
			return
		}
		if ev.ID == "" || ev.Source == "" || ev.Type == "" {
			t.Fatalf("accepted without a required attribute: %+v", ev)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(ev.Attrs), &m); err != nil {
			t.Fatalf("attrs %q: %v", ev.Attrs, err)
		}
		back, err := cloudevents.ParseStructured([]byte(ev.Attrs))
		if err != nil || back.Attrs != ev.Attrs || back.ID != ev.ID || back.Source != ev.Source || back.Type != ev.Type {
			t.Fatalf("attrs %s read back as %+v, %v", ev.Attrs, back, err)
		}
	})
}
