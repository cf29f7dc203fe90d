//go:build !nofleetdemo

// The release build (.ci/build) sets the nofleetdemo tag: this file, and
// with it the embedded NATS server, stays out of the binary that runs as a
// sidecar (demo_nofleet.go says why).

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/natscluster"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// demoFleet is the tour of fleet mode: an embedded 3-node JetStream
// cluster, three `sluice serve` processes sharing it, a producer spread
// over all three, and one node SIGKILLed mid-stream. Its lanes move to the
// survivors once their lease expires, and the receiver's figures show that
// nothing accepted was lost. The nodes are real processes (this binary,
// re-executed) so the kill is a real kill.
func demoFleet(events int, maxWait time.Duration, stdout io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "sluice-fleet-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(stdout, "sluice demo --fleet: starting a 3-node NATS JetStream cluster (embedded) ...")
	cl, err := natscluster.Start(natscluster.Options{Dir: filepath.Join(dir, "nats"), MaxPayloadBytes: 8 << 20})
	if err != nil {
		return err
	}
	defer cl.Close()
	secret, err := signing.GenerateSecret()
	if err != nil {
		return err
	}
	tb := testbed.New(testbed.Options{Secrets: []signing.Secret{secret}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		return err
	}
	defer tb.Close()
	tb.SetMode("/flaky", testbed.ModeFlaky)

	const leaseTTL = 3 * time.Second
	nodes := make([]*demoNode, 3)
	addrs, err := freeAddrs(2 * len(nodes))
	if err != nil {
		return err
	}
	for i := range nodes {
		n := &demoNode{id: fmt.Sprintf("node-%d", i), dir: filepath.Join(dir, fmt.Sprintf("node-%d", i))}
		nodes[i] = n
		n.ingest, n.admin = addrs[2*i], addrs[2*i+1]
		cfg := fmt.Sprintf(`listen: %s
admin: {listen: %s}
data_dir: %s
node_id: %s
log_level: warn
allow_private_targets: true
# Budgets at demo scale: the tour lasts seconds, not the minutes of the
# production defaults.
retry_budget: {ratio: 1, min_per_second: 500, window: 2s}
log: {backend: jetstream}
jetstream:
  urls: [%s]
  replicas: 3
  lease_ttl: %s
subscriptions:
  - {id: healthy, url: %s/healthy, secret: %s, types: ["*"]}
  - {id: geofence-only, url: %s/geofence-only, secret: %s, types: [geofence.enter]}
  - {id: flaky, url: %s/flaky, secret: %s, types: ["*"], retry: {base: 50ms, cap: 200ms, max_attempts: 20}, breaker: {failure_ratio: 0.9}}
  - {id: billing, url: %s/billing, secret: %s, types: ["*"], concurrency: {max: 4}, rate: {per_second: 100}}
`, n.ingest, n.admin, n.dir, n.id, strings.Join(cl.URLs(), ", "), leaseTTL,
			tb.URL(), secret.Encode(), tb.URL(), secret.Encode(), tb.URL(), secret.Encode(), tb.URL(), secret.Encode())
		n.config = filepath.Join(dir, n.id+".yaml")
		if err := os.WriteFile(n.config, []byte(cfg), 0o600); err != nil {
			return err
		}
		if err := n.start(exe); err != nil {
			return err
		}
		defer n.kill()
	}
	for _, n := range nodes {
		if err := n.awaitReady(30 * time.Second); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "three sluice nodes up (ingest %s, %s, %s), lease_ttl %s; endpoints on %s\n\n",
		nodes[0].ingest, nodes[1].ingest, nodes[2].ingest, leaseTTL, tb.URL())
	printOwners(stdout, "owners at start", nodes[0])

	// The producer: round-robin over the live nodes, as a Service's
	// replicas each post to their own sidecar.
	start := time.Now()
	var (
		mu       sync.Mutex
		accepted int
	)
	killAt := events / 2
	var killed time.Time
	c := &http.Client{Timeout: 10 * time.Second}
	for i := range events {
		if i == killAt {
			killed = time.Now()
			nodes[1].kill()
			fmt.Fprintf(stdout, "%5.1fs SIGKILL %s (its lanes wait for their lease to expire, then move)\n", time.Since(start).Seconds(), nodes[1].id)
		}
		n := nodes[i%3]
		if n.dead {
			n = nodes[(i+1)%3]
			if n.dead {
				n = nodes[(i+2)%3]
			}
		}
		typ := "geofence.enter"
		if i%3 == 2 {
			typ = "geofence.exit"
		}
		req, _ := http.NewRequest(http.MethodPost, "http://"+n.ingest+"/v1/events/"+typ, strings.NewReader(fmt.Sprintf(`{"n":%d}`, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("fleet-demo-%d-%d", start.UnixNano(), i))
		if resp, err := c.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusAccepted {
				mu.Lock()
				accepted++
				mu.Unlock()
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Fprintf(stdout, "%5.1fs published %d events, %d accepted (202) across the fleet\n", time.Since(start).Seconds(), events, accepted)

	// Wait for every subscription to have every event it is owed.
	want := map[string]int64{"/healthy": int64(accepted), "/flaky": int64(accepted), "/billing": int64(accepted)}
	deadline := time.Now().Add(maxWait)
	var moved time.Duration
	for time.Now().Before(deadline) {
		if moved == 0 {
			if ls, err := nodes[0].lanes(); err == nil && ownedBy(ls, nodes[1].id) == 0 {
				moved = time.Since(killed)
			}
		}
		st := tb.Stats()
		done := true
		for p, n := range want {
			if st[p].Unique < n {
				done = false
			}
		}
		if done && moved > 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Fprintln(stdout)
	if moved > 0 {
		fmt.Fprintf(stdout, "the killed node's lanes moved %.1fs after the SIGKILL (lease_ttl %s)\n", moved.Seconds(), leaseTTL)
	}
	printOwners(stdout, "owners now", nodes[0])
	st := tb.Stats()
	lost := int64(0)
	fmt.Fprintf(stdout, "\n%-14s %8s %8s %10s %8s\n", "SUBSCRIPTION", "OWED", "UNIQUE", "DUPLICATES", "LOST")
	for _, p := range []string{"/healthy", "/geofence-only", "/flaky", "/billing"} {
		owed := want[p]
		if p == "/geofence-only" {
			owed = st[p].Unique // entitled to geofence.enter only; counted by the receiver
		}
		l := max(owed-st[p].Unique, 0)
		lost += l
		fmt.Fprintf(stdout, "%-14s %8d %8d %10d %8d\n", strings.TrimPrefix(p, "/"), owed, st[p].Unique, st[p].Duplicates, l)
	}
	fmt.Fprintln(stdout, "\nDuplicates are the deliveries that were in flight on the killed node: at-least-once, never lost.")
	fmt.Fprintln(stdout, "Each lane ran on one node at a time, so billing's cap of 4 and 100/s held across the fleet.")
	for _, n := range nodes {
		n.stop()
	}
	if lost > 0 {
		return fmt.Errorf("fleet demo: %d deliveries missing", lost)
	}
	return nil
}

type demoNode struct {
	id, dir, config, ingest, admin string
	cmd                            *exec.Cmd
	dead                           bool
}

// demoNodeCommand makes the command of one demo node: this binary's
// serve. Tests replace it (a test binary runs sluice only when told to).
var demoNodeCommand = func(exe, config string) *exec.Cmd { return exec.Command(exe, "serve", "--config", config) }

func (n *demoNode) start(exe string) error {
	n.cmd = demoNodeCommand(exe, n.config)
	logf, err := os.Create(n.dir + ".log")
	if err != nil {
		return err
	}
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	return n.cmd.Start()
}

func (n *demoNode) kill() {
	if n.cmd != nil && n.cmd.Process != nil && !n.dead {
		n.dead = true
		n.cmd.Process.Kill()
		n.cmd.Wait()
	}
}

// stop ends a node as Kubernetes does: SIGTERM, then the grace.
func (n *demoNode) stop() {
	if n.cmd == nil || n.dead {
		return
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		n.cmd.Process.Kill()
		<-done
	}
	n.dead = true
}

func (n *demoNode) awaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + n.admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := os.ReadFile(n.dir + ".log")
	return fmt.Errorf("%s not ready within %s: %s", n.id, timeout, lastLines(string(b), 5))
}

func (n *demoNode) lanes() ([]api.LaneStatus, error) {
	resp, err := http.Get("http://" + n.admin + "/v1/subscriptions")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var l api.SubscriptionList
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return nil, err
	}
	return l.Subscriptions, nil
}

func ownedBy(ls []api.LaneStatus, node string) int {
	n := 0
	for _, l := range ls {
		if l.Owner == node {
			n++
		}
	}
	return n
}

func printOwners(w io.Writer, title string, n *demoNode) {
	ls, err := n.lanes()
	if err != nil {
		fmt.Fprintf(w, "%s: %v\n", title, err)
		return
	}
	var parts []string
	for _, l := range ls {
		parts = append(parts, fmt.Sprintf("%s→%s", l.Subscription, orNone(l.Owner)))
	}
	fmt.Fprintf(w, "%s: %s\n", title, strings.Join(parts, ", "))
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(ls[max(len(ls)-n, 0):], "\n")
}

// freeAddrs returns n distinct loopback addresses nothing listens on right
// now. It holds all n listeners open until it has them: one closed before
// the next was opened could be handed out again (a node's ingest and admin
// address once came out equal, and the node refused its config).
func freeAddrs(n int) ([]string, error) {
	out := make([]string, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		out = append(out, ln.Addr().String())
	}
	return out, nil
}
