package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/signing"
)

// signedReceiver is an endpoint that counts the deliveries to /billing
// signed with the secret it is given once the CLI has printed it, and
// those that are not; it accepts every other path unchecked.
type signedReceiver struct {
	mu               sync.Mutex
	secret           []signing.Secret
	verified, forged int
	srv              *httptest.Server
}

func newSignedReceiver(t *testing.T) *signedReceiver {
	r := &signedReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if req.URL.Path != "/billing" {
			return
		}
		h := req.Header
		r.mu.Lock()
		defer r.mu.Unlock()
		if signing.Verify(r.secret, h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature"), body, time.Now(), time.Minute) != nil {
			r.forged++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		r.verified++
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *signedReceiver) trust(t *testing.T, secret string) {
	t.Helper()
	k, err := signing.ParseSecret(secret)
	if err != nil {
		t.Fatalf("printed secret %q: %v", secret, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.secret = []signing.Secret{k}
}

func (r *signedReceiver) counts() (verified, forged int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.verified, r.forged
}

// apiSidecar is an in-process sidecar whose admin API can make
// subscriptions with serve's own parser of their documents (specParser).
// The API tests of this package share it: the CLI's (startAPISidecar),
// the API table, tenant isolation, filters and reloads.
type apiSidecar struct {
	srv    *proxy.Server
	config string        // a config file naming the admin listener and token, for the CLI
	opts   proxy.Options // as opened, but for Subscriptions: reopen opens these again
}

// startAPISidecar is the CLI tests' sidecar: a file subscription "filed"
// delivering to filedURL, none of the API's yet, and cliToken as the
// operator's token.
func startAPISidecar(t *testing.T, filedURL string) *apiSidecar {
	t.Helper()
	k, err := signing.ParseSecret(e2eSecret)
	if err != nil {
		t.Fatal(err)
	}
	filed := &delivery.Subscription{ID: "filed", URL: filedURL, Secrets: []signing.Secret{k}, MaxConcurrency: 2, Timeout: 2 * time.Second}
	return openAPISidecar(t, proxy.Options{AdminToken: cliToken, Subscriptions: []*delivery.Subscription{filed}})
}

// openAPISidecar opens a sidecar with opts, filling in what these tests
// all want: loopback listeners (the admin one on a free port that reopen
// keeps), a data dir under t.TempDir(), private targets allowed (the
// endpoints are on loopback), serve's specParser, a short cursor interval
// and a quiet logger. opts.Subscriptions are the config file's. It closes
// when the test ends.
func openAPISidecar(t *testing.T, opts proxy.Options) *apiSidecar {
	t.Helper()
	if opts.AdminListen == "" {
		opts.AdminListen = freePort(t)
	}
	if opts.DataDir == "" {
		opts.DataDir = filepath.Join(t.TempDir(), "data")
	}
	if opts.CursorInterval == 0 {
		opts.CursorInterval = 10 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		if os.Getenv("SHOW") != "" {
			opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
		}
	}
	opts.Listen, opts.AllowPrivateTargets, opts.Specs = "127.0.0.1:0", true, specParser{allowPrivate: true}
	subs := opts.Subscriptions
	opts.Subscriptions = nil
	s := &apiSidecar{opts: opts, config: filepath.Join(t.TempDir(), "sluice.yaml")}
	if err := os.WriteFile(s.config, []byte("admin:\n  listen: "+opts.AdminListen+"\n  token: "+opts.AdminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.open(t, subs)
	return s
}

func (s *apiSidecar) open(t *testing.T, subs []*delivery.Subscription) {
	t.Helper()
	o := s.opts
	o.Subscriptions = subs
	srv := proxy.New(o)
	if err := srv.Open(); err != nil {
		t.Fatalf("open the sidecar: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Close(ctx)
	})
	s.srv = srv
}

// reopen closes the sidecar and opens a new one on the same data dir and
// admin address, with subs as the config file's.
func (s *apiSidecar) reopen(t *testing.T, subs ...*delivery.Subscription) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.srv.Close(ctx); err != nil {
		t.Fatalf("close the sidecar: %v", err)
	}
	s.open(t, subs)
}

// call makes one admin request with token ("" sends none).
func (s *apiSidecar) call(t *testing.T, token, method, path, body string) (int, string) {
	t.Helper()
	return adminCall(t, s.srv.AdminURL(), token, method, path, body)
}

// adminCall makes one request of the admin API at base with a bearer
// token ("" sends none) and returns the status and the body.
func adminCall(t *testing.T, base, token, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (s *apiSidecar) publish(t *testing.T, typ, id string) {
	t.Helper()
	s.post(t, typ, id, `{"n":1}`)
}

// post publishes one event of typ with id and a JSON body; it wants 202.
func (s *apiSidecar) post(t *testing.T, typ, id, body string) {
	t.Helper()
	s.postAs(t, "", typ, id, body)
}

// postAs publishes an event of tenant ("" for a platform event).
func (s *apiSidecar) postAs(t *testing.T, tenant, typ, id, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL()+"/v1/events/"+typ, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", id)
	if tenant != "" {
		req.Header.Set(ingest.HeaderTenant, tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("publish %s: %s", id, resp.Status)
	}
}

func (s *apiSidecar) lane(id string) (api.LaneStatus, bool) {
	for _, l := range s.srv.Lanes() {
		if l.Subscription == id {
			return l, true
		}
	}
	return api.LaneStatus{}, false
}

// mustFail runs the CLI, wants exit 1, and returns its output.
func mustFail(t *testing.T, args ...string) string {
	t.Helper()
	code, out := sluiceRun(args...)
	if os.Getenv("SHOW") != "" {
		t.Logf("$ sluice %s\n%s", strings.Join(args, " "), out)
	}
	if code != 1 {
		t.Fatalf("sluice %s: exit %d, want 1\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// printed finds what re's first group matched in out.
func printed(t *testing.T, out string, re *regexp.Regexp) string {
	t.Helper()
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("output lacks %s:\n%s", re, out)
	}
	return m[1]
}

func contains(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Fatalf("output lacks %q:\n%s", w, out)
		}
	}
}

// TestCLISubscriptions drives the subscription API through the CLI
// against a real sidecar: create (flags, then a YAML file), get, update
// (--set, then a patch file), list (all, by tenant, with a tenant's own
// token), rotate-secret, recover, delete, and the errors a person meets.
// The secret the CLI prints once is the one deliveries are signed with.
func TestCLISubscriptions(t *testing.T) {
	rcv := newSignedReceiver(t)
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	t.Cleanup(failing.Close)
	s := startAPISidecar(t, rcv.srv.URL+"/filed")
	c := []string{"--config", s.config}
	sub := func(args ...string) []string { return append(append([]string{"subscriptions"}, args...), c...) }

	// create from flags: the sidecar generates the secret, printed once.
	out := mustRun(t, sub("create", "--id", "billing", "--url", rcv.srv.URL+"/billing", "--types", "order.created, order.paid")...)
	contains(t, out, "created billing (active)", onceNote)
	secret := printed(t, out, regexp.MustCompile(`(?m)^secret: (whsec_\S+)$`))
	rcv.trust(t, secret)
	s.publish(t, "order.created", "ev-1")
	s.publish(t, "order.shipped", "ev-2") // not one of billing's types
	eventually(t, "billing's delivery", func() bool { l, _ := s.lane("billing"); return l.Delivered == 1 })
	if v, f := rcv.counts(); v != 1 || f != 0 {
		t.Fatalf("receiver verified %d deliveries, refused %d; want the one, signed with the printed secret", v, f)
	}

	// create from a YAML file, with a secret of its own and a tenant.
	dir := t.TempDir()
	spec := filepath.Join(dir, "shipping.yaml")
	os.WriteFile(spec, []byte(fmt.Sprintf(`id: shipping
url: %s/shipping
secret: %s
tenant: acme
types: ["*"]
rate: {per_second: 50, burst: 10}
classify: {409: ack}
retry: {max_attempts: 1}
`, failing.URL, e2eSecret)), 0o600)
	out = mustRun(t, sub("create", "--file", spec)...)
	contains(t, out, "created shipping (active)")
	if strings.Contains(out, "secret:") || strings.Contains(out, e2eSecret) {
		t.Fatalf("create with a secret of its own printed a secret:\n%s", out)
	}
	// shipping's endpoint fails and it has one attempt: this event is
	// dead-lettered, for recover below.
	s.postAs(t, "acme", "order.shipped", "ev-4", `{"n":4}`) // an event of shipping's tenant

	// get: the lane and the settings, never the secret.
	out = mustRun(t, sub("get", "billing")...)
	for _, re := range []string{`(?m)^subscription +billing$`, `(?m)^managed by +api$`, `(?m)^delivered +1$`, `(?m)^  url: ` + regexp.QuoteMeta(rcv.srv.URL) + `/billing$`,
		`(?m)^  secrets_count: 1$`, `(?m)^  types:\n +- order\.created\n +- order\.paid$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("get lacks %s:\n%s", re, out)
		}
	}
	if strings.Contains(out, secret) {
		t.Fatalf("get shows the secret:\n%s", out)
	}
	var info api.SubscriptionInfo
	if err := json.Unmarshal([]byte(mustRun(t, sub("get", "shipping", "--json")...)), &info); err != nil {
		t.Fatal(err)
	}
	if info.Tenant != "acme" || info.ManagedBy != api.ManagedByAPI || info.Secret != "" ||
		!reflect.DeepEqual(info.Config["rate"], map[string]any{"per_second": float64(50), "burst": float64(10)}) ||
		!reflect.DeepEqual(info.Config["classify"], map[string]any{"409": "ack"}) {
		t.Fatalf("get --json = %+v", info)
	}

	// update by --set: dotted keys merge into an object, values are JSON
	// when they parse, strings else.
	out = mustRun(t, sub("update", "shipping", "--set", "rate.per_second=20", "--set", "timeout=3s", "--set", "headers.X-Tenant=acme")...)
	contains(t, out, "updated shipping: headers, rate, timeout")
	info = api.SubscriptionInfo{}
	json.Unmarshal([]byte(mustRun(t, sub("get", "shipping", "--json")...)), &info)
	if !reflect.DeepEqual(info.Config["rate"], map[string]any{"per_second": float64(20), "burst": float64(10)}) ||
		info.Config["timeout"] != "3s" || !reflect.DeepEqual(info.Config["headers"], map[string]any{"X-Tenant": "acme"}) {
		t.Fatalf("after update: %+v", info.Config)
	}
	// ... and by a patch file; null removes a key.
	patch := filepath.Join(dir, "patch.yaml")
	os.WriteFile(patch, []byte("types: [order.created]\nheaders: null\n"), 0o600)
	mustRun(t, sub("update", "shipping", "--file", patch)...)
	info = api.SubscriptionInfo{}
	json.Unmarshal([]byte(mustRun(t, sub("get", "shipping", "--json")...)), &info)
	if _, ok := info.Config["headers"]; ok || !reflect.DeepEqual(info.Config["types"], []any{"order.created"}) {
		t.Fatalf("after the patch file: %+v", info.Config)
	}

	// list: every subscription, or one tenant's.
	out = mustRun(t, sub("list")...)
	for _, re := range []string{`SUBSCRIPTION +STATE +TENANT +MANAGED BY +IN FLIGHT/CAP +BACKLOG +DELIVERED +DEAD`,
		`(?m)^billing +active +- +api +0/\d+ +\d+ +1 +0$`, `(?m)^filed +active +- +file `, `(?m)^shipping +active +acme +api `} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("list lacks %s:\n%s", re, out)
		}
	}
	var list api.SubscriptionList
	if err := json.Unmarshal([]byte(mustRun(t, sub("list", "--tenant", "acme", "--json")...)), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Subscriptions) != 1 || list.Subscriptions[0].Subscription != "shipping" {
		t.Fatalf("list --tenant acme = %+v", list.Subscriptions)
	}

	// A tenant's token, printed once, sees its tenant's subscriptions only.
	out = mustRun(t, append([]string{"tenants", "token", "acme"}, c...)...)
	contains(t, out, onceNote)
	tok := printed(t, out, regexp.MustCompile(`(?m)^token of tenant acme: (\S+)$`))
	out = mustRun(t, sub("list", "--token", tok)...)
	if !strings.Contains(out, "shipping") || strings.Contains(out, "billing") || strings.Contains(out, "filed") {
		t.Fatalf("list with acme's token:\n%s", out)
	}
	out = mustFail(t, sub("get", "billing", "--token", tok)...)
	contains(t, out, "404 Not Found")

	// rotate-secret: a new secret, printed once; the old one signs for the
	// grace, then (0s) not at all.
	out = mustRun(t, sub("rotate-secret", "billing", "--grace", "1h")...)
	contains(t, out, onceNote, "the old secrets sign beside it until ")
	newSecret := printed(t, out, regexp.MustCompile(`(?m)^new secret of billing: (whsec_\S+)$`))
	if newSecret == secret {
		t.Fatal("rotate-secret printed the old secret")
	}
	out = mustRun(t, sub("rotate-secret", "billing", "--grace", "0s")...)
	contains(t, out, "the old secrets no longer sign")
	rcv.trust(t, printed(t, out, regexp.MustCompile(`(?m)^new secret of billing: (whsec_\S+)$`)))
	s.publish(t, "order.paid", "ev-3")
	eventually(t, "billing's delivery after the rotation", func() bool { l, _ := s.lane("billing"); return l.Delivered == 2 })
	if v, f := rcv.counts(); v != 2 || f != 0 {
		t.Fatalf("after the rotation the receiver verified %d, refused %d", v, f)
	}

	// recover: shipping's event is dead; recover replays it once, and a
	// second recover skips it.
	eventually(t, "shipping's dead letter", func() bool { l, _ := s.lane("shipping"); return l.DeadLettered == 1 })
	out = mustRun(t, sub("recover", "shipping", "--since", "1h")...)
	contains(t, out, "shipping: 1 dead letter in range, 1 replayed\n")
	eventually(t, "the replay to fail again", func() bool { l, _ := s.lane("shipping"); return l.DeadLettered == 2 })
	out = mustRun(t, sub("recover", "shipping", "--since", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339), "--until", "0s")...)
	contains(t, out, "shipping: 1 dead letter in range, 0 replayed; 1 skipped: replayed before and not delivered yet")

	// delete: the subscription drains, then goes.
	out = mustRun(t, sub("delete", "billing")...)
	contains(t, out, "deleted billing (draining): it takes no new events")

	// Errors are the sidecar's message, exit 1.
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{sub("create", "--id", "bad", "--url", "ftp://example.com/hooks"), []string{"400 Bad Request", "url", "must be http or https"}},
		{sub("create", "--id", "shipping", "--url", failing.URL), []string{"409 Conflict", "shipping", "already exists"}},
		{sub("update", "filed", "--set", "timeout=1s"), []string{"409 Conflict", "managed by the config file"}},
		{sub("update", "shipping", "--set", "retry.max_attempts=many"), []string{"400 Bad Request", "retry.max_attempts"}},
		{sub("get", "nope"), []string{"404 Not Found", `"nope"`}},
		{sub("recover", "shipping", "--since", "1h", "--until", "2h"), []string{"400 Bad Request", "since"}},
	} {
		out := mustFail(t, tc.args...)
		contains(t, out, tc.want...)
	}
	// What the CLI refuses itself, before asking.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{sub("create"), "give --file FILE, or at least --id and --url"},
		{sub("update", "shipping", "--set", "secret=null"), "rotate-secret"},
		{sub("update", "shipping"), "give --file PATCH or --set KEY=VALUE"},
		{sub("rotate-secret", "shipping", "--grace", "soon"), "--grace"},
		{sub("recover", "shipping"), "--since is required"},
		{sub("frobnicate"), `unknown subcommand "frobnicate"`},
		{[]string{"tenants", "list"}, "want 'tenants token TENANT'"},
	} {
		out := mustFail(t, tc.args...)
		contains(t, out, tc.want)
	}
}

func TestSetPatch(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		want string // the patch as JSON, or "error: ..." for a part of the error
	}{
		{[]string{"timeout=5s"}, `{"timeout":"5s"}`},
		{[]string{"concurrency.max=8", "concurrency.auto=false"}, `{"concurrency":{"auto":false,"max":8}}`},
		{[]string{"types=[\"a\",\"b\"]"}, `{"types":["a","b"]}`},
		{[]string{"rate=null"}, `{"rate":null}`},
		{[]string{`headers.X-Id="123"`, "headers.X-N=123"}, `{"headers":{"X-Id":"123","X-N":123}}`},
		{[]string{"url=https://x.example/a=b"}, `{"url":"https://x.example/a=b"}`},
		{[]string{"note="}, `{"note":""}`},
		{[]string{"timeout"}, "error: KEY=VALUE"},
		{[]string{"=x"}, "error: KEY=VALUE"},
		{[]string{"rate..burst=1"}, "error: empty part"},
		{[]string{"rate=null", "rate.burst=1"}, "error: rate is set to a value already"},
		{[]string{"timeout=1s", "timeout=2s"}, "error: timeout is set twice"},
		{[]string{"secret=null"}, "error: rotate-secret"},
		{[]string{"secrets=[]"}, "error: rotate-secret"},
	} {
		patch := map[string]any{}
		var err error
		for _, s := range tc.sets {
			if err = setPatch(patch, s); err != nil {
				break
			}
		}
		got := ""
		if err != nil {
			got = "error: " + err.Error()
			if !strings.Contains(got, strings.TrimPrefix(tc.want, "error: ")) || !strings.HasPrefix(tc.want, "error: ") {
				t.Errorf("%q: %s, want %s", tc.sets, got, tc.want)
			}
			continue
		}
		b, _ := json.Marshal(patch)
		if string(b) != tc.want {
			t.Errorf("%q: %s, want %s", tc.sets, b, tc.want)
		}
	}
}

func TestReadDocument(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, text string
		want       string // as JSON, or "error: ..."
	}{
		{"a.yaml", "id: a\nurl: https://x.example\nrate: {per_second: 1.5}\nclassify: {409: ack, \"404\": dead_letter}\n",
			`{"classify":{"404":"dead_letter","409":"ack"},"id":"a","rate":{"per_second":1.5},"url":"https://x.example"}`},
		{"b.json", `{"id": "b", "retry": {"max_attempts": 12345678901234567890}}`, `{"id":"b","retry":{"max_attempts":12345678901234567890}}`},
		{"c.txt", "  {\"id\": \"c\"}\n", `{"id":"c"}`},
		{"d.yaml", "headers: null\ntypes: []\n", `{"headers":null,"types":[]}`},
		{"e.yaml", "- id: a\n", "error: want a mapping"},
		{"f.yaml", "id: a\n---\nid: b\n", "error: want one YAML document"},
		{"g.yaml", "", "error: empty"},
		{"h.json", `{"id": "h"} {"id": "i"}`, "error: more than one JSON value"},
		{"i.json", `[1]`, "error: not a JSON object"},
		{"j.yaml", "id: [unclosed\n", "error: j.yaml"},
	} {
		p := filepath.Join(dir, tc.name)
		os.WriteFile(p, []byte(tc.text), 0o600)
		doc, err := readDocument(p)
		if err != nil {
			if !strings.HasPrefix(tc.want, "error: ") || !strings.Contains(err.Error(), strings.TrimPrefix(tc.want, "error: ")) {
				t.Errorf("%s: %v, want %s", tc.name, err, tc.want)
			}
			continue
		}
		b, _ := json.Marshal(doc)
		if string(b) != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, b, tc.want)
		}
	}
}

func TestParseWhen(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-11-30T12:00:00Z":      time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
		"2026-11-30T13:00:00+01:00": time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
		"24h":                       now.Add(-24 * time.Hour),
		"90m":                       now.Add(-90 * time.Minute),
		"0s":                        now,
	} {
		got, err := parseWhen(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseWhen(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"yesterday", "-1h", "2026-11-30", ""} {
		if _, err := parseWhen(in, now); err == nil {
			t.Errorf("parseWhen(%q) accepted", in)
		}
	}
}

// TestRecoverSummaryCountsDelivered: dead letters in the range that a
// replay delivered are not replayed again, and the summary says so rather
// than report an empty range.
func TestRecoverSummaryCountsDelivered(t *testing.T) {
	for _, c := range []struct {
		ans  api.RecoverAnswer
		want string
	}{
		{api.RecoverAnswer{Subscription: "s", Delivered: 2}, "s: 2 dead letters in range, 0 replayed; 2 already delivered"},
		{api.RecoverAnswer{Subscription: "s"}, "s: 0 dead letters in range, 0 replayed"},
		{api.RecoverAnswer{Subscription: "s", Matched: 3, Replayed: 2, Skipped: 1, Delivered: 1},
			"s: 4 dead letters in range, 2 replayed; 1 already delivered; 1 skipped: replayed before and not delivered yet, or a retry scheduled (sluice dlq replay --force replays one again)"},
	} {
		if got := recoverSummary(&c.ans); got != c.want {
			t.Errorf("recoverSummary(%+v)\n got %q\nwant %q", c.ans, got, c.want)
		}
	}
}
