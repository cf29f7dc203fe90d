package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy/api"
)

// configMapVolume is a directory laid out as the kubelet mounts a
// ConfigMap: config.yaml -> ..data/config.yaml, ..data -> ..<version>.
type configMapVolume struct {
	t    *testing.T
	dir  string
	n    int
	path string // what --config names
}

func newConfigMapVolume(t *testing.T, dir, content string) *configMapVolume {
	v := &configMapVolume{t: t, dir: dir, path: filepath.Join(dir, "config.yaml")}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	v.publish(content)
	if err := os.Symlink("..data/config.yaml", v.path); err != nil {
		t.Fatal(err)
	}
	return v
}

// publish makes content the volume's, as the kubelet does: a new
// directory, then a symlink to it renamed over ..data.
func (v *configMapVolume) publish(content string) {
	v.t.Helper()
	v.n++
	version := fmt.Sprintf("..2026_12_01_10_00_%02d.%d", v.n, 1000+v.n)
	if err := os.Mkdir(filepath.Join(v.dir, version), 0o755); err != nil {
		v.t.Fatal(err)
	}
	writeFile(v.t, filepath.Join(v.dir, version, "config.yaml"), content)
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
}

// lanesNow is laneIDs for a sidecar that may not answer yet.
func lanesNow(admin string) ([]string, error) {
	resp, err := http.Get(admin + "/v1/subscriptions")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list api.SubscriptionList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	var ids []string
	for _, l := range list.Subscriptions {
		ids = append(ids, l.Subscription)
	}
	slices.Sort(ids)
	return ids, nil
}

// awaitLanes polls the admin API until its lanes are want.
func awaitLanes(t *testing.T, sc *sidecar, admin string, want ...string) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	var got []string
	var err error
	for {
		if got, err = lanesNow(admin); err == nil && slices.Equal(got, want) {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("lanes = %v (%v), want %v; log:\n%s", got, err, want, sc.log.String())
		}
	}
}

// TestConfigMapUpdateReloads: a real `sluice serve` whose --config is a
// ConfigMap volume picks up an update of the ConfigMap, which swaps the
// ..data symlink and sends no signal; a bad update keeps the running
// config.
func TestConfigMapUpdateReloads(t *testing.T) {
	dir := t.TempDir()
	tb := startReceiver(t)
	a := subYAML("a", tb.URL()+"/a", `["*"]`)
	b := subYAML("b", tb.URL()+"/b", `["*"]`)
	sc := newSidecar(t, dir, a)
	base, err := os.ReadFile(sc.config)
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.Replace(string(base), "log_level: warn", "log_level: info", 1)
	admin := "http://" + regexp.MustCompile(`admin:\n  listen: (\S+)`).FindStringSubmatch(conf)[1]
	vol := newConfigMapVolume(t, filepath.Join(dir, "configmap"), conf)
	sc.config = vol.path
	sc.start()
	awaitLanes(t, sc, admin, "a")

	vol.publish(conf + b)
	awaitLanes(t, sc, admin, "a", "b")
	if !strings.Contains(sc.log.String(), "config file changed; reloading") {
		t.Errorf("log lacks the reason of the reload:\n%s", sc.log.String())
	}

	// A bad update changes nothing, and says so.
	vol.publish(conf + b + "  - id: c\n    url: ftp://c.example\n    secret: " + e2eSecret + "\n")
	sc.log.await(t, "config reload failed; keeping the running config", 1, 30*time.Second)
	if got, err := lanesNow(admin); err != nil || !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("lanes after a bad update = %v (%v), want [a b]", got, err)
	}
	if !strings.Contains(sc.log.String(), "subscriptions[2].url") {
		t.Errorf("the failed reload does not name the key:\n%s", sc.log.String())
	}

	// The next good update applies.
	vol.publish(conf)
	awaitLanes(t, sc, admin, "a")

	sc.cmd.Process.Signal(syscall.SIGTERM)
	if err := sc.cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM exit: %v", err)
	}
}
