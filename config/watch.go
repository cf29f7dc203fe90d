package config

import (
	"context"
	"hash/maphash"
	"io"
	"os"
	"path/filepath"
	"time"
)

// DefaultWatchInterval is how often a Watcher looks at the file. A
// Kubernetes ConfigMap update reaches the pod's volume within about a
// minute (the kubelet's sync period), so a second more is nothing; one
// stat a second is nothing either.
const DefaultWatchInterval = time.Second

// hashEvery makes every so many polls hash the file even when its
// metadata is unchanged, to catch a rewrite of the same size within the
// file system's timestamp granularity. maphash reads a 7 MiB file (50,000
// subscriptions) in about a millisecond, so this costs nothing to speak
// of.
const hashEvery = 30

// Watcher notices when a config file changes on disk, so that it is
// re-read without a SIGHUP.
//
// It polls rather than using inotify (koanf's file.Watch, through
// fsnotify): that watch ends for good on the first error or when the
// file is removed, as editors that save by delete-and-create do; it
// sees a Kubernetes ConfigMap update (the mounted config.yaml is a
// symlink to ..data/config.yaml, and the kubelet replaces the ..data
// symlink by renaming a new one over it) only because it watches the
// whole directory; it calls back once per event, several times for one
// write; and each watch uses an inotify instance, of which a node has
// few per user. A poll of stat(2), following symlinks, costs some
// microseconds and handles all of these the same way.
//
// A change is reported once the file has held still for one interval
// (a write in progress is not read half-done) and only when its content
// differs from the last reported (or the first) content: a touch, or a
// ConfigMap swapped for an identical copy, is not a change. A file that
// disappears is not a change either until it is back with other content.
//
// A Watcher is used by one goroutine.
type Watcher struct {
	// Interval is the time between two looks at the file;
	// DefaultWatchInterval if zero. Set it before Run.
	Interval time.Duration

	path    string
	seed    maphash.Seed // content hashes are compared within one Watcher only
	last    fileState    // the content last reported, or the baseline
	pending *fileState   // metadata that changed, waiting to hold still
	polls   int
}

// fileState is what a poll sees of the file: where its symlinks lead and
// what stat says of the file there, and its content's hash once read.
type fileState struct {
	resolved string
	info     os.FileInfo // nil: missing or unreadable
	sum      uint64
}

// sameMeta reports whether two polls saw the same file: the same target,
// inode, size and modification time.
func (a fileState) sameMeta(b fileState) bool {
	if a.info == nil || b.info == nil {
		return a.info == nil && b.info == nil
	}
	return a.resolved == b.resolved && os.SameFile(a.info, b.info) &&
		a.info.Size() == b.info.Size() && a.info.ModTime().Equal(b.info.ModTime())
}

// NewWatcher returns a Watcher of the file at path, not yet polling. It
// reads the file now as the baseline: a change made after NewWatcher
// returns is reported by Run, even one made before Run starts. So call it
// before the file is loaded.
func NewWatcher(path string) *Watcher {
	w := &Watcher{path: path, seed: maphash.MakeSeed()}
	w.last = w.stat()
	w.last.sum, _ = w.hash()
	return w
}

// Run looks at the file every Interval until ctx is done and calls
// onChange, on Run's goroutine, each time it has changed. It returns
// ctx's error.
func (w *Watcher) Run(ctx context.Context, onChange func()) error {
	interval := w.Interval
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if w.poll() {
				onChange()
			}
		}
	}
}

// poll looks at the file once and reports whether it has changed.
func (w *Watcher) poll() bool {
	w.polls++
	cur := w.stat()
	switch {
	case cur.info == nil:
		w.pending = nil // gone or unreadable: wait for it to come back
		return false
	case w.pending == nil && cur.sameMeta(w.last) && w.polls%hashEvery != 0:
		return false
	case w.pending == nil || !cur.sameMeta(*w.pending):
		if !cur.sameMeta(w.last) {
			w.pending = &cur // changed: wait one interval for it to hold still
			return false
		}
	}
	w.pending = nil
	sum, ok := w.hash()
	if !ok {
		return false
	}
	cur.sum = sum
	changed := w.last.info == nil || sum != w.last.sum
	w.last = cur
	return changed
}

func (w *Watcher) stat() fileState {
	resolved, err := filepath.EvalSymlinks(w.path)
	if err != nil {
		return fileState{}
	}
	info, err := os.Stat(resolved)
	if err != nil {
		return fileState{}
	}
	return fileState{resolved: resolved, info: info}
}

// hash reads the file through its symlinks as they are now.
func (w *Watcher) hash() (sum uint64, ok bool) {
	f, err := os.Open(w.path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var h maphash.Hash
	h.SetSeed(w.seed)
	if _, err := io.Copy(&h, f); err != nil {
		return 0, false
	}
	return h.Sum64(), true
}
