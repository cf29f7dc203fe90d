package delivery

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// TestVariantSnapshotRoundTrip: the membership snapshot keeps a
// subscription's body variant in canonical form, so that a removed
// subscription drains with it and an API subscription keeps it across
// restarts; snapshots written before variants existed have none.
func TestVariantSnapshotRoundTrip(t *testing.T) {
	v, err := policy.ParseVariant(policy.VariantSpec{Envelope: policy.EnvelopeStandardWebhooks, Fields: []string{"data.id", "data.depot", "data.id.x"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, managed := range []string{api.ManagedByFile, api.ManagedByAPI} {
		s := (&Subscription{ID: "a", URL: "https://a.example/", Variant: v, ManagedBy: managed, Spec: []byte(`{}`)}).WithDefaults()
		snap := encodeSnapshot(s)
		if !strings.Contains(string(snap), `"body":{"envelope":"standard-webhooks","fields":["data.depot","data.id"]}`) {
			t.Errorf("%s snapshot %s", managed, snap)
		}
		back, err := decodeSnapshot("a", snap)
		if err != nil {
			t.Fatal(err)
		}
		if back.Variant.Key() != v.Key() {
			t.Errorf("%s: variant %v after the snapshot, want %v", managed, back.Variant, v)
		}
		if string(encodeSnapshot(back)) != string(snap) {
			t.Errorf("%s: snapshot changed across a round trip:\n%s\n%s", managed, snap, encodeSnapshot(back))
		}
	}
	plain := encodeSnapshot((&Subscription{ID: "b", URL: "https://b.example/"}).WithDefaults())
	if strings.Contains(string(plain), `"body"`) {
		t.Errorf("snapshot without a variant: %s", plain)
	}
	if back, err := decodeSnapshot("b", plain); err != nil || back.Variant != nil {
		t.Errorf("no variant: %v %v", back.Variant, err)
	}
	bad := strings.Replace(string(plain), `{"url"`, `{"body":{"envelope":"svix"},"url"`, 1)
	if _, err := decodeSnapshot("b", []byte(bad)); err == nil || !strings.Contains(err.Error(), "body.envelope") {
		t.Errorf("bad variant in a snapshot: %v", err)
	}
}

// TestVariantDeadLetterCopyRendersTheSameBytes: a dead letter, encoded as
// both backends store it, keeps what a variant renders from (the body, the
// type, the accepted-at time to the nanosecond), so a replay of an event
// the log has compacted (startRetries builds the event from the letter)
// sends the bytes of the first attempt.
func TestVariantDeadLetterCopyRendersTheSameBytes(t *testing.T) {
	v, err := policy.ParseVariant(policy.VariantSpec{Envelope: policy.EnvelopeStandardWebhooks, Fields: []string{"data"}})
	if err != nil {
		t.Fatal(err)
	}
	// A wall clock with a monotonic reading and a zone, as ingest stamps it.
	at := time.Now().In(time.FixedZone("X", -7*3600))
	ev := &queue.Event{Seq: 9, ID: "ev-9", Type: "card.shipped", ContentType: "application/json", AcceptedAt: at,
		Body: []byte(`{"data": {"id": 9, "note": "\u00e9"}, "x": 1}`)}
	first, err := v.Render(ev.Type, ev.AcceptedAt, ev.Body)
	if err != nil {
		t.Fatal(err)
	}
	b, err := queue.AppendDeadLetter(nil, newDeadLetter("a", "", ev, policy.ReasonRejected, 1, policy.Exchange{Status: 404}, "", time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	dl, err := queue.DecodeDeadLetter(b)
	if err != nil {
		t.Fatal(err)
	}
	copied := &queue.Event{Seq: 9, ID: dl.EventID, Type: dl.Type, ContentType: dl.ContentType, AcceptedAt: dl.AcceptedAt, Body: dl.Body}
	again, err := v.Render(copied.Type, copied.AcceptedAt, copied.Body)
	if err != nil || string(again) != string(first) {
		t.Fatalf("from the dead letter: %s (%v)\nfirst attempt:        %s", again, err, first)
	}
}
