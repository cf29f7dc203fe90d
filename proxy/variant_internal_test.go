package proxy

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
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
	for _, managed := range []string{ManagedByFile, ManagedByAPI} {
		s := (&Subscription{ID: "a", URL: "https://a.example/", Variant: v, ManagedBy: managed, Spec: []byte(`{}`)}).withDefaults()
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
	plain := encodeSnapshot((&Subscription{ID: "b", URL: "https://b.example/"}).withDefaults())
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
