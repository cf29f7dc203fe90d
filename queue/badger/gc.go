package badger

import (
	"errors"
	"path/filepath"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"
)

// Value-log garbage collection. Bodies over the value threshold (64 KiB)
// live in Badger's value log, which Compact's deletes do not shrink: Badger
// only rewrites a value-log file when asked, and only once LSM compactions
// have counted its values as discarded. Those compactions follow memtable
// flushes, and with large bodies the memtable holds only small pointers: at
// 1 MiB per event it fills after some 100,000 events, 100 GB of value log.
// So when the value log passes gcFlushAbove, the loop forces a flush and an
// L0 compaction (Badger exposes them only through DropPrefix, here of a
// sentinel key) before asking for GC. That blocks appends for the flush,
// tens of milliseconds, at most once per gcInterval and only for a log that
// holds that much value log (measured in TestValueLogGCReclaimsLargeEvents).
const (
	gcInterval = time.Minute
	// gcDiscardRatio: rewrite a file when half of it is garbage; the
	// rewrite costs reading the whole file and writing the live half.
	gcDiscardRatio = 0.5
	// gcMaxRounds bounds one pass, each round reclaiming at most one file.
	gcMaxRounds = 16
	// gcFlushAbove: four value-log files.
	gcFlushAbove = 4 * valueLogFileSize
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
		for {
			select {
			case <-l.gc.stop:
				return
			case <-t.C:
				l.collectValueLog(gcFlushAbove)
			}
		}
	}()
}

func (l *Log) stopGC() {
	close(l.gc.stop)
	<-l.gc.done
}

// collectValueLog runs rounds until Badger finds nothing worth rewriting,
// first forcing the compactions that find garbage when the value log holds
// more than flushAbove bytes. It returns how many files were rewritten.
func (l *Log) collectValueLog(flushAbove int64) int {
	if valueLogBytes(l.opts.Dir) > flushAbove {
		err := l.db.Update(func(txn *badgerdb.Txn) error { return txn.Set(gcSentinel, nil) })
		if err == nil {
			err = l.db.DropPrefix(gcSentinel)
		}
		if err != nil {
			l.log.Warn("value log gc: forcing a flush", "err", err)
		}
	}
	n := 0
	for range gcMaxRounds {
		err := l.db.RunValueLogGC(gcDiscardRatio)
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
