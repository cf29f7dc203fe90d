package queue_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// TestDeadLetterEncodingKeepsEventContext: a dead letter's ordering key and
// trace context round-trip; a letter written before they existed (its
// header built here as that version wrote it) decodes with them empty; and
// a letter without them encodes as it did before.
func TestDeadLetterEncodingKeepsEventContext(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	d := &queue.DeadLetter{Subscription: "s", Seq: 3, EventID: "e", Type: "t", Reason: "rejected", Attempts: 1,
		DeadAt: time.Unix(1_700_000_000, 0).UTC(), OrderingKey: "vehicle-17", TraceParent: tp, TraceState: "rojo=1", Body: []byte("x")}
	b, err := queue.AppendDeadLetter(nil, d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := queue.DecodeDeadLetter(b)
	if err != nil || got.OrderingKey != "vehicle-17" || got.TraceParent != tp || got.TraceState != "rojo=1" || string(got.Body) != "x" {
		t.Fatalf("round trip = %+v, %v", got, err)
	}

	h := `{"subscription":"s","seq":3,"event_id":"e","type":"t","accepted_at":"0001-01-01T00:00:00Z","reason":"rejected","attempts":1,"dead_at":"2023-11-14T22:13:20Z"}`
	old := binary.AppendUvarint([]byte{1}, uint64(len(h)))
	old = append(append(old, h...), 'x')
	got, err = queue.DecodeDeadLetter(old)
	if err != nil || got.EventID != "e" || got.OrderingKey != "" || got.TraceParent != "" || got.TraceState != "" || string(got.Body) != "x" {
		t.Fatalf("an old letter decodes as %+v, %v", got, err)
	}
	d.OrderingKey, d.TraceParent, d.TraceState = "", "", ""
	if b, err := queue.AppendDeadLetter(nil, d); err != nil || string(b) != string(old) {
		t.Fatalf("a letter without them encodes as\n%q\nwant the old bytes\n%q", b, old)
	}
}
