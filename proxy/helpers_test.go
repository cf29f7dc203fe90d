package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

func TestMain(m *testing.M) { testwait.Main(m, httpClient) }

var testSecret = mustSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")

func mustSecret(s string) signing.Secret {
	k, err := signing.ParseSecret(s)
	if err != nil {
		panic(err)
	}
	return k
}

func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// fastRetry retries quickly so tests never wait on real backoff.
func fastRetry(attempts int) policy.RetryPolicy {
	return policy.RetryPolicy{MaxAttempts: attempts, MaxAge: time.Hour, Backoff: policy.Backoff{Base: 5 * time.Millisecond, Cap: 20 * time.Millisecond}}
}

func sub(id, url string, types ...string) *delivery.Subscription {
	return &delivery.Subscription{ID: id, URL: url, Secrets: []signing.Secret{testSecret}, Types: types, Timeout: 2 * time.Second, Retry: fastRetry(5)}
}

// startServer opens a sidecar on loopback over dir (a new temp dir if "").
func startServer(t *testing.T, dir string, subs ...*delivery.Subscription) *proxy.Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	s := proxy.New(proxy.Options{AllowPrivateTargets: true,
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: dir, Sync: true,
		Subscriptions: subs, Logger: quietLogger(), CursorInterval: 10 * time.Millisecond,
	})
	if err := s.Open(); err != nil {
		t.Fatalf("open server: %v", err)
	}
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })
	return s
}

func closeServer(t *testing.T, s *proxy.Server, grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Errorf("close: %v", err)
	}
}

func startTestbed(t *testing.T, mode testbed.Mode) *testbed.Server {
	t.Helper()
	tb := testbed.New(testbed.Options{Mode: mode, Secrets: []signing.Secret{testSecret}})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	return tb
}

type ingestAnswer struct {
	ID        string `json:"id"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
	Error     string `json:"error"`
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

func post(t *testing.T, s *proxy.Server, typ, key, body string) (int, ingestAnswer) {
	t.Helper()
	return postWith(t, s, typ, key, body, nil)
}

// postWith is post with more headers (a tenant's, say).
func postWith(t *testing.T, s *proxy.Server, typ, key, body string, hdr map[string]string) (int, ingestAnswer) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/"+typ, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (int, ingestAnswer) {
	t.Helper()
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	var a ingestAnswer
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("%s %s answered %d with non-JSON %q", req.Method, req.URL.Path, resp.StatusCode, b)
	}
	return resp.StatusCode, a
}

// publish posts n events of typ with keys prefix-0..n-1 and fails on any non-202.
func publish(t *testing.T, s *proxy.Server, typ, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
		if code, a := post(t, s, typ, ids[i], fmt.Sprintf(`{"n":%d}`, i)); code != http.StatusAccepted {
			t.Fatalf("publish %s: %d %+v", ids[i], code, a)
		}
	}
	return ids
}

// waitFor waits until the testbed's stats satisfy cond.
func waitFor(t *testing.T, tb *testbed.Server, what string, cond func(map[string]testbed.PathStats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tb.Wait(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v; stats %+v", what, err, tb.Stats())
	}
}

// eventually polls a condition of the sidecar's own state (lanes, dead
// letters), for which there is no notification to await.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func lane(s *proxy.Server, id string) api.LaneStatus {
	for _, l := range s.Lanes() {
		if l.Subscription == id {
			return l
		}
	}
	return api.LaneStatus{}
}

func hasLane(s *proxy.Server, id string) bool { return lane(s, id).Subscription == id }

func accepted(n int64) func(map[string]testbed.PathStats) bool {
	return func(m map[string]testbed.PathStats) bool {
		for _, st := range m {
			if st.Unique < n {
				return false
			}
		}
		return len(m) > 0
	}
}

func uniqueAt(path string, n int64) func(map[string]testbed.PathStats) bool {
	return func(m map[string]testbed.PathStats) bool { return m[path].Unique >= n }
}
