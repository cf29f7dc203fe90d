package cloudevents

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
)

var acceptedAt = time.Date(2026, 3, 4, 5, 6, 7, 890_000_000, time.FixedZone("CET", 3600))

func TestAppendDerived(t *testing.T) {
	for _, tc := range []struct {
		name, id, typ, source string
		at                    time.Time
		want                  string
	}{
		{"plain", "01JC8Z4Q9Y3W2V1T0S9R8Q7P6N", "geofence.enter", DefaultSource, acceptedAt,
			`{"specversion":"1.0","id":"01JC8Z4Q9Y3W2V1T0S9R8Q7P6N","source":"/sluice","type":"geofence.enter","time":"2026-03-04T04:06:07.89Z"}`},
		{"whole second", "a", "t", "//fleet.example.com/sluice", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
			`{"specversion":"1.0","id":"a","source":"//fleet.example.com/sluice","type":"t","time":"2026-01-02T03:04:05Z"}`},
		{"nanoseconds", "a", "t", "/s", time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC),
			`{"specversion":"1.0","id":"a","source":"/s","type":"t","time":"2026-01-02T03:04:05.123456789Z"}`},
		{"escaped", `a"b`, "t", "/s?q=<&>", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
			`{"specversion":"1.0","id":"a\"b","source":"/s?q=\u003c\u0026\u003e","type":"t","time":"2026-01-02T03:04:05Z"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := string(AppendDerived(nil, tc.id, tc.typ, tc.source, tc.at))
			if got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			if _, err := AppendHeaders(nil, []byte(got)); err != nil {
				t.Fatalf("its headers: %v", err)
			}
		})
	}
}

// headerMap reads h into a map, failing on a name given twice.
func headerMap(t *testing.T, h Headers) map[string]string {
	t.Helper()
	m := map[string]string{}
	for k, v := range h.All() {
		if _, dup := m[string(k)]; dup {
			t.Fatalf("header %s twice", k)
		}
		m[string(k)] = string(v)
	}
	return m
}

func TestAppendHeaders(t *testing.T) {
	attrs := `{"specversion":"1.0","id":"order 7","source":"https://shop.example/ørders","type":"order.created",` +
		`"subject":"100% \"done\"","time":"2026-03-04T05:06:07Z","priority":3,"urgent":true,"ratio":-1.5e3,"gone":null,` +
		`"tab":"a\tb","esc":"\u00e9\/"}`
	h, err := AppendHeaders([]byte("prefix"), []byte(attrs))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Ce-Specversion": "1.0",
		"Ce-Id":          "order%207",
		"Ce-Source":      "https://shop.example/%C3%B8rders",
		"Ce-Type":        "order.created",
		"Ce-Subject":     "100%25%20%22done%22",
		"Ce-Time":        "2026-03-04T05:06:07Z",
		"Ce-Priority":    "3",
		"Ce-Urgent":      "true",
		"Ce-Ratio":       "-1.5e3",
		"Ce-Tab":         "a%09b",
		"Ce-Esc":         "%C3%A9/",
	}
	if got := headerMap(t, h); !maps.Equal(got, want) {
		t.Fatalf("headers\n got %v\nwant %v", got, want)
	}
	// Percent-decoding gives the attribute's text back.
	var decoded map[string]any
	json.Unmarshal([]byte(attrs), &decoded)
	for k, v := range h.All() {
		text, err := url.PathUnescape(string(v))
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		name := strings.ToLower(strings.TrimPrefix(string(k), "Ce-"))
		if s, ok := decoded[name].(string); ok && s != text {
			t.Errorf("%s decodes to %q, the attribute is %q", k, text, s)
		}
	}
	// All stops when asked.
	n := 0
	for range h.All() {
		n++
		break
	}
	if n != 1 {
		t.Fatal("All went on after break")
	}
}

func TestAttrErrors(t *testing.T) {
	const ok = `"specversion":"1.0","id":"a","source":"/s","type":"t"`
	for _, tc := range []struct{ name, attrs, attr, problem string }{
		{"not JSON", `{"specversion":`, "(all)", "not valid JSON"},
		{"two values", `{} {}`, "(all)", "not valid JSON"},
		{"array", `[1]`, "(all)", "not a JSON object"},
		{"no specversion", `{"id":"a","source":"/s","type":"t"}`, "specversion", "missing"},
		{"no id", `{"specversion":"1.0","source":"/s","type":"t"}`, "id", "missing"},
		{"no source", `{"specversion":"1.0","id":"a","type":"t"}`, "source", "missing"},
		{"no type", `{"specversion":"1.0","id":"a","source":"/s"}`, "type", "missing"},
		{"empty id", `{"specversion":"1.0","id":"","source":"/s","type":"t"}`, "id", "non-empty string"},
		{"numeric id", `{"specversion":"1.0","id":7,"source":"/s","type":"t"}`, "id", "non-empty string"},
		{"null type", `{"specversion":"1.0","id":"a","source":"/s","type":null}`, "type", "non-empty string"},
		{"old version", `{"specversion":"0.3","id":"a","source":"/s","type":"t"}`, "specversion", "must be 1.0"},
		{"object value", `{` + ok + `,"ext":{"a":1}}`, "ext", "a string, a number or a boolean"},
		{"array value", `{` + ok + `,"ext":[1]}`, "ext", "a string, a number or a boolean"},
		{"data", `{` + ok + `,"data":{}}`, "data", "body or content type"},
		{"data_base64", `{` + ok + `,"data_base64":"AA=="}`, "data_base64", "body or content type"},
		{"datacontenttype", `{` + ok + `,"datacontenttype":"text/plain"}`, "datacontenttype", "body or content type"},
		{"upper case name", `{` + ok + `,"Ext":"x"}`, "Ext", "not an attribute name"},
		{"empty name", `{` + ok + `,"":"x"}`, "", "not an attribute name"},
		{"header-breaking name", `{` + ok + `,"a\nb":"x"}`, "a\nb", "not an attribute name"},
		{"twice", `{` + ok + `,"id":"b"}`, "id", "given twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for mode, err := range map[string]error{
				"binary":     func() error { _, err := AppendHeaders(nil, []byte(tc.attrs)); return err }(),
				"structured": func() error { _, err := AppendStructured(nil, []byte(tc.attrs), "", nil); return err }(),
			} {
				var ae *AttrError
				if !errors.As(err, &ae) || ae.Attr != tc.attr || !strings.Contains(ae.Problem, tc.problem) {
					t.Errorf("%s: %v, want attribute %q: %s", mode, err, tc.attr, tc.problem)
				}
			}
		})
	}
}

func TestAppendStructured(t *testing.T) {
	attrs := `{"specversion":"1.0","id":"a","source":"/s","type":"t","n":2}`
	for _, tc := range []struct {
		name, contentType, data, want string
	}{
		{"json", "application/json", ` {"x": [1, 2]}` + "\n",
			`{"specversion":"1.0","id":"a","source":"/s","type":"t","n":2,"datacontenttype":"application/json","data":{"x": [1, 2]}}`},
		{"json with parameters", `application/json; charset="utf-8"`, `"str"`,
			`{"specversion":"1.0","id":"a","source":"/s","type":"t","n":2,"datacontenttype":"application/json; charset=\"utf-8\"","data":"str"}`},
		{"json suffix", "application/vnd.fleet+json", `{"a":1}`,
			`{"specversion":"1.0","id":"a","source":"/s","type":"t","n":2,"datacontenttype":"application/vnd.fleet+json","data_base64":"eyJhIjoxfQ=="}`},
		{"invalid json", "application/json", `{"x":`,
			`{"specversion":"1.0","id":"a","source":"/s","type":"t","n":2,"datacontenttype":"application/json","data_base64":"eyJ4Ijo="}`},
		{"text", "text/plain", "hello",
			`{"specversion":"1.0","id":"a","source":"/s","type":"t","n":2,"datacontenttype":"text/plain","data_base64":"aGVsbG8="}`},
		{"text that looks like json", "text/plain", "1",
			`{"specversion":"1.0","id":"a","source":"/s","type":"t","n":2,"datacontenttype":"text/plain","data_base64":"MQ=="}`},
		{"white space only", "text/plain", " ",
			`{"specversion":"1.0","id":"a","source":"/s","type":"t","n":2,"datacontenttype":"text/plain","data_base64":"IA=="}`},
		{"no content type, json", "", `[true]`,
			`{"specversion":"1.0","id":"a","source":"/s","type":"t","n":2,"data":[true]}`},
		{"no content type, not json", "", "\x00\xff",
			`{"specversion":"1.0","id":"a","source":"/s","type":"t","n":2,"data_base64":"AP8="}`},
		{"no data", "application/json", "",
			`{"specversion":"1.0","id":"a","source":"/s","type":"t","n":2,"datacontenttype":"application/json"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AppendStructured([]byte("prefix"), []byte(attrs+" \n"), tc.contentType, []byte(tc.data))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != "prefix"+tc.want {
				t.Fatalf("got  %s\nwant prefix%s", got, tc.want)
			}
			got = got[len("prefix"):]
			if !json.Valid(got) {
				t.Fatalf("not JSON: %s", got)
			}
			// The SDK reads it back: the attributes, the content type and the data as stored.
			var ev cloudevent.Event
			if err := json.Unmarshal(got, &ev); err != nil {
				t.Fatalf("the SDK refuses %s: %v", got, err)
			}
			if ev.ID() != "a" || ev.Source() != "/s" || ev.Type() != "t" || ev.Extensions()["n"] == nil {
				t.Errorf("the SDK reads %v", ev)
			}
			if ev.DataContentType() != tc.contentType && !(tc.contentType == "" && ev.DataContentType() == "application/json") {
				t.Errorf("datacontenttype %q, want %q", ev.DataContentType(), tc.contentType)
			}
			wantData := tc.data
			if strings.Contains(tc.want, `"data":`) {
				wantData = strings.Trim(tc.data, jsonSpace)
			}
			if string(ev.Data()) != wantData {
				t.Errorf("the SDK reads data %q, want %q", ev.Data(), wantData)
			}
		})
	}
}

func TestDataAsJSON(t *testing.T) {
	for ct, want := range map[string]bool{
		"": true, "application/json": true, "application/json; charset=utf-8": true, "application/json;x=y": true,
		// What the Go SDK reads as a JSON string, not a JSON value.
		"Application/JSON": false, "application/cloudevents+json": false, "application/ld+json": false,
		" application/json": false, "text/plain": false, "application/jsonx": false, "text/json": false,
	} {
		if dataAsJSON(ct) != want {
			t.Errorf("dataAsJSON(%q) = %v", ct, !want)
		}
	}
}

func TestCheckSource(t *testing.T) {
	for _, ok := range []string{DefaultSource, "https://fleet.example.com/sluice", "urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66",
		"//example.com/a%20b", "billing", "/x?y=1#z", "mailto:ops@example.com"} {
		if err := CheckSource(ok); err != nil {
			t.Errorf("CheckSource(%q): %v", ok, err)
		}
	}
	for src, want := range map[string]string{
		"":                        "must not be empty",
		"/a b":                    "a space must be percent-encoded",
		"/ø":                      "non-ASCII byte must be percent-encoded",
		`/"q"`:                    `""" must be percent-encoded`,
		"/a%2":                    `"%" must start a percent-encoded byte`,
		"/a%zz":                   `"%" must start a percent-encoded byte`,
		"http://[::1":             "not a URI-reference",
		strings.Repeat("a", 1025): "longer than 1024 bytes",
	} {
		if err := CheckSource(src); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckSource(%q) = %v, want %q", src, err, want)
		}
	}
}

// FuzzRender: whatever the attributes, content type and data, rendering
// never panics and the two modes agree on what they accept; what they
// render carries the attributes as given: the structured body is JSON
// that decodes to them, the data and the content type, and each header
// percent-decodes to its attribute's text.
func FuzzRender(f *testing.F) {
	f.Add(`{"specversion":"1.0","id":"a","source":"/s","type":"t"}`, "application/json", []byte(`{"a":1}`))
	f.Add(`{"specversion":"1.0","id":"a b%","source":"/ø","type":"t","x":1.5,"y":false,"z":null,"s":"\u0000\"\\"}`, "text/plain", []byte("hi"))
	f.Add(`{"specversion":"1.0","id":"a","source":"/s","type":"t","id":"b"}`, "", []byte(`[`))
	f.Add(` { "specversion" : "1.0" , "id":"a","source":"/s","type":"t" } `, "application/x+json", []byte(" 1 "))
	f.Add(`{"specversion":"1.0","id":"a","source":"/s","type":"t","e":{}}`, "", []byte(nil))
	f.Fuzz(func(t *testing.T, attrs, contentType string, data []byte) {
		h, herr := AppendHeaders(nil, []byte(attrs))
		body, serr := AppendStructured(nil, []byte(attrs), contentType, data)
		if (herr == nil) != (serr == nil) {
			t.Fatalf("binary: %v; structured: %v", herr, serr)
		}
		if herr != nil {
			var ae *AttrError
			if !errors.As(herr, &ae) {
				t.Fatalf("not an *AttrError: %v", herr)
			}
			return
		}
		var want map[string]any
		dec := json.NewDecoder(strings.NewReader(attrs))
		dec.UseNumber()
		if err := dec.Decode(&want); err != nil {
			t.Fatalf("accepted attributes that do not decode: %v", err)
		}
		var got map[string]any
		dec = json.NewDecoder(strings.NewReader(string(body)))
		dec.UseNumber()
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("structured body is not JSON: %v\n%s", err, body)
		}
		wantCT := contentType // as JSON can carry it: each byte of invalid UTF-8 as U+FFFD
		b, _ := json.Marshal(wantCT)
		json.Unmarshal(b, &wantCT)
		if ct, ok := got["datacontenttype"]; ok != (contentType != "") || ok && ct != wantCT {
			t.Fatalf("datacontenttype %v, want %q", ct, contentType)
		}
		switch {
		case got["data"] != nil:
			if !dataAsJSON(contentType) {
				t.Fatalf("data as JSON with content type %q", contentType)
			}
		case got["data_base64"] != nil:
			b, err := base64.StdEncoding.DecodeString(got["data_base64"].(string))
			if err != nil || string(b) != string(data) {
				t.Fatalf("data_base64 %v decodes to %q (%v), want %q", got["data_base64"], b, err, data)
			}
		case len(data) > 0:
			t.Fatalf("data %q is missing from %s", data, body)
		}
		delete(got, "data")
		delete(got, "data_base64")
		delete(got, "datacontenttype")
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("structured attributes %v, want %v", got, want)
		}
		headers := 0
		for k, v := range h.All() {
			headers++
			name := strings.ToLower(strings.TrimPrefix(string(k), "Ce-"))
			if strings.ContainsAny(string(v), " \"\r\n\x00") {
				t.Fatalf("%s: %q is not percent-encoded", k, v)
			}
			text, err := url.PathUnescape(string(v))
			if err != nil {
				t.Fatalf("%s: %q: %v", k, v, err)
			}
			var wantText string
			switch a := want[name].(type) {
			case string:
				// encoding/json reads each byte of invalid UTF-8 as U+FFFD:
				// so must the header's text be read.
				wantText = a
				b, _ := json.Marshal(text)
				json.Unmarshal(b, &text)
			case json.Number:
				wantText = a.String()
			case bool:
				wantText = map[bool]string{true: "true", false: "false"}[a]
			default:
				t.Fatalf("%s: header for %T", k, a)
			}
			if text != wantText {
				t.Fatalf("%s decodes to %q, want %q", k, text, wantText)
			}
		}
		nonNull := 0
		for _, v := range want {
			if v != nil {
				nonNull++
			}
		}
		if headers != nonNull {
			t.Fatalf("%d headers for %d attributes", headers, nonNull)
		}
	})
}

// BenchmarkRender is what a CloudEvents format costs per event (the
// delivery engine renders once per event and shares the result between
// every subscription of the format): the binary-mode headers and the
// structured body of a 512-byte JSON body, for attributes derived from a
// plain event and for ones posted with the event.
func BenchmarkRender(b *testing.B) {
	data := []byte(`{"type":"geofence.enter","data":{"depot":"A","speed":42,"kind":"alarm.high","pad":"` + strings.Repeat("x", 430) + `"}}`)
	at := time.Date(2026, 3, 4, 5, 6, 7, 891_234_000, time.UTC)
	posted := []byte(`{"specversion":"1.0","id":"order-7","source":"https://shop.example/orders","type":"order.created","subject":"orders/7","time":"2026-03-04T05:06:07.5Z","priority":3}`)
	attrs := func(derived bool) []byte {
		if derived {
			return AppendDerived(make([]byte, 0, 160), "01JC8Z4Q9Y3W2V1T0S9R8Q7P6N", "geofence.enter", DefaultSource, at)
		}
		return posted
	}
	for _, derived := range []bool{true, false} {
		b.Run(fmt.Sprintf("derived=%v/binary", derived), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := AppendHeaders(nil, attrs(derived)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("derived=%v/structured", derived), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				a := attrs(derived)
				if _, err := AppendStructured(make([]byte, 0, len(a)+len(data)+64), a, "application/json", data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
