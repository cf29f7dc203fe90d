package inject_test

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/synclog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/inject"
	"github.com/sluicehq/sluice/internal/injecttest"
)

// tlsWebhook serves h over TLS on loopback as the injector does, with a
// pair from a test CA; the client trusts that CA only.
func tlsWebhook(tb testing.TB, h http.Handler) (url string, client *http.Client) {
	tb.Helper()
	ca, vol := injecttest.Serving(tb, 7)
	certs, err := inject.NewCertReloader(vol.CertFile(), vol.KeyFile(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{GetCertificate: certs.GetCertificate, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	tb.Cleanup(srv.Close)
	c := injecttest.Client(ca.Pool)
	tb.Cleanup(c.CloseIdleConnections)
	return "https://localhost:" + strings.TrimPrefix(srv.URL, "https://127.0.0.1:"), c
}

// counts reads the webhook's metrics from reg: reviews by result, and the
// histogram's count.
func counts(tb testing.TB, reg *prometheus.Registry) (map[string]float64, uint64) {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	byResult, observed := map[string]float64{}, uint64(0)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "sluice_injector_reviews_total":
				byResult[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			case "sluice_injector_review_duration_seconds":
				observed = m.GetHistogram().GetSampleCount()
			}
		}
	}
	return byResult, observed
}

func post(tb testing.TB, c *http.Client, url string, body []byte) (*http.Response, []byte) {
	tb.Helper()
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp, b
}

// TestWebhookServesReviewsOverTLS: a review of a Deployment's pod, built
// with the k8s.io/api types, POSTed over TLS to a client that trusts only
// the test's CA, is answered with an AdmissionReview (decoded strictly)
// under the request's uid, on both webhook paths; each review moves one
// result's counter by one and the histogram by one; every result is
// there from the start.
func TestWebhookServesReviewsOverTLS(t *testing.T) {
	reg := prometheus.NewRegistry()
	url, c := tlsWebhook(t, inject.NewWebhook(inject.Defaults(), reg, nil))
	before, n := counts(t, reg)
	for _, r := range inject.Results {
		if v, ok := before[string(r)]; !ok || v != 0 {
			t.Errorf("result %q starts at %v (present %v), want 0", r, v, ok)
		}
	}
	// The pod opts in itself (a label), so both paths inject it.
	want := map[string]inject.Result{inject.PodPath: inject.Injected, inject.NamespacePath: inject.Injected}
	for i, path := range []string{inject.PodPath, inject.NamespacePath} {
		uid := fmt.Sprintf("d6a3f0b2-5e1c-4b7a-9f0e-%012d", i)
		body := injecttest.Review(t, uid, injecttest.DeploymentPod(nil))
		resp, answer := post(t, c, url+path, body)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s: %s %q", path, resp.Status, resp.Header.Get("Content-Type"))
		}
		ar, err := injecttest.DecodeResponse(answer)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if string(ar.Response.UID) != uid {
			t.Errorf("%s: answer's uid %q, want %q", path, ar.Response.UID, uid)
		}
		if patched := ar.Response.Patch != nil; patched != (want[path] == inject.Injected) {
			t.Errorf("%s: patch %q, want a patch: %v", path, ar.Response.Patch, !patched)
		}
		after, m := counts(t, reg)
		injecttest.MovedByOne(t, before, after)
		if d := after[string(want[path])] - before[string(want[path])]; d != 1 {
			t.Errorf("%s: %s moved by %g, want 1", path, want[path], d)
		}
		if m != n+1 {
			t.Errorf("%s: the histogram counts %d, want %d", path, m, n+1)
		}
		before, n = after, m
	}
}

// TestWebhookLogsBadInput: a pod let through without the sidecar, or
// refused, is logged with its namespace, its name and why; a pod that gets
// the sidecar is not.
func TestWebhookLogsBadInput(t *testing.T) {
	var log synclog.Buffer
	url, c := tlsWebhook(t, inject.NewWebhook(inject.Defaults(), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&log, nil))))
	post(t, c, url+inject.PodPath, injecttest.Review(t, "uid-good", injecttest.DeploymentPod(nil)))
	if s := log.String(); s != "" {
		t.Errorf("an injected pod is logged: %s", s)
	}
	post(t, c, url+inject.PodPath, injecttest.Review(t, "uid-warned", injecttest.DeploymentPod(map[string]string{"sluice.io/grace": "soon"})))
	post(t, c, url+inject.PodPath, injecttest.Review(t, "uid-denied", injecttest.DeploymentPod(map[string]string{"sluice.io/grace": "soon", inject.AnnotationRequired: "true"})))
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got:\n%s", log.String())
	}
	for i, want := range []string{"result=warned uid=uid-warned namespace=shop pod=web-7d9f8c6b5d-", "result=denied uid=uid-denied namespace=shop pod=web-7d9f8c6b5d-"} {
		if !strings.Contains(lines[i], want) || !strings.Contains(lines[i], `sluice.io/grace \"soon\": not a duration`) {
			t.Errorf("line %d: %s\nwant %s and the reason", i, lines[i], want)
		}
	}
}

// TestWebhookBadRequests: a GET is 405; a body over the limit and garbage
// get well-formed answers (the first Malformed, under the uid its start
// names), never a crash; only reviews are counted.
func TestWebhookBadRequests(t *testing.T) {
	reg := prometheus.NewRegistry()
	url, c := tlsWebhook(t, inject.NewWebhook(inject.Defaults(), reg, nil))

	before, n := counts(t, reg)
	resp, err := c.Get(url + "/mutate")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET: %s, Allow %q; want 405, POST", resp.Status, resp.Header.Get("Allow"))
	}
	if after, m := counts(t, reg); !maps.Equal(before, after) || m != n {
		t.Errorf("a GET is counted as a review: %v → %v", before, after)
	}

	// Over 4 MiB: a pod with a 5 MiB annotation.
	const uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	big := injecttest.Review(t, uid, injecttest.DeploymentPod(map[string]string{"example.com/blob": strings.Repeat("x", 5<<20)}))
	resp, answer := post(t, c, url+"/mutate", big)
	ar, err := injecttest.DecodeResponse(answer)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("over the limit: %s, %v", resp.Status, err)
	}
	if string(ar.Response.UID) != uid || !ar.Response.Allowed || len(ar.Response.Warnings) != 1 {
		t.Errorf("over the limit: answer %+v, want allowed with a warning under uid %s", ar.Response, uid)
	}
	after, _ := counts(t, reg)
	if got := injecttest.MovedByOne(t, before, after); got != string(inject.Malformed) {
		t.Errorf("over the limit counted as %s, want malformed", got)
	}
	before = after

	for _, garbage := range [][]byte{[]byte("not json"), {}, []byte(`{"request":`), []byte(`[1,2]`), []byte(`{"kind":"AdmissionReview"}`)} {
		resp, answer := post(t, c, url+"/mutate", garbage)
		if _, err := injecttest.DecodeResponse(answer); err != nil || resp.StatusCode != 200 {
			t.Errorf("%q: %s, %v", garbage, resp.Status, err)
		}
		after, _ := counts(t, reg)
		injecttest.MovedByOne(t, before, after)
		before = after
	}
}

// BenchmarkWebhookLatency is the admission latency of a typical pod (a
// Deployment's, with the service account volume the API server has added)
// over TLS on loopback, one client keeping its connection alive, against a
// no-op handler on the same server and connection that reads the same body
// and answers a fixed small AdmissionReview. The two requests alternate,
// so noise hits both alike. It reports the P50 and P99 of each in µs and
// our own time: the difference of the two, and their ratio at the P99.
// ns/op is one of each. The collector runs as the injector's does: at
// GOGC, Go's default of 100 unless it is set.
func BenchmarkWebhookLatency(b *testing.B) {
	noop := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"x","allowed":true}}`))
	})
	mux := http.NewServeMux()
	mux.Handle(inject.PodPath, inject.NewWebhook(inject.Defaults(), prometheus.NewRegistry(), nil))
	mux.Handle("/noop", noop)
	url, c := tlsWebhook(b, mux)
	body := injecttest.Review(b, "7c1d0e5f-2a3b-4c5d-8e9f-0a1b2c3d4e5f", injecttest.DeploymentPod(nil))
	b.Logf("review body: %d bytes", len(body))
	once := func(path string) time.Duration {
		start := time.Now()
		resp, err := c.Post(url+path, "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(start)
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("%s: %v %v", path, resp.Status, err)
		}
		return d
	}
	for range 200 { // warm the connection, the pools and the caches
		once("/mutate")
		once("/noop")
	}
	var mutate, base []time.Duration
	for b.Loop() {
		mutate = append(mutate, once("/mutate"))
		base = append(base, once("/noop"))
	}
	b.StopTimer()
	pct := func(ds []time.Duration, p float64) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[min(len(s)-1, int(p*float64(len(s))))].Nanoseconds()) / 1e3
	}
	m50, m99, n50, n99 := pct(mutate, 0.50), pct(mutate, 0.99), pct(base, 0.50), pct(base, 0.99)
	b.ReportMetric(m50, "mutate-p50-us")
	b.ReportMetric(m99, "mutate-p99-us")
	b.ReportMetric(n50, "noop-p50-us")
	b.ReportMetric(n99, "noop-p99-us")
	b.ReportMetric(m50-n50, "own-p50-us")
	b.ReportMetric(m99-n99, "own-p99-us")
	b.ReportMetric(m99/n99, "p99-ratio")
}

// metric reads one unlabelled gauge or counter from reg.
func metric(tb testing.TB, reg *prometheus.Registry, name string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	tb.Fatalf("no metric %s", name)
	return 0
}

// slotCounter counts, through the webhook's slot hooks, the reviews that
// hold a slot now and the most that ever did at once. Until open is
// closed, a review that takes a slot keeps it.
type slotCounter struct {
	now, most atomic.Int64
	open      chan struct{}
}

func countSlots(w *inject.Webhook) *slotCounter {
	c := &slotCounter{open: make(chan struct{})}
	inject.SetSlotHooks(w, func() {
		n := c.now.Add(1)
		for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
		}
		<-c.open
	}, func() { c.now.Add(-1) })
	return c
}

// await polls until cond holds, failing after 30 s.
func await(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			tb.Fatalf("waited 30s for %s", what)
		}
	}
}

// TestWebhookBoundsReviewsInFlight, the security review's case: eight
// concurrent 3 MiB reviews over TLS against a webhook that allows two at
// once. Two hold a slot (kept until the test has seen the other six
// waiting), never more, and every review is answered with its pod's patch
// under its own uid.
func TestWebhookBoundsReviewsInFlight(t *testing.T) {
	const n, bound = 8, 2
	reg := prometheus.NewRegistry()
	wh := inject.NewWebhook(inject.Defaults(), reg, nil)
	wh.Limits = inject.Limits{MaxInFlight: bound, QueueWait: time.Minute} // the waits end when the test opens the slots
	slots := countSlots(wh)
	url, c := tlsWebhook(t, wh)

	type answer struct {
		uid  string
		code int
		body []byte
		err  error
	}
	answers := make(chan answer, n)
	blob := strings.Repeat("x", 3<<20)
	for i := range n {
		uid := fmt.Sprintf("5b0c8e7a-1d2f-4e3a-9b8c-%012d", i)
		body := injecttest.Review(t, uid, injecttest.DeploymentPod(map[string]string{"example.com/blob": blob}))
		if len(body) < 3<<20 || len(body) > inject.MaxReviewBytes {
			t.Fatalf("review of %d bytes, want 3 MiB to the limit", len(body))
		}
		go func() {
			resp, err := c.Post(url+inject.PodPath, "application/json", bytes.NewReader(body))
			if err != nil {
				answers <- answer{uid: uid, err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			answers <- answer{uid, resp.StatusCode, b, err}
		}()
	}
	await(t, fmt.Sprintf("%d reviews in flight and %d waiting", bound, n-bound), func() bool {
		return metric(t, reg, "sluice_injector_reviews_in_flight") == bound && metric(t, reg, "sluice_injector_reviews_waiting") == n-bound
	})
	close(slots.open)
	for range n {
		a := <-answers
		if a.err != nil || a.code != 200 {
			t.Errorf("%s: %d, %v", a.uid, a.code, a.err)
			continue
		}
		ar, err := injecttest.DecodeResponse(a.body)
		if err != nil {
			t.Errorf("%s: %v", a.uid, err)
			continue
		}
		if string(ar.Response.UID) != a.uid || !ar.Response.Allowed || ar.Response.Patch == nil {
			t.Errorf("%s: answer %+v, want allowed with a patch under its uid", a.uid, ar.Response)
		}
	}
	if most := slots.most.Load(); most != bound {
		t.Errorf("at most %d reviews held a slot at once, want %d", most, bound)
	}
	byResult, observed := counts(t, reg)
	if byResult[string(inject.Injected)] != n || observed != n {
		t.Errorf("counted %v and %d observed, want %d injected", byResult, observed, n)
	}
	for _, name := range []string{"sluice_injector_reviews_in_flight", "sluice_injector_reviews_waiting", "sluice_injector_reviews_shed_total"} {
		if v := metric(t, reg, name); v != 0 {
			t.Errorf("%s is %g after all are answered, want 0", name, v)
		}
	}
}

// TestWebhookShedsReviewsPastTheWait: with the one slot held, a review
// the API server gives 1 s (?timeout=1s, no time to wait for a slot), and
// one that waits out --queue-wait, are answered 503, so that the API
// server applies the webhook's failurePolicy; they are counted as shed,
// not as reviews. The review holding the slot is answered as usual.
func TestWebhookShedsReviewsPastTheWait(t *testing.T) {
	reg := prometheus.NewRegistry()
	wh := inject.NewWebhook(inject.Defaults(), reg, nil)
	wh.Limits = inject.Limits{MaxInFlight: 1, QueueWait: 20 * time.Millisecond}
	slots := countSlots(wh)
	url, c := tlsWebhook(t, wh)

	held := make(chan []byte, 1)
	first := injecttest.Review(t, "uid-held", injecttest.DeploymentPod(nil))
	go func() {
		resp, err := c.Post(url+inject.PodPath, "application/json", bytes.NewReader(first))
		if err != nil {
			held <- nil
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		held <- b
	}()
	await(t, "the first review to hold the slot", func() bool { return slots.now.Load() == 1 })

	for i, path := range []string{inject.PodPath + "?timeout=1s", inject.NamespacePath} {
		resp, body := post(t, c, url+path, injecttest.Review(t, "uid-shed", injecttest.DeploymentPod(nil)))
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "" {
			t.Errorf("%s: %s, Retry-After %q: %q; want 503 without Retry-After", path, resp.Status, resp.Header.Get("Retry-After"), body)
		}
		if shed := metric(t, reg, "sluice_injector_reviews_shed_total"); shed != float64(i+1) {
			t.Errorf("%s: shed_total %g, want %d", path, shed, i+1)
		}
	}
	if byResult, observed := counts(t, reg); observed != 0 || byResult[string(inject.Injected)] != 0 {
		t.Errorf("shed reviews counted as reviews: %v, %d observed", byResult, observed)
	}

	close(slots.open)
	ar, err := injecttest.DecodeResponse(<-held)
	if err != nil || string(ar.Response.UID) != "uid-held" || ar.Response.Patch == nil {
		t.Fatalf("the review holding the slot: %+v, %v", ar, err)
	}
	if most := slots.most.Load(); most != 1 {
		t.Errorf("%d reviews held the one slot at once", most)
	}
}
