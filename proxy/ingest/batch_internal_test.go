package ingest

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestIngestGateBatch: the gate admits a batch's events and bytes
// together: over either bound only when nothing else is inside (a batch
// larger than the gate must not be refused for ever), and what it admits
// it releases whole.
func TestIngestGateBatch(t *testing.T) {
	g := ingestGate{maxEvents: 10, maxBytes: 1000}
	if !g.enter(50, 5000) {
		t.Fatal("a batch larger than the gate, alone, refused")
	}
	if g.enter(1, 1) {
		t.Fatal("an event admitted past a full gate")
	}
	g.leave(50, 5000)
	if !g.enter(6, 600) || g.enter(6, 10) || g.enter(1, 500) || !g.enter(4, 400) {
		t.Fatal("the bounds of events and bytes do not hold for batches")
	}
	g.leave(6, 600)
	g.leave(4, 400)
	if g.events.Load() != 0 || g.bytes.Load() != 0 {
		t.Fatalf("after every leave: %d events, %d bytes", g.events.Load(), g.bytes.Load())
	}
}

// TestBodyLimit: a batch's body is bound by ingest.max_batch_bytes, any
// other request's by max_body_bytes, and each 413 names its own.
func TestBodyLimit(t *testing.T) {
	s := New(Config{MaxBodyBytes: 100, Limits: Limits{MaxBatchBytes: 5000}})
	for _, c := range []struct {
		uri, ctype string
		max        int
		key        string
	}{
		{"/v1/events", "application/x-ndjson", 5000, "ingest.max_batch_bytes"},
		{"/v1/events?x=1", "application/x-ndjson; charset=utf-8", 5000, "ingest.max_batch_bytes"},
		{"/v1/events", "application/cloudevents-batch+json", 5000, "ingest.max_batch_bytes"},
		{"/v1/events", "application/cloudevents+json", 100, "max_body_bytes"},
		{"/v1/events/t", "application/x-ndjson", 100, "max_body_bytes"},
		{"/v1/events/", "application/x-ndjson", 100, "max_body_bytes"},
		{"/v1/eventsx", "application/x-ndjson", 100, "max_body_bytes"},
	} {
		var h fasthttp.RequestHeader
		h.SetRequestURI(c.uri)
		h.SetContentType(c.ctype)
		if max, key := s.bodyLimit(&h); max != c.max || key != c.key {
			t.Errorf("%s as %s: %d %s, want %d %s", c.uri, c.ctype, max, key, c.max, c.key)
		}
	}
}

// FuzzBatchNDJSON: whatever the body, the NDJSON reader does not panic,
// reads no more events than the limit, and what it accepts agrees with
// encoding/json: each non-blank line is a JSON object whose type, id,
// ordering key and body (the value's own bytes, or body_base64 decoded)
// are the event's.
func FuzzBatchNDJSON(f *testing.F) {
	for _, s := range []string{
		`{"type":"order.created","id":"o-1","body":{"n":1}}` + "\n" + `{"type":"t","id":"b","body_base64":"AAEC","ordering_key":"k"}`,
		`{ "id" : "x\/y", "type" : "t.a", "content_type" : "text/plain", "body" : "s\"\u00e9" }` + "\r\n\r\n",
		`{"type":"t","id":"x","body":[1,{"a":[true,null,-1.5e3]}]}`,
		`{"type":"t","id":"x","body":{"a":}}`,
		`{"type":"t","id":"x","id":"y","body":1}`,
		`{"type":"t","id":"x","body":"\ud800"}`,
		`{"Type":"t","id":"x","body":1}`,
		`{"type":"t","id":"x","body":1} {}`,
		`[]`,
		"{\"type\":\"t\",\"id\":\"\x01\",\"body\":1}",
		"",
	} {
		f.Add([]byte(s))
	}
	s := New(Config{MaxBodyBytes: 1 << 10, Limits: Limits{MaxBatchEvents: 20}})
	f.Fuzz(func(t *testing.T, body []byte) {
		b := batch{in: &s.in, now: time.Now()}
		if err := s.readNDJSON(body, &b); err != nil {
			if err.status != fasthttp.StatusBadRequest && err.status != fasthttp.StatusRequestEntityTooLarge {
				t.Fatalf("status %d: %s", err.status, err.msg)
			}
			return
		}
		if len(b.evs) > 20 {
			t.Fatalf("%d events read past a limit of 20", len(b.evs))
		}
		var lines [][]byte
		for _, l := range bytes.Split(body, []byte{'\n'}) {
			if len(bytes.TrimLeft(l, " \t\r\n")) > 0 {
				lines = append(lines, l)
			}
		}
		if len(lines) != len(b.evs) {
			t.Fatalf("%d events from %d lines", len(b.evs), len(lines))
		}
		for i, l := range lines {
			var want struct {
				Type        string          `json:"type"`
				ID          string          `json:"id"`
				Body        json.RawMessage `json:"body"`
				BodyBase64  []byte          `json:"body_base64"`
				OrderingKey string          `json:"ordering_key"`
			}
			if err := json.Unmarshal(l, &want); err != nil {
				t.Fatalf("line %q read as an event, but encoding/json: %v", l, err)
			}
			ev := b.evs[i]
			body := []byte(want.Body)
			if want.Body == nil {
				body = want.BodyBase64
			}
			if ev.Type != want.Type || ev.ID != want.ID || ev.OrderingKey != want.OrderingKey || !bytes.Equal(ev.Body, body) {
				t.Fatalf("line %q read as %+v; encoding/json reads %+v", l, ev, want)
			}
		}
	})
}

// FuzzJSONValue: the body's scanner accepts exactly what json.Valid
// accepts, and ends a value where it ends.
func FuzzJSONValue(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,-0.5e+3,true,false,null,"s\"\\\/\b\f\n\r\t\u00e9"]}`, ` [ ] `, `{}`, `""`, `0`, `-`, `01`, `1.`, `1e`, `.5`,
		`"\u12"`, `"\x"`, "\"\x01\"", `{"a" 1}`, `{"a":1,}`, `[1,]`, `[1 2]`, `tru`, `nul`, `{"a":{"b":[[[]]]}}`, `"\ud800"`, "\"\xff\"",
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001), strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		end, ok := scanValue(b, skipSpace(b, 0), 0)
		ours := ok && skipSpace(b, end) == len(b)
		if want := json.Valid(b); ours != want {
			t.Fatalf("scanValue says %v (end %d), json.Valid %v, for %q", ours, end, want, b)
		}
	})
}

// BenchmarkReadNDJSON reads a batch of 100 events of 512 B bodies (as the
// bench's ingest-batch posts); ns/op is per batch. json.Valid is what
// checking the bodies alone cost with encoding/json, for comparison.
func BenchmarkReadNDJSON(b *testing.B) {
	body := []byte(`{"sent_ns":1234567890123456789,"at_ns":1234567890123456789,"pad":"` + strings.Repeat("x", 440) + `"}`)
	var batchBody []byte
	for i := range 100 {
		batchBody = append(batchBody, `{"type":"bench.event","id":"k-1-`...)
		batchBody = append(batchBody, strconv.Itoa(i)...)
		batchBody = append(batchBody, `","body":`...)
		batchBody = append(batchBody, body...)
		batchBody = append(batchBody, "}\n"...)
	}
	s := New(Config{MaxBodyBytes: 1 << 20})
	b.Run("read", func(b *testing.B) {
		b.SetBytes(int64(len(batchBody)))
		for b.Loop() {
			bt := batch{in: &s.in}
			if err := s.readNDJSON(batchBody, &bt); err != nil || len(bt.evs) != 100 {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Valid", func(b *testing.B) {
		b.SetBytes(int64(len(batchBody)))
		for b.Loop() {
			for range 100 {
				if !json.Valid(body) {
					b.Fatal("invalid")
				}
			}
		}
	})
}
