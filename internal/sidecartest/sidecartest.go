// Package sidecartest starts the in-process sidecar the admin client's and
// the CLI's tests share: a real proxy.Server with an admin token, a
// subscription "ok" delivering to a healthy testbed path and one,
// "failing", whose path answers 500, so its events are dead-lettered after
// two attempts. For tests only.
package sidecartest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// Start opens the receiver and the sidecar, with its admin API on
// adminListen guarded by token and its deliveries signed with secret; both
// close when the test ends.
func Start(t *testing.T, adminListen, token, secret string) (*proxy.Server, *testbed.Server) {
	t.Helper()
	tb := testbed.New(testbed.Options{})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	tb.SetMode("/failing", testbed.ModeFail)
	k, err := signing.ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	sub := func(id string) *delivery.Subscription {
		return &delivery.Subscription{ID: id, URL: tb.URL() + "/" + id, Secrets: []signing.Secret{k}, Timeout: 2 * time.Second, MaxConcurrency: 4,
			Retry: policy.RetryPolicy{MaxAttempts: 2, Backoff: policy.Backoff{Base: time.Millisecond, Cap: 5 * time.Millisecond}}}
	}
	srv := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: adminListen, AdminToken: token,
		DataDir: filepath.Join(t.TempDir(), "data"), Subscriptions: []*delivery.Subscription{sub("ok"), sub("failing")},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := srv.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	return srv, tb
}

// Publish posts n events with ids prefix-0… and waits until each lane has
// settled them: delivered to "ok", dead-lettered on "failing".
func Publish(t *testing.T, srv *proxy.Server, prefix string, n int) {
	t.Helper()
	for i := range n {
		req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/v1/events/order.created", strings.NewReader(fmt.Sprintf(`{"n":%d}`, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", prefix, i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("publish: %s", resp.Status)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var ok, dead uint64
		for _, l := range srv.Lanes() {
			switch l.Subscription {
			case "ok":
				ok = l.Delivered
			case "failing":
				dead = l.DeadLettered
			}
		}
		if ok >= uint64(n) && dead >= uint64(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("events not settled: %d delivered, %d dead-lettered of %d", ok, dead, n)
		}
		time.Sleep(5 * time.Millisecond) // the lanes' state has no notification to await
	}
}
