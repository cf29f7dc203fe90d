package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/internal/sidecartest"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/testbed"
)

const (
	testToken  = "client-test-token"
	testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)

// sidecar is the shared in-process sidecar (internal/sidecartest):
// subscription "ok" delivers to a healthy endpoint, "failing" to one
// answering 500, so its events are dead-lettered after two attempts.
type sidecar struct {
	srv *proxy.Server
	tb  *testbed.Server
}

func startSidecar(t *testing.T, adminListen string) *sidecar {
	t.Helper()
	srv, tb := sidecartest.Start(t, adminListen, testToken, testSecret)
	return &sidecar{srv: srv, tb: tb}
}

// publish posts n events with ids prefix-0... and waits until both lanes
// settled them.
func (s *sidecar) publish(t *testing.T, prefix string, n int) {
	t.Helper()
	sidecartest.Publish(t, s.srv, prefix, n)
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

func newClient(t *testing.T, addr string, opts client.Options) *client.Client {
	t.Helper()
	c, err := client.New(addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// apiError returns err as an *APIError, failing the test if it is not one
// with the given status.
func apiError(t *testing.T, err error, status int) *client.APIError {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != status {
		t.Fatalf("error %v (%T), want an *APIError with status %d", err, err, status)
	}
	return ae
}

func TestClientCallsEveryPath(t *testing.T) {
	s := startSidecar(t, "127.0.0.1:0")
	s.publish(t, "e", 3)
	ctx := ctxT(t)
	c := newClient(t, s.srv.AdminURL(), client.Options{Token: testToken})

	if err := c.Healthz(ctx); err != nil {
		t.Fatalf("healthz: %v", err)
	}
	if err := c.Ready(ctx); err != nil {
		t.Fatalf("ready: %v", err)
	}
	subs, err := c.Subscriptions(ctx)
	if err != nil || len(subs.Subscriptions) != 2 || subs.Head != 3 || subs.Subscriptions[0].Subscription != "failing" || subs.Subscriptions[1].Delivered != 3 {
		t.Fatalf("subscriptions: %+v %v", subs, err)
	}
	if b, err := c.RetryBudget(ctx); err != nil || b.Successes == 0 {
		t.Fatalf("retry budget: %+v %v", b, err)
	}

	ev, err := c.Event(ctx, "e-0")
	if err != nil || ev.ID != "e-0" || ev.Seq != 1 || len(ev.Deliveries) != 2 {
		t.Fatalf("event: %+v %v", ev, err)
	}
	states := map[string]string{}
	for _, d := range ev.Deliveries {
		states[d.Subscription] = d.State
	}
	if states["ok"] != "delivered" || states["failing"] != "dead_lettered" {
		t.Fatalf("event deliveries: %+v", ev.Deliveries)
	}
	_, err = c.Event(ctx, "nope")
	if ae := apiError(t, err, 404); !strings.Contains(ae.Message, `event "nope"`) || !strings.HasPrefix(err.Error(), "404 Not Found: event ") {
		t.Fatalf("unknown event: %q", err)
	}

	// Dead letters, a page at a time.
	var all []api.DeadLetterInfo
	q := client.DeadLetterQuery{Subscription: "failing", Reason: "max_attempts", Limit: 1}
	for pages := 0; ; pages++ {
		page, err := c.DeadLetters(ctx, q)
		if err != nil || pages > 3 {
			t.Fatalf("dead letters page %d: %+v %v", pages, page, err)
		}
		all = append(all, page.DeadLetters...)
		if page.Next == "" {
			break
		}
		q.Cursor = page.Next
	}
	if len(all) != 3 || all[0].Subscription != "failing" || all[0].Attempts != 2 || all[0].LastStatus != 500 || all[0].Body != nil {
		t.Fatalf("dead letters: %+v", all)
	}
	if page, err := c.DeadLetters(ctx, client.DeadLetterQuery{Subscription: "ok"}); err != nil || page.DeadLetters == nil || len(page.DeadLetters) != 0 {
		t.Fatalf("dead letters of a healthy subscription: %+v %v", page, err)
	}
	_, err = c.DeadLetters(ctx, client.DeadLetterQuery{Limit: 5000})
	if ae := apiError(t, err, 400); !strings.Contains(ae.Message, "limit") {
		t.Fatalf("bad limit: %q", err)
	}
	d, err := c.DeadLetter(ctx, "failing", all[0].Seq)
	if err != nil || d.Body == nil || *d.Body != `{"n":0}` || d.ContentType != "application/json" || d.EventID != "e-0" {
		t.Fatalf("dead letter: %+v %v", d, err)
	}
	_, err = c.DeadLetter(ctx, "failing", 999)
	apiError(t, err, 404)

	// Replay: once, skipped the second time, again with force.
	s.tb.SetMode("/failing", testbed.ModeOK)
	one := api.ReplayRequest{Subscription: "failing", Seq: all[0].Seq}
	if r, err := c.Replay(ctx, one); err != nil || r.Replayed != 1 || len(r.Results) != 1 || r.Results[0].EventID != "e-0" {
		t.Fatalf("replay: %+v %v", r, err)
	}
	if r, err := c.Replay(ctx, one); err != nil || r.Replayed != 0 || !strings.Contains(r.Results[0].Skipped, "already replayed") {
		t.Fatalf("second replay: %+v %v", r, err)
	}
	eventually(t, "replay delivered", func() bool { return s.srv.Lanes()[0].Delivered == 1 })
	one.Force = true
	if r, err := c.Replay(ctx, one); err != nil || r.Replayed != 1 {
		t.Fatalf("forced replay: %+v %v", r, err)
	}
	if r, err := c.Replay(ctx, api.ReplayRequest{Filter: &api.ReplayFilter{Subscription: "failing"}}); err != nil || r.Replayed != 2 {
		t.Fatalf("replay by filter: %+v %v", r, err)
	}

	// Pause and resume.
	if st, err := c.Pause(ctx, "ok", "maintenance"); err != nil || *st != (api.StateAnswer{Subscription: "ok", State: "paused"}) {
		t.Fatalf("pause: %+v %v", st, err)
	}
	subs, err = c.Subscriptions(ctx)
	if err != nil || subs.Subscriptions[1].State != "paused" || subs.Subscriptions[1].PausedBy != "maintenance" {
		t.Fatalf("after pause: %+v %v", subs, err)
	}
	if st, err := c.Resume(ctx, "ok"); err != nil || st.State != "active" {
		t.Fatalf("resume: %+v %v", st, err)
	}
	_, err = c.Pause(ctx, "nobody", "")
	if ae := apiError(t, err, 404); ae.Message != `subscription "nobody": not found` {
		t.Fatalf("pause of nobody: %q", ae.Message)
	}
}

// TestClientToken: without the token every path but /healthz is refused,
// once (a 401 is not retried).
func TestClientToken(t *testing.T) {
	s := startSidecar(t, "127.0.0.1:0")
	var retries atomic.Int64
	c := newClient(t, s.srv.AdminURL(), client.Options{OnRetry: func(int, string) { retries.Add(1) }})
	ctx := ctxT(t)
	_, err := c.Subscriptions(ctx)
	if ae := apiError(t, err, 401); ae.Message != "missing or wrong admin token" {
		t.Fatalf("without the token: %q", ae.Message)
	}
	apiError(t, c.Ready(ctx), 401)
	if err := c.Healthz(ctx); err != nil {
		t.Fatalf("healthz without the token: %v", err)
	}
	wrong := newClient(t, s.srv.AdminURL(), client.Options{Token: "wrong"})
	_, err = wrong.Event(ctx, "x")
	apiError(t, err, 401)
	if n := retries.Load(); n != 0 {
		t.Fatalf("%d retries of a 401", n)
	}
}

// TestClientRidesOutALateStart: the admin API starts listening only after
// the call began; the call is retried until it answers, and OnRetry says
// why it waits.
func TestClientRidesOutALateStart(t *testing.T) {
	// The late start registers the sidecar's Close from its own goroutine,
	// possibly after this test's body has returned (the client's answer
	// comes as soon as Open has bound the listener). The temp dir's root
	// is made here, first, so its removal is the last cleanup: removed
	// before the sidecar closed, its data dir took Badger's memtable
	// flush, and so Close, into a retry loop for ever (a 10 min CI hang).
	t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	admin := ln.Addr().String()
	ln.Close()
	started := make(chan *sidecar, 1)
	late := time.AfterFunc(300*time.Millisecond, func() { started <- startSidecar(t, admin) })
	t.Cleanup(func() {
		if !late.Stop() {
			<-started
		}
	})
	var mu sync.Mutex
	var reasons []string
	c := newClient(t, "http://"+admin+"/", client.Options{Token: testToken, OnRetry: func(n int, why string) {
		mu.Lock()
		defer mu.Unlock()
		reasons = append(reasons, fmt.Sprintf("%d:%s", n, why))
	}})
	begin := time.Now()
	subs, err := c.Subscriptions(ctxT(t))
	if err != nil || len(subs.Subscriptions) != 2 {
		t.Fatalf("subscriptions across the late start: %+v %v", subs, err)
	}
	if el := time.Since(begin); el < 300*time.Millisecond {
		t.Fatalf("answered after %s, before the listener opened", el)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reasons) == 0 || !strings.HasPrefix(reasons[0], "1:") || !strings.Contains(reasons[0], "connection refused") {
		t.Fatalf("retries: %q", reasons)
	}
}

// TestClientUnixSocket: an admin listener on a unix socket, addressed as
// admin.listen names it.
func TestClientUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "admin.sock")
	s := startSidecar(t, "unix://"+sock)
	c := newClient(t, "unix://"+sock, client.Options{Token: testToken})
	ctx := ctxT(t)
	if err := c.Ready(ctx); err != nil {
		t.Fatalf("ready over the socket: %v", err)
	}
	if _, err := c.Pause(ctx, "ok", ""); err != nil {
		t.Fatalf("pause over the socket: %v", err)
	}
	if l := s.srv.Lanes(); l[1].State != "paused" || l[1].PausedBy == "" {
		t.Fatalf("lane after pause without a reason: %+v", l[1])
	}
	if _, err := client.New("unix://"+sock, client.Options{Transport: http.DefaultTransport}); err == nil {
		t.Fatal("a unix socket with a Transport of its own was accepted")
	}
}

// TestClientIsSafeForConcurrentUse: one client, many goroutines (run with
// -race).
func TestClientIsSafeForConcurrentUse(t *testing.T) {
	s := startSidecar(t, "127.0.0.1:0")
	s.publish(t, "c", 2)
	c := newClient(t, s.srv.AdminURL(), client.Options{Token: testToken})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 8 {
		wg.Go(func() {
			for range 8 {
				var err error
				switch i % 3 {
				case 0:
					_, err = c.Subscriptions(ctx)
				case 1:
					_, err = c.Event(ctx, "c-1")
				default:
					_, err = c.DeadLetters(ctx, client.DeadLetterQuery{Subscription: "failing"})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestNewAddresses(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:8701":          "http://127.0.0.1:8701",
		"http://127.0.0.1:8701/":  "http://127.0.0.1:8701",
		"https://admin.internal":  "https://admin.internal",
		"unix:///run/sluice.sock": "http://sluice",
	} {
		c, err := client.New(addr, client.Options{})
		if err != nil || c.URL() != want {
			t.Errorf("New(%q): URL %q, %v; want %q", addr, c.URL(), err, want)
		}
	}
	for _, bad := range []string{"ftp://host", "unix://", "http://", "http://bad host:1"} {
		if _, err := client.New(bad, client.Options{}); err == nil {
			t.Errorf("New(%q) accepted", bad)
		}
	}
}

// TestClientRetryPolicy: 5xx and connection errors are retried, 4xx and
// 501 never; a forced replay is not sent twice; a replay is not bounded by
// the attempt timeout.
func TestClientRetryPolicy(t *testing.T) {
	var calls atomic.Int64
	var answers atomic.Value // func(n int64, w http.ResponseWriter) int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		code := answers.Load().(func(int64) int)(n)
		if code == 0 { // slow: three attempt timeouts, then 200
			select {
			case <-time.After(150 * time.Millisecond): // the experiment: slower than one attempt may take
			case <-r.Context().Done():
				return
			}
			code = 200
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		switch {
		case code == 502:
			fmt.Fprint(w, "<html>"+strings.Repeat("bad gateway ", 100)+"</html>")
		case code != 200:
			fmt.Fprintf(w, `{"error": "scripted %d"}`, code)
		case r.URL.Path == "/v1/dead-letters/replay":
			fmt.Fprint(w, `{"replayed":1,"results":[{"subscription":"a","seq":1,"replayed":true}]}`)
		default:
			fmt.Fprint(w, `{"id":"x","seq":1,"deliveries":[]}`)
		}
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL, client.Options{RetryWaitMin: time.Millisecond, RetryWaitMax: 5 * time.Millisecond, AttemptTimeout: 50 * time.Millisecond})
	event := func(ctx context.Context) error { _, err := c.Event(ctx, "x"); return err }
	replay := func(force bool) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := c.Replay(ctx, api.ReplayRequest{Subscription: "a", Seq: 1, Force: force})
			return err
		}
	}
	cases := []struct {
		name      string
		call      func(context.Context) error
		answer    func(int64) int
		wantCalls int64
		wantErr   string // "" for success
	}{
		{"5xx then 200", event, func(n int64) int { return map[bool]int{true: 503, false: 200}[n <= 2] }, 3, ""},
		{"5xx to the end", event, func(int64) int { return 500 }, 1 + client.DefaultRetryMax, "500 Internal Server Error: scripted 500"},
		{"404 once", event, func(int64) int { return 404 }, 1, "404 Not Found: scripted 404"},
		{"429 once", event, func(int64) int { return 429 }, 1, "429 Too Many Requests: scripted 429"},
		{"501 once", event, func(int64) int { return 501 }, 1, "501 Not Implemented: scripted 501"},
		{"a body that is not an error answer", event, func(n int64) int { return map[bool]int{true: 502, false: 400}[n == 1] }, 2, "400 Bad Request: scripted 400"},
		{"forced replay once", replay(true), func(int64) int { return 500 }, 1, "500 Internal Server Error: scripted 500"},
		{"replay retried", replay(false), func(n int64) int { return map[bool]int{true: 502, false: 200}[n == 1] }, 2, ""},
		{"slow read times out", event, func(int64) int { return 0 }, 1 + client.DefaultRetryMax, "Client.Timeout exceeded"},
		{"slow replay is waited for", replay(false), func(int64) int { return 0 }, 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			calls.Store(0)
			answers.Store(tc.answer)
			err := tc.call(ctxT(t))
			if calls.Load() != tc.wantCalls || (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("%d calls (want %d), error %v (want %q)", calls.Load(), tc.wantCalls, err, tc.wantErr)
			}
		})
	}

	// What a 502 page says is kept short.
	calls.Store(0)
	answers.Store(func(int64) int { return 502 })
	once := newClient(t, srv.URL, client.Options{RetryMax: -1})
	_, err := once.Event(ctxT(t), "x")
	if ae := apiError(t, err, 502); len(ae.Message) > 200 || !strings.HasPrefix(ae.Message, "<html>bad gateway") || calls.Load() != 1 {
		t.Fatalf("502 page: %d calls, %q", calls.Load(), ae.Message)
	}

	// A forced replay is retried when the connection was never made.
	gone := httptest.NewServer(http.NotFoundHandler())
	addr := gone.URL
	gone.Close()
	var retried atomic.Int64
	dead := newClient(t, addr, client.Options{RetryWaitMin: time.Millisecond, RetryWaitMax: time.Millisecond, RetryMax: 2,
		OnRetry: func(int, string) { retried.Add(1) }})
	_, err = dead.Replay(ctxT(t), api.ReplayRequest{Subscription: "a", Seq: 1, Force: true})
	if err == nil || !strings.Contains(err.Error(), "gave up after 3 attempts") || retried.Load() != 2 {
		t.Fatalf("forced replay to a closed port: %d retries, %v", retried.Load(), err)
	}
	// The context ends the retries.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := dead.Subscriptions(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
}
