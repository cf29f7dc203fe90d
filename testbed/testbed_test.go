package testbed_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// mustOpen starts a Server on a loopback port and closes it when the test
// ends.
func mustOpen(tb testing.TB, opts testbed.Options) *testbed.Server {
	tb.Helper()
	s := testbed.New(opts)
	if err := s.Open("127.0.0.1:0"); err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return s
}

// newClient returns an HTTP client whose idle connections are closed when
// the test ends. It has no timeout: tests bound waits with contexts.
func newClient(tb testing.TB) *http.Client {
	tb.Helper()
	tr := &http.Transport{}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

type delivery struct {
	id, ts, sig, attempt string
	body                 string
}

// send POSTs d to url and returns the status and response headers.
func send(tb testing.TB, ctx context.Context, c *http.Client, url string, d delivery) (int, http.Header) {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(d.body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range map[string]string{
		signing.HeaderID: d.id, signing.HeaderTimestamp: d.ts, signing.HeaderSignature: d.sig, "X-Attempt": d.attempt,
	} {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		tb.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header
}

// signed returns a delivery signed with secrets at the current time.
func signed(secrets []signing.Secret, id, body string) delivery {
	ts := time.Now().Unix()
	return delivery{id: id, ts: strconv.FormatInt(ts, 10), sig: signing.Sign(secrets, id, ts, []byte(body)), body: body}
}

func waitCtx(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func TestParseMode(t *testing.T) {
	for _, name := range []string{"ok", "fail", "slow", "blackhole", "ratelimit", "flaky"} {
		m, err := testbed.ParseMode(name)
		if err != nil || string(m) != name {
			t.Errorf("ParseMode(%q) = %q, %v", name, m, err)
		}
	}
	for _, name := range []string{"", "OK", "down", "rate-limit", " ok"} {
		_, err := testbed.ParseMode(name)
		if !errors.Is(err, testbed.ErrUnknownMode) {
			t.Errorf("ParseMode(%q) err = %v, want ErrUnknownMode", name, err)
		}
		if err != nil && !strings.Contains(err.Error(), "blackhole") {
			t.Errorf("ParseMode(%q) err = %q does not list the modes", name, err)
		}
	}
}

func TestModes(t *testing.T) {
	tests := []struct {
		name           string
		opts           testbed.Options
		want           int
		wantRetryAfter string
		minDuration    time.Duration
	}{
		{name: "default is ok", want: http.StatusOK},
		{name: "ok", opts: testbed.Options{Mode: testbed.ModeOK}, want: http.StatusOK},
		{name: "fail", opts: testbed.Options{Mode: testbed.ModeFail}, want: http.StatusInternalServerError},
		{name: "slow", opts: testbed.Options{Mode: testbed.ModeSlow, Delay: 50 * time.Millisecond}, want: http.StatusOK, minDuration: 50 * time.Millisecond},
		{name: "ratelimit default", opts: testbed.Options{Mode: testbed.ModeRateLimit}, want: http.StatusTooManyRequests, wantRetryAfter: "1"},
		{name: "ratelimit custom", opts: testbed.Options{Mode: testbed.ModeRateLimit, RetryAfter: "7"}, want: http.StatusTooManyRequests, wantRetryAfter: "7"},
		{name: "flaky first request fails", opts: testbed.Options{Mode: testbed.ModeFlaky}, want: http.StatusInternalServerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustOpen(t, tt.opts)
			start := time.Now()
			got, hdr := send(t, waitCtx(t), newClient(t), s.URL()+"/hook", delivery{id: "msg_1", body: "{}"})
			if got != tt.want {
				t.Fatalf("status = %d, want %d", got, tt.want)
			}
			if ra := hdr.Get("Retry-After"); ra != tt.wantRetryAfter {
				t.Fatalf("Retry-After = %q, want %q", ra, tt.wantRetryAfter)
			}
			if d := time.Since(start); d < tt.minDuration {
				t.Fatalf("answered after %s, want at least %s", d, tt.minDuration)
			}
			st := s.Stats()["/hook"]
			if st.Requests != 1 || st.Statuses[tt.want] != 1 || st.InFlight != 0 || st.MaxInFlight != 1 {
				t.Fatalf("stats = %+v", st)
			}
			if wantAccepted := int64(0); tt.want == http.StatusOK {
				wantAccepted = 1
				if st.Accepted != wantAccepted {
					t.Fatalf("Accepted = %d, want %d", st.Accepted, wantAccepted)
				}
			} else if st.Accepted != 0 || st.Unique != 0 {
				t.Fatalf("non-2xx counted as accepted: %+v", st)
			}
		})
	}
}

func TestFlaky_OddRequestsPerPathFail(t *testing.T) {
	s := mustOpen(t, testbed.Options{Mode: testbed.ModeFlaky})
	c, ctx := newClient(t), waitCtx(t)
	var got []int
	for i := range 5 {
		code, _ := send(t, ctx, c, s.URL()+"/a", delivery{id: fmt.Sprintf("a%d", i)})
		got = append(got, code)
	}
	// Another path has its own count: its first request fails too.
	code, _ := send(t, ctx, c, s.URL()+"/b", delivery{id: "b0"})
	got = append(got, code)
	want := []int{500, 200, 500, 200, 500, 500}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("statuses = %v, want %v", got, want)
	}
	if st := s.Stats()["/a"]; st.Accepted != 2 || st.Statuses[500] != 3 || st.Statuses[200] != 2 {
		t.Fatalf("/a stats = %+v", st)
	}
}

func TestSetMode(t *testing.T) {
	s := mustOpen(t, testbed.Options{})
	c, ctx := newClient(t), waitCtx(t)
	status := func(path string) int {
		code, _ := send(t, ctx, c, s.URL()+path, delivery{})
		return code
	}
	s.SetMode("/down", testbed.ModeFail)
	if got := status("/down"); got != 500 {
		t.Fatalf("/down = %d, want 500", got)
	}
	if got := status("/up"); got != 200 {
		t.Fatalf("/up = %d, want 200", got)
	}
	s.SetMode("", testbed.ModeRateLimit) // default for paths without their own
	if got := status("/up"); got != 429 {
		t.Fatalf("/up after default change = %d, want 429", got)
	}
	if got := status("/down"); got != 500 {
		t.Fatalf("/down keeps its own mode: got %d, want 500", got)
	}
	s.SetMode("/down", "") // back to the default
	if got := status("/down"); got != 429 {
		t.Fatalf("/down after removing its mode = %d, want 429", got)
	}
	s.SetMode("", "")
	if got := status("/down"); got != 200 {
		t.Fatalf("after resetting the default = %d, want 200", got)
	}
	s.SetMode("/weird", testbed.Mode("nonsense"))
	if got := status("/weird"); got != 500 {
		t.Fatalf("unknown mode = %d, want 500", got)
	}
}

func TestDuplicatesAndIDs(t *testing.T) {
	s := mustOpen(t, testbed.Options{})
	c, ctx := newClient(t), waitCtx(t)
	for _, id := range []string{"msg_a", "msg_b", "msg_a", "msg_a", "msg_c", ""} {
		send(t, ctx, c, s.URL()+"/p", delivery{id: id})
	}
	st := s.Stats()["/p"]
	if st.Requests != 6 || st.Accepted != 6 || st.Unique != 3 || st.Duplicates != 2 {
		t.Fatalf("stats = %+v, want 6 requests, 6 accepted, 3 unique, 2 duplicates", st)
	}
	if got := strings.Join(s.IDs("/p"), ","); got != "msg_a,msg_b,msg_c" {
		t.Fatalf("IDs = %s, want msg_a,msg_b,msg_c in order of first acceptance", got)
	}
	if ids := s.IDs("/never"); ids != nil {
		t.Fatalf("IDs of unknown path = %v, want nil", ids)
	}
}

func TestDuplicates_OnlyAcceptedCount(t *testing.T) {
	// A retry after a failure is not a duplicate; a redelivery after success is.
	s := mustOpen(t, testbed.Options{Mode: testbed.ModeFlaky})
	c, ctx := newClient(t), waitCtx(t)
	for attempt := 1; attempt <= 4; attempt++ {
		send(t, ctx, c, s.URL()+"/p", delivery{id: "msg_x", attempt: strconv.Itoa(attempt)})
	}
	st := s.Stats()["/p"]
	if st.Accepted != 2 || st.Unique != 1 || st.Duplicates != 1 {
		t.Fatalf("stats = %+v, want 2 accepted, 1 unique, 1 duplicate", st)
	}
	want := map[string]int64{"1": 1, "2": 1, "3": 1, "4": 1}
	if fmt.Sprint(st.Attempts) != fmt.Sprint(want) {
		t.Fatalf("Attempts = %v, want %v", st.Attempts, want)
	}
}

func TestSignatures(t *testing.T) {
	good, err := signing.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	other, err := signing.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	s := mustOpen(t, testbed.Options{Secrets: []signing.Secret{good}})
	c, ctx := newClient(t), waitCtx(t)
	url := s.URL() + "/signed"

	if code, _ := send(t, ctx, c, url, signed([]signing.Secret{good}, "msg_ok", `{"n":1}`)); code != 200 {
		t.Fatalf("good signature: %d, want 200", code)
	}
	if code, _ := send(t, ctx, c, url, signed([]signing.Secret{other, good}, "msg_rot", `{"n":2}`)); code != 200 {
		t.Fatalf("rotation header: %d, want 200", code)
	}
	if code, _ := send(t, ctx, c, url, signed([]signing.Secret{other}, "msg_bad", `{"n":3}`)); code != 401 {
		t.Fatalf("other secret: %d, want 401", code)
	}
	tampered := signed([]signing.Secret{good}, "msg_tampered", `{"n":4}`)
	tampered.body = `{"n":5}`
	if code, _ := send(t, ctx, c, url, tampered); code != 401 {
		t.Fatalf("tampered body: %d, want 401", code)
	}
	old := signed([]signing.Secret{good}, "msg_old", `{}`)
	oldTS := time.Now().Add(-time.Hour).Unix()
	old.ts, old.sig = strconv.FormatInt(oldTS, 10), signing.Sign([]signing.Secret{good}, "msg_old", oldTS, []byte(`{}`))
	if code, _ := send(t, ctx, c, url, old); code != 401 {
		t.Fatalf("hour-old timestamp: %d, want 401", code)
	}
	if code, _ := send(t, ctx, c, url, delivery{id: "msg_unsigned", body: "{}"}); code != 401 {
		t.Fatalf("unsigned: %d, want 401", code)
	}

	st := s.Stats()["/signed"]
	if st.Requests != 6 || st.Accepted != 2 || st.BadSignatures != 3 || st.Unsigned != 1 || st.Statuses[401] != 4 {
		t.Fatalf("stats = %+v, want 6 requests, 2 accepted, 3 bad, 1 unsigned, 4×401", st)
	}
	if got := strings.Join(s.IDs("/signed"), ","); got != "msg_ok,msg_rot" {
		t.Fatalf("IDs = %s, rejected deliveries must not be recorded", got)
	}
}

func TestSignatures_NotVerifiedWithoutSecrets(t *testing.T) {
	sec, err := signing.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	s := mustOpen(t, testbed.Options{})
	c, ctx := newClient(t), waitCtx(t)
	send(t, ctx, c, s.URL()+"/p", delivery{id: "u", body: "{}"})
	send(t, ctx, c, s.URL()+"/p", delivery{id: "s", ts: "1", sig: "v1,garbage"})
	send(t, ctx, c, s.URL()+"/p", signed([]signing.Secret{sec}, "g", "{}"))
	st := s.Stats()["/p"]
	if st.Accepted != 3 || st.Unsigned != 1 || st.BadSignatures != 0 {
		t.Fatalf("stats = %+v, want 3 accepted, 1 unsigned, 0 bad", st)
	}
}

func TestBlackhole_CloseReleases(t *testing.T) {
	s := testbed.New(testbed.Options{Mode: testbed.ModeBlackhole})
	if err := s.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	c := newClient(t)
	ctx := waitCtx(t)

	const n = 3
	errs := make(chan error, n)
	for i := range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/hole", strings.NewReader("{}"))
			req.Header.Set(signing.HeaderID, fmt.Sprintf("msg_%d", i))
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
				err = fmt.Errorf("got an answer: %s", resp.Status)
			} else {
				err = nil // the connection was closed without an answer
			}
			errs <- err
		}()
	}
	if err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/hole"].InFlight == n }); err != nil {
		t.Fatalf("requests never held: %v (stats %+v)", err, s.Stats())
	}

	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Close did not return while requests were black-holed")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %s with black-holed requests", d)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	st := s.Stats()["/hole"]
	if st.Requests != n || st.InFlight != 0 || st.MaxInFlight != n || st.Accepted != 0 || len(st.Statuses) != 0 {
		t.Fatalf("stats after Close = %+v", st)
	}
}

func TestBlackhole_ClientDisconnectReleases(t *testing.T) {
	s := mustOpen(t, testbed.Options{})
	s.SetMode("/hole", testbed.ModeBlackhole)
	c, ctx := newClient(t), waitCtx(t)

	reqCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(reqCtx, http.MethodPost, s.URL()+"/hole", strings.NewReader("{}"))
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("black hole answered %s", resp.Status)
		}
	}()
	if err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/hole"].InFlight == 1 }); err != nil {
		t.Fatalf("request never held: %v", err)
	}
	cancel() // the client gives up and closes its connection
	<-done
	if err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/hole"].InFlight == 0 }); err != nil {
		t.Fatalf("server did not notice the disconnect: %v (stats %+v)", err, s.Stats())
	}
	// Other paths keep working meanwhile.
	if code, _ := send(t, ctx, c, s.URL()+"/ok", delivery{}); code != 200 {
		t.Fatalf("/ok = %d", code)
	}
}

func TestSlow_CloseReleases(t *testing.T) {
	s := testbed.New(testbed.Options{Mode: testbed.ModeSlow, Delay: time.Hour})
	if err := s.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	c, ctx := newClient(t), waitCtx(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/slow", nil)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	if err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/slow"].InFlight == 1 }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	<-done
	if st := s.Stats()["/slow"]; st.InFlight != 0 || st.Accepted != 0 {
		t.Fatalf("stats after Close = %+v", st)
	}
}

func TestWait(t *testing.T) {
	s := mustOpen(t, testbed.Options{})
	c := newClient(t)

	t.Run("condition met", func(t *testing.T) {
		ctx := waitCtx(t)
		waited := make(chan error, 1)
		go func() {
			waited <- s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/w"].Accepted >= 3 })
		}()
		for i := range 3 {
			send(t, ctx, c, s.URL()+"/w", delivery{id: strconv.Itoa(i)})
		}
		if err := <-waited; err != nil {
			t.Fatalf("Wait = %v, want nil", err)
		}
	})
	t.Run("already true", func(t *testing.T) {
		calls := 0
		err := s.Wait(context.Background(), func(map[string]testbed.PathStats) bool { calls++; return true })
		if err != nil || calls != 1 {
			t.Fatalf("Wait = %v after %d calls", err, calls)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/never"].Requests > 0 })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait = %v, want DeadlineExceeded", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := s.Wait(ctx, func(map[string]testbed.PathStats) bool { return false })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v, want Canceled", err)
		}
	})
}

func TestConcurrentRequests(t *testing.T) {
	s := mustOpen(t, testbed.Options{})
	c, ctx := newClient(t), waitCtx(t)
	const workers, each = 8, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				// Every id is sent twice: once by worker w, once by w+1.
				send(t, ctx, c, s.URL()+"/c", delivery{id: fmt.Sprintf("%d-%d", (w+i%2)%workers, i)})
			}
		})
	}
	wg.Wait()
	st := s.Stats()["/c"]
	if st.Requests != workers*each || st.Accepted != workers*each || st.Unique+st.Duplicates != st.Accepted || st.InFlight != 0 {
		t.Fatalf("stats = %+v", st)
	}
	if int(st.Unique) != len(s.IDs("/c")) {
		t.Fatalf("Unique %d != len(IDs) %d", st.Unique, len(s.IDs("/c")))
	}
}

func TestControlEndpoints(t *testing.T) {
	s := mustOpen(t, testbed.Options{})
	c, ctx := newClient(t), waitCtx(t)
	do := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, s.URL()+path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	if code, body := do(http.MethodPost, "/_mode?path=/p&mode=fail"); code != 200 {
		t.Fatalf("POST /_mode: %d %s", code, body)
	}
	if code, _ := send(t, ctx, c, s.URL()+"/p", delivery{id: "x"}); code != 500 {
		t.Fatalf("/p after /_mode fail = %d, want 500", code)
	}
	if code, body := do(http.MethodPost, "/_mode?path=/p&mode=bogus"); code != 400 || !strings.Contains(body, "unknown mode") {
		t.Fatalf("bad mode: %d %q, want 400 naming the problem", code, body)
	}
	if code, _ := do(http.MethodPost, "/_mode?path=/p"); code != 400 {
		t.Fatalf("missing mode: %d, want 400", code)
	}
	if code, _ := do(http.MethodGet, "/_mode?path=/p&mode=ok"); code != 405 {
		t.Fatalf("GET /_mode: %d, want 405", code)
	}
	if code, _ := do(http.MethodPost, "/_mode?path=/p&mode=ok"); code != 200 {
		t.Fatal("reset /p")
	}
	send(t, ctx, c, s.URL()+"/p", delivery{id: "a"})
	send(t, ctx, c, s.URL()+"/p", delivery{id: "b"})
	send(t, ctx, c, s.URL()+"/p", delivery{id: "a"})
	if code, _ := do(http.MethodPost, "/_mode?mode=ratelimit"); code != 200 {
		t.Fatal("set default mode")
	}
	if code, _ := send(t, ctx, c, s.URL()+"/q", delivery{}); code != 429 {
		t.Fatalf("/q after default ratelimit = %d, want 429", code)
	}

	code, body := do(http.MethodGet, "/_ids?path=/p")
	if code != 200 || body != "a\nb\n" {
		t.Fatalf("GET /_ids: %d %q, want %q", code, body, "a\nb\n")
	}
	if code, _ := do(http.MethodGet, "/_ids"); code != 400 {
		t.Fatalf("GET /_ids without path: %d, want 400", code)
	}

	code, body = do(http.MethodGet, "/_stats")
	if code != 200 {
		t.Fatalf("GET /_stats: %d", code)
	}
	for _, key := range []string{`"requests"`, `"accepted"`, `"unique"`, `"duplicates"`, `"bad_signatures"`, `"unsigned"`, `"in_flight"`, `"max_in_flight"`, `"attempts"`, `"statuses"`} {
		if !strings.Contains(body, key) {
			t.Errorf("/_stats lacks %s: %s", key, body)
		}
	}
	var stats map[string]testbed.PathStats
	if err := json.Unmarshal([]byte(body), &stats); err != nil {
		t.Fatalf("decode /_stats: %v", err)
	}
	p := stats["/p"]
	if p.Requests != 4 || p.Accepted != 3 || p.Unique != 2 || p.Duplicates != 1 || p.Statuses[500] != 1 {
		t.Fatalf("/_stats /p = %+v", p)
	}
	if _, ok := stats["/_stats"]; ok {
		t.Fatal("control endpoints must not be counted as webhook paths")
	}
	if fmt.Sprint(stats) != fmt.Sprint(s.Stats()) {
		t.Fatalf("/_stats %v differs from Stats() %v", stats, s.Stats())
	}
}

func TestStats_IsACopy(t *testing.T) {
	s := mustOpen(t, testbed.Options{})
	send(t, waitCtx(t), newClient(t), s.URL()+"/p", delivery{attempt: "1"})
	m := s.Stats()
	m["/p"].Statuses[200] = 99
	m["/p"].Attempts["1"] = 99
	if st := s.Stats()["/p"]; st.Statuses[200] != 1 || st.Attempts["1"] != 1 {
		t.Fatalf("Stats shares maps with the server: %+v", st)
	}
}

func TestLifecycle(t *testing.T) {
	s := testbed.New(testbed.Options{})
	if s.Addr() != "" || s.URL() != "" {
		t.Fatal("Addr/URL before Open must be empty")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close before Open: %v", err)
	}
	if err := s.Open("127.0.0.1:0"); !errors.Is(err, testbed.ErrServerClosed) {
		t.Fatalf("Open after Close: %v, want ErrServerClosed", err)
	}

	a := mustOpen(t, testbed.Options{})
	if !strings.HasPrefix(a.URL(), "http://127.0.0.1:") {
		t.Fatalf("URL = %q", a.URL())
	}
	if err := a.Open("127.0.0.1:0"); err == nil {
		t.Fatal("second Open succeeded")
	}
	b := testbed.New(testbed.Options{})
	err := b.Open(a.Addr())
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Fatalf("Open on a used port: %v, want a bind error", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := http.Post(a.URL()+"/p", "text/plain", nil); err == nil {
		t.Fatal("server still answers after Close")
	}
}

// TestBlackhole_InFlightExact: a client that closes its connection to a
// held request and then sends another is not counted twice, even when the
// goroutine holding the first has not yet run to notice (held back here,
// as a busy machine holds it); a request whose client still waits is
// counted.
func TestBlackhole_InFlightExact(t *testing.T) {
	late := make(chan struct{})
	defer testbed.SetHolderLate(func() { <-late })()
	defer close(late)
	s := mustOpen(t, testbed.Options{})
	s.SetMode("/hole", testbed.ModeBlackhole)
	ctx := waitCtx(t)

	// hold sends a request on a connection of its own, closed (at once,
	// as sluice's client closes one that timed out) by the function it
	// returns.
	hold := func() (closeConn func()) {
		c, err := net.Dial("tcp", strings.TrimPrefix(s.URL(), "http://"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, "POST /hole HTTP/1.1\r\nHost: testbed\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
			t.Fatal(err)
		}
		return func() { c.Close() }
	}
	requests := func(n int64) {
		t.Helper()
		if err := s.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/hole"].Requests == n }); err != nil {
			t.Fatalf("request %d never arrived: %v", n, err)
		}
	}

	giveUp := hold()
	requests(1)
	giveUp() // closed: its holder is held back before counting it over
	stillWaiting := hold()
	defer stillWaiting()
	requests(2)
	if st := s.Stats()["/hole"]; st.InFlight != 1 || st.MaxInFlight != 1 {
		t.Errorf("after a client gave up and sent again: in flight %d, at most %d; want 1 and 1", st.InFlight, st.MaxInFlight)
	}
	third := hold()
	defer third()
	requests(3)
	if st := s.Stats()["/hole"]; st.InFlight != 2 || st.MaxInFlight != 2 {
		t.Errorf("two clients waiting: in flight %d, at most %d; want 2 and 2", st.InFlight, st.MaxInFlight)
	}
}
