package proxy_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/signing"
)

// TestEd25519Delivery signs a subscription's deliveries with an Ed25519
// (whsk_) secret beside an HMAC one: each delivery carries a v1
// and a v1a entry, a receiver holding only the whpk_ key or only the HMAC
// secret accepts it, and GET /v1/subscriptions/{id} shows the whpk_ key,
// never the whsk_ one.
func TestEd25519Delivery(t *testing.T) {
	const edText = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=" // RFC 8032 TEST 1's seed
	const wantPK = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="
	ed := mustSecret(edText)
	pk, err := signing.ParsePublicKey(wantPK)
	if err != nil {
		t.Fatal(err)
	}
	type delivery struct {
		id, ts, sig string
		body        []byte
	}
	var mu sync.Mutex
	var got []delivery
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var d delivery
		d.id, d.ts, d.sig = r.Header.Get(signing.HeaderID), r.Header.Get(signing.HeaderTimestamp), r.Header.Get(signing.HeaderSignature)
		var err error
		if d.body, err = io.ReadAll(r.Body); err != nil {
			t.Errorf("read body: %v", err)
		}
		mu.Lock()
		got = append(got, d)
		mu.Unlock()
	}))
	t.Cleanup(endpoint.Close)

	sb := sub("signed", endpoint.URL)
	sb.Secrets = []signing.Secret{ed, testSecret}
	s := startAdminServer(t, "", "", sb)
	publish(t, s, "order.paid", "ed", 2)
	eventually(t, "two deliveries", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 2 })

	mu.Lock()
	defer mu.Unlock()
	for _, d := range got {
		entries := strings.Split(d.sig, " ")
		if len(entries) != 2 || !strings.HasPrefix(entries[0], "v1a,") || !strings.HasPrefix(entries[1], "v1,") {
			t.Fatalf("webhook-signature %q: want a v1a entry, then a v1 one (the secrets' order)", d.sig)
		}
		now := time.Now()
		if err := signing.Verify(nil, d.id, d.ts, d.sig, d.body, now, 0, pk); err != nil {
			t.Errorf("%s: whpk_ receiver: %v", d.id, err)
		}
		if err := signing.Verify([]signing.Secret{testSecret}, d.id, d.ts, d.sig, d.body, now, 0); err != nil {
			t.Errorf("%s: HMAC receiver: %v", d.id, err)
		}
	}

	code, body := rawAdmin(t, s, "GET", "/v1/subscriptions/signed", "", "")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/subscriptions/signed: %d %s", code, body)
	}
	var info struct {
		PublicKeys []string `json:"public_keys"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		t.Fatal(err)
	}
	if len(info.PublicKeys) != 1 || info.PublicKeys[0] != wantPK {
		t.Errorf("public_keys = %q, want [%s]", info.PublicKeys, wantPK)
	}
	if strings.Contains(string(body), strings.TrimPrefix(edText, "whsk_")[:16]) {
		t.Errorf("the answer shows the private key: %s", body)
	}

	// An HMAC-only subscription's answer has no public_keys at all.
	plain := startAdminServer(t, "", "", sub("plain", endpoint.URL))
	if _, body := rawAdmin(t, plain, "GET", "/v1/subscriptions/plain", "", ""); strings.Contains(string(body), "public_keys") {
		t.Errorf("HMAC subscription shows public_keys: %s", body)
	}
}
