// Package badger is sluice's embedded log: a queue.Store over Badger in one
// data dir. It owns everything of a sidecar that must survive a crash.
//
// Guarantees (besides those of queue.Store):
//
//   - Append returns only after the event is written (and, with Options.Sync,
//     fsynced). Concurrent appends are gathered by one committer goroutine
//     into one transaction and one sync (group commit): Badger with
//     SyncWrites syncs once per transaction, which caps durable appends near
//     5k/s; one sync per batch lets many producers share it.
//   - Sequence numbers are assigned by the committer, strictly increasing,
//     never reused (the head is persisted with every batch, so compaction of
//     the whole log does not rewind it).
//   - Append is idempotent on the event id within Options.DedupWindow.
//   - Membership (Join/Leave) is ordered against appends: a subscription that
//     joins is entitled to exactly the events appended after it joined.
//   - A cursor, retry record or dead letter that a call wrote is kept across
//     process crashes; with Sync, across power loss once SaveCursors (which
//     syncs) has returned after it.
//   - Open refuses a data dir that another process holds, that is not a
//     sluice data dir, or that Badger would wipe or crash on (datadir.go),
//     and repairs none by deleting data.
//
// All methods are safe for concurrent use.
//
// Files: badger.go opens and closes; append.go is the group committer;
// read.go reads events; member.go memberships and cursors; outcome.go,
// retry.go and deadletter.go the delivery state; records.go the admin
// API's records; compact.go, gc.go and disk.go bound the space;
// recover.go rebuilds memory on open; datadir.go checks a dir before
// Badger touches it; key.go and encoding.go are the layout below.
//
// Key layout (all integers big endian):
//
//	m/format                        format version of the data dir (key.go)
//	m/head                          last assigned sequence number
//	m/low                           compaction boundary: no event below it but those retries hold
//	m/indexed                       every event up to it has its i/ entry (format 5; dedup.go)
//	e/<seq:8>                       event: version | id | type | content type | accepted-at | body;
//	                                or a group (format 6): the events of one batch up to seq (encoding.go)
//	i/<event id>                    seq:8 | type, Badger TTL = dedup window, written after e/ (dedup.go)
//	s/<subscription>                membership JSON: from, until, paused, config snapshot
//	c/<subscription>                cursor seq:8
//	r/<subscription>/<due:8><seq:8> retry JSON: attempt, first attempt, last status/error, replay
//	q/<subscription>/<seq:8>        due:8 of that retry record (RetryOf's index)
//	d/<subscription>/<seq:8>        dead letter: version | JSON header | body copy
//	a/<record key>                  an admin record (queue.Records: tenant token hashes), as given
package badger

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/queue"
)

// valueThreshold: values this size and larger go to the value log, smaller
// ones stay in the LSM tree (see Open).
const valueThreshold = 8 << 10

// valueLogFileSize is the size of one Badger value-log file (records of
// 8 KiB and more); GC reclaims whole files, never the one being written.
// It also bounds one record (Badger refuses a value larger than a file),
// so it stays at max_body_bytes' ceiling. A log
// with less room than eight such files gets smaller ones (vlogFileSize):
// on a 128 MiB volume the file being written could otherwise hold every
// body up to the floor, and never be collected.
const valueLogFileSize = 64 << 20

// vlogFileSize is the value-log file size for a log with this much room
// (queue.DefaultMinFreeBytes and the quota applied): an eighth of it,
// between Badger's least (1 MiB) and valueLogFileSize. Badger reads files
// of any size, so it may change from one Open to the next.
func vlogFileSize(room int64) int64 { return min(max(room/8, 1<<20), valueLogFileSize) }

// roomAtOpen is the space the log in dir may fill: the quota, or what its
// file system has free (measured at the nearest existing parent of a dir
// not made yet) plus what the log holds already, less the floor.
func roomAtOpen(dir string, quota, minFree int64) int64 {
	room := int64(1) << 62
	if quota > 0 {
		room = quota
	}
	if minFree <= 0 {
		return room
	}
	at := dir
	for {
		if _, err := os.Stat(at); err == nil || filepath.Dir(at) == at {
			break
		}
		at = filepath.Dir(at)
	}
	if free := freeBytes(at); free >= 0 {
		room = min(room, dirUsage(dir)+free-minFree)
	}
	return room
}

// Batch bounds for the group committer: large enough to share one sync among
// all producers of a busy moment, small enough to stay far below Badger's
// transaction limit.
const (
	maxBatchEvents = 1024
	maxBatchBytes  = 4 << 20
	// groupMaxBytes bounds a group record (format 6, key.go): about 30
	// events of 512 bytes in one Badger entry, well below the value
	// threshold so that groups stay in the LSM tree, and small enough
	// that reading one event of it, or copying out the few a retry
	// holds, costs little.
	groupMaxBytes = 16 << 10
)

// Options configure a Log. The zero value of each field but Dir is usable.
type Options struct {
	// Dir is the Badger directory; created if missing.
	Dir string
	// Sync makes Append wait for fsync (durability: fsync). Without it an
	// accepted event survives a process crash but not power loss.
	Sync bool
	// DedupWindow is how long an event id is remembered;
	// queue.DefaultDedupWindow if 0. Badger expires ids to the second.
	DedupWindow time.Duration
	// OnCommit, if set, is called by the committer goroutine after each batch
	// is durable, with its new events in sequence order, before the appenders
	// are answered. It must not block and must not modify the events.
	OnCommit func([]*queue.Event)
	// Logger receives Badger's warnings and errors; slog.Default() if nil.
	Logger *slog.Logger
	// MaxDiskBytes is the disk quota of the data dir; 0 means none. Past
	// it Append returns queue.ErrDiskFull.
	MaxDiskBytes int64
	// MinFreeBytes is the free space Append leaves on the data dir's file
	// system (queue.ErrDiskFull below it); queue.DefaultMinFreeBytes if 0,
	// none if < 0.
	MinFreeBytes int64
	// Registerer receives the log's metrics (metrics.go) until Close; nil
	// registers none.
	Registerer prometheus.Registerer
	// AcceptDataLoss opens a dir whose write-ahead or newest value log is
	// damaged in the middle (intact records after a bad one), which Open
	// otherwise refuses: Badger cuts the log at the damage and the records
	// after it are gone. Open logs what was dropped, and keeps new
	// sequence numbers above every one the dropped part named. It is
	// meant for one start after an operator has chosen the loss over a
	// backup (sluice serve --accept-data-loss), not as a standing setting.
	AcceptDataLoss bool
	// Memory sizes what the log keeps in memory; a zero field takes
	// DefaultMemory's value.
	Memory Memory
}

// Memory is what the log may keep in memory, part by part. The server
// derives it from its one memory budget (proxy.SplitMemory).
type Memory struct {
	// MemTable is the size of one memtable: the one being written and,
	// while flushes lag behind it, up to two more waiting for theirs
	// (NumMemtables). Each is an arena of about 1.3 times this on the
	// heap, and its write-ahead file (mapped, twice this) is what a sync
	// flushes.
	MemTable int64
	// BlockCache caches table blocks read back. Lanes
	// that keep up read events from the server's ring, not the log; only
	// a lane behind reads blocks, once each, so the cache mostly serves
	// the retry scheduler's and the dead letters' re-reads.
	BlockCache int64
	// IndexCache bounds the tables' indexes and Bloom filters held in
	// memory.
	IndexCache int64
	// IDFilter bounds the Bloom filter of recent event ids that spares
	// most appends a dedup lookup (idfilter.go).
	IDFilter int64
}

// DefaultMemory is the log's share of the default memory budget.
var DefaultMemory = Memory{MemTable: 4 << 20, BlockCache: 2 << 20, IndexCache: 1 << 20, IDFilter: 2 << 20}

func (m Memory) withDefaults() Memory {
	d := DefaultMemory
	return Memory{MemTable: cmp.Or(m.MemTable, d.MemTable), BlockCache: cmp.Or(m.BlockCache, d.BlockCache),
		IndexCache: cmp.Or(m.IndexCache, d.IndexCache), IDFilter: cmp.Or(m.IDFilter, d.IDFilter)}
}

// Log is the durable log and delivery state in one data dir. Create it
// with Open; Close it when done.
type Log struct {
	db   *badgerdb.DB
	opts Options
	log  *slog.Logger

	closeMu sync.RWMutex // Append holds it shared while sending to reqs
	closed  bool
	reqs    chan *appendReq
	done    chan struct{} // closed when the committer has exited

	seqMu    sync.Mutex    // held while a batch assigns and writes sequence numbers
	assigned atomic.Uint64 // last seq written (not yet synced, with Sync)
	head     atomic.Uint64 // last seq durable and published
	lastSync atomic.Int64  // unix nanos of the last fsync
	syncing  atomic.Int64  // batches handed to the syncer, not yet published
	low      atomic.Uint64 // no event below low exists (compaction boundary)

	refMu     sync.Mutex
	retryRefs map[uint64]int32    // seq → retry records that still need the event
	held      map[uint64]struct{} // events below low kept for retries
	released  []uint64            // events below low no retry needs any more, not yet deleted

	// stateMu serialises the read-modify-write transactions of retry
	// records and dead letters (Record, Replay): Badger runs without
	// conflict detection, so two of them could otherwise both read a
	// letter as it was and both write (two replays of one letter, or a
	// replay's history lost to a dead-lettering). Membership writes take
	// seqMu instead; whoever takes both takes seqMu first.
	stateMu sync.Mutex
	// compactMu keeps Compact calls one at a time.
	compactMu sync.Mutex
	// writeMu is held shared around every write and exclusively while
	// the reclaim forces a flush (DropPrefix), during which Badger fails
	// writes (ErrBlockedWrites) rather than holding them: with it they
	// wait. Taken last, after any other lock, and never twice by one call.
	writeMu sync.RWMutex

	// The dedup index (dedup.go). ids and idsOld are the ids the
	// committer wrote lately, the newer generation first: every event
	// past idsLow is in one of them. idsMax and idsOldMax are the last seq
	// of each. The committer writes them, Lookup reads them.
	idsMu     sync.RWMutex
	ids       map[string]idEntry
	idsOld    map[string]idEntry
	idsLow    uint64
	idsMax    uint64
	idsOldMax uint64
	// indexed: every event up to it has its i/ entry (m/indexed).
	indexed   atomic.Uint64
	indexMu   sync.Mutex // one index write at a time; guards idxEnts, idxArena
	idxEnts   []badgerdb.Entry
	idxArena  []byte
	pendMu    sync.Mutex
	pend      []indexBatch // published events without i/ entries, in seq order
	indexKick chan struct{}
	indexStop chan struct{}
	indexDone chan struct{}
	filter    *idFilter     // ids written within the window (idfilter.go)
	fillDone  chan struct{} // closed when fillFilter has returned

	disk *diskGuard // nil when neither disk limit is set
	m    *metrics
	gc   *valueLogGC
	// deleted counts the events Compact has deleted since Open: the
	// reclaim loop reclaims only once it has moved.
	deleted atomic.Uint64
	// deletedBytes is what the records Compact deleted since the last
	// reclaim held in the LSM tree (their values), for the reclaim to
	// judge its flush by.
	deletedBytes atomic.Uint64
	reclaimKick  chan struct{}
	// vlogKick asks the GC loop for a pass: the committer sends it each
	// time it has written half a value-log file (vlogWritten, its own).
	vlogKick    chan struct{}
	vlogWritten int64
	vlogSize    int64 // bytes of one value-log file (vlogFileSize)

	corruptMu sync.Mutex
	corrupt   map[uint64]struct{} // last seqs of the unreadable records reported (reportCorrupt)
}

var (
	_ queue.Store             = (*Log)(nil)
	_ queue.DeadLetterTrimmer = (*Log)(nil)
)

// Open opens (or creates) the log in opts.Dir, recovers the head, the
// compaction boundary and the retry references, and starts the committer.
// It refuses a dir another process holds (ErrLocked), one that is not a
// sluice data dir (ErrNotDataDir) and one that looks damaged (ErrCorrupt),
// with an error that names the dir; it repairs none by deleting data.
func Open(opts Options) (_ *Log, err error) {
	if opts.Dir == "" {
		return nil, errors.New("open queue: empty data dir")
	}
	if opts.DedupWindow <= 0 {
		opts.DedupWindow = queue.DefaultDedupWindow
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	minFree := opts.MinFreeBytes
	if minFree == 0 {
		minFree = queue.DefaultMinFreeBytes
	}
	vlogSize := vlogFileSize(roomAtOpen(opts.Dir, opts.MaxDiskBytes, minFree))
	mem := opts.Memory.withDefaults()
	// Sizes come from the memory budget (Options.Memory). A record of
	// 8 KiB or more goes to the value log: a group record once a dozen
	// 512-byte events share a group commit (a busy log), or a large body.
	// In the LSM tree every byte is copied by the write-ahead log, the
	// memtable, the table its flush builds and each compaction after it,
	// and each table is msynced: with every record in the tree, group
	// commits of 100-event batches spent 12–15 µs of CPU per 512-byte
	// event, over half of it in flushes and compactions; through the
	// value log 4.7–5.2 µs (BenchmarkAppendBatch), and single appends
	// 3.8 against 12 µs without fsync. What the value log costs instead is
	// its GC, which the committer asks for as it writes (gc.go). Smaller
	// records, a quiet log's, stay in the tree: their space comes back
	// with compaction alone, and reading them back needs no second
	// lookup. Badger msyncs whole
	// mappings on Sync, so the memtable (its WAL is twice its size) and
	// value-log files stay small: with the 1 GiB default every sync cost
	// about 2 ms even when idle.
	bopts := badgerdb.DefaultOptions(opts.Dir).
		WithSyncWrites(false). // we sync per batch ourselves; see package doc
		WithLogger(badgerLogger{log}).
		WithNumVersionsToKeep(1).
		WithDetectConflicts(false).
		WithMemTableSize(mem.MemTable).
		// At most two memtables wait for their flush beside the one
		// written (Badger's default is five): more would only let a burst
		// run further ahead of the flush, on the heap.
		WithNumMemtables(2).
		WithBlockCacheSize(mem.BlockCache).
		WithIndexCacheSize(mem.IndexCache).
		WithValueThreshold(valueThreshold).
		WithNumCompactors(2).
		WithValueLogFileSize(vlogSize).
		// Events live for seconds: compressing them into tables that
		// compaction soon rewrites or drops costs CPU for nothing.
		WithCompression(options.None).
		WithMetricsEnabled(false)
	// Refuse a dir Badger would wipe or crash on before it touches it
	// (datadir.go). A panic left in the open path is damage too.
	damage, err := checkDataDir(opts.Dir, bopts)
	if err != nil {
		return nil, err
	}
	// floor: no new event may take a seq at or below it (recover).
	var floor uint64
	for _, d := range damage {
		if !opts.AcceptDataLoss {
			return nil, &dirError{opts.Dir, queue.ErrCorrupt, d}
		}
		log.Error("data dir damaged; opening it anyway (accept data loss): the records after the damage are dropped",
			"data_dir", opts.Dir, "file", d.file, "offset", d.offset, "records_dropped", d.lost, "max_seq_dropped", d.maxSeq)
		floor = max(floor, d.maxSeq)
	}
	var db *badgerdb.DB
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				db.Close()
			}
			err = &dirError{opts.Dir, queue.ErrCorrupt, fmt.Errorf("opening it panicked: %v", firstLine(r))}
		}
	}()
	if db, err = badgerdb.Open(bopts); err != nil {
		return nil, openError(opts.Dir, err)
	}
	if err := checkOwned(db, opts.Dir); err != nil {
		db.Close()
		return nil, err
	}
	l := &Log{
		db:        db,
		opts:      opts,
		log:       log,
		reqs:      make(chan *appendReq, 4*maxBatchEvents),
		done:      make(chan struct{}),
		retryRefs: map[uint64]int32{},
		held:      map[uint64]struct{}{},
		vlogSize:  vlogSize,
		corrupt:   map[uint64]struct{}{},
		ids:       map[string]idEntry{},
		idsOld:    map[string]idEntry{},
		indexKick: make(chan struct{}, 1),
		indexStop: make(chan struct{}),
		indexDone: make(chan struct{}),
		filter:    newIDFilter(opts.DedupWindow, time.Now(), mem.IDFilter),
		fillDone:  make(chan struct{}),
		// Buffered: a kick of the guard waits in it while a reclaim runs.
		reclaimKick: make(chan struct{}, 1),
		vlogKick:    make(chan struct{}, 1),
	}
	l.m = newMetrics(opts.Registerer, l)
	if err := l.recover(floor); err != nil {
		db.Close()
		if errors.Is(err, queue.ErrCorrupt) {
			return nil, &dirError{opts.Dir, queue.ErrCorrupt, err}
		}
		return nil, fmt.Errorf("open queue %s: %w", opts.Dir, err)
	}
	if opts.MaxDiskBytes > 0 || minFree > 0 {
		l.disk = newDiskGuard(opts.Dir, opts.MaxDiskBytes, max(minFree, 0), log, l.kickReclaim)
	}
	l.startGC(gcInterval)
	go l.indexer(l.indexStop, l.indexDone)
	go func() {
		defer close(l.fillDone)
		l.fillFilter(l.indexStop)
	}()
	go l.committer()
	// Last, so that a scrape never sees a half-made log.
	if err := l.m.register(); err != nil {
		l.Close()
		return nil, fmt.Errorf("open queue %s: %w", opts.Dir, err)
	}
	return l, nil
}

// update is db.Update under writeMu.
func (l *Log) update(f func(txn *badgerdb.Txn) error) error {
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	return l.db.Update(f)
}

// Close stops accepting appends, commits those already queued, and closes
// Badger. It is safe to call more than once.
func (l *Log) Close() error {
	l.closeMu.Lock()
	if l.closed {
		l.closeMu.Unlock()
		return nil
	}
	l.closed = true
	close(l.reqs)
	l.closeMu.Unlock()
	<-l.done
	close(l.indexStop)
	<-l.indexDone
	<-l.fillDone
	// What the indexer had not written yet; Open would write it too.
	ierr := l.index()
	l.stopGC()
	if l.disk != nil {
		l.disk.close()
	}
	l.m.unregister()
	if err := l.db.Close(); err != nil {
		return err
	}
	return ierr
}

// DiskUsage returns the last measurement of the data dir's disk use; the
// zero value with Free -1 when no disk limit is set.
func (l *Log) DiskUsage() queue.DiskUsage {
	if l.disk == nil {
		return queue.DiskUsage{Free: -1}
	}
	return l.disk.usage()
}

// Head returns the last assigned sequence number (0 for an empty log).
func (l *Log) Head() uint64 { return l.head.Load() }

// badgerLogger passes Badger's warnings and errors to slog; its info and
// debug chatter is dropped.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any) {
	// A value Badger cannot read it logs on every read, in several lines,
	// and hands over empty; the event then fails to decode, and
	// reportCorrupt names it once.
	if strings.HasPrefix(f, "Unable to read: ") || strings.HasPrefix(f, "Key: %v, Version : %v") {
		return
	}
	b.l.Error("badger: " + fmt.Sprintf(f, a...))
}

func (b badgerLogger) Warningf(f string, a ...any) { b.l.Warn("badger: " + fmt.Sprintf(f, a...)) }

func (b badgerLogger) Infof(string, ...any) {}

func (b badgerLogger) Debugf(string, ...any) {}
