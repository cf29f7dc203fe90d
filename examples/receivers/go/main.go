// Command receiver is a webhook endpoint for sluice deliveries, verifying
// them with the signing package (HMAC from crypto/hmac, Ed25519 from
// crypto/ed25519).
//
// Environment: PORT (8080), WEBHOOK_SECRET (space-separated whsec_ secrets
// for HMAC "v1" signatures and whpk_ public keys for Ed25519 "v1a" ones, as
// during a rotation or a migration), FAIL_FIRST (answer 500 to the first N
// deliveries, to watch retries).
//
// POST any path answers 204 processed, 200 webhook-id already processed (not
// re-processed), 400 missing or malformed headers, 401 bad signature or a
// timestamp more than 5 minutes off, 500 while FAIL_FIRST lasts.
// GET /_stats answers {"received", "duplicates", "rejected"}.
package main

import (
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/signing"
)

const seenTTL = 24 * time.Hour // remember ids as long as sluice's dedup window

type receiver struct {
	secrets []signing.Secret    // whsec_
	keys    []signing.PublicKey // whpk_

	mu       sync.Mutex
	failLeft int
	seen     map[string]time.Time // webhook-id -> when processed
	stats    struct {
		Received   int64 `json:"received"`
		Duplicates int64 `json:"duplicates"`
		Rejected   int64 `json:"rejected"`
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (rc *receiver) serveStats(w http.ResponseWriter, _ *http.Request) {
	rc.mu.Lock()
	st := rc.stats
	rc.mu.Unlock()
	writeJSON(w, http.StatusOK, st)
}

func (rc *receiver) serveWebhook(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": "body too large"})
		return
	}
	rc.mu.Lock()
	if rc.failLeft > 0 {
		rc.failLeft--
		rc.mu.Unlock()
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "FAIL_FIRST"})
		return
	}
	rc.mu.Unlock()

	id := r.Header.Get(signing.HeaderID)
	err = signing.Verify(rc.secrets, id, r.Header.Get(signing.HeaderTimestamp),
		r.Header.Get(signing.HeaderSignature), body, time.Now(), signing.DefaultTolerance, rc.keys...)
	if err != nil {
		status := http.StatusUnauthorized
		if errors.Is(err, signing.ErrMissingHeader) || errors.Is(err, signing.ErrBadTimestamp) {
			status = http.StatusBadRequest
		}
		rc.mu.Lock()
		rc.stats.Rejected++
		rc.mu.Unlock()
		writeJSON(w, status, map[string]string{"error": err.Error()})
		return
	}

	now := time.Now()
	rc.mu.Lock()
	if _, dup := rc.seen[id]; dup {
		rc.stats.Duplicates++
		rc.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]bool{"duplicate": true})
		return
	}
	if len(rc.seen) > 100000 {
		for k, t := range rc.seen {
			if now.Sub(t) > seenTTL {
				delete(rc.seen, k)
			}
		}
	}
	rc.seen[id] = now
	rc.mu.Unlock()

	process(id, body)

	rc.mu.Lock()
	rc.stats.Received++
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// process is where business logic goes; it runs once per webhook-id.
func process(id string, body []byte) {}

func main() {
	var secrets []signing.Secret
	var keys []signing.PublicKey
	for _, s := range strings.Fields(os.Getenv("WEBHOOK_SECRET")) {
		switch {
		case strings.HasPrefix(s, "whpk_"):
			pk, err := signing.ParsePublicKey(s)
			if err != nil {
				log.Fatalf("WEBHOOK_SECRET: %v", err)
			}
			keys = append(keys, pk)
		case strings.HasPrefix(s, "whsk_"):
			log.Fatal("WEBHOOK_SECRET: a whsk_ key is the sender's secret; give its whpk_ public key")
		default:
			k, err := signing.ParseSecret(s)
			if err != nil {
				log.Fatalf("WEBHOOK_SECRET: %v", err)
			}
			secrets = append(secrets, k)
		}
	}
	if len(secrets) == 0 && len(keys) == 0 {
		log.Fatal("WEBHOOK_SECRET is required")
	}
	failFirst, _ := strconv.Atoi(os.Getenv("FAIL_FIRST"))
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}

	rc := &receiver{secrets: secrets, keys: keys, failLeft: failFirst, seen: make(map[string]time.Time)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /_stats", rc.serveStats)
	mux.HandleFunc("POST /", rc.serveWebhook)
	srv := &http.Server{Addr: ":" + port, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("receiver listening on :%s", port)
	log.Fatal(srv.ListenAndServe())
}
