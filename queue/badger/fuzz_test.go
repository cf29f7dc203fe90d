package badger

import (
	"bytes"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// FuzzDecodeEvent: decoding arbitrary bytes never panics, and what encodes
// decodes to the same event.
func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte("id-1"), []byte("geofence.enter"), []byte("application/json"), []byte(`{"a":1}`), "", "")
	f.Add([]byte(""), []byte(""), []byte(""), []byte(""), "", "")
	f.Add(bytes.Repeat([]byte{0xff}, 20), []byte{0}, []byte{1}, []byte{2, 3}, "", "")
	f.Add([]byte("id-2"), []byte("t"), []byte("text/plain"), []byte("x"), "vehicle-17", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	f.Fuzz(func(t *testing.T, id, typ, ct, body []byte, key, trace string) {
		// Each input runs without a tenant and with key as its tenant, so
		// every record version is fuzzed.
		for _, tenant := range []string{"", key} {
			ev := &queue.Event{ID: string(id), Type: string(typ), ContentType: string(ct), AcceptedAt: time.Unix(0, 42), Body: body,
				OrderingKey: key, TraceParent: trace, TraceState: key, Tenant: tenant}
			b := appendEvent(nil, ev)
			got, err := decodeEvent(7, b)
			if err != nil {
				t.Fatalf("round trip: %v", err)
			}
			if got.ID != ev.ID || got.Type != ev.Type || got.ContentType != ev.ContentType || !bytes.Equal(got.Body, ev.Body) || !got.AcceptedAt.Equal(ev.AcceptedAt) ||
				got.OrderingKey != ev.OrderingKey || got.TraceParent != ev.TraceParent || got.TraceState != ev.TraceState || got.Tenant != ev.Tenant {
				t.Fatalf("round trip changed the event: %+v", got)
			}
			if ten2, typ2, err := eventTenantType(b); err != nil || string(typ2) != ev.Type || string(ten2) != ev.Tenant {
				t.Fatalf("eventTenantType = %q, %q, %v", ten2, typ2, err)
			}
			if id2, typ2, ten2, err := eventIDType(b); err != nil || id2 != ev.ID || typ2 != ev.Type || ten2 != ev.Tenant {
				t.Fatalf("eventIDType = %q, %q, %q, %v", id2, typ2, ten2, err)
			}
			// Any prefix or mutation decodes or fails cleanly.
			for i := range b {
				decodeEvent(1, b[:i])
				eventTenantType(b[:i])
			}
		}
		decodeEvent(1, id)
		decodeDeadLetter(body)
	})
}

// FuzzDecodeDeadLetter: arbitrary bytes never panic the dead-letter decoder.
func FuzzDecodeDeadLetter(f *testing.F) {
	good, _ := appendDeadLetter(nil, &queue.DeadLetter{Subscription: "s", Seq: 1, EventID: "e", Reason: "rejected", Body: []byte("x")})
	f.Add(good)
	f.Add([]byte{recordVersion, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		decodeDeadLetter(b)
	})
}
