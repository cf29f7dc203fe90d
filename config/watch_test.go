package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// configMap lays out dir as the kubelet mounts a ConfigMap volume:
// dir/config.yaml -> ..data/config.yaml, dir/..data -> ..<version>, and
// the file in dir/..<version>/. swap publishes a new version the way the
// kubelet does: write a new directory, point a temporary symlink at it and
// rename that over ..data, atomically.
type configMap struct {
	t    *testing.T
	dir  string
	n    int
	path string // dir/config.yaml
}

func newConfigMap(t *testing.T, content string) *configMap {
	c := &configMap{t: t, dir: t.TempDir()}
	c.path = filepath.Join(c.dir, "config.yaml")
	c.swap(content)
	if err := os.Symlink(filepath.Join("..data", "config.yaml"), c.path); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *configMap) swap(content string) {
	c.t.Helper()
	c.n++
	version := "..2026_12_01_00_00_0" + string(rune('0'+c.n))
	if err := os.Mkdir(filepath.Join(c.dir, version), 0o755); err != nil {
		c.t.Fatal(err)
	}
	writeFile(c.t, filepath.Join(c.dir, version, "config.yaml"), content)
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		c.t.Fatal(err)
	}
}

// TestWatcherPolls drives poll by hand, one call per interval: what is a
// change and what is not, with no clock involved.
func TestWatcherPolls(t *testing.T) {
	cm := newConfigMap(t, "listen: 127.0.0.1:1\n")
	w := NewWatcher(cm.path)
	polls := func(want ...bool) {
		t.Helper()
		for i, v := range want {
			if got := w.poll(); got != v {
				t.Fatalf("poll %d of %v = %v", i+1, want, got)
			}
		}
	}
	polls(false, false)

	// A ConfigMap update: reported once it has held still one interval,
	// and once only.
	cm.swap("listen: 127.0.0.1:2\n")
	polls(false, true, false, false)

	// Swapped for an identical copy, or touched: no change.
	cm.swap("listen: 127.0.0.1:2\n")
	polls(false, false, false)
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(cm.path, later, later); err != nil {
		t.Fatal(err)
	}
	polls(false, false)

	// A write in two steps is read once it holds still.
	target, err := filepath.EvalSymlinks(cm.path)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, target, "listen: 127.0.0.1:3\n")
	polls(false)
	writeFile(t, target, "listen: 127.0.0.1:3\nlog_level: debug\n")
	polls(false, true)

	// Gone (an editor's delete, then create) is no change; back with the
	// same content neither; with other content it is.
	if err := os.Remove(target); err != nil {
		t.Fatal(err)
	}
	polls(false, false)
	writeFile(t, target, "listen: 127.0.0.1:3\nlog_level: debug\n")
	polls(false, false, false)
	if err := os.Remove(target); err != nil {
		t.Fatal(err)
	}
	polls(false)
	writeFile(t, target, "listen: 127.0.0.1:4\n")
	polls(false, true)

	// A rewrite that keeps the size and the modification time is caught
	// by the periodic hash.
	info, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, target, "listen: 127.0.0.1:5\n")
	if err := os.Chtimes(target, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	changed := false
	for range hashEvery {
		changed = changed || w.poll()
	}
	if !changed {
		t.Fatalf("a same-size rewrite was not noticed in %d polls", hashEvery)
	}
}

// TestWatcherMissingAtFirst: a file that does not exist yet is reported
// when it appears.
func TestWatcherMissingAtFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	w := NewWatcher(path)
	if w.poll() {
		t.Fatal("change reported for a missing file")
	}
	writeFile(t, path, "listen: 127.0.0.1:1\n")
	if w.poll() || !w.poll() {
		t.Fatal("the new file was not reported after one still interval")
	}
}

// TestWatcherRun: Run, with a short interval, calls back when a ConfigMap
// is updated, including an update made between NewWatcher and Run, and
// returns when its context ends.
func TestWatcherRun(t *testing.T) {
	cm := newConfigMap(t, "listen: 127.0.0.1:1\n")
	w := NewWatcher(cm.path)
	w.Interval = 5 * time.Millisecond
	cm.swap("listen: 127.0.0.1:2\n") // before Run: still a change

	ctx, cancel := context.WithCancel(context.Background())
	changed := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- w.Run(ctx, func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		})
	}()
	await := func(what string) {
		t.Helper()
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatalf("no change reported for %s", what)
		}
	}
	await("an update before Run")
	cm.swap("listen: 127.0.0.1:3\n")
	await("an update while running")

	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
