package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/tmpfs"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/testbed"
)

// fillUntil507 posts events of size bytes until the sidecar answers 507 and
// returns how many it accepted. Any answer but 202 and 507 fails the test.
func fillUntil507(t *testing.T, s *proxy.Server, size, limit int) (accepted int, last map[string]any, retryAfter string) {
	t.Helper()
	body := bytes.Repeat([]byte("d"), size)
	for i := range limit {
		req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/t", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", fmt.Sprintf("fill-%d", i))
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusAccepted:
			accepted++
		case http.StatusInsufficientStorage:
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("507 with non-JSON body %q", b)
			}
			return accepted, m, resp.Header.Get("Retry-After")
		default:
			t.Fatalf("event %d: %d %s", i, resp.StatusCode, b)
		}
	}
	t.Fatalf("no 507 after %d events of %d bytes", limit, size)
	return
}

// postOnce posts one event and returns the status code.
func postOnce(t *testing.T, s *proxy.Server, key string, size int) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/t", bytes.NewReader(bytes.Repeat([]byte("r"), size)))
	req.Header.Set("Idempotency-Key", key)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestDiskQuota507KeepsEverythingAccepted: past max_disk_bytes ingest
// answers 507 with Retry-After and an error naming the limit; every event
// accepted before is delivered while ingest refuses; a refused event leaves
// no trace (the sequence goes on without a gap after a restart with a larger
// quota, and the refused ids were never recorded).
func TestDiskQuota507KeepsEverythingAccepted(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	dir := t.TempDir()
	open := func(quota int64) *proxy.Server {
		s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: dir, Sync: true,
			Subscriptions: []*delivery.Subscription{sub("a", tb.URL()+"/a")}, Logger: quietLogger(),
			MaxDiskBytes: quota, MinFreeDiskBytes: -1})
		if err := s.Open(); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open(24 << 20)
	// The lane is paused while the log fills: a lane that keeps up lets
	// compaction and value-log GC free the space as fast as it is taken,
	// and the quota is never reached (seen on a loaded machine).
	if err := s.Pause("a", "filling the log"); err != nil {
		t.Fatal(err)
	}
	n, m, ra := fillUntil507(t, s, 32<<10, 5000)
	if msg, _ := m["error"].(string); !strings.Contains(msg, "max_disk_bytes") || ra == "" {
		t.Fatalf("507 answer %v, Retry-After %q: want an error naming max_disk_bytes and a Retry-After", m, ra)
	}
	if n == 0 {
		t.Fatal("nothing was accepted before the quota")
	}
	// Delivery goes on while ingest refuses: every accepted event arrives.
	// (Whether the next post is refused too depends on Badger: a memtable
	// flush deletes its write-ahead log and may bring the log back under.)
	if err := s.Resume("a"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, tb, "every accepted event delivered while ingest refuses", uniqueAt("/a", int64(n)))
	closeServer(t, s, 5*time.Second)

	s = open(0)
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })
	code, a := post(t, s, "t", "after-quota", `{}`)
	if code != http.StatusAccepted || a.Seq != uint64(n)+1 {
		t.Fatalf("after raising the quota: %d %+v; want 202 with seq %d (a refused event takes no id and no seq)", code, a, n+1)
	}
	waitFor(t, tb, "the first event after the quota", uniqueAt("/a", int64(n)+1))
}

// TestDiskFullFilesystem runs the log on a real, small tmpfs whose free
// space is eaten by another file, as a full volume is in production. Badger
// writes through mmap, where a full file system is SIGBUS rather than an
// error, so sluice must stop accepting while there is room left: ingest
// answers 507 while free space is below min_free_disk_bytes, everything
// accepted is delivered, and ingest resumes by itself when the other file
// is deleted. Needs permission to mount: skipped without it (root in a
// container without CAP_SYS_ADMIN cannot mount either;
// TestDiskQuota507KeepsEverythingAccepted covers the quota path without a
// mount), and failed without it when CI is set (CI runs as root).
func TestDiskFullFilesystem(t *testing.T) {
	mnt := tmpfs.Mount(t, "160m")

	tb := startTestbed(t, testbed.ModeOK)
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: filepath.Join(mnt, "data"), Sync: true,
		Subscriptions: []*delivery.Subscription{sub("a", tb.URL()+"/a")}, Logger: quietLogger()})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })

	// Leave 16 MiB above the 64 MiB floor, then fill.
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	ballast := filepath.Join(mnt, "ballast")
	if err := os.WriteFile(ballast, make([]byte, free-(64<<20)-(16<<20)), 0o600); err != nil {
		t.Fatal(err)
	}
	// Paused while it fills, as in TestDiskQuota507KeepsEverythingAccepted.
	if err := s.Pause("a", "filling the log"); err != nil {
		t.Fatal(err)
	}
	n, m, ra := fillUntil507(t, s, 16<<10, 5000)
	if msg, _ := m["error"].(string); !strings.Contains(msg, "min_free_disk_bytes") || ra == "" {
		t.Fatalf("507 answer %v, Retry-After %q: want an error naming min_free_disk_bytes and a Retry-After", m, ra)
	}
	if err := s.Resume("a"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, tb, "every accepted event delivered while the disk is full", uniqueAt("/a", int64(n)))

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	// Resumes by itself: the guard measures again within 250 ms.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; postOnce(t, s, fmt.Sprintf("resume-%d", i), 100) != http.StatusAccepted; i++ {
		if ctx.Err() != nil {
			t.Fatal("ingest did not resume after space was freed")
		}
		time.Sleep(50 * time.Millisecond) // a producer honouring Retry-After, quicker
	}
	waitFor(t, tb, "the event after space was freed", uniqueAt("/a", int64(n)+1))
}
