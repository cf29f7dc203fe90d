package badger

import (
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// diskCheckInterval is how often usage and free space are measured. Bytes
// appended in between are counted as they are admitted, so a burst cannot
// overrun the limits by more than one batch between two checks.
const diskCheckInterval = 250 * time.Millisecond

// appendOverhead is what an event costs on disk beyond its body: keys, the
// record header, the dedup index entry.
const appendOverhead = 160

// diskGuard measures the data dir and admits appends against the limits.
type diskGuard struct {
	dir     string
	max     int64 // 0: no quota
	minFree int64 // 0: no floor
	log     *slog.Logger

	used    atomic.Int64
	free    atomic.Int64
	pending atomic.Int64 // bytes admitted since the last measurement

	mu     sync.Mutex
	reason string // non-empty while the last measurement was over a limit

	stop chan struct{}
	done chan struct{}
}

func newDiskGuard(dir string, max, minFree int64, log *slog.Logger) *diskGuard {
	g := &diskGuard{dir: dir, max: max, minFree: minFree, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	g.measure()
	go g.loop()
	return g
}

func (g *diskGuard) loop() {
	defer close(g.done)
	t := time.NewTicker(diskCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
			g.measure()
		}
	}
}

func (g *diskGuard) close() {
	close(g.stop)
	<-g.done
}

// measure reads the dir's allocated bytes and the file system's free bytes.
func (g *diskGuard) measure() {
	used := dirUsage(g.dir)
	free := freeBytes(g.dir)
	g.used.Store(used)
	g.free.Store(free)
	g.pending.Store(0)
	reason := g.over(used, free, 0)
	g.mu.Lock()
	was := g.reason
	g.reason = reason
	g.mu.Unlock()
	switch {
	case reason != "" && was == "":
		g.log.Warn("disk limit reached: ingest answers 507 until space is freed; delivery goes on", "reason", reason)
	case reason == "" && was != "":
		g.log.Info("disk space is back under the limits: ingest resumes", "used_bytes", used, "free_bytes", free)
	}
}

// over returns which limit used+pending bytes would pass, or "".
func (g *diskGuard) over(used, free, pending int64) string {
	if g.max > 0 && used+pending > g.max {
		return fmt.Sprintf("the log uses %s of max_disk_bytes %s", mib(used+pending), mib(g.max))
	}
	if g.minFree > 0 && free >= 0 && free-pending < g.minFree {
		return fmt.Sprintf("its file system has %s free, below min_free_disk_bytes %s", mib(max(free-pending, 0)), mib(g.minFree))
	}
	return ""
}

// admit counts an append of n body bytes against the limits, or refuses it.
func (g *diskGuard) admit(n int) error {
	if g == nil {
		return nil
	}
	c := int64(n) + appendOverhead
	p := g.pending.Add(c)
	if r := g.over(g.used.Load(), g.free.Load(), p); r != "" {
		g.pending.Add(-c)
		return fmt.Errorf("%w: %s", queue.ErrDiskFull, r)
	}
	return nil
}

func (g *diskGuard) usage() queue.DiskUsage {
	g.mu.Lock()
	r := g.reason
	g.mu.Unlock()
	return queue.DiskUsage{Used: g.used.Load(), Free: g.free.Load(), Full: r != "", Reason: r}
}

// dirUsage sums the bytes allocated to the files under dir. Allocated, not
// apparent: Badger's write-ahead log and value-log files are created sparse
// at twice their size and fill as they are written.
func dirUsage(dir string) int64 {
	var total int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil // a file removed by a compaction meanwhile
		}
		if fi, err := d.Info(); err == nil {
			total += allocated(fi)
		}
		return nil
	})
	return total
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
