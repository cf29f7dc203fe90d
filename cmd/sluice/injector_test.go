package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/inject"
	"github.com/sluicehq/sluice/internal/injecttest"
)

// startedInjector is `sluice injector` running in the test's process.
type startedInjector struct {
	webhook, admin string // addresses
	log            *syncBuffer
	drain, abort   context.CancelFunc
	done           chan error
}

// startInjector runs the injector with args on loopback ports of its
// choosing and waits until it serves.
func startInjector(t *testing.T, args ...string) *startedInjector {
	t.Helper()
	drain, stopDrain := context.WithCancel(context.Background())
	abort, stopAbort := context.WithCancel(context.Background())
	s := &startedInjector{log: &syncBuffer{}, drain: stopDrain, abort: stopAbort, done: make(chan error, 1)}
	ready := make(chan struct{})
	// No API server here: the scan is tested against a real one
	// (kubeapi_test.go).
	args = append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--scan-interval=0"}, args...)
	go func() {
		s.done <- runInjector(drain, abort, args, io.Discard, s.log, func(webhook, admin string) {
			s.webhook, s.admin = webhook, admin
			close(ready)
		})
	}()
	select {
	case <-ready:
	case err := <-s.done:
		t.Fatalf("injector stopped: %v; log:\n%s", err, s.log)
	case <-time.After(10 * time.Second):
		t.Fatalf("injector not serving after 10s; log:\n%s", s.log)
	}
	t.Cleanup(func() {
		stopDrain()
		stopAbort()
		<-s.done
	})
	return s
}

// stop drains the injector and waits for it to stop.
func (s *startedInjector) stop(t *testing.T) {
	t.Helper()
	s.drain()
	err := <-s.done
	s.done <- err // for the cleanup's wait
	if err != nil {
		t.Fatalf("injector: %v", err)
	}
}

// adminGet GETs path from the admin listener.
func (s *startedInjector) adminGet(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.admin + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// reviews reads /metrics and returns sluice_injector_reviews_total by
// result, and the review histogram's count.
func (s *startedInjector) reviews(t *testing.T) (map[string]float64, float64) {
	t.Helper()
	code, text := s.adminGet(t, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	byResult := map[string]float64{}
	for _, r := range inject.Results {
		v, ok := metricSum(text, "sluice_injector_reviews_total", `result="`+string(r)+`"`)
		if !ok {
			t.Fatalf("/metrics lacks sluice_injector_reviews_total{result=%q}:\n%s", r, text)
		}
		byResult[string(r)] = v
	}
	count, ok := metricSum(text, "sluice_injector_review_duration_seconds_count")
	if !ok {
		t.Fatalf("/metrics lacks sluice_injector_review_duration_seconds:\n%s", text)
	}
	return byResult, count
}

// oneMoved checks that one result, and the histogram, moved by one since
// before, and returns that result.
func oneMoved(t *testing.T, before, after map[string]float64, n, m float64) string {
	t.Helper()
	if m != n+1 {
		t.Fatalf("the histogram moved by %g, want 1", m-n)
	}
	return injecttest.MovedByOne(t, before, after)
}

// awaitSerial opens new TLS connections until one presents serial.
func awaitSerial(t *testing.T, addr string, pool *x509.CertPool, serial int64, log *syncBuffer) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		got, err := injecttest.ServedSerial(addr, pool)
		if err == nil && got.Int64() == serial {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("new connections present serial %v (err %v), want %d; log:\n%s", got, err, serial, log)
		}
	}
}

// notListening checks that nothing accepts connections at addrs.
func notListening(t *testing.T, addrs ...string) {
	t.Helper()
	for _, addr := range addrs {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Errorf("%s listens", addr)
		}
	}
}

// TestInjectorServesRotatesAndStops: `sluice injector` answers a review of
// a Deployment's pod over TLS to a client trusting only the test's CA, and
// counts it on the admin listener's /metrics; a pair rotated the way
// cert-manager's Secret volume does (a new leaf serial) is served to new
// connections without a restart; bad requests get their answers and
// counts; on the first signal /readyz goes 503 while reviews are still
// answered, and the second stops it.
func TestInjectorServesRotatesAndStops(t *testing.T) {
	ca, vol := injecttest.Serving(t, 501)
	s := startInjector(t, "--tls-cert-file", vol.CertFile(), "--tls-key-file", vol.KeyFile(), "--shutdown-delay", "1h")
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, _ := s.adminGet(t, path); code != 200 {
			t.Errorf("%s: %d", path, code)
		}
	}
	c := injecttest.Client(ca.Pool)
	defer c.CloseIdleConnections()
	url := "https://localhost:" + strings.Split(s.webhook, ":")[1] + "/mutate"
	post := func(body []byte) []byte {
		t.Helper()
		resp, err := c.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("POST: %s %q %q", resp.Status, resp.Header.Get("Content-Type"), b)
		}
		return b
	}

	before, n := s.reviews(t)
	for r, v := range before {
		if v != 0 {
			t.Errorf("%s starts at %g", r, v)
		}
	}
	const uid = "3f2e1d0c-b9a8-4766-8554-433221100fed"
	body := injecttest.Review(t, uid, injecttest.DeploymentPod(nil))
	ar, err := injecttest.DecodeResponse(post(body))
	if err != nil {
		t.Fatal(err)
	}
	if string(ar.Response.UID) != uid {
		t.Errorf("answer's uid %q, want %q", ar.Response.UID, uid)
	}
	after, m := s.reviews(t)
	oneMoved(t, before, after, n, m)
	before, n = after, m

	// Rotation: a new pair, swapped in at once; the connection the client
	// keeps alive carries on, new ones get the new certificate.
	next := ca.Leaf(t, 502)
	vol.Write(t, next.Cert, next.Key)
	awaitSerial(t, s.webhook, ca.Pool, 502, s.log)
	if !strings.Contains(s.log.String(), "serial=502") {
		t.Errorf("the rotation is not logged:\n%s", s.log)
	}

	// Bad requests.
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /mutate: %s, want 405", resp.Status)
	}
	huge := injecttest.Review(t, uid, injecttest.DeploymentPod(map[string]string{"example.com/blob": strings.Repeat("y", 5<<20)}))
	if ar, err := injecttest.DecodeResponse(post(huge)); err != nil || string(ar.Response.UID) != uid || !ar.Response.Allowed {
		t.Errorf("over the limit: %+v, %v; want allowed under uid %s", ar, err, uid)
	}
	after, m = s.reviews(t)
	if got := oneMoved(t, before, after, n, m); got != string(inject.Malformed) {
		t.Errorf("over the limit counted as %s, want malformed", got)
	}
	before, n = after, m
	if _, err := injecttest.DecodeResponse(post([]byte("\x00garbage"))); err != nil {
		t.Error(err)
	}
	after, m = s.reviews(t)
	oneMoved(t, before, after, n, m)

	// Stopping: the first signal turns /readyz off, reviews still answered.
	s.drain()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for code, _ := s.adminGet(t, "/readyz"); code != http.StatusServiceUnavailable; code, _ = s.adminGet(t, "/readyz") {
		select {
		case <-tick.C:
		case err := <-s.done:
			t.Fatalf("stopped before the shutdown delay: %v", err)
		}
	}
	if _, err := injecttest.DecodeResponse(post(body)); err != nil {
		t.Errorf("during the shutdown delay: %v", err)
	}
	s.abort()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		if !errors.Is(err, errInjectorAborted) {
			t.Errorf("stopped with %v, want %v", err, errInjectorAborted)
		}
	case <-time.After(injectorShutdownGrace + 5*time.Second):
		t.Fatal("the second signal does not stop it")
	}
	notListening(t, s.webhook, s.admin)
}

// TestInjectorStartupErrors: a missing or bad pair, or a bad flag, is an
// error at start naming it, and nothing listens.
func TestInjectorStartupErrors(t *testing.T) {
	dir := injecttest.BadPairs(t)
	file := func(name string) string { return filepath.Join(dir, name) }
	certA, keyA, keyB := file("a.crt"), file("a.key"), file("b.key")
	missing := filepath.Join(dir, "missing.crt")
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"no cert flag", []string{"--tls-key-file", keyA}, []string{"--tls-cert-file is required"}},
		{"no key flag", []string{"--tls-cert-file", certA}, []string{"--tls-key-file is required"}},
		{"missing cert file", []string{"--tls-cert-file", missing, "--tls-key-file", keyA}, []string{"--tls-cert-file", missing, "no such file"}},
		{"mismatched pair", []string{"--tls-cert-file", certA, "--tls-key-file", keyB}, []string{"a.crt", "b.key", "does not match"}},
		{"bad inject flag", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--grace", "soon"}, []string{"--grace"}},
		{"bad port", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--admin-port", "0"}, []string{"--admin-port"}},
		{"unknown flag", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--nope"}, []string{"-nope"}},
		{"bad listen", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--listen", "nowhere"}, []string{"--listen", "nowhere"}},
		{"no review in flight", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--max-in-flight", "0"}, []string{"--max-in-flight 0", "out of range"}},
		{"too many in flight", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--max-in-flight", "257"}, []string{"--max-in-flight 257"}},
		{"negative queue wait", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--queue-wait", "-1s"}, []string{"--queue-wait -1s"}},
		{"queue wait past any API server timeout", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--queue-wait", "31s"}, []string{"--queue-wait 31s", "30s"}},
		{"negative scan interval", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--scan-interval", "-1s"}, []string{"--scan-interval -1s"}},
		{"scan interval too short", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--scan-interval", "1s"}, []string{"--scan-interval 1s", "10s"}},
		{"scan outside a cluster", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--scan-interval", "1m"}, []string{"--scan-interval", "not in a Kubernetes pod", "--scan-interval=0"}},
		{"scan with a missing kubeconfig", []string{"--tls-cert-file", certA, "--tls-key-file", keyA, "--kubeconfig", missing}, []string{"--scan-interval", missing}},
	} {
		t.Run(c.name, func(t *testing.T) {
			webhook, admin := freePort(t), freePort(t)
			args := append([]string{"--listen", webhook, "--admin-listen", admin, "--scan-interval=0"}, c.args...)
			if strings.Contains(c.name, "scan") {
				args = append([]string{"--listen", webhook, "--admin-listen", admin}, c.args...)
				t.Setenv("KUBERNETES_SERVICE_HOST", "") // as outside a pod, whatever runs the test
			}
			var log bytes.Buffer
			err := runInjector(context.Background(), context.Background(), args, io.Discard, &log, func(string, string) {
				t.Error("it serves")
			})
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			notListening(t, webhook, admin)
		})
	}
}

// TestInjectorStopsGracefully: with no shutdown delay, the first signal
// closes the listeners once the reviews in flight are answered, and the
// injector returns nil.
func TestInjectorStopsGracefully(t *testing.T) {
	ca, vol := injecttest.Serving(t, 9)
	s := startInjector(t, "--tls-cert-file", vol.CertFile(), "--tls-key-file", vol.KeyFile(), "--shutdown-delay", "0s")
	c := injecttest.Client(ca.Pool)
	defer c.CloseIdleConnections()
	resp, err := c.Post("https://localhost:"+strings.Split(s.webhook, ":")[1]+"/mutate", "application/json",
		bytes.NewReader(injecttest.Review(t, "u-1", injecttest.DeploymentPod(nil))))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	s.drain()
	select {
	case err := <-s.done:
		s.done <- err
		if err != nil {
			t.Fatalf("stopped with %v; log:\n%s", err, s.log)
		}
	case <-time.After(injectorShutdownGrace + 5*time.Second):
		t.Fatal("not stopped")
	}
	if !strings.Contains(s.log.String(), "stopped") {
		t.Errorf("no stop in the log:\n%s", s.log)
	}
	notListening(t, s.webhook, s.admin)
}

// TestInjectorSetsMemoryLimit: like `sluice serve`, the injector gives its
// Go heap 85% of the container's memory limit, unless GOMEMLIMIT says
// otherwise; its limits on reviews in flight come from its flags.
func TestInjectorSetsMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	files := cgroupMemoryFiles
	t.Cleanup(func() { cgroupMemoryFiles = files })
	cgroupMemoryFiles = []string{filepath.Join(t.TempDir(), "memory.max")}
	if err := os.WriteFile(cgroupMemoryFiles[0], []byte("134217728\n"), 0o600); err != nil { // the shipped 128Mi
		t.Fatal(err)
	}
	_, vol := injecttest.Serving(t, 11)

	t.Run("from the cgroup", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "")
		os.Unsetenv("GOMEMLIMIT")
		debug.SetMemoryLimit(old)
		s := startInjector(t, "--tls-cert-file", vol.CertFile(), "--tls-key-file", vol.KeyFile(), "--max-in-flight", "3", "--queue-wait", "1500ms")
		limit := float64(128 << 20)
		want := int64(limit * memLimitShare) // as setMemoryLimit rounds
		if got := debug.SetMemoryLimit(-1); got != want {
			t.Errorf("Go memory limit %d, want %d (85%% of 128Mi)", got, want)
		}
		for _, w := range []string{"gomemlimit_bytes=" + strconv.FormatInt(want, 10), "max_in_flight=3", "queue_wait=1.5s"} {
			if !strings.Contains(s.log.String(), w) {
				t.Errorf("the log does not say %s:\n%s", w, s.log)
			}
		}
		code, text := s.adminGet(t, "/metrics")
		for _, name := range []string{"sluice_injector_reviews_in_flight", "sluice_injector_reviews_waiting", "sluice_injector_reviews_shed_total"} {
			if v, ok := metricSum(text, name); code != 200 || !ok || v != 0 {
				t.Errorf("/metrics: %s is %g (present %v), want 0", name, v, ok)
			}
		}
	})
	t.Run("GOMEMLIMIT wins", func(t *testing.T) {
		t.Setenv("GOMEMLIMIT", "300MiB")
		debug.SetMemoryLimit(old)
		s := startInjector(t, "--tls-cert-file", vol.CertFile(), "--tls-key-file", vol.KeyFile())
		if got := debug.SetMemoryLimit(-1); got != old {
			t.Errorf("Go memory limit %d with GOMEMLIMIT set, want it left at %d", got, old)
		}
		if strings.Contains(s.log.String(), "gomemlimit_bytes") {
			t.Errorf("a memory limit is logged with GOMEMLIMIT set:\n%s", s.log)
		}
	})
}
