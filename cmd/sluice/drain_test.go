package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The drain contract of `sluice serve`: on the
// first SIGTERM, ingest answers 503 with Retry-After, deliveries in flight
// get shutdown_grace to finish and none starts, cursors are written, and
// the process exits 0; whatever did not finish is delivered after a
// restart on the same data dir.

// drainReceiver is a loopback webhook endpoint whose answers the test
// controls: it holds requests until released (a slow endpoint on the
// test's schedule), holds them until the client goes away (a black hole),
// or answers 200 at once. It records, per webhook-id, what arrived and what
// was answered 200, and wakes waiters on every change.
type drainReceiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	mode     string        // "hold", "blackhole" or "ok"
	gate     chan struct{} // closed to release held requests
	held     map[string]bool
	arrived  map[string]int
	answered map[string]int
	changed  chan struct{} // closed on the next change
}

func newDrainReceiver(t *testing.T, mode string) *drainReceiver {
	r := &drainReceiver{mode: mode, gate: make(chan struct{}), held: map[string]bool{},
		arrived: map[string]int{}, answered: map[string]int{}, changed: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	t.Cleanup(r.release) // runs first: no handler outlives the test
	return r
}

// notify wakes the waiters; r.mu is held.
func (r *drainReceiver) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *drainReceiver) serve(w http.ResponseWriter, req *http.Request) {
	io.Copy(io.Discard, req.Body)
	id := req.Header.Get("Webhook-Id")
	r.mu.Lock()
	r.arrived[id]++
	mode, gate := r.mode, r.gate
	if mode != "ok" {
		r.held[id] = true
	}
	r.notify()
	r.mu.Unlock()

	var answer bool
	switch mode {
	case "hold":
		select {
		case <-gate:
			answer = true
		case <-req.Context().Done():
		}
	case "blackhole":
		<-req.Context().Done()
	default:
		answer = true
	}
	r.mu.Lock()
	delete(r.held, id)
	if answer {
		r.answered[id]++ // before the answer is written, like testbed
	}
	r.notify()
	r.mu.Unlock()
	if answer {
		w.WriteHeader(http.StatusOK)
	}
}

// release answers every held request and every later one in hold mode.
func (r *drainReceiver) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.gate:
	default:
		close(r.gate)
	}
}

func (r *drainReceiver) setMode(mode string) {
	r.mu.Lock()
	r.mode = mode
	r.mu.Unlock()
}

// await waits until cond, called with r.mu held, is true.
func (r *drainReceiver) await(t *testing.T, what string, timeout time.Duration, cond func(r *drainReceiver) bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		ok, ch := cond(r), r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("timed out waiting for %s: %d held, %d ids arrived, %d answered", what, len(r.held), len(r.arrived), len(r.answered))
		}
	}
}

// snapshot copies the per-id counts.
func (r *drainReceiver) snapshot() (held []string, arrived, answered map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.held {
		held = append(held, id)
	}
	arrived, answered = map[string]int{}, map[string]int{}
	for k, v := range r.arrived {
		arrived[k] = v
	}
	for k, v := range r.answered {
		answered[k] = v
	}
	return held, arrived, answered
}

// newDrainSidecar is newSidecar with shutdown_grace set, private targets
// allowed for the loopback receiver, and info logs, which say when the
// sidecar serves (startServing).
func newDrainSidecar(t *testing.T, dir string, grace time.Duration, subsYAML string) *sidecar {
	sc := newSidecar(t, dir, subsYAML)
	cfg := fmt.Sprintf("listen: unix://%s\nadmin:\n  listen: %s\ndata_dir: %s\nlog_level: info\nallow_private_targets: true\nshutdown_grace: %s\nsubscriptions:\n%s",
		sc.sock, freePort(t), filepath.Join(dir, "data"), grace, subsYAML)
	if err := os.WriteFile(sc.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return sc
}

// startServing starts the sidecar and waits for its "sluice serving" line,
// which serve logs after it has caught the signals (cmd/sluice/serve.go): a
// SIGTERM sent as soon as the socket answers could otherwise still meet
// Go's default action and kill the process without a drain.
func (sc *sidecar) startServing(t *testing.T) {
	t.Helper()
	n := strings.Count(sc.log.String(), "sluice serving")
	sc.start()
	sc.log.await(t, "sluice serving", n+1, 20*time.Second)
}

func drainSubYAML(url string, concurrency int) string {
	// A timeout far past the grace: only the drain ends these requests.
	return fmt.Sprintf("  - id: hook\n    url: %s\n    secret: %s\n    types: [\"*\"]\n    timeout: 60s\n    concurrency: {max: %d}\n    retry: {base: 10ms, cap: 100ms, max_attempts: 100}\n",
		url, e2eSecret, concurrency)
}

// postDraining publishes one event and returns the status and Retry-After.
func (sc *sidecar) postDraining(key string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodPost, "http://sluice/v1/events/t", strings.NewReader(fmt.Sprintf(`{"key":%q}`, key)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := sc.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After"), nil
}

// publishN publishes n events keyed prefix-0… and fails on anything but 202.
func (sc *sidecar) publishN(t *testing.T, prefix string, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range n {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
		if code, err := sc.post("t", keys[i]); err != nil || code != http.StatusAccepted {
			t.Fatalf("publish %s: %d %v", keys[i], code, err)
		}
	}
	return keys
}

// terminate sends SIGTERM and waits for the exit, failing past limit. It
// returns how long the process took to exit.
func (sc *sidecar) terminate(t *testing.T, limit time.Duration, beforeExit func()) time.Duration {
	t.Helper()
	start := time.Now()
	if err := sc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sc.cmd.Wait() }()
	if beforeExit != nil {
		beforeExit()
	}
	select {
	case err := <-exited:
		took := time.Since(start)
		sc.client.Transport.(*http.Transport).CloseIdleConnections()
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v (want 0) after %v", err, took)
		}
		return took
	case <-time.After(limit):
		sc.cmd.Process.Kill()
		<-exited
		t.Fatalf("still running %v after SIGTERM; log:\n%s", limit, sc.log.String())
	}
	return 0
}

// TestDrainSIGTERMFinishesInFlightAndRedeliversTheRest: deliveries held by
// the endpoint when SIGTERM arrives are answered and recorded; meanwhile
// ingest answers 503 with Retry-After and nothing new goes out; the
// process exits 0 well within the grace; after a restart every event that
// got a 202 reaches the endpoint, and the drained ones are not sent again.
func TestDrainSIGTERMFinishesInFlightAndRedeliversTheRest(t *testing.T) {
	const (
		grace  = 5 * time.Second
		margin = 5 * time.Second
		slots  = 4
		events = 20
	)
	rcv, sc, accepted, inFlight := startDrainScenario(t, "hold", grace, slots, events)

	var refused int
	took := sc.terminate(t, grace+margin, func() {
		// (c) While the held deliveries keep the drain open, ingest turns
		// producers away. Posts that beat the signal are accepted and must
		// be delivered after the restart like any other.
		deadline := time.Now().Add(grace)
		for i := 0; ; i++ {
			key := fmt.Sprintf("during-%d", i)
			code, retryAfter, err := sc.postDraining(key)
			if err != nil {
				t.Errorf("ingest unreachable before the drain finished: %v", err)
				break
			}
			if code == http.StatusAccepted {
				accepted = append(accepted, key)
			} else if code == http.StatusServiceUnavailable && retryAfter != "" {
				refused++
				break
			} else {
				t.Errorf("ingest answered %d (Retry-After %q) while draining, want 503 with Retry-After", code, retryAfter)
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("ingest still accepting %v after SIGTERM", grace)
				break
			}
		}
		rcv.release() // (a) the endpoint answers what it held
	})
	if refused != 1 {
		t.Fatal("never saw ingest answer 503 during the drain")
	}
	if took > grace {
		t.Errorf("exit took %v with every in-flight delivery answered, want well within the %v grace", took, grace)
	}
	held, arrived, answered := rcv.snapshot()
	// Nothing new went out during the drain, not even into the slots the
	// answered deliveries freed: only the ones in flight at the signal.
	if len(held) != 0 || len(arrived) != slots {
		t.Fatalf("after exit: %d still held, %d ids arrived; want 0 and the %d in flight at SIGTERM", len(held), len(arrived), slots)
	}
	for _, id := range inFlight {
		if answered[id] != 1 {
			t.Fatalf("in-flight delivery %s answered %d times before exit, want 1", id, answered[id])
		}
	}
	if strings.Contains(sc.log.String(), "abandoned") {
		t.Errorf("deliveries abandoned although every one finished within the grace; log:\n%s", sc.log.String())
	}
	t.Logf("SIGTERM → exit 0 in %v (grace %v); %d in-flight deliveries answered and recorded; %d accepted in all", took, grace, len(inFlight), len(accepted))

	// (d) Restart on the same data dir with a healthy endpoint.
	rcv.setMode("ok")
	sc.startServing(t)
	rcv.await(t, "every accepted event delivered after the restart", 20*time.Second, answeredAll(accepted))
	_, arrived, answered = rcv.snapshot()
	var again []string
	for _, id := range inFlight {
		if arrived[id] != 1 {
			again = append(again, id)
		}
	}
	// The drain recorded the ACKs: what finished before exit is not sent
	// again (at-least-once would allow it, counted; none is expected).
	if len(again) != 0 {
		t.Errorf("deliveries answered during the drain were sent again after the restart: %v", again)
	}
	for id := range answered {
		if !strings.HasPrefix(id, "e-") && !strings.HasPrefix(id, "during-") {
			t.Fatalf("endpoint received %q, which was never published", id)
		}
	}
}

// TestDrainBlackHoleExitsWithinGrace: deliveries to an endpoint that never
// answers cannot finish; SIGTERM still exits 0 once the grace is over
// instead of hanging for the request timeout, and the abandoned deliveries
// go out after a restart, to the endpoint now healthy.
func TestDrainBlackHoleExitsWithinGrace(t *testing.T) {
	const (
		grace  = 2 * time.Second
		margin = 5 * time.Second
		slots  = 2
		events = 5
	)
	rcv, sc, accepted, inFlight := startDrainScenario(t, "blackhole", grace, slots, events)

	took := sc.terminate(t, grace+margin, nil)
	if _, _, answered := rcv.snapshot(); len(answered) != 0 {
		t.Fatalf("the black hole answered %v", answered)
	}
	rcv.await(t, "the abandoned requests' connections closed", 10*time.Second, func(r *drainReceiver) bool { return len(r.held) == 0 })
	t.Logf("SIGTERM with %d deliveries black-holed → exit 0 in %v (grace %v)", len(inFlight), took, grace)

	rcv.setMode("ok")
	sc.startServing(t)
	rcv.await(t, "every accepted event delivered after the restart", 20*time.Second, answeredAll(accepted))
	// Each abandoned delivery went out once more, to be answered.
	_, arrived, answered := rcv.snapshot()
	for _, id := range inFlight {
		if arrived[id] != 2 || answered[id] != 1 {
			t.Fatalf("black-holed %s: %d requests, %d answered; want 2 (the abandoned one, then after the restart) and 1", id, arrived[id], answered[id])
		}
	}
}

// answeredAll is an await condition: every id answered at least once.
func answeredAll(ids []string) func(*drainReceiver) bool {
	return func(r *drainReceiver) bool {
		for _, id := range ids {
			if r.answered[id] == 0 {
				return false
			}
		}
		return true
	}
}

// startDrainScenario starts a receiver in mode and a sidecar delivering to
// it with the cap slots, publishes events and waits until the receiver
// holds the cap's worth of deliveries, which it returns as inFlight.
func startDrainScenario(t *testing.T, mode string, grace time.Duration, slots, events int) (rcv *drainReceiver, sc *sidecar, accepted, inFlight []string) {
	t.Helper()
	t.Setenv("GORACE", "atexit_sleep_ms=0") // a -race child otherwise idles 1 s before exiting
	rcv = newDrainReceiver(t, mode)
	sc = newDrainSidecar(t, t.TempDir(), grace, drainSubYAML(rcv.srv.URL+"/hook", slots))
	sc.startServing(t)
	accepted = sc.publishN(t, "e", events)
	rcv.await(t, "the cap's worth of deliveries held", 20*time.Second, func(r *drainReceiver) bool { return len(r.held) == slots })
	inFlight, _, _ = rcv.snapshot()
	return rcv, sc, accepted, inFlight
}

// TestDrainSecondSignalExitsAtOnce: a second SIGTERM during a drain that
// would last the whole grace (the endpoint is a black hole) stops the
// process at once with exit status 1, through serve returning rather than
// os.Exit in a goroutine; after a restart every accepted event, the
// abandoned in-flight ones included, reaches the endpoint.
func TestDrainSecondSignalExitsAtOnce(t *testing.T) {
	const (
		grace  = time.Minute // far longer than the test may take
		limit  = 15 * time.Second
		slots  = 2
		events = 6
	)
	rcv, sc, accepted, inFlight := startDrainScenario(t, "blackhole", grace, slots, events)
	exited := make(chan error, 1)
	if err := sc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go func() { exited <- sc.cmd.Wait() }()
	// The second signal must come after serve has taken the first: two
	// pending signals of one kind arrive as one.
	sc.log.await(t, "draining", 1, limit)
	// The log line comes just before Close turns ingest away, so a post
	// may still be accepted; then it must be delivered like the others.
	code, retryAfter, err := sc.postDraining("during-drain")
	switch {
	case err != nil:
		t.Fatalf("ingest unreachable while draining: %v", err)
	case code == http.StatusAccepted:
		accepted = append(accepted, "during-drain")
	case code != http.StatusServiceUnavailable || retryAfter == "":
		t.Errorf("ingest while draining: %d (Retry-After %q), want 503 with Retry-After", code, retryAfter)
	}
	start := time.Now()
	if err := sc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("exit after the second SIGTERM: %v, want status 1", err)
		}
		t.Logf("second SIGTERM → exit 1 in %v (grace %v)", time.Since(start), grace)
	case <-time.After(limit):
		sc.cmd.Process.Kill()
		<-exited
		t.Fatalf("still running %v after the second SIGTERM (grace %v)", limit, grace)
	}
	sc.client.Transport.(*http.Transport).CloseIdleConnections()
	if log := sc.log.String(); !strings.Contains(log, "second signal: exiting now") || !strings.Contains(log, "sluice: second signal") {
		t.Errorf("log does not say why it stopped:\n%s", log)
	}
	if _, _, answered := rcv.snapshot(); len(answered) != 0 {
		t.Fatalf("the black hole answered %v", answered)
	}

	rcv.setMode("ok")
	sc.startServing(t)
	rcv.await(t, "every accepted event delivered after the restart", 20*time.Second, answeredAll(accepted))
	_, arrived, _ := rcv.snapshot()
	if code != http.StatusAccepted && arrived["during-drain"] != 0 {
		t.Errorf("an event refused with 503 during the drain was delivered")
	}
	for _, id := range inFlight {
		if arrived[id] < 2 {
			t.Errorf("abandoned %s went out %d times, want again after the restart", id, arrived[id])
		}
	}
}
