package jetstream

import (
	"encoding/base64"
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
