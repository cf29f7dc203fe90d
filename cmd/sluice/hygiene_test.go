package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
)

// TestLogsNeverShowSecretsOrURLs runs a real sidecar at debug level through
// the paths that log: deliveries that fail, retry and dead-letter, an admin
// request with a wrong token, a reload with a bad config, a drain. Its whole
// log must name endpoints by subscription id only: no signing secret, no
// admin token, no credential header, and no URL path or query (they often
// carry tokens).
func TestLogsNeverShowSecretsOrURLs(t *testing.T) {
	const (
		token     = "adm-tok-7Qx2-never-logged"
		authValue = "Bearer hdr-cred-9Zk4-never-logged"
		urlSecret = "path-cred-4Wm8"
		querySecr = "query-cred-1Pn6"
		// An Ed25519 key, RFC 8032 TEST 2's seed.
		edSecret = "whsk_TM0Imyj/ltqdtsNG7BFOD1uKMZ81q6Yk2oz27U+4pvs="
	)
	fail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }))
	t.Cleanup(fail.Close)
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(ok.Close)

	dir := t.TempDir()
	admin := freePort(t)
	sock := filepath.Join(dir, "ingest.sock")
	cfgPath := filepath.Join(dir, "sluice.yaml")
	subs := fmt.Sprintf(`subscriptions:
  - id: failing
    url: %s/hooks/%s?token=%s
    secret: %s
    headers: {Authorization: %q}
    retry: {base: 10ms, cap: 20ms, max_attempts: 2}
  - id: healthy
    url: %s/hooks/%s?token=%s
    secrets: [%s, %s]
`, fail.URL, urlSecret, querySecr, e2eSecret, authValue, ok.URL, urlSecret, querySecr, edSecret, e2eSecret)
	cfg := fmt.Sprintf("listen: unix://%s\nadmin: {listen: %s, token: %s}\ndata_dir: %s\nlog_level: debug\nlog_format: json\nallow_private_targets: true\n%s",
		sock, admin, token, filepath.Join(dir, "data"), subs)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	log := &syncBuffer{}
	sc := &sidecar{t: t, config: cfgPath, sock: sock, log: log}
	sc.client = unixClient(sock)
	sc.start()
	t.Cleanup(func() {
		if sc.cmd.ProcessState == nil {
			sc.cmd.Process.Kill()
			sc.cmd.Wait()
		}
	})
	for i := range 3 {
		if code, err := sc.post("t", fmt.Sprintf("ev-%d", i)); err != nil || code != 202 {
			t.Fatalf("post: %d %v", code, err)
		}
	}
	// Await the three dead letters of "failing" through the admin API.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	api, err := client.New(admin, client.Options{Token: token, RetryMax: -1})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if page, err := api.DeadLetters(ctx, client.DeadLetterQuery{Subscription: "failing"}); err == nil && len(page.DeadLetters) == 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no 3 dead letters; log:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond) // polling another process's state
	}
	// A wrong token, then a reload with a bad value next to the secrets.
	wrong, err := client.New(admin, client.Options{Token: "wrong-" + token, RetryMax: -1})
	if err != nil {
		t.Fatal(err)
	}
	var ae *client.APIError
	if _, err := wrong.Subscriptions(ctx); !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		t.Fatalf("wrong token: %v", err)
	}
	bad := strings.Replace(cfg, "max_attempts: 2", "max_attempts: -2", 1)
	if err := os.WriteFile(cfgPath, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := sc.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(log.String(), "config reload failed") {
		if ctx.Err() != nil {
			t.Fatalf("the bad reload was not logged; log:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond) // polling another process's log
	}
	sc.cmd.Process.Signal(syscall.SIGTERM)
	sc.cmd.Wait()

	out := log.String()
	secretKey := strings.TrimPrefix(e2eSecret, "whsec_")
	for what, s := range map[string]string{
		"signing secret": secretKey, "Ed25519 key": strings.TrimPrefix(edSecret, "whsk_")[:16], "admin token": token, "Authorization header": "hdr-cred-9Zk4",
		"URL path": urlSecret, "URL query": querySecr, "endpoint address": strings.TrimPrefix(fail.URL, "http://"),
	} {
		if strings.Contains(out, s) {
			t.Errorf("the log shows the %s (%q):\n%s", what, s, out)
		}
	}
	for _, want := range []string{`"subscription":"failing"`, "retry.max_attempts", "dead-lettered"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not mention %s, so this test checked less than it claims:\n%s", want, out)
		}
	}
}
