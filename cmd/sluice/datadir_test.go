package main

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
)

// serveOnce runs `sluice serve` on dataDir (ports of its own) and returns
// its exit code and output. Start-up must end, one way or the other,
// within a minute: a hang fails the test.
func serveOnce(t *testing.T, dataDir string) (int, string) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	yaml := fmt.Sprintf("data_dir: %s\nlisten: %s\nadmin: {listen: %s}\nlog_level: warn\n", dataDir, freePort(t), freePort(t))
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd := sluiceCmd(t, out, "serve", "--config", cfg)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	timer := time.NewTimer(time.Minute)
	defer timer.Stop()
	select {
	case <-exited:
	case <-timer.C:
		cmd.Process.Kill()
		<-exited
		t.Fatalf("sluice serve on %s still running after a minute; output:\n%s", dataDir, out.String())
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// assertRefused: serve exited 1 saying each of want, without a Go crash
// trace.
func assertRefused(t *testing.T, code int, out string, want ...string) {
	t.Helper()
	if code != 1 {
		t.Fatalf("exit code %d, want 1; output:\n%s", code, out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output does not say %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "panic: ") || strings.Contains(out, "[running]") {
		t.Errorf("output shows a panic:\n%s", out)
	}
}

// dataDirWithEvents is a data dir a clean shutdown left with n events.
func dataDirWithEvents(t *testing.T, n int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	q, err := badger.Open(badger.Options{Dir: dir, Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, _, err := q.Append(&queue.Event{ID: fmt.Sprintf("ev-%d", i), Type: "t.created", AcceptedAt: time.Now(), Body: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// fileHashes maps each file under dir but Badger's LOCK (a pid file) to a
// hash of its content.
func fileHashes(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "LOCK" {
			return err
		}
		b, err := os.ReadFile(p)
		out[p] = fmt.Sprintf("%d bytes %x", len(b), sha256.Sum256(b))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func assertSameFiles(t *testing.T, dir string, before map[string]string) {
	t.Helper()
	after := fileHashes(t, dir)
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("refused start changed the data dir:\nbefore %v\nafter  %v", before, after)
	}
}

// TestDataDirLockedSecondServeFails: a second sluice on the data dir of a
// running one exits at once saying so; the first goes on serving.
func TestDataDirLockedSecondServeFails(t *testing.T) {
	dir := t.TempDir()
	sc := newSidecar(t, dir, "")
	sc.start()
	if code, err := sc.post("t.created", "before"); err != nil || code != 202 {
		t.Fatalf("post to the first: %d %v", code, err)
	}
	data := filepath.Join(dir, "data")
	code, out := serveOnce(t, data)
	assertRefused(t, code, out, "sluice: data dir "+data+" is in use by another process (is another sluice running?)")
	if code, err := sc.post("t.created", "after"); err != nil || code != 202 {
		t.Fatalf("post to the first after the second was refused: %d %v; log:\n%s", code, err, sc.log.String())
	}
	// Both events are in the log, read by the next sluice on the dir.
	sc.kill()
	q, err := badger.Open(badger.Options{Dir: data})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for _, key := range []string{"before", "after"} {
		if _, _, _, err := q.Lookup(key); err != nil {
			t.Errorf("event %s: %v", key, err)
		}
	}
}

// TestDataDirCorruptServeFails: a damaged data dir stops start-up with an
// error that names it and says what to do, and nothing in it changes.
func TestDataDirCorruptServeFails(t *testing.T) {
	cases := map[string]func(t *testing.T, dir string){
		// Badger would cut the torn record and delete every table.
		"MANIFEST cut in half": func(t *testing.T, dir string) {
			p := filepath.Join(dir, "MANIFEST")
			fi, _ := os.Stat(p)
			if err := os.Truncate(p, fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		},
		// Badger panics in a goroutine of its own on this one.
		"table cut in half": func(t *testing.T, dir string) {
			p := filepath.Join(dir, "000001.sst")
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(p, fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			data := dataDirWithEvents(t, 100)
			corrupt(t, data)
			before := fileHashes(t, data)
			code, out := serveOnce(t, data)
			assertRefused(t, code, out, "sluice: data dir "+data+" looks damaged", "restore it from a backup, or move it aside")
			assertSameFiles(t, data, before)
		})
	}
}

// TestDataDirNewerFormatServeFails: a data dir a newer sluice wrote is
// refused, not read or rewritten.
func TestDataDirNewerFormatServeFails(t *testing.T) {
	data := dataDirWithEvents(t, 10)
	db, err := badgerdb.Open(badgerdb.DefaultOptions(data).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	// m/format is the queue's format version key (queue/badger/key.go).
	err = db.Update(func(txn *badgerdb.Txn) error { return txn.Set([]byte("m/format"), []byte{0, 0, 0, 0, 0, 0, 0, 99}) })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	before := fileHashes(t, data)
	code, out := serveOnce(t, data)
	assertRefused(t, code, out, data, "format 99", "newer format version")
	// The format is read after Badger has opened the dir, and Badger
	// replaces its empty value-log files on every open; the tables and
	// the MANIFEST stay as they were, and the format key says 99 still.
	after := fileHashes(t, data)
	for p, h := range before {
		if (strings.HasSuffix(p, ".sst") || strings.HasSuffix(p, "MANIFEST")) && after[p] != h {
			t.Errorf("%s changed: %s, was %s", p, after[p], h)
		}
	}
	db, err = badgerdb.Open(badgerdb.DefaultOptions(data).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(txn *badgerdb.Txn) error {
		item, err := txn.Get([]byte("m/format"))
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if string(v) != "\x00\x00\x00\x00\x00\x00\x00\x63" {
				return fmt.Errorf("m/format = %x, want 99", v)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDataDirForeignServeFails: a data_dir that is a file is refused and
// left as it is.
func TestDataDirForeignServeFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(path, []byte("mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := serveOnce(t, path)
	assertRefused(t, code, out, "sluice: data dir "+path+" is not a sluice data dir: it is not a directory")
	if b, _ := os.ReadFile(path); string(b) != "mine\n" {
		t.Fatalf("file now holds %q", b)
	}
}
