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
	tables  atomic.Int64 // bytes of the LSM tree (tables and write-ahead logs), part of used
	pending atomic.Int64 // bytes admitted since the last measurement
	// pendingTree is the part of pending that will be in the tree: the
	// bodies below the value threshold, and every event's keys.
	pendingTree atomic.Int64

	// onFull is called after each measurement over a limit and each
	// refused append (the log's reclaim kick: it never blocks). Both: the
	// last measurement may be under the floor by less than an event.
	onFull func()

	mu     sync.Mutex
	reason string // non-empty while the last measurement was over a limit

	stop chan struct{}
	done chan struct{}
}

func newDiskGuard(dir string, max, minFree int64, log *slog.Logger, onFull func()) *diskGuard {
	g := &diskGuard{dir: dir, max: max, minFree: minFree, log: log, onFull: onFull, stop: make(chan struct{}), done: make(chan struct{})}
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

// measure reads the dir's allocated bytes and the file system's free
// bytes, and returns which limit they are over ("" for none).
func (g *diskGuard) measure() string {
	used, tables := usage(g.dir)
	free := freeBytes(g.dir)
	g.used.Store(used)
	g.tables.Store(tables)
	g.free.Store(free)
	g.pending.Store(0)
	g.pendingTree.Store(0)
	reason := g.over(used, free, 0, tables)
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
	if reason != "" && g.onFull != nil {
		g.onFull()
	}
	return reason
}

// over returns which limit used+pending bytes would pass, or "".
//
// The floor grows by the size of the LSM tree: a compaction writes its
// new tables before it deletes the old ones, so it may need as much again
// as it reads, and a write through mmap into space the file system does
// not have is SIGBUS. Measured on a 256 MiB tmpfs: 16 KiB bodies stopped
// at the bare 64 MiB floor with 184 MiB of tables, and Badger's own L0
// compaction killed the process; 60,000-byte bodies, with the tables alone
// reserved, stopped with 48 MiB still in memtables, whose flush made L0
// too big for the room left. So the write-ahead logs (the memtables' data,
// tables to be) count too. Bodies in the value log leave the tree small
// and the floor about as it was.
func (g *diskGuard) over(used, free, pending, tables int64) string {
	if g.max > 0 && used+pending > g.max {
		return fmt.Sprintf("the log uses %s of max_disk_bytes %s", mib(used+pending), mib(g.max))
	}
	if g.minFree > 0 && free >= 0 && free-pending < g.minFree+tables {
		if tables < 1<<20 {
			return fmt.Sprintf("its file system has %s free, below min_free_disk_bytes %s", mib(max(free-pending, 0)), mib(g.minFree))
		}
		return fmt.Sprintf("its file system has %s free, below min_free_disk_bytes %s plus the %s Badger may need to compact the log's tables",
			mib(max(free-pending, 0)), mib(g.minFree), mib(tables))
	}
	return ""
}

// roomToCompact reports whether, by the last measurement, the file system
// has room for a compaction that rewrites the whole tree (Flatten).
func (g *diskGuard) roomToCompact() bool {
	free := g.free.Load()
	return g.minFree <= 0 || free < 0 || free >= g.tables.Load()
}

// admit counts an append of n body bytes against the limits, or refuses it.
func (g *diskGuard) admit(n int) error {
	if g == nil {
		return nil
	}
	c, t := appendCost(n)
	return g.admitCost(c, t)
}

// admitAll admits the bodies of a batch together: all or none.
func (g *diskGuard) admitAll(evs []*queue.Event) error {
	if g == nil {
		return nil
	}
	var c, t int64
	for _, ev := range evs {
		ec, et := appendCost(len(ev.Body))
		c, t = c+ec, t+et
	}
	return g.admitCost(c, t)
}

// appendCost is what appending a body of n bytes adds to the data dir (c)
// and to its LSM tree (t).
func appendCost(n int) (c, t int64) {
	c = int64(n) + appendOverhead
	t = int64(appendOverhead)
	if n < valueThreshold {
		t = c
	}
	return c, t
}

// admitCost admits c bytes, t of them in the tree, or refuses them all.
func (g *diskGuard) admitCost(c, t int64) error {
	p, pt := g.pending.Add(c), g.pendingTree.Add(t)
	if r := g.over(g.used.Load(), g.free.Load(), p, g.tables.Load()+pt); r != "" {
		g.pending.Add(-c)
		g.pendingTree.Add(-t)
		if g.onFull != nil {
			g.onFull()
		}
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
	total, _ := usage(dir)
	return total
}

// usage is dirUsage, and the part of it in the LSM tree: tables and the
// write-ahead logs of memtables.
func usage(dir string) (total, tree int64) {
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil // a file removed by a compaction meanwhile
		}
		if fi, err := d.Info(); err == nil {
			n := allocated(fi)
			total += n
			if inTree(d.Name()) {
				tree += n
			}
		}
		return nil
	})
	return total, tree
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
