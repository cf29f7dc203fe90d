package admin

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
)

// TestSortExpiring: secrets that never expire first, then the latest
// deadline first, so the live ones are always a prefix.
func TestSortExpiring(t *testing.T) {
	ks := make([]signing.Secret, 4)
	for i := range ks {
		ks[i], _ = signing.GenerateSecret()
	}
	t1, t2 := time.Unix(100, 0), time.Unix(200, 0)
	secrets := []signing.Secret{ks[0], ks[1], ks[2], ks[3]}
	expiry := []time.Time{t1, {}, t2, t1.Add(50 * time.Second)}
	sortExpiring(secrets, expiry)
	want := []signing.Secret{ks[1], ks[2], ks[3], ks[0]}
	for i := range want {
		if secrets[i].Encode() != want[i].Encode() {
			t.Fatalf("position %d: got expiry %v", i, expiry)
		}
	}
	s := &delivery.Subscription{Secrets: secrets, SecretExpiry: expiry}
	if n := len(s.LiveSecrets(time.Unix(160, 0))); n != 2 {
		t.Fatalf("at 160 s the secrets of 200 s and the one without a deadline sign: got %d", n)
	}
}
