package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sluicehq/sluice/testbed"
)

// apiProc is a sluice serve process whose admin listener keeps its
// port across restarts, for the subscription API's end-to-end tests.
type apiProc struct {
	*sidecar
	admin string // http://127.0.0.1:port
	token string
}

func newAPIProc(t *testing.T, dir, extraYAML string) *apiProc {
	sc := newSidecar(t, dir, "  []\n")
	port := freePort(t)
	tokenFile := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(tokenFile, []byte("operator-token-0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("listen: unix://%s\nadmin:\n  listen: %s\n  token_file: %s\ndata_dir: %s\nlog_level: warn\nallow_private_targets: true\n%s",
		sc.sock, port, tokenFile, filepath.Join(dir, "data"), extraYAML)
	if err := os.WriteFile(sc.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return &apiProc{sidecar: sc, admin: "http://" + port, token: "operator-token-0123456789"}
}

// call makes one admin request and returns the status and body.
func (a *apiProc) call(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	return adminCall(t, a.admin, a.token, method, path, body)
}

// awaitAdmin waits until the admin API answers (the process is up).
func (a *apiProc) awaitAdmin(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, a.admin+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+a.token)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin API never ready; log:\n%s", a.log.String())
		}
		time.Sleep(10 * time.Millisecond) // another process starting; nothing to await
	}
}

func (a *apiProc) publish(t *testing.T, prefix string, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if code, err := a.post("geofence.enter", id); err != nil || code != 202 {
			t.Fatalf("publish %s: %d %v", id, code, err)
		}
		ids = append(ids, id)
	}
	return ids
}

// TestAPISubscriptionSurvivesSIGKILL: a subscription made through the
// API survives kill -9 and restarts; every event accepted after its 201
// is delivered to it and none from before; a DELETE drains what was owed
// and delivers nothing accepted after it.
func TestAPISubscriptionSurvivesSIGKILL(t *testing.T) {
	dir := t.TempDir()
	tb := startReceiver(t)
	a := newAPIProc(t, dir, "")
	a.start()
	a.awaitAdmin(t)
	before := a.publish(t, "before", 5)

	doc := fmt.Sprintf(`{"id": "api", "url": %q, "secret": %q, "types": ["geofence.*"], "retry": {"base": "10ms", "cap": "100ms", "max_attempts": 100}}`,
		tb.URL()+"/api", e2eSecret)
	if code, body := a.call(t, "POST", "/v1/subscriptions", doc); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	if code, body := a.call(t, "POST", "/v1/subscriptions", doc); code != 409 {
		t.Fatalf("create again: want 409, got %d %s", code, body)
	}
	// Killed at once after the 201: the subscription and its cut-off are
	// already durable.
	a.kill()
	a.start()
	a.awaitAdmin(t)
	after := a.publish(t, "after", 10)
	a.kill()
	a.start()
	a.awaitAdmin(t)
	after = append(after, a.publish(t, "later", 10)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tb.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/api"].Unique >= int64(len(after)) }); err != nil {
		t.Fatalf("deliveries after the 201: %v (%d of %d); log:\n%s", err, len(tb.IDs("/api")), len(after), a.log.String())
	}
	got := map[string]bool{}
	for _, id := range tb.IDs("/api") {
		got[id] = true
	}
	for _, id := range after {
		if !got[id] {
			t.Errorf("accepted after the 201, never delivered: %s", id)
		}
	}
	for _, id := range before {
		if got[id] {
			t.Errorf("accepted before the subscription existed, delivered to it: %s", id)
		}
	}

	// Owed at the delete: accepted while paused. Not owed: accepted after.
	if code, body := a.call(t, "POST", "/v1/subscriptions/api/pause", ""); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	owed := a.publish(t, "owed", 5)
	if code, body := a.call(t, "DELETE", "/v1/subscriptions/api", ""); code != 202 || !strings.Contains(body, `"draining"`) {
		t.Fatalf("delete: %d %s", code, body)
	}
	late := a.publish(t, "late", 5)
	a.kill() // the delete is durable too: after a restart the lane still drains
	a.start()
	a.awaitAdmin(t)
	if code, body := a.call(t, "POST", "/v1/subscriptions/api/resume", ""); code != 200 {
		t.Fatalf("resume: %d %s", code, body)
	}
	if err := tb.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/api"].Unique >= int64(len(after)+len(owed)) }); err != nil {
		t.Fatalf("owed deliveries after the delete: %v; log:\n%s", err, a.log.String())
	}
	// Retired once drained: the id is gone.
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _ := a.call(t, "GET", "/v1/subscriptions/api", "")
		if code == 404 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("deleted subscription never retired (GET answers %d)", code)
		}
		time.Sleep(20 * time.Millisecond) // retirement runs once a second; nothing to await
	}
	for _, id := range tb.IDs("/api") {
		for _, l := range late {
			if id == l {
				t.Errorf("accepted after the delete, delivered: %s", id)
			}
		}
	}
}

// TestAPISubscriptionsConcurrentCreates: creates racing on one id make
// one subscription; every other answer is 409.
func TestAPISubscriptionsConcurrentCreates(t *testing.T) {
	dir := t.TempDir()
	tb := startReceiver(t)
	a := newAPIProc(t, dir, "")
	a.start()
	a.awaitAdmin(t)
	doc := fmt.Sprintf(`{"id": "race", "url": %q, "types": ["*"]}`, tb.URL()+"/race")
	var wg sync.WaitGroup
	codes := make([]int, 16)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _ = a.call(t, "POST", "/v1/subscriptions", doc)
		}()
	}
	wg.Wait()
	created := 0
	for _, c := range codes {
		switch c {
		case 201:
			created++
		case 409:
		default:
			t.Errorf("unexpected status %d", c)
		}
	}
	if created != 1 {
		t.Fatalf("%d creates succeeded, want 1: %v", created, codes)
	}
}

// sigRecorder is an endpoint that keeps every delivery's body and headers,
// for verifying them with the official Standard Webhooks library.
type sigRecorder struct {
	mu      sync.Mutex
	reqs    []recorded
	srv     *httptest.Server
	arrived chan struct{} // signalled after each request is kept
}

type recorded struct {
	body   []byte
	header http.Header
}

func newSigRecorder(t *testing.T) *sigRecorder {
	r := &sigRecorder{arrived: make(chan struct{}, 1)}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.reqs = append(r.reqs, recorded{b, req.Header.Clone()})
		r.mu.Unlock()
		select {
		case r.arrived <- struct{}{}:
		default:
		}
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *sigRecorder) since(n int) []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reqs[min(n, len(r.reqs)):])
}

// deliver publishes one event through a and returns the first request
// that arrives after it (a redelivery may come first after a restart).
func (r *sigRecorder) deliver(t *testing.T, a *apiProc, prefix string) recorded {
	t.Helper()
	n := len(r.since(0))
	a.publish(t, prefix, 1)
	deadline := time.After(10 * time.Second)
	for len(r.since(n)) == 0 {
		select {
		case <-r.arrived:
		case <-deadline:
			t.Fatalf("%s never delivered; log:\n%s", prefix, a.log.String())
		}
	}
	return r.since(n)[0]
}

// verifies reports whether the official library accepts rec with secret.
func verifies(t *testing.T, secret string, rec recorded) bool {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatalf("the official library refuses the secret: %v", err)
	}
	return wh.Verify(rec.body, rec.header) == nil
}

// TestAPIRotateSecret: a generated secret signs; after rotate-secret both
// the old and the new one verify with the official Standard Webhooks
// library during the grace, and only the new one after it.
func TestAPIRotateSecret(t *testing.T) {
	dir := t.TempDir()
	rec := newSigRecorder(t)
	a := newAPIProc(t, dir, "")
	a.start()
	a.awaitAdmin(t)
	code, body := a.call(t, "POST", "/v1/subscriptions", fmt.Sprintf(`{"id": "rot", "url": %q, "types": ["*"]}`, rec.srv.URL))
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	var created struct {
		Secret string `json:"secret"`
	}
	if err := json.Unmarshal([]byte(body), &created); err != nil || !strings.HasPrefix(created.Secret, "whsec_") {
		t.Fatalf("create answer has no generated secret: %s", body)
	}
	if code, body := a.call(t, "GET", "/v1/subscriptions/rot", ""); code != 200 || strings.Contains(body, created.Secret) {
		t.Fatalf("get: %d, and the secret must not be shown again: %s", code, body)
	}
	deliver := func(prefix string) recorded { return rec.deliver(t, a, prefix) }
	first := deliver("first")
	if !verifies(t, created.Secret, first) {
		t.Fatalf("the generated secret does not verify its delivery: %v", first.header)
	}

	const grace = 2 * time.Second
	// Taken before the request: the sidecar starts the grace somewhere
	// between this and the answer, so time since rotatedAt is never less
	// than the grace the sidecar has counted. Taken after the answer (a
	// slow answer on a loaded machine), it was, and an old secret retired
	// on time looked retired early.
	rotatedAt := time.Now()
	code, body = a.call(t, "POST", "/v1/subscriptions/rot/rotate-secret", fmt.Sprintf(`{"grace": %q}`, grace))
	if code != 200 {
		t.Fatalf("rotate: %d %s", code, body)
	}
	var rot struct {
		Secret string `json:"secret"`
	}
	json.Unmarshal([]byte(body), &rot)
	if rot.Secret == "" || rot.Secret == created.Secret {
		t.Fatalf("rotate gave no new secret: %s", body)
	}
	during := deliver("during")
	if time.Since(rotatedAt) < grace {
		if !verifies(t, created.Secret, during) || !verifies(t, rot.Secret, during) {
			t.Fatalf("during the grace both secrets must verify: %v", during.header)
		}
	}
	// After the grace only the new one signs. Deliveries are awaited, not
	// slept for: each is checked until one is past the grace.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		r := deliver(fmt.Sprintf("after-%d", i))
		if !verifies(t, rot.Secret, r) {
			t.Fatalf("the new secret does not verify: %v", r.header)
		}
		if !verifies(t, created.Secret, r) {
			if time.Since(rotatedAt) < grace {
				t.Fatalf("the old secret stopped signing before its grace ended")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the old secret still signs long after its grace")
		}
		time.Sleep(100 * time.Millisecond) // the grace is wall-clock time in a real process
	}
	// The retirement survives a restart: the old secret does not come back.
	a.kill()
	a.start()
	a.awaitAdmin(t)
	if r := deliver("restarted"); verifies(t, created.Secret, r) || !verifies(t, rot.Secret, r) {
		t.Fatalf("after a restart only the new secret may sign: %v", r.header)
	}
}
