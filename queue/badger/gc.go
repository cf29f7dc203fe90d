package badger

import (
	"errors"
	"path/filepath"
	"strings"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"
)

// Reclaiming the space of deleted events.
//
// Compact deletes keys; Badger gives their space back only later, and on
// its own only while writes go on:
//
//   - Records over the value threshold (8 KiB: large bodies, and the
//     group records of a busy log) live in the value log, which Badger
//     rewrites only when asked (RunValueLogGC), and only once LSM
//     compactions have counted its values as discarded. Those follow
//     memtable flushes, and with large bodies the memtable holds only small
//     pointers: at 1 MiB per event it fills after some 100,000 events,
//     100 GB of value log.
//   - Smaller records live in the LSM tree, in tables that only a
//     compaction merging them with their tombstones shrinks; the
//     tombstones sit in the memtable until it fills and is flushed.
//
// So the loop forces a memtable flush and an L0 compaction (Badger
// exposes them only through DropPrefix, here of a sentinel key) and then
// asks for value-log GC. The periodic pass does it once the value log
// passes a quarter of the room the log has (the quota, or the file system
// less its floor; at most gcFlushAbove), and only after Compact has
// deleted something: the flush holds writes back for tens of milliseconds
// (measured in TestValueLogGCReclaimsLargeEvents). The pass runs every
// gcInterval, and also each time the committer has written half a
// value-log file: a log taking 100,000 events a second in group records
// writes a file every second, and the compactions its own memtable
// flushes cause count them discarded soon after Compact deletes them
// (measured: with passes only once a minute the data dir grew by 100 MB
// a second; with them, it stayed under 400 MiB, TestValueLogKeptDown).
//
// A log that filled its volume itself never fills its memtable again:
// ingest refuses every append, and a minute is long to answer 507. The
// disk guard kicks the loop while it refuses, which then reclaims at once
// if Compact has deleted events since the last time: flush and L0
// compaction, value-log GC, and if the guard still refuses, Flatten, which
// merges every level (small bodies spread over several). Each reclaim is
// followed by another (reclaimMinWait later, longer while they free
// little) for as long as events go on being deleted, kicked or not: the
// first one that brings the disk under its floor ends the kicks, though
// what is deleted after it is as much garbage. Measured on a
// 256 MiB tmpfs filled to the floor, the events then all compacted (a
// throwaway probe of each step): value-log GC alone freed nothing; the
// flush and GC took 64 KiB bodies from 192 to 63 MiB (the value-log file
// being written is never collected), 60,000-byte bodies from 176 to 0 MiB;
// 1 KiB bodies the flush from 201 to 81 MiB and Flatten to 4 MiB.
// TestReclaimWhenFull and proxy's TestDiskFullOfItsOwnLogComesBack keep
// it so. Compaction writes its tables before it deletes the old ones; the
// disk guard keeps room for that (disk.go), and reclaim checks it.
const (
	gcInterval = time.Minute
	// gcDiscardRatio: rewrite a file when half of it is garbage; the
	// rewrite costs reading the whole file and writing the live half.
	gcDiscardRatio = 0.5
	// gcMaxRounds bounds one pass, each round reclaiming at most one file.
	gcMaxRounds = 16
	// gcFlushAbove: four value-log files, the most the periodic pass lets
	// the value log hold before it forces the compactions that find its
	// garbage.
	gcFlushAbove = 4 * valueLogFileSize
	// reclaimMinWait is the least time between two reclaims while the
	// guard refuses appends. It doubles, up to gcInterval, after each
	// reclaim that freed little: with a backlog that is still owed (a
	// lane behind, deleting a few events a second), each reclaim would
	// otherwise rewrite the tables for nothing.
	reclaimMinWait = time.Second
)

// gcSentinel is the key DropPrefix is asked to drop; it is written just
// before, because DropPrefix does nothing for a prefix with no keys.
var gcSentinel = []byte("m/gc")

type valueLogGC struct {
	stop chan struct{}
	done chan struct{}
}

func (l *Log) startGC(interval time.Duration) {
	l.gc = &valueLogGC{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.gc.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		// l.deleted when the last forced flush and the last reclaim ran.
		// None has run yet: a dir may have been left full of deleted
		// events by the process before.
		var (
			flushedAt, reclaimedAt = ^uint64(0), ^uint64(0)
			wait                   = reclaimMinWait
			next                   time.Time
			// follow runs a reclaim again after each one, whether or not
			// the guard still refuses, for as long as events were deleted
			// in between: a Compact under way when a reclaim ends (its
			// chunks interleave with the reclaim's flush and GC) deletes
			// the rest after it, and once that reclaim has brought the
			// disk under its floor no kick comes for them. Lanes
			// delivering a backlog do the same.
			follow = time.NewTimer(0)
		)
		defer follow.Stop()
		<-follow.C
		// pass is the periodic pass: on the ticker, and sooner on the
		// committer's kick as it fills the value log (the garbage of a
		// busy log is found by the compactions its writes cause anyway,
		// and a minute of it is gigabytes).
		pass := func() {
			d := l.deleted.Load()
			l.collectValueLog(l.gcThreshold(), d != flushedAt)
			flushedAt = d
		}
		reclaim := func() {
			// Only deletions since the last reclaim can have freed
			// anything for it to find.
			d := l.deleted.Load()
			if d == reclaimedAt || time.Now().Before(next) {
				return
			}
			before := dirUsage(l.opts.Dir)
			l.reclaim()
			// The first reclaim runs on a hunch (nothing deleted yet
			// here): what it finds says nothing of the backlog.
			first := reclaimedAt == ^uint64(0)
			reclaimedAt, flushedAt = d, d
			if freed := before - dirUsage(l.opts.Dir); freed < before/8 && !first {
				wait = min(2*wait, gcInterval)
			} else {
				wait = reclaimMinWait
			}
			next = time.Now().Add(wait)
			follow.Reset(wait)
		}
		for {
			select {
			case <-l.gc.stop:
				return
			case <-t.C:
				pass()
			case <-l.vlogKick:
				pass()
			case <-l.reclaimKick:
				reclaim()
			case <-follow.C:
				reclaim()
			}
		}
	}()
}

func (l *Log) stopGC() {
	close(l.gc.stop)
	<-l.gc.done
}

// kickGC asks the loop for a periodic pass now; the committer calls it as
// it fills the value log. It never blocks.
func (l *Log) kickGC() {
	select {
	case l.vlogKick <- struct{}{}:
	default:
	}
}

// kickReclaim asks the loop for a reclaim; the disk guard calls it while
// it refuses appends. It never blocks.
func (l *Log) kickReclaim() {
	select {
	case l.reclaimKick <- struct{}{}:
	default:
	}
}

// gcThreshold is how much value log the periodic pass lets be before it
// forces a flush: a quarter of the room the log may fill, at least one
// file besides the one being written, at most gcFlushAbove.
func (l *Log) gcThreshold() int64 {
	room := int64(gcFlushAbove) * 4
	if g := l.disk; g != nil {
		if g.max > 0 {
			room = min(room, g.max)
		}
		if free := g.free.Load(); free >= 0 && g.minFree > 0 {
			room = min(room, g.used.Load()+free-g.minFree)
		}
	}
	return max(room/4, l.vlogSize)
}

// collectValueLog runs rounds until Badger finds nothing worth rewriting,
// first forcing the compactions that find garbage when the value log holds
// more than flushAbove bytes and flush says events were deleted since the
// last time. It returns how many files were rewritten.
func (l *Log) collectValueLog(flushAbove int64, flush bool) int {
	if flush && valueLogBytes(l.opts.Dir) > flushAbove && l.roomToCompact() {
		l.flushTables()
	}
	return l.runValueLogGC()
}

// roomToCompact: see diskGuard.roomToCompact; true without a guard.
func (l *Log) roomToCompact() bool { return l.disk == nil || l.disk.roomToCompact() }

// reclaim gives back what deleted events hold, whatever their size, while
// the guard refuses appends; see the comment at the top.
//
// Compacting writes the tables' live entries anew before it deletes the
// old tables, and a write the file system has no room for is SIGBUS. The
// guard's floor keeps room for the whole tree (disk.go), but a reclaim may
// follow an overshoot of it; so it first measures what is live and waits
// for the next kick if that does not fit. After the deletions that make a
// reclaim worth it, little is.
func (l *Log) reclaim() {
	if !l.roomToRewrite() {
		l.log.Warn("reclaim: no room on the file system to compact the log's tables yet")
		return
	}
	deleted := int64(l.deletedBytes.Swap(0))
	before := dirUsage(l.opts.Dir)
	l.flushTables()
	l.runValueLogGC()
	// The flush moves the tombstones to the level above the data, and
	// only a compaction of that level with the last drops both; Badger
	// runs it when the level's size says so, which tombstones alone seldom
	// do (seen in TestReclaimWhenFull: 2 KiB events in group records left
	// two thirds of their tables). So merge the levels also when the flush
	// gave back less than half of what Compact deleted from the tree since
	// the last reclaim, not only when the guard still refuses.
	if l.disk == nil || !l.roomToRewrite() {
		return
	}
	if l.disk.measure() == "" && before-dirUsage(l.opts.Dir) >= deleted/2 {
		return
	}
	// One worker: a second finds nothing left to compact and says so as a
	// warning.
	if err := l.db.Flatten(1); err != nil {
		l.log.Warn("reclaim: flatten", "err", err)
	}
	l.runValueLogGC()
	l.disk.measure()
}

// rewriteSlack is room a compaction needs besides its live entries: one
// memtable flushed into L0 (the tombstones), table indexes and blooms.
const rewriteSlack = 16 << 20

// roomToRewrite reports whether the file system has room to write every
// live entry of the tree again, with a quarter more for what an entry
// costs in a table beyond its key and value.
func (l *Log) roomToRewrite() bool {
	if l.disk == nil || l.disk.minFree <= 0 {
		return true
	}
	free := freeBytes(l.opts.Dir)
	if free < 0 {
		return true
	}
	live := l.liveTreeBytes()
	return free >= live+live/4+rewriteSlack
}

// liveTreeBytes is what the tree holds that is not deleted: every live
// key, with its value where the tree keeps it (below valueThreshold) and a
// value-log pointer where it does not. A key-only scan; reclaim runs it at
// most once a second, and less often while reclaims free little.
func (l *Log) liveTreeBytes() int64 {
	var n int64
	l.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			v := item.ValueSize()
			if v >= valueThreshold {
				v = 16
			}
			n += int64(len(item.Key())) + v + 16 // version and meta
		}
		return nil
	})
	return n
}

// flushTables forces a memtable flush and an L0 compaction. Writes wait
// for it (writeMu).
func (l *Log) flushTables() {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	err := l.db.Update(func(txn *badgerdb.Txn) error { return txn.Set(gcSentinel, nil) })
	if err == nil {
		err = l.db.DropPrefix(gcSentinel)
	}
	if err != nil {
		l.log.Warn("value log gc: forcing a flush", "err", err)
	}
}

// runValueLogGC runs value-log GC rounds, each with writes held back
// (writeMu): Badger v4.9.6's rewrite reads the memtable's max version
// (MaxVersion, under db.lock) while a write may be setting it
// (memTable.Put, without), a data race the race detector reports. Writes
// go on between rounds: a round rewrites one file, tens of milliseconds
// for a 64 MiB one. A round with nothing to rewrite returns at once.
func (l *Log) runValueLogGC() int {
	n := 0
	for range gcMaxRounds {
		l.writeMu.Lock()
		err := l.db.RunValueLogGC(gcDiscardRatio)
		l.writeMu.Unlock()
		if err != nil {
			if !errors.Is(err, badgerdb.ErrNoRewrite) && !errors.Is(err, badgerdb.ErrRejected) {
				l.log.Warn("value log gc", "err", err)
			}
			break
		}
		n++
	}
	return n
}

// valueLogBytes is the space the value-log files take.
func valueLogBytes(dir string) int64 {
	files, _ := filepath.Glob(filepath.Join(dir, "*.vlog"))
	var total int64
	for _, f := range files {
		total += dirUsage(f)
	}
	return total
}

// inTree reports whether a data-dir file is part of the LSM tree: a table
// or a memtable's write-ahead log.
func inTree(name string) bool {
	return strings.HasSuffix(name, ".sst") || strings.HasSuffix(name, ".mem")
}
