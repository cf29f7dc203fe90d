package examples_test

// These tests run the language examples under examples/producers and
// examples/receivers against a live in-process sidecar. A missing
// interpreter skips its case, unless CI is set: then it fails and names the
// package .ci/run must install.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

const (
	secretText = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	// otherSecret is a second active secret on the receiver side, as during
	// a rotation.
	otherSecret = "whsec_c2x1aWNlLWV4YW1wbGVzLXJvdGF0aW9uLWtleQ=="
	maxBody     = 4096
)

var testSecret = mustSecret(secretText)

func mustSecret(s string) signing.Secret {
	k, err := signing.ParseSecret(s)
	if err != nil {
		panic(err)
	}
	return k
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// need returns the path of tool, or skips (fails under CI) naming pkg.
func need(t *testing.T, tool, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found: .ci/run must install the %q package", tool, pkg)
	}
	t.Skipf("%s not found (install %q); skipping", tool, pkg)
	return ""
}

// goBuild compiles ./pkg into a temp dir and returns the binary.
func goBuild(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(filepath.Dir(pkg))+"-bin")
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

func startSidecar(t *testing.T, listen, dir string, subs ...*delivery.Subscription) *proxy.Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	s := proxy.New(proxy.Options{AllowPrivateTargets: true,
		Listen: listen, AdminListen: "-", DataDir: dir, Sync: true, MaxBodyBytes: maxBody,
		Subscriptions: subs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		CursorInterval: 10 * time.Millisecond,
	})
	if err := s.Open(); err != nil {
		t.Fatalf("open sidecar: %v", err)
	}
	t.Cleanup(func() { closeSidecar(t, s) })
	return s
}

func closeSidecar(t *testing.T, s *proxy.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil && !strings.Contains(err.Error(), "closed") {
		t.Errorf("close sidecar: %v", err)
	}
}

func subscription(id, url string) *delivery.Subscription {
	return &delivery.Subscription{
		ID: id, URL: url, Secrets: []signing.Secret{testSecret}, Types: []string{"*"}, Timeout: 2 * time.Second,
		Retry: policy.RetryPolicy{MaxAttempts: 10, MaxAge: time.Hour, Backoff: policy.Backoff{Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond}},
	}
}

type summary struct {
	Producer   string   `json:"producer"`
	Sent       int      `json:"sent"`
	Accepted   int      `json:"accepted"`
	Duplicates int      `json:"duplicates"`
	TooLarge   int      `json:"too_large"`
	Failed     int      `json:"failed"`
	IDs        []string `json:"ids"`
}

// runProducer runs argv with env added and parses its last stdout line.
func runProducer(t *testing.T, argv []string, env ...string) summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v\nstdout:\n%s\nstderr:\n%s", argv, err, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var s summary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &s); err != nil {
		t.Fatalf("%v: last stdout line is not a JSON summary: %v\n%s\nstderr:\n%s", argv, err, stdout.String(), stderr.String())
	}
	if testing.Verbose() {
		t.Logf("%v: %s\nstderr:\n%s", argv, lines[len(lines)-1], stderr.String())
	}
	return s
}

// producers lists each producer example with the tool it needs.
func producers(t *testing.T) []struct {
	name string
	argv func(t *testing.T) []string
} {
	return []struct {
		name string
		argv func(t *testing.T) []string
	}{
		{"curl", func(t *testing.T) []string {
			need(t, "curl", "curl")
			return []string{need(t, "bash", "bash"), "producers/curl.sh"}
		}},
		{"python", func(t *testing.T) []string { return []string{need(t, "python3", "python3"), "producers/producer.py"} }},
		{"node", func(t *testing.T) []string { return []string{need(t, "node", "nodejs"), "producers/producer.mjs"} }},
		{"go", func(t *testing.T) []string { return []string{goBuild(t, "./producers/go")} }},
	}
}

// waitIDs waits until the testbed has accepted every id on path.
func waitIDs(t *testing.T, tb *testbed.Server, path string, ids []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := tb.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m[path].Unique >= int64(len(ids)) })
	got := tb.IDs(path)
	for _, id := range ids {
		if !slices.Contains(got, id) {
			t.Fatalf("event %s reported accepted never reached the receiver (wait: %v); got %d ids, stats %+v", id, err, len(got), tb.Stats()[path])
		}
	}
	if st := tb.Stats()[path]; st.BadSignatures > 0 {
		t.Errorf("%d deliveries failed signature verification", st.BadSignatures)
	}
}

func TestProducers(t *testing.T) {
	tb := testbed.New(testbed.Options{Secrets: []signing.Secret{testSecret}})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })

	for _, p := range producers(t) {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			argv := p.argv(t)
			path := "/" + p.name
			s := startSidecar(t, "127.0.0.1:0", "", subscription(p.name, tb.URL()+path))
			prefix := fmt.Sprintf("%s-%d", p.name, time.Now().UnixNano())

			// 10 events plus one over max_body_bytes, which must get 413.
			got := runProducer(t, argv, "SLUICE_URL="+s.URL(), "EVENTS=10", "KEY_PREFIX="+prefix, "OVERSIZE_BYTES=8192")
			if got.Sent != 11 || got.Accepted != 10 || got.TooLarge != 1 || got.Failed != 0 || len(got.IDs) != 10 {
				t.Fatalf("first run: %+v, want 11 sent, 10 accepted, 1 too large", got)
			}
			waitIDs(t, tb, path, got.IDs)

			// The same keys again: every one is a 200 duplicate, nothing new is delivered.
			again := runProducer(t, argv, "SLUICE_URL="+s.URL(), "EVENTS=10", "KEY_PREFIX="+prefix)
			if again.Duplicates != 10 || again.Accepted != 0 || again.Failed != 0 {
				t.Fatalf("second run: %+v, want 10 duplicates", again)
			}

			// The same producer over a unix socket.
			us := startSidecar(t, "unix://"+filepath.Join(t.TempDir(), "s.sock"), "", subscription(p.name+"-unix", tb.URL()+path+"-unix"))
			sock := strings.TrimPrefix(us.URL(), "unix://")
			viaSock := runProducer(t, argv, "SLUICE_SOCKET="+sock, "EVENTS=5", "KEY_PREFIX="+prefix+"-unix")
			if viaSock.Accepted != 5 || viaSock.Failed != 0 {
				t.Fatalf("unix socket run: %+v, want 5 accepted", viaSock)
			}
			waitIDs(t, tb, path+"-unix", viaSock.IDs)
			if st := tb.Stats()[path]; st.Unique != 10 {
				t.Errorf("testbed saw %d unique events on %s, want 10", st.Unique, path)
			}
		})
	}
}

// TestGoProducerRidesOutRestart stops the sidecar while the Go producer is
// posting, restarts it on the same address and data directory, and checks
// that every event still arrives exactly once per key.
func TestGoProducerRidesOutRestart(t *testing.T) {
	bin := goBuild(t, "./producers/go")
	tb := testbed.New(testbed.Options{Secrets: []signing.Secret{testSecret}})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	dir := t.TempDir()
	sub := subscription("restart", tb.URL()+"/restart")
	s := startSidecar(t, "127.0.0.1:0", dir, sub)
	addr := strings.TrimPrefix(s.URL(), "http://")

	done := make(chan summary, 1)
	var stderr bytes.Buffer
	go func() {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), "SLUICE_URL="+s.URL(), "EVENTS=30", "INTERVAL_MS=30", "KEY_PREFIX=restart")
		var stdout bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run()
		var got summary
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		if json.Unmarshal([]byte(lines[len(lines)-1]), &got) != nil {
			got.Producer = "unparsable: " + stdout.String() + stderr.String()
		}
		done <- got
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tb.Wait(ctx, func(m map[string]testbed.PathStats) bool { return m["/restart"].Unique >= 5 }); err != nil {
		t.Fatalf("no deliveries before the restart: %v", err)
	}
	closeSidecar(t, s)
	// The outage itself: the producer must ride out a sidecar that is down
	// for a while, not only one that restarts at once. Nothing to await.
	time.Sleep(300 * time.Millisecond)
	startSidecar(t, addr, dir, sub)

	got := <-done
	if got.Accepted+got.Duplicates != 30 || got.Failed != 0 {
		t.Fatalf("producer across a restart: %+v, want all 30 settled\n%s", got, stderr.String())
	}
	// The restart must have been noticed (and ridden out), not missed.
	if !strings.Contains(stderr.String(), "retry") {
		t.Errorf("producer never retried across the restart; stderr:\n%s", stderr.String())
	}
	waitIDs(t, tb, "/restart", got.IDs)
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

type receiverStats struct {
	Received   int64 `json:"received"`
	Duplicates int64 `json:"duplicates"`
	Rejected   int64 `json:"rejected"`
}

func getStats(base string) (receiverStats, error) {
	var st receiverStats
	resp, err := httpClient.Get(base + "/_stats")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("/_stats answered %d", resp.StatusCode)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// waitStats polls the receiver's /_stats until cond holds.
func waitStats(t *testing.T, base, what string, cond func(receiverStats) bool, logs *bytes.Buffer) receiverStats {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := getStats(base)
		if err == nil && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: stats %+v, err %v\nreceiver output:\n%s", what, st, err, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// signedPost sends a delivery signed with testSecret over signedBody but
// carrying body.
func signedPost(t *testing.T, url, id string, ts int64, signedBody, body string) int {
	t.Helper()
	return signedPostWith(t, []signing.Secret{testSecret}, url, id, ts, signedBody, body)
}

// signedPostWith is signedPost with these secrets.
func signedPostWith(t *testing.T, secrets []signing.Secret, url, id string, ts int64, signedBody, body string) int {
	t.Helper()
	return postDelivery(t, url, id, ts, signing.Sign(secrets, id, ts, []byte(signedBody)), body)
}

// postDelivery sends body with these webhook headers.
func postDelivery(t *testing.T, url, id string, ts int64, signature, body string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(signing.HeaderID, id)
	req.Header.Set(signing.HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(signing.HeaderSignature, signature)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// needPythonModule skips (fails under CI) unless python imports module,
// naming the Debian package that provides it.
func needPythonModule(t *testing.T, python, module, pkg string) {
	t.Helper()
	if err := exec.Command(python, "-c", "import "+module).Run(); err == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("python3 cannot import %s: .ci/run must install the %q package", module, pkg)
	}
	t.Skipf("python3 cannot import %s (install %q); skipping", module, pkg)
}

// startReceiver runs a receiver example on a free port with these keys in
// WEBHOOK_SECRET and returns its base URL and output.
func startReceiver(t *testing.T, argv []string, keys string, failFirst int) (string, *bytes.Buffer) {
	t.Helper()
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	logs := new(bytes.Buffer)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port), "WEBHOOK_SECRET="+keys, fmt.Sprintf("FAIL_FIRST=%d", failFirst))
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	waitStats(t, base, "the receiver to start", func(receiverStats) bool { return true }, logs)
	return base, logs
}

func TestReceivers(t *testing.T) {
	receivers := []struct {
		name string
		argv func(t *testing.T) []string
		// ed25519 checks what the receiver needs for whpk_ keys.
		ed25519 func(t *testing.T, argv []string)
	}{
		{"python", func(t *testing.T) []string { return []string{need(t, "python3", "python3"), "receivers/receiver.py"} },
			func(t *testing.T, argv []string) {
				needPythonModule(t, argv[0], "cryptography.hazmat.primitives.asymmetric.ed25519", "python3-cryptography")
			}},
		{"node", func(t *testing.T) []string { return []string{need(t, "node", "nodejs"), "receivers/receiver.mjs"} }, nil},
		{"go", func(t *testing.T) []string { return []string{goBuild(t, "./receivers/go")} }, nil},
	}
	for _, r := range receivers {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			argv := r.argv(t)
			base, logs := startReceiver(t, argv, otherSecret+" "+secretText, 2)

			const n = 10
			s := startSidecar(t, "127.0.0.1:0", "", subscription("recv-"+r.name, base+"/hooks"))
			for i := range n {
				req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/order.paid", strings.NewReader(fmt.Sprintf(`{"n":%d}`, i)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", r.name, i))
				resp, err := httpClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					t.Fatalf("ingest answered %d", resp.StatusCode)
				}
			}
			// FAIL_FIRST=2 makes the sidecar retry two deliveries; all must
			// arrive, verified, exactly once.
			st := waitStats(t, base, "all deliveries", func(st receiverStats) bool { return st.Received >= n }, logs)
			if st.Received != n || st.Rejected != 0 {
				t.Fatalf("after %d events: %+v, want %d received, 0 rejected", n, st, n)
			}

			now := time.Now().Unix()
			// A replay of a processed webhook-id, correctly signed: 200, not re-processed.
			if code := signedPost(t, base+"/hooks", r.name+"-0", now, `{"n":0}`, `{"n":0}`); code != http.StatusOK {
				t.Errorf("replayed delivery answered %d, want 200", code)
			}
			// Signed, then the body changed: 401.
			if code := signedPost(t, base+"/hooks", "tampered-1", now, `{"amount":1}`, `{"amount":1000}`); code != http.StatusUnauthorized {
				t.Errorf("tampered delivery answered %d, want 401", code)
			}
			// Correctly signed 10 minutes ago: outside the tolerance, 401.
			if code := signedPost(t, base+"/hooks", "stale-1", now-600, `{"n":1}`, `{"n":1}`); code != http.StatusUnauthorized {
				t.Errorf("stale delivery answered %d, want 401", code)
			}
			st, err := getStats(base)
			if err != nil {
				t.Fatal(err)
			}
			if want := (receiverStats{Received: n, Duplicates: st.Duplicates, Rejected: 2}); st != want || st.Duplicates < 1 {
				t.Errorf("final stats %+v, want %d received, at least 1 duplicate, 2 rejected", st, n)
			}

			t.Run("v1a", func(t *testing.T) {
				if r.ed25519 != nil {
					r.ed25519(t, argv)
				}
				testEd25519Receiver(t, r.name, argv)
			})
		})
	}
}

// testEd25519Receiver gives a receiver only whpk_ public keys
// (an unrelated one first, as during a rotation) and a sidecar that signs
// with a whsk_ key beside the HMAC secret, as while receivers migrate: the
// receiver must verify the v1a entry with its language's own Ed25519, and
// refuse what only an HMAC secret signed.
func testEd25519Receiver(t *testing.T, name string, argv []string) {
	ed, err := signing.GenerateEd25519Secret()
	if err != nil {
		t.Fatal(err)
	}
	unrelated, err := signing.GenerateEd25519Secret()
	if err != nil {
		t.Fatal(err)
	}
	pk, _ := ed.PublicKey()
	otherPK, _ := unrelated.PublicKey()
	base, logs := startReceiver(t, argv, otherPK.Encode()+" "+pk.Encode(), 1)

	const n = 5
	sub := subscription("recv-"+name+"-v1a", base+"/hooks")
	sub.Secrets = []signing.Secret{ed, testSecret}
	s := startSidecar(t, "127.0.0.1:0", "", sub)
	for i := range n {
		req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/order.paid", strings.NewReader(fmt.Sprintf(`{"ed":%d}`, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-v1a-%d", name, i))
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("ingest answered %d", resp.StatusCode)
		}
	}
	st := waitStats(t, base, "all v1a deliveries", func(st receiverStats) bool { return st.Received >= n }, logs)
	if st.Received != n || st.Rejected != 0 {
		t.Fatalf("after %d events: %+v, want %d received, 0 rejected\nreceiver output:\n%s", n, st, n, logs)
	}

	now := time.Now().Unix()
	edOnly := []signing.Secret{ed}
	if code := signedPostWith(t, edOnly, base+"/hooks", name+"-v1a-0", now, `{"ed":0}`, `{"ed":0}`); code != http.StatusOK {
		t.Errorf("replayed v1a delivery answered %d, want 200", code)
	}
	if code := signedPostWith(t, edOnly, base+"/hooks", "v1a-tampered", now, `{"amount":1}`, `{"amount":1000}`); code != http.StatusUnauthorized {
		t.Errorf("tampered v1a delivery answered %d, want 401", code)
	}
	if code := signedPostWith(t, edOnly, base+"/hooks", "v1a-stale", now-600, `{"ed":1}`, `{"ed":1}`); code != http.StatusUnauthorized {
		t.Errorf("stale v1a delivery answered %d, want 401", code)
	}
	// Only HMAC-signed: this receiver holds no whsec_ secret.
	if code := signedPost(t, base+"/hooks", "v1-only", now, `{"ed":2}`, `{"ed":2}`); code != http.StatusUnauthorized {
		t.Errorf("a delivery with only a v1 signature answered %d, want 401", code)
	}
	// A v1a entry of another key, then the right one: the list is searched.
	header := signing.Sign([]signing.Secret{unrelated}, "v1a-list", now, []byte(`{"ed":3}`)) + " " +
		signing.Sign([]signing.Secret{ed}, "v1a-list", now, []byte(`{"ed":4}`)) + " " +
		signing.Sign(edOnly, "v1a-list", now, []byte(`{"ed":3}`))
	if code := postDelivery(t, base+"/hooks", "v1a-list", now, header, `{"ed":3}`); code != http.StatusNoContent {
		t.Errorf("a list ending in the valid v1a entry answered %d, want 204", code)
	}
	st, err = getStats(base)
	if err != nil {
		t.Fatal(err)
	}
	if want := (receiverStats{Received: n + 1, Duplicates: st.Duplicates, Rejected: 3}); st != want || st.Duplicates < 1 {
		t.Errorf("final stats %+v, want %d received, at least 1 duplicate, 3 rejected", st, n+1)
	}
}
