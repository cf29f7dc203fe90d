package docs

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestReadmeQuickPath runs the README's "From zero to a signed delivery"
// as a reader would: the testbed with the README's secret, `sluice serve`
// with examples/config/minimal.yaml, the README's curl, then the
// receiver's stats and `sluice status`, whose header must be the one the
// README shows. Only the ports and the data dir differ, so that the test
// can run beside anything else on the machine.
func TestReadmeQuickPath(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	testbedCmd := regexp.MustCompile(`\./sluice testbed --listen 127\.0\.0\.1:9000 --secret (whsec_\S+)`).FindStringSubmatch(text)
	if testbedCmd == nil {
		t.Fatal("README has no `./sluice testbed --listen 127.0.0.1:9000 --secret whsec_…` step")
	}
	if !strings.Contains(text, "./sluice serve --config examples/config/minimal.yaml") {
		t.Fatal("README has no `./sluice serve --config examples/config/minimal.yaml` step")
	}
	curl := regexp.MustCompile(`--data '([^']+)' \\\n\s+http://127\.0\.0\.1:8700(/v1/events/\S+)`).FindStringSubmatch(text)
	if curl == nil {
		t.Fatal("README has no curl step posting to http://127.0.0.1:8700/v1/events/…")
	}
	statusHeader := regexp.MustCompile(`(?m)^\s*(SUBSCRIPTION\s+STATE.*)$`).FindStringSubmatch(text)
	if statusHeader == nil {
		t.Fatal("README shows no `sluice status` output")
	}

	minimal, err := os.ReadFile(filepath.Join("..", "examples", "config", "minimal.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(minimal), "secret: "+testbedCmd[1]) {
		t.Fatalf("minimal.yaml does not sign with the secret the README gives the testbed (%s)", testbedCmd[1])
	}
	if !strings.Contains(string(minimal), "url: http://127.0.0.1:9000/hooks") {
		t.Fatal("minimal.yaml no longer delivers to http://127.0.0.1:9000/hooks, as the README says")
	}

	dir := t.TempDir()
	bin := filepath.Join(dir, "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	receiver, ingest, admin := freeAddr(t), freeAddr(t), freeAddr(t)
	cfg := filepath.Join(dir, "minimal.yaml")
	if err := os.WriteFile(cfg, bytes.ReplaceAll(minimal, []byte("127.0.0.1:9000"), []byte(receiver)), 0o600); err != nil {
		t.Fatal(err)
	}

	start(t, bin, "testbed", "--listen", receiver, "--secret", testbedCmd[1])
	start(t, bin, "serve", "--config", cfg, "--listen", ingest, "--admin-listen", admin, "--data-dir", filepath.Join(dir, "data"))

	// The 202 of step 3, awaited through the sidecar's start-up.
	post := func() (int, error) {
		resp, err := http.Post("http://"+ingest+curl[2], "application/json", strings.NewReader(curl[1]))
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	code, err := await(t, func() (int, error) { return post() }, func(c int) bool { return c != 0 })
	if err != nil || code != http.StatusAccepted {
		t.Fatalf("POST %s = %d, %v; the README promises 202", curl[2], code, err)
	}

	// Step 4: the receiver counts one valid signature on /hooks.
	type pathStats struct {
		Accepted      int `json:"accepted"`
		BadSignatures int `json:"bad_signatures"`
	}
	stats := func() (map[string]pathStats, error) {
		resp, err := http.Get("http://" + receiver + "/_stats")
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		m := map[string]pathStats{}
		return m, json.NewDecoder(resp.Body).Decode(&m)
	}
	got, err := await(t, stats, func(m map[string]pathStats) bool { return m["/hooks"].Accepted >= 1 })
	if err != nil || got["/hooks"].Accepted != 1 || got["/hooks"].BadSignatures != 0 {
		t.Fatalf("receiver stats %+v (%v): want one accepted delivery on /hooks and no bad signatures", got, err)
	}

	out, err := exec.Command(bin, "status", "--admin", "http://"+admin).CombinedOutput()
	if err != nil {
		t.Fatalf("sluice status: %v\n%s", err, out)
	}
	if first := strings.SplitN(string(out), "\n", 2)[0]; strings.Join(strings.Fields(first), " ") != strings.Join(strings.Fields(statusHeader[1]), " ") {
		t.Errorf("sluice status prints the header\n  %s\nbut the README shows\n  %s", first, statusHeader[1])
	}
	if !regexp.MustCompile(`(?m)^local\s+active\s`).Match(out) {
		t.Errorf("sluice status does not show subscription local as active:\n%s", out)
	}
}

// start runs bin with args until the test ends.
func start(t *testing.T, bin string, args ...string) {
	t.Helper()
	var logs bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("sluice %s:\n%s", args[0], logs.String())
		}
	})
}

// await calls f until ok holds of its result, for at most a minute: the
// processes' start-up on a loaded machine is all it waits for.
func await[T any](t *testing.T, f func() (T, error), ok func(T) bool) (T, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		v, err := f()
		if err == nil && ok(v) {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("still %v after a minute: %w", v, cmp.Or(err, ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// freeAddr is a loopback address nobody listens on at the moment.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
