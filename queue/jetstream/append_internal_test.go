package jetstream

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// BenchmarkEventMsg: what building an event's message costs Append, with
// newEventMsg and eventSubject ("store") and as Append built it before
// (a header map literal and one slice per value, the subject joined from
// its encoding: "literal"), the baseline of the same run.
//
//	go test ./queue/jetstream -run '^$' -bench BenchmarkEventMsg -benchmem
func BenchmarkEventMsg(b *testing.B) {
	s := &Store{evSubj: "BENCH.ev."}
	ev := &queue.Event{ID: "0b5e2c1a-7f4e-4d0a-9a53-3c1f0f6b9a21", Type: "card.shipped", ContentType: "application/json",
		AcceptedAt: time.Now(), Body: make([]byte, 512)}
	var sink *nats.Msg
	b.Run("store", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sink = newEventMsg(s.eventSubject(ev.ID), ev)
		}
	})
	b.Run("literal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m := &nats.Msg{
				Subject: s.evSubj + base64.RawURLEncoding.EncodeToString([]byte(ev.ID)),
				Data:    ev.Body,
				Header: nats.Header{
					jetstream.MsgIDHeader: {ev.ID},
					hdrType:               {ev.Type},
					hdrAcceptedAt:         {strconv.FormatInt(ev.AcceptedAt.UnixNano(), 10)},
				},
			}
			m.Header[hdrContentType] = []string{ev.ContentType}
			sink = m
		}
	})
	_ = sink
}

// TestEventMsg: the message carries every header of the event that is
// set, and no empty one; the subject is the id's base64url.
func TestEventMsg(t *testing.T) {
	s := &Store{evSubj: "S.ev."}
	at := time.Unix(0, 1234567890)
	ev := &queue.Event{ID: "a/b c", Type: "t", ContentType: "application/json", TraceParent: "00-x-y-01", AcceptedAt: at, Body: []byte("x")}
	m := newEventMsg(s.eventSubject(ev.ID), ev)
	if want := "S.ev." + base64.RawURLEncoding.EncodeToString([]byte(ev.ID)); m.Subject != want {
		t.Errorf("subject %q, want %q", m.Subject, want)
	}
	long := string(make([]byte, 300))
	if got, want := s.eventSubject(long), "S.ev."+base64.RawURLEncoding.EncodeToString([]byte(long)); got != want {
		t.Errorf("subject of a long id: %q, want %q", got, want)
	}
	want := map[string]string{jetstream.MsgIDHeader: "a/b c", hdrType: "t", hdrContentType: "application/json",
		hdrAcceptedAt: "1234567890", hdrTraceParent: "00-x-y-01"}
	if len(m.Header) != len(want) {
		t.Errorf("headers %v, want %v", m.Header, want)
	}
	for k, v := range want {
		if got := m.Header[k]; len(got) != 1 || got[0] != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	got, err := decodeEvent(7, m.Subject, m.Header, m.Data)
	if err != nil || got.ID != ev.ID || got.Type != ev.Type || got.ContentType != ev.ContentType ||
		got.TraceParent != ev.TraceParent || got.OrderingKey != "" || !got.AcceptedAt.Equal(at) {
		t.Errorf("decoded %+v, %v", got, err)
	}
}

// TestParsePubAck: the PubAcks the servers send are read by hand as
// encoding/json reads them; errors and anything unusual go to
// encoding/json.
func TestParsePubAck(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     *jetstream.PubAck
		fast     bool
		errCode  jetstream.ErrorCode // an API error with this code
		invalid  bool                // ErrInvalidJSAck
	}{
		{"plain", `{"stream":"S","seq":42}`, &jetstream.PubAck{Stream: "S", Sequence: 42}, true, 0, false},
		{"duplicate", `{"stream":"S","seq":7,"duplicate":true}`, &jetstream.PubAck{Stream: "S", Sequence: 7, Duplicate: true}, true, 0, false},
		{"not duplicate", `{"stream":"S","seq":7,"duplicate":false}`, &jetstream.PubAck{Stream: "S", Sequence: 7}, true, 0, false},
		{"domain", `{"stream":"S","domain":"hub","seq":18446744073709551615}`, &jetstream.PubAck{Stream: "S", Domain: "hub", Sequence: 18446744073709551615}, true, 0, false},
		{"spaces", " {\n \"seq\" : 3 , \"stream\" : \"other\" }\n", &jetstream.PubAck{Stream: "other", Sequence: 3}, true, 0, false},
		{"escaped name", `{"stream":"S\u0041","seq":1}`, &jetstream.PubAck{Stream: "SA", Sequence: 1}, false, 0, false},
		{"unknown key", `{"stream":"S","seq":1,"val":"9"}`, &jetstream.PubAck{Stream: "S", Sequence: 1, Value: "9"}, false, 0, false},
		{"seq overflow", `{"stream":"S","seq":18446744073709551616}`, nil, false, 0, true},
		{"seq negative", `{"stream":"S","seq":-1}`, nil, false, 0, true},
		{"seq float", `{"stream":"S","seq":1.5}`, nil, false, 0, true},
		{"seq twice", `{"stream":"S","seq":1,"seq":2}`, &jetstream.PubAck{Stream: "S", Sequence: 2}, false, 0, false},
		{"no stream", `{"seq":1}`, nil, false, 0, true},
		{"empty", ``, nil, false, 0, true},
		{"trailing", `{"stream":"S","seq":1}x`, nil, false, 0, true},
		{"error", `{"error":{"code":503,"err_code":10077,"description":"maximum bytes exceeded"},"stream":"S","seq":0}`, nil, false, 10077, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := parsePubAckFast([]byte(tc.in), "S"); ok != tc.fast {
				t.Errorf("read by hand: %v, want %v", ok, tc.fast)
			}
			got, err := parsePubAck([]byte(tc.in), "S")
			switch {
			case tc.errCode != 0:
				if ae := apiError(err); ae == nil || ae.ErrorCode != tc.errCode {
					t.Fatalf("error %v, want API error %d", err, tc.errCode)
				}
			case tc.invalid:
				if !errors.Is(err, jetstream.ErrInvalidJSAck) {
					t.Fatalf("error %v, want ErrInvalidJSAck", err)
				}
			case err != nil || *got != *tc.want:
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// FuzzParsePubAck: what the hand-written reader accepts, encoding/json
// reads the same.
func FuzzParsePubAck(f *testing.F) {
	for _, s := range []string{`{"stream":"S","seq":42}`, `{"stream":"S","seq":7,"duplicate":true}`,
		`{"stream":"S","domain":"d","seq":0}`, `{"seq":1,"stream":"x"}`, ` { "stream" : "S" , "seq" : 9 } `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := parsePubAckFast(b, "S")
		if !ok {
			return
		}
		var want jetstream.PubAck
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("read by hand as %+v, but encoding/json: %v", fast, err)
		}
		if *fast != want {
			t.Fatalf("read by hand as %+v, encoding/json as %+v", fast, want)
		}
	})
}

// BenchmarkPubAck: reading a PubAck by hand against encoding/json alone
// (parsePubAckJSON), in the same run. A loop keeps the library's caches
// warm: about 0.85 µs a parse here (0.1 µs by hand), about 5 µs in a
// fleet node's CPU profile at 1,000 events/s (append.go, "Publishing").
//
//	go test ./queue/jetstream -run '^$' -bench BenchmarkPubAck -benchmem
func BenchmarkPubAck(b *testing.B) {
	in := []byte(`{"stream":"SLUICE_EVENTS","seq":123456789}`)
	b.Run("store", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := parsePubAck(in, "SLUICE_EVENTS"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := parsePubAckJSON(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestFollowerHeld: held and heldBytes follow pending through holds (a
// seq held again replaces its entry), releases and non-events.
func TestFollowerHeld(t *testing.T) {
	var f follower
	check := func(n, bytes int64) {
		t.Helper()
		if f.held.Load() != n || f.heldBytes.Load() != bytes || int64(len(f.pending)) != n {
			t.Fatalf("held %d, %d bytes (pending %d); want %d, %d", f.held.Load(), f.heldBytes.Load(), len(f.pending), n, bytes)
		}
	}
	f.hold(5, &queue.Event{Body: []byte("abc")})
	f.hold(6, nil)
	check(2, 3)
	f.hold(5, &queue.Event{Body: []byte("abcdef")})
	check(2, 6)
	if !f.holdsTooMuch(1) || f.holdsTooMuch(2) {
		t.Fatal("holdsTooMuch does not compare held with the window")
	}
	if _, ok := f.release(7); ok {
		t.Fatal("released a seq never held")
	}
	if ev, ok := f.release(5); !ok || len(ev.Body) != 6 {
		t.Fatalf("release(5) = %v, %v", ev, ok)
	}
	check(1, 0)
	if ev, ok := f.release(6); !ok || ev != nil {
		t.Fatalf("release(6) = %v, %v", ev, ok)
	}
	check(0, 0)
}
