package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/sidecartest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

const cliToken = "cli-test-token-5d21"

// cliSidecar is an in-process sidecar with an admin token, a healthy
// subscription "ok" and a subscription "failing" whose endpoint answers
// 500, so that its events are dead-lettered after two attempts.
type cliSidecar struct {
	srv    *proxy.Server
	tb     *testbed.Server
	config string // names the admin listener and the token
}

func startCLISidecar(t *testing.T) *cliSidecar {
	t.Helper()
	admin := freePort(t)
	srv, tb := sidecartest.Start(t, admin, cliToken, e2eSecret)
	config := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(config, []byte("admin:\n  listen: "+admin+"\n  token: "+cliToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &cliSidecar{srv: srv, tb: tb, config: config}
}

// publish posts n events with ids prefix-0... and waits until each lane has
// settled them: delivered to ok, dead-lettered on failing.
func (c *cliSidecar) publish(t *testing.T, prefix string, n int) {
	t.Helper()
	sidecartest.Publish(t, c.srv, prefix, n)
}

func (c *cliSidecar) lane(t *testing.T, id string) api.LaneStatus {
	t.Helper()
	for _, l := range c.srv.Lanes() {
		if l.Subscription == id {
			return l
		}
	}
	t.Fatalf("no lane %q", id)
	return api.LaneStatus{}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// sluiceRun runs the CLI in-process and returns its exit code and output
// (stdout and stderr together).
func sluiceRun(args ...string) (int, string) {
	var out bytes.Buffer
	code := run(args, &out, &out)
	return code, out.String()
}

// mustRun runs the CLI and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	code, out := sluiceRun(args...)
	if code != 0 {
		t.Fatalf("sluice %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

func TestCLIStatus(t *testing.T) {
	c := startCLISidecar(t)
	c.publish(t, "s", 2)
	out := mustRun(t, "status", "--config", c.config)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`SUBSCRIPTION +STATE +IN FLIGHT/CAP +BACKLOG +OLDEST +RETRIES +BREAKER +DELIVERED +RETRIED +DEAD`),
		regexp.MustCompile(`(?m)^failing +active +0/4 +0 +- +0 +closed +0 +2 +2$`),
		regexp.MustCompile(`(?m)^ok +active +0/4 +0 +- +0 +closed +2 +0 +0$`),
		regexp.MustCompile(`retry budget: \d+% available \(successes \d+, retries \d+, allowed \d+\)`),
	} {
		if !want.MatchString(out) {
			t.Fatalf("status lacks %s:\n%s", want, out)
		}
	}

	var js struct {
		Subscriptions api.SubscriptionList `json:"subscriptions"`
		RetryBudget   *policy.BudgetStats  `json:"retry_budget"`
	}
	out = mustRun(t, "status", "--config", c.config, "--json")
	if err := json.Unmarshal([]byte(out), &js); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if len(js.Subscriptions.Subscriptions) != 2 || js.Subscriptions.Head != 2 || js.RetryBudget == nil {
		t.Fatalf("status --json: %+v", js)
	}
}

// TestCLIStatusMarksSaturatedLanes: a lane at 80% of its cap is marked,
// and a paused lane and one held by its endpoint's announced limit say so.
func TestCLIStatusMarksSaturatedLanes(t *testing.T) {
	heldUntil := time.Date(2026, 12, 5, 17, 31, 0, 0, time.UTC)
	var out bytes.Buffer
	writeStatus(&out, []api.LaneStatus{
		{Subscription: "hole", State: "active", InFlight: 4, Cap: 5, Breaker: "closed"},
		{Subscription: "calm", State: "active", InFlight: 3, Cap: 5, Breaker: "closed"},
		{Subscription: "gone", State: "paused", PausedBy: "endpoint answered 410 Gone", Breaker: "closed"},
		{Subscription: "busy", State: "active", Breaker: "closed", HeldUntil: &heldUntil, HeldBy: "X-RateLimit-Reset"},
	}, policy.BudgetStats{Available: 0})
	for _, want := range []string{"4/5 !", "gone is paused: endpoint answered 410 Gone", "retry budget: 0% available", "empty",
		"busy is held until " + heldUntil.Local().Format(time.TimeOnly) + ": its endpoint announced its limit (X-RateLimit-Reset)"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("status lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "3/5 !") {
		t.Fatalf("60%% marked as saturated:\n%s", out.String())
	}
}

func TestCLIDeadLetters(t *testing.T) {
	c := startCLISidecar(t)
	c.publish(t, "d", 3)

	out := mustRun(t, "dlq", "list", "--config", c.config)
	if n := len(regexp.MustCompile(`(?m)^failing +\d+ +d-\d +order\.created +max_attempts +2 +500 `).FindAllString(out, -1)); n != 3 {
		t.Fatalf("dlq list shows %d of 3 dead letters:\n%s", n, out)
	}
	var page api.DeadLetterPage
	out = mustRun(t, "dlq", "list", "--config", c.config, "--limit", "1", "--json")
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.DeadLetters) != 1 || page.Next == "" {
		t.Fatalf("dlq list --limit 1 --json: %v\n%s", err, out)
	}
	out = mustRun(t, "dlq", "list", "--config", c.config, "--limit", "1")
	if !strings.Contains(out, "--cursor "+page.Next) {
		t.Fatalf("dlq list --limit 1 does not point to the next page:\n%s", out)
	}
	out = mustRun(t, "dlq", "list", "--config", c.config, "--limit", "1", "--all", "--json", "--subscription", "failing", "--reason", "max_attempts")
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.DeadLetters) != 3 || page.Next != "" {
		t.Fatalf("dlq list --all follows %d pages: %v\n%s", len(page.DeadLetters), err, out)
	}
	if out := mustRun(t, "dlq", "list", "--config", c.config, "--subscription", "ok"); !strings.Contains(out, "no dead letters") {
		t.Fatalf("dlq list for a healthy subscription:\n%s", out)
	}

	first := page.DeadLetters[0]
	seq := strconv.FormatUint(first.Seq, 10)
	out = mustRun(t, "dlq", "show", "failing", seq, "--config", c.config)
	for _, want := range []string{"event", first.EventID, "max_attempts", "last status", "500", "content type", "application/json", `{"n":`} {
		if !strings.Contains(out, want) {
			t.Fatalf("dlq show lacks %q:\n%s", want, out)
		}
	}
	if code, out := sluiceRun("dlq", "show", "failing", "999", "--config", c.config); code != 1 || !strings.Contains(out, "dead letter failing/999: not found") {
		t.Fatalf("dlq show of a missing dead letter: %d\n%s", code, out)
	}

	// The endpoint is fixed: replay one, then again without and with force.
	c.tb.SetMode("/failing", testbed.ModeOK)
	out = mustRun(t, "dlq", "replay", "failing", seq, "--config", c.config)
	if !regexp.MustCompile(`(?m)^replayed +failing/`+seq+` +`+first.EventID).MatchString(out) || !strings.Contains(out, "replayed 1, skipped 0") {
		t.Fatalf("dlq replay:\n%s", out)
	}
	eventually(t, "replayed delivery", func() bool { return c.lane(t, "failing").Delivered == 1 })
	out = mustRun(t, "dlq", "replay", "failing", seq, "--config", c.config)
	if !strings.Contains(out, "skipped") || !strings.Contains(out, "already replayed") || !strings.Contains(out, "replayed 0, skipped 1") {
		t.Fatalf("second dlq replay without --force:\n%s", out)
	}
	if out := mustRun(t, "dlq", "show", "failing", seq, "--config", c.config); !strings.Contains(out, "delivered") {
		t.Fatalf("dlq show after the replay was delivered:\n%s", out)
	}
	out = mustRun(t, "dlq", "replay", "--config", c.config, "--subscription", "failing", "--reason", "max_attempts", "--all", "--json")
	var res api.ReplayAnswer
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Replayed != 2 {
		t.Fatalf("dlq replay --all replays the two others: %v\n%s", err, out)
	}
	eventually(t, "all replayed", func() bool { return c.lane(t, "failing").Delivered == 3 })
	if out := mustRun(t, "dlq", "replay", "failing", seq, "--force", "--config", c.config); !strings.Contains(out, "replayed 1, skipped 0") {
		t.Fatalf("dlq replay --force:\n%s", out)
	}

	for _, bad := range [][]string{
		{"dlq", "replay", "--config", c.config},                          // neither form
		{"dlq", "replay", "failing", seq, "--all", "--config", c.config}, // both forms
		{"dlq", "replay", "failing", "x", "--config", c.config},          // bad seq
		{"dlq", "replay", "failing", "999", "--config", c.config},        // no such dead letter
		{"dlq", "list", "--limit", "5000", "--config", c.config},         // the API's 400
		{"dlq", "frobnicate"}, // unknown subcommand
	} {
		if code, out := sluiceRun(bad...); code != 1 {
			t.Fatalf("sluice %s: exit %d, want 1\n%s", strings.Join(bad, " "), code, out)
		}
	}
	if _, out := sluiceRun("dlq", "list", "--limit", "5000", "--config", c.config); !strings.Contains(out, "400 Bad Request: limit: want 1..1000") {
		t.Fatalf("the API's error message is not shown:\n%s", out)
	}
}

func TestCLIEventsShow(t *testing.T) {
	c := startCLISidecar(t)
	c.publish(t, "e", 1)
	out := mustRun(t, "events", "show", "e-0", "--config", c.config)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`event e-0, seq 1, type order\.created, accepted`),
		regexp.MustCompile(`SUBSCRIPTION +STATE +ATTEMPT +DUE/AT +REASON`),
		regexp.MustCompile(`(?m)^ok +delivered +- +- *$`),
		regexp.MustCompile(`(?m)^failing +dead_lettered +2 +\S+ ago +max_attempts \(last status 500\)$`),
	} {
		if !want.MatchString(out) {
			t.Fatalf("events show lacks %s:\n%s", want, out)
		}
	}
	var st api.EventStatus
	out = mustRun(t, "events", "show", "--json", "--config", c.config, "e-0")
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Deliveries) != 2 {
		t.Fatalf("events show --json: %v\n%s", err, out)
	}
	code, out := sluiceRun("events", "show", "nope", "--config", c.config)
	if code != 1 || !strings.Contains(out, `404 Not Found: event "nope" (ids are kept for dedup_window): not found`) {
		t.Fatalf("events show of an unknown id: %d\n%s", code, out)
	}
}

func TestCLIPauseResume(t *testing.T) {
	c := startCLISidecar(t)
	if out := mustRun(t, "pause", "ok", "--reason", "maintenance until 14:00", "--config", c.config); !strings.Contains(out, "paused ok") {
		t.Fatalf("pause: %s", out)
	}
	if l := c.lane(t, "ok"); l.State != "paused" || l.PausedBy != "maintenance until 14:00" {
		t.Fatalf("after pause: %+v", l)
	}
	out := mustRun(t, "status", "--config", c.config)
	if !regexp.MustCompile(`(?m)^ok +paused `).MatchString(out) || !strings.Contains(out, "ok is paused: maintenance until 14:00") {
		t.Fatalf("status of a paused subscription:\n%s", out)
	}
	if out := mustRun(t, "resume", "--config", c.config, "ok"); !strings.Contains(out, "resumed ok") {
		t.Fatalf("resume: %s", out)
	}
	if l := c.lane(t, "ok"); l.State != "active" {
		t.Fatalf("after resume: %+v", l)
	}
	if code, out := sluiceRun("pause", "nobody", "--config", c.config); code != 1 || !strings.Contains(out, `subscription "nobody": not found`) {
		t.Fatalf("pause of an unknown subscription: %d\n%s", code, out)
	}
}

// TestCLIUsesTheToken: without the token the API's 401 is shown, once.
func TestCLIUsesTheToken(t *testing.T) {
	c := startCLISidecar(t)
	code, out := sluiceRun("status", "--admin", c.srv.AdminURL(), "--config", filepath.Join(t.TempDir(), "missing.yaml"))
	if code != 1 || !strings.Contains(out, "no such file") {
		t.Fatalf("missing config: %d\n%s", code, out)
	}
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(empty, nil, 0o600)
	code, out = sluiceRun("status", "--admin", c.srv.AdminURL(), "--config", empty)
	if code != 1 || !strings.Contains(out, "401 Unauthorized: missing or wrong admin token") || strings.Contains(out, "retry") {
		t.Fatalf("status without the token: %d\n%s", code, out)
	}
	if out := mustRun(t, "status", "--admin", c.srv.AdminURL(), "--config", empty, "--token", cliToken); !strings.Contains(out, "retry budget:") {
		t.Fatalf("status with --token:\n%s", out)
	}
}

// TestCLIRidesOutARestart: the admin API starts listening only after the
// command started; the command waits for it.
func TestCLIRidesOutARestart(t *testing.T) {
	dir := t.TempDir()
	admin := freePort(t)
	config := filepath.Join(dir, "sluice.yaml")
	os.WriteFile(config, []byte("admin:\n  listen: "+admin+"\n  token: "+cliToken+"\n"), 0o600)
	started := make(chan *proxy.Server, 1)
	late := time.AfterFunc(300*time.Millisecond, func() {
		srv := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: admin, AdminToken: cliToken, DataDir: filepath.Join(dir, "data"),
			Subscriptions: []*delivery.Subscription{{ID: "late", URL: "http://127.0.0.1:1/"}},
			Logger:        slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err := srv.Open(); err != nil {
			t.Errorf("open: %v", err)
			srv = nil
		}
		started <- srv
	})
	t.Cleanup(func() {
		if !late.Stop() {
			if srv := <-started; srv != nil {
				srv.Close(context.Background())
			}
		}
	})
	begin := time.Now()
	out := mustRun(t, "status", "--config", config)
	if el := time.Since(begin); el < 300*time.Millisecond {
		t.Fatalf("answered after %s, before the listener opened", el)
	}
	if !regexp.MustCompile(`(?m)^late +active `).MatchString(out) || !strings.Contains(out, "connection refused; retry 1 of") {
		t.Fatalf("status across the late start:\n%s", out)
	}
}

// TestCLIRetryPolicy: 5xx and connection errors are retried, 4xx never; a
// forced replay is not sent twice.
func TestCLIRetryPolicy(t *testing.T) {
	var calls atomic.Int64
	var answers atomic.Value // func(n int64) int
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		code := answers.Load().(func(int64) int)(n)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		if code != 200 {
			fmt.Fprintf(w, `{"error": "scripted %d"}`, code)
			return
		}
		fmt.Fprint(w, `{"id":"x","seq":1,"deliveries":[]}`)
	}))
	t.Cleanup(api.Close)
	cases := []struct {
		name      string
		args      []string
		answer    func(int64) int
		wantCode  int
		wantCalls int64
		wantOut   string
	}{
		{"5xx then 200", []string{"events", "show", "x"}, func(n int64) int { return map[bool]int{true: 503, false: 200}[n <= 2] }, 0, 3, "event x, seq 1"},
		{"404 once", []string{"events", "show", "x"}, func(int64) int { return 404 }, 1, 1, "404 Not Found: scripted 404"},
		{"429 once", []string{"events", "show", "x"}, func(int64) int { return 429 }, 1, 1, "429 Too Many Requests: scripted 429"},
		{"forced replay once", []string{"dlq", "replay", "a", "1", "--force"}, func(int64) int { return 500 }, 1, 1, "500 Internal Server Error: scripted 500"},
		{"replay retried", []string{"dlq", "replay", "a", "1"}, func(n int64) int { return map[bool]int{true: 502, false: 200}[n == 1] }, 0, 2, "replayed 0, skipped 0"},
	}
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(empty, nil, 0o600)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			calls.Store(0)
			answers.Store(c.answer)
			code, out := sluiceRun(append(c.args, "--admin", api.URL, "--config", empty)...)
			if code != c.wantCode || calls.Load() != c.wantCalls || !strings.Contains(out, c.wantOut) {
				t.Fatalf("exit %d (want %d), %d calls (want %d), output:\n%s", code, c.wantCode, calls.Load(), c.wantCalls, out)
			}
		})
	}
}

func TestCLIVerify(t *testing.T) {
	k, _ := signing.ParseSecret(e2eSecret)
	other, _ := signing.GenerateSecret()
	body := []byte(`{"vehicle":"v-17","zone":"depot-3"}`)
	now := time.Now().Unix()
	ts := strconv.FormatInt(now, 10)
	sig := signing.Sign([]signing.Secret{k}, "msg_1", now, body)
	withStdin := func(t *testing.T, b []byte) {
		saved := stdin
		stdin = bytes.NewReader(b)
		t.Cleanup(func() { stdin = saved })
	}
	headers := filepath.Join(t.TempDir(), "headers")
	os.WriteFile(headers, []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nWebhook-Id: msg_1\r\nwebhook-timestamp: "+ts+"\r\nWEBHOOK-SIGNATURE: "+sig+"\r\n\r\n"), 0o600)
	flags := []string{"--id", "msg_1", "--timestamp", ts, "--signature", sig}
	cases := []struct {
		name     string
		args     []string
		body     []byte
		wantCode int
		wantOut  string
	}{
		{"flags", append([]string{"--secret", e2eSecret}, flags...), body, 0, "valid\n"},
		{"headers file", []string{"--secret", e2eSecret, "--headers", headers}, body, 0, "valid\n"},
		{"rotation", []string{"--secret", other.Encode() + " " + e2eSecret, "--headers", headers}, body, 0, "valid\n"},
		{"repeated secret", []string{"--secret", other.Encode(), "--headers", headers, "--secret", e2eSecret}, body, 0, "valid\n"},
		{"tampered body", append([]string{"--secret", e2eSecret}, flags...), []byte(`{"vehicle":"v-18","zone":"depot-3"}`), 1, "signature mismatch"},
		{"trailing newline", []string{"--secret", e2eSecret, "--headers", headers}, append(body, '\n'), 1, "signature mismatch"},
		{"wrong secret", append([]string{"--secret", other.Encode()}, flags...), body, 1, "signature mismatch"},
		{"old", []string{"--secret", e2eSecret, "--id", "msg_1", "--timestamp", strconv.FormatInt(now-3600, 10),
			"--signature", signing.Sign([]signing.Secret{k}, "msg_1", now-3600, body)}, body, 1, "timestamp too old"},
		{"old within tolerance", []string{"--secret", e2eSecret, "--tolerance", "2h", "--id", "msg_1", "--timestamp", strconv.FormatInt(now-3600, 10),
			"--signature", signing.Sign([]signing.Secret{k}, "msg_1", now-3600, body)}, body, 0, "valid\n"},
		{"flag overrides file", []string{"--secret", e2eSecret, "--headers", headers, "--id", "msg_2"}, body, 1, "signature mismatch"},
		{"no headers", []string{"--secret", e2eSecret}, body, 1, "missing header"},
		{"no secret", flags, body, 1, "--secret"},
		{"bad secret", append([]string{"--secret", "whsec_nope"}, flags...), body, 1, "bad secret"},
	}
	// Ed25519: a subscription with a whsk_ key beside the HMAC
	// one; its receivers verify the v1a entry with the whpk_ public key.
	ed, _ := signing.GenerateEd25519Secret()
	pk, _ := ed.PublicKey()
	otherPK, _ := signing.GenerateEd25519Secret()
	otherPub, _ := otherPK.PublicKey()
	mixed := signing.Sign([]signing.Secret{ed, k}, "msg_1", now, body)
	edFlags := []string{"--id", "msg_1", "--timestamp", ts, "--signature", mixed}
	edOnly := []string{"--id", "msg_1", "--timestamp", ts, "--signature", signing.Sign([]signing.Secret{ed}, "msg_1", now, body)}
	cases = append(cases, []struct {
		name     string
		args     []string
		body     []byte
		wantCode int
		wantOut  string
	}{
		{"whpk_ public key", append([]string{"--secret", pk.Encode()}, edFlags...), body, 0, "valid\n"},
		{"whsec_ on a mixed header", append([]string{"--secret", e2eSecret}, edFlags...), body, 0, "valid\n"},
		{"whpk_ and whsec_ while migrating", append([]string{"--secret", otherPub.Encode() + " " + e2eSecret, "--secret", pk.Encode()}, edOnly...), body, 0, "valid\n"},
		{"the sender's whsk_", append([]string{"--secret", ed.Encode()}, edOnly...), body, 0, "valid\n"},
		{"whpk_, tampered body", append([]string{"--secret", pk.Encode()}, edFlags...), append(body, ' '), 1, "none of 1 v1a signatures matches 1 Ed25519 keys"},
		{"another whpk_", append([]string{"--secret", otherPub.Encode()}, edOnly...), body, 1, "signature mismatch"},
		{"whsec_ on a v1a-only header", append([]string{"--secret", e2eSecret}, edOnly...), body, 1, "none of 0 v1 signatures"},
		{"bad whpk_", append([]string{"--secret", "whpk_AAAA"}, edFlags...), body, 1, "--secret: parse public key: key is 3 bytes, want 32"},
	}...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			withStdin(t, c.body)
			code, out := sluiceRun(append([]string{"verify"}, c.args...)...)
			if code != c.wantCode || !strings.Contains(out, c.wantOut) {
				t.Fatalf("exit %d (want %d):\n%s", code, c.wantCode, out)
			}
		})
	}
}

func TestParseArgsAcceptsFlagsAnywhere(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	force := fs.Bool("force", false, "")
	n := fs.Int("n", 0, "")
	pos, err := parseArgs(fs, []string{"a", "--force", "b", "-n", "3", "--", "--c"})
	if err != nil || strings.Join(pos, " ") != "a b --c" || !*force || *n != 3 {
		t.Fatalf("parseArgs: %q %v force=%v n=%d", pos, err, *force, *n)
	}
}

func TestCLIStatusNamesOwnersInFleetMode(t *testing.T) {
	var out bytes.Buffer
	writeStatus(&out, []api.LaneStatus{
		{Subscription: "billing", State: "active", Cap: 4, Breaker: "closed", Owner: "pod-b"},
		{Subscription: "fresh", State: "active", Cap: 4, Breaker: "closed"},
	}, policy.BudgetStats{Available: 1})
	if !regexp.MustCompile(`(?m)OWNER$`).MatchString(out.String()) || !regexp.MustCompile(`(?m)^billing .* pod-b$`).MatchString(out.String()) ||
		!regexp.MustCompile(`(?m)^fresh .* \(none yet\)$`).MatchString(out.String()) {
		t.Fatalf("status does not name the owners:\n%s", out.String())
	}
	out.Reset()
	writeStatus(&out, []api.LaneStatus{{Subscription: "solo", State: "active", Cap: 4, Breaker: "closed"}}, policy.BudgetStats{Available: 1})
	if strings.Contains(out.String(), "OWNER") {
		t.Fatalf("a single sidecar's status shows an owner column:\n%s", out.String())
	}
}
