package badger_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/tmpfs"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
)

// dirBytes is what the files of dir take, as the disk guard counts it
// (allocated blocks), measured now.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			n += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
	}
	return n
}

func listing(dir string) string {
	ents, _ := os.ReadDir(dir)
	var s []string
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			s = append(s, fmt.Sprintf("%s %d KiB", e.Name(), fi.Sys().(*syscall.Stat_t).Blocks/2))
		}
	}
	return fmt.Sprint(s)
}

// fill appends bodies of size bytes from several goroutines until the log
// refuses one with ErrDiskFull, and returns how many it took.
func fill(t *testing.T, l *badger.Log, prefix string, size int) int {
	t.Helper()
	body := bytes.Repeat([]byte("b"), size)
	var (
		n    atomic.Int64
		full atomic.Bool
		wg   sync.WaitGroup
	)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; !full.Load(); i++ {
				_, _, err := l.Append(&queue.Event{ID: fmt.Sprintf("%s-%d-%d", prefix, w, i), Type: "t", AcceptedAt: time.Now(), Body: body})
				switch {
				case errors.Is(err, queue.ErrDiskFull):
					full.Store(true)
				case err != nil:
					t.Errorf("append: %v", err)
					full.Store(true)
				default:
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(n.Load())
}

// TestReclaimWhenFull: a log that filled its volume itself, whose events
// are then all compacted away, takes appends again by itself, whatever
// the body size: in the value log (1 MiB, 64 KiB, 16 KiB, and most 2 KiB
// group commits of its 8 appenders) or in the LSM tree (512 B: a group of
// 8 stays under the 8 KiB value threshold). Nothing writes any more while the guard refuses, so
// nothing but the reclaim it kicks gives the space back; and the process
// must survive Badger's compactions at the floor (a write through mmap
// into a full tmpfs is SIGBUS).
func TestReclaimWhenFull(t *testing.T) {
	for _, size := range []int{1 << 20, 64 << 10, 16 << 10, 2 << 10, 512} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			mnt := tmpfs.Mount(t, "128m")
			dir := filepath.Join(mnt, "data")
			l, err := badger.Open(badger.Options{Dir: dir, Sync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			n := fill(t, l, "fill", size)
			if n == 0 {
				t.Fatal("nothing appended before the log was full")
			}
			full := dirBytes(t, dir)
			start := time.Now()
			if _, err := l.Compact(l.Head() + 1); err != nil {
				t.Fatal(err)
			}
			body := bytes.Repeat([]byte("a"), size)
			again := func(i int) bool {
				_, _, err := l.Append(&queue.Event{ID: fmt.Sprint("again-", i), Type: "t", AcceptedAt: time.Now(), Body: body})
				if err != nil && !errors.Is(err, queue.ErrDiskFull) {
					t.Fatal(err)
				}
				return err == nil
			}
			for i := 0; !again(i); i++ {
				if time.Since(start) > 30*time.Second {
					t.Fatalf("no append taken 30 s after compacting all %d events; %+v", n, l.DiskUsage())
				}
				time.Sleep(10 * time.Millisecond) // the guard measures every 250 ms
			}
			back := time.Since(start)
			// The reclaim may still be running: await the usage it leaves.
			bodies := int64(n) * int64(size)
			for dirBytes(t, dir) > full-bodies/2 {
				if time.Since(start) > 30*time.Second {
					t.Fatalf("the log uses %d MiB 30 s after compacting all %d events, %d MiB when full; the bodies took %d MiB; %s",
						dirBytes(t, dir)>>20, n, full>>20, bodies>>20, listing(dir))
				}
				time.Sleep(10 * time.Millisecond)
			}
			at := dirBytes(t, dir)
			// Back means a steady flow again: a quarter of what filled it,
			// far more than the slack the refusal left.
			for i, ok := 1, 1; ok < max(n/4, 1); i++ {
				if again(1_000_000 + i) {
					ok++
					continue
				}
				if time.Since(start) > 30*time.Second {
					t.Fatalf("%d of %d appends taken 30 s after compacting all %d events; %+v", ok, n/4, n, l.DiskUsage())
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("%d bodies of %d bytes until full at %d MiB; appends again %v after Compact; the log then at %d MiB; %d more taken",
				n, size, full>>20, back.Round(time.Millisecond), at>>20, max(n/4, 1))
		})
	}
}
