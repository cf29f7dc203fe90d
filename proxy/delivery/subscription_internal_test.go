package delivery

import (
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/signing"
)

// TestSnapshotKeepsWhatTheAPISet: an API subscription lives in its
// membership's snapshot, so everything the API set must come back from
// it after a restart: tenant, filter, who manages it, its document, a
// pause written in the document, and the rotation deadlines of its
// secrets (they were lost once, checked before the secrets were read).
func TestSnapshotKeepsWhatTheAPISet(t *testing.T) {
	f, err := policy.ParseFilter(map[string]any{"data.depot": map[string]any{"$in": []any{"A", "B"}}})
	if err != nil {
		t.Fatal(err)
	}
	k1, _ := signing.GenerateSecret()
	k2, _ := signing.GenerateSecret()
	until := time.Unix(1_800_000_000, 0).UTC()
	in := (&Subscription{
		ID: "api", URL: "https://example.com/hook", Secrets: []signing.Secret{k1, k2}, SecretExpiry: []time.Time{{}, until},
		Types: []string{"geofence.*"}, Tenant: "acme", Filter: f, ManagedBy: api.ManagedByAPI, Paused: true,
		Spec: []byte(`{"id":"api"}`),
	}).WithDefaults()
	out, err := decodeSnapshot("api", encodeSnapshot(in))
	if err != nil {
		t.Fatal(err)
	}
	if out.Tenant != "acme" || out.ManagedBy != api.ManagedByAPI || !out.Paused || string(out.Spec) != `{"id":"api"}` {
		t.Errorf("lost a setting: %+v", out)
	}
	if out.Filter == nil || out.Filter.String() != f.String() {
		t.Errorf("filter: got %v, want %s", out.Filter, f)
	}
	if !slices.EqualFunc(out.SecretExpiry, in.SecretExpiry, time.Time.Equal) || len(out.Secrets) != 2 {
		t.Errorf("secret deadlines: got %v for %d secrets, want %v", out.SecretExpiry, len(out.Secrets), in.SecretExpiry)
	}
	if live := out.LiveSecrets(until.Add(time.Second)); len(live) != 1 || live[0].Encode() != k1.Encode() {
		t.Errorf("after the grace only the new secret signs; got %d secrets", len(live))
	}
	if live := out.LiveSecrets(until.Add(-time.Second)); len(live) != 2 {
		t.Errorf("during the grace both secrets sign; got %d", len(live))
	}
	// A file subscription's snapshot holds no document: the file has it.
	file := (&Subscription{ID: "f", URL: "https://example.com/f", Secrets: []signing.Secret{k1}, Spec: []byte(`{"id":"f"}`)}).WithDefaults()
	back, err := decodeSnapshot("f", encodeSnapshot(file))
	if err != nil {
		t.Fatal(err)
	}
	if back.Spec != nil || back.ManagedByAPI() {
		t.Errorf("file subscription: spec %q, managed by %q", back.Spec, back.ManagedBy)
	}
}
