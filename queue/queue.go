// Package queue is sluice's durable log over Badger: it owns everything that
// must survive a crash.
//
// Guarantees:
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
//
// All methods are safe for concurrent use.
//
// Key layout (all integers big endian):
//
//	m/format                       format version of the data dir
//	m/head                         last assigned sequence number
//	m/low                          compaction boundary: no event below it but those retries hold
//	e/<seq:8>                      event: version | id | type | content type | accepted-at | body
//	i/<event id>                   seq:8 | type, Badger TTL = dedup window
//	s/<subscription>               membership JSON: from, until, config snapshot
//	c/<subscription>               cursor seq:8
//	r/<subscription>/<due:8><seq:8> retry JSON: attempt, first attempt, last status/error
//	d/<subscription>/<seq:8>       dead letter: version | JSON header | body copy
package queue

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// DefaultDedupWindow is how long an event id is remembered (DESIGN.md §4).
const DefaultDedupWindow = 24 * time.Hour

// valueLogFileSize is the size of one Badger value-log file (bodies over
// 64 KiB); GC reclaims whole files.
const valueLogFileSize = 64 << 20

// Batch bounds for the group committer: large enough to share one sync among
// all producers of a busy moment, small enough to stay far below Badger's
// transaction limit.
const (
	maxBatchEvents = 1024
	maxBatchBytes  = 4 << 20
)

// Options configure a Queue. The zero value of each field but Dir is usable.
type Options struct {
	// Dir is the Badger directory; created if missing.
	Dir string
	// Sync makes Append wait for fsync (durability: fsync). Without it an
	// accepted event survives a process crash but not power loss.
	Sync bool
	// DedupWindow is how long an event id is remembered; DefaultDedupWindow if 0.
	DedupWindow time.Duration
	// OnCommit, if set, is called by the committer goroutine after each batch
	// is durable, with its new events in sequence order, before the appenders
	// are answered. It must not block and must not modify the events.
	OnCommit func([]*Event)
	// Logger receives Badger's warnings and errors; slog.Default() if nil.
	Logger *slog.Logger
	// MaxDiskBytes is the disk quota of the data dir; 0 means none. Past
	// it Append returns ErrDiskFull.
	MaxDiskBytes int64
	// MinFreeBytes is the free space Append leaves on the data dir's file
	// system (ErrDiskFull below it); DefaultMinFreeBytes if 0, none if < 0.
	MinFreeBytes int64
}

// Queue is the durable log. Create it with Open; Close it when done.
type Queue struct {
	db   *badger.DB
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

	disk *diskGuard // nil when neither disk limit is set
	gc   *valueLogGC
}

var _ Store = (*Queue)(nil)

type appendReq struct {
	ev   *Event
	seq  uint64
	dup  bool
	err  error
	done chan struct{}
}

var reqPool = sync.Pool{New: func() any { return &appendReq{done: make(chan struct{}, 1)} }}

// Open opens (or creates) the log in opts.Dir, recovers the head, the
// compaction boundary and the retry references, and starts the committer.
// It refuses a dir another process holds (ErrLocked), one that is not a
// sluice data dir (ErrNotDataDir) and one that looks damaged (ErrCorrupt),
// with an error that names the dir; it repairs none by deleting data.
func Open(opts Options) (_ *Queue, err error) {
	if opts.Dir == "" {
		return nil, errors.New("open queue: empty data dir")
	}
	if opts.DedupWindow <= 0 {
		opts.DedupWindow = DefaultDedupWindow
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	// Sizes suit a sidecar: modest memtables and caches. Values up to 64 KiB
	// stay in the LSM tree, so typical events never touch the value log,
	// whose write path allocates a buffer the size of each batch (a second
	// heap copy of every body). Larger ones go to the value log: in the LSM
	// tree a 64 KiB body is copied again by every memtable flush and table
	// build (measured: 8 copies per event against 1). Badger msyncs whole
	// mappings on Sync, so the memtable (its WAL is twice its size) and
	// value-log files stay small: with the 1 GiB default every sync cost
	// about 2 ms even when idle.
	bopts := badger.DefaultOptions(opts.Dir).
		WithSyncWrites(false). // we sync per batch ourselves; see package doc
		WithLogger(badgerLogger{log}).
		WithNumVersionsToKeep(1).
		WithDetectConflicts(false).
		WithMemTableSize(16 << 20).
		WithNumMemtables(3).
		WithBlockCacheSize(32 << 20).
		WithIndexCacheSize(16 << 20).
		WithValueThreshold(64 << 10).
		WithNumCompactors(2).
		WithValueLogFileSize(valueLogFileSize).
		// Events live for seconds: compressing them into tables that
		// compaction soon rewrites or drops costs CPU for nothing.
		WithCompression(options.None).
		WithMetricsEnabled(false)
	// Refuse a dir Badger would wipe or crash on before it touches it
	// (datadir.go). A panic left in the open path is damage too.
	if err := checkDataDir(opts.Dir, bopts); err != nil {
		return nil, err
	}
	var db *badger.DB
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				db.Close()
			}
			err = &dirError{opts.Dir, ErrCorrupt, fmt.Errorf("opening it panicked: %v", firstLine(r))}
		}
	}()
	if db, err = badger.Open(bopts); err != nil {
		return nil, openError(opts.Dir, err)
	}
	if err := checkOwned(db, opts.Dir); err != nil {
		db.Close()
		return nil, err
	}
	q := &Queue{
		db:        db,
		opts:      opts,
		log:       log,
		reqs:      make(chan *appendReq, 4*maxBatchEvents),
		done:      make(chan struct{}),
		retryRefs: map[uint64]int32{},
		held:      map[uint64]struct{}{},
	}
	if err := q.recover(); err != nil {
		db.Close()
		if errors.Is(err, ErrCorrupt) {
			return nil, &dirError{opts.Dir, ErrCorrupt, err}
		}
		return nil, fmt.Errorf("open queue %s: %w", opts.Dir, err)
	}
	minFree := opts.MinFreeBytes
	if minFree == 0 {
		minFree = DefaultMinFreeBytes
	}
	if opts.MaxDiskBytes > 0 || minFree > 0 {
		q.disk = newDiskGuard(opts.Dir, opts.MaxDiskBytes, max(minFree, 0), log)
	}
	q.startGC(gcInterval)
	go q.committer()
	return q, nil
}

// recover checks the format version, upgrades a dir of an older format,
// and rebuilds the in-memory state: head, compaction boundary, retry
// references, and the events below the boundary still on disk.
func (q *Queue) recover() error {
	var format uint64 // 0: no format key yet (a new dir)
	err := q.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(keyFormat)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		if len(v) != 8 {
			return fmt.Errorf("format version: %w", ErrCorrupt)
		}
		format = binary.BigEndian.Uint64(v)
		return nil
	})
	if err != nil {
		return err
	}
	if format > formatVersion {
		return fmt.Errorf("format %d, this sluice reads up to %d: %w", format, formatVersion, ErrNewerFormat)
	}
	// Format 3 added the retry index (key.go); an older dir gets it built
	// from its retry records before m/format says 3, so a crash during the
	// upgrade leaves an older format that is upgraded again.
	var index *badger.WriteBatch
	if format < 3 {
		index = q.db.NewWriteBatch()
		defer index.Cancel()
	}
	err = q.db.View(func(txn *badger.Txn) error {
		var head uint64
		if item, err := txn.Get(keyHead); err == nil {
			v, err := item.ValueCopy(nil)
			if err != nil || len(v) != 8 {
				return fmt.Errorf("head: %w", ErrCorrupt)
			}
			head = binary.BigEndian.Uint64(v)
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		low := uint64(1)
		if item, err := txn.Get(keyLow); err == nil {
			v, err := item.ValueCopy(nil)
			if err != nil || len(v) != 8 {
				return fmt.Errorf("compaction boundary: %w", ErrCorrupt)
			}
			low = binary.BigEndian.Uint64(v)
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		// The last event key can only be past m/head if a write of the head
		// was lost; trust the log.
		rit := txn.NewIterator(badger.IteratorOptions{Prefix: prefixEvent, Reverse: true})
		defer rit.Close()
		if rit.Seek(eventKey(^uint64(0))); rit.Valid() {
			head = max(head, seqFromEventKey(rit.Item().Key()))
		}
		q.head.Store(head)
		q.assigned.Store(head)
		q.low.Store(low)
		retries := txn.NewIterator(badger.IteratorOptions{Prefix: prefixRetry})
		defer retries.Close()
		for retries.Rewind(); retries.Valid(); retries.Next() {
			k := retries.Item().Key()
			if len(k) < len(prefixRetry)+18 {
				return fmt.Errorf("retry key: %w", ErrCorrupt)
			}
			seq := binary.BigEndian.Uint64(k[len(k)-8:])
			q.retryRefs[seq]++
			if index != nil {
				sub := string(k[len(prefixRetry) : len(k)-17])
				if err := index.Set(retryIndexKey(sub, seq), bytes.Clone(k[len(k)-16:len(k)-8])); err != nil {
					return fmt.Errorf("index retries: %w", err)
				}
			}
		}
		// Events below the boundary are those retries hold, and those a
		// Compact freed but had not deleted when the process stopped: the
		// next Compact deletes the latter.
		eit := txn.NewIterator(badger.IteratorOptions{Prefix: prefixEvent})
		defer eit.Close()
		for eit.Rewind(); eit.Valid(); eit.Next() {
			seq := seqFromEventKey(eit.Item().Key())
			if seq >= low {
				break
			}
			if q.retryRefs[seq] > 0 {
				q.held[seq] = struct{}{}
			} else {
				q.released = append(q.released, seq)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if index != nil {
		if err := index.Flush(); err != nil {
			return fmt.Errorf("index retries: %w", err)
		}
	}
	if format < formatVersion {
		// Every older format is readable as it is (key.go); rewriting
		// m/format makes an older sluice refuse the dir rather than misread it.
		if err := q.db.Update(func(txn *badger.Txn) error { return txn.Set(keyFormat, u64(formatVersion)) }); err != nil {
			return fmt.Errorf("write format version: %w", err)
		}
	}
	return nil
}

// Close stops accepting appends, commits those already queued, and closes
// Badger. It is safe to call more than once.
func (q *Queue) Close() error {
	q.closeMu.Lock()
	if q.closed {
		q.closeMu.Unlock()
		return nil
	}
	q.closed = true
	close(q.reqs)
	q.closeMu.Unlock()
	<-q.done
	q.stopGC()
	if q.disk != nil {
		q.disk.close()
	}
	return q.db.Close()
}

// DiskUsage returns the last measurement of the data dir's disk use; the
// zero value with Free -1 when no disk limit is set.
func (q *Queue) DiskUsage() DiskUsage {
	if q.disk == nil {
		return DiskUsage{Free: -1}
	}
	return q.disk.usage()
}

// Head returns the last assigned sequence number (0 for an empty log).
func (q *Queue) Head() uint64 { return q.head.Load() }

// Append makes ev durable and returns its sequence number. ev.ID must be set
// (the proxy generates one when the producer gave none) and ev.AcceptedAt
// too. If the id was appended within the dedup window, Append returns the
// original sequence number with dup = true and writes nothing.
// After Append returns, ev belongs to the queue: its Body is shared with the
// lanes and must not be modified.
func (q *Queue) Append(ev *Event) (seq uint64, dup bool, err error) {
	if err := q.disk.admit(len(ev.Body)); err != nil {
		return 0, false, err
	}
	r := reqPool.Get().(*appendReq)
	r.ev = ev
	q.closeMu.RLock()
	if q.closed {
		q.closeMu.RUnlock()
		reqPool.Put(r)
		return 0, false, ErrClosed
	}
	q.reqs <- r
	q.closeMu.RUnlock()
	<-r.done
	seq, dup, err = r.seq, r.dup, r.err
	*r = appendReq{done: r.done}
	reqPool.Put(r)
	return seq, dup, err
}

// written is a batch whose transaction is committed, waiting for its sync.
type written struct {
	reqs      []*appendReq
	events    []*Event // the new events, in seq order
	committed uint64   // last seq actually written
	err       error    // the write error, for requests past committed
}

// committer gathers waiting appends into batches and writes each in one
// transaction. With Sync, it hands written batches to the syncer and goes
// on gathering the next batch while the sync runs: the write of batch n+1
// overlaps the fsync of batch n, and one fsync covers every batch written
// before it started.
func (q *Queue) committer() {
	var (
		arena []byte
		seen  = map[string]uint64{}
		syncs chan *written
		done  = make(chan struct{})
	)
	if q.opts.Sync {
		syncs = make(chan *written, 8)
		go q.syncer(syncs, done)
	} else {
		close(done)
	}
	defer func() {
		if syncs != nil {
			close(syncs)
		}
		<-done
		close(q.done)
	}()
	for r := range q.reqs {
		batch := []*appendReq{r}
		size := r.ev.Size()
	gather:
		for len(batch) < maxBatchEvents && size < maxBatchBytes {
			select {
			case r, ok := <-q.reqs:
				if !ok {
					break gather
				}
				batch = append(batch, r)
				size += r.ev.Size()
			default:
				break gather
			}
		}
		var w *written
		w, arena = q.write(batch, arena[:0], seen)
		clear(seen)
		if syncs != nil && w.committed > q.head.Load() {
			syncs <- w
		} else {
			q.publish(w, nil)
		}
	}
}

// syncer fsyncs written batches, as many per fsync as have queued up.
func (q *Queue) syncer(in <-chan *written, done chan<- struct{}) {
	defer close(done)
	var ws []*written
	for w := range in {
		ws = append(ws[:0], w)
	more:
		for {
			select {
			case w, ok := <-in:
				if !ok {
					break more
				}
				ws = append(ws, w)
			default:
				break more
			}
		}
		err := q.db.Sync()
		q.lastSync.Store(time.Now().UnixNano())
		for _, w := range ws {
			q.publish(w, err)
		}
		clear(ws)
	}
}

// write assigns sequence numbers and writes one batch in as few
// transactions as Badger allows.
func (q *Queue) write(batch []*appendReq, arena []byte, seen map[string]uint64) (*written, []byte) {
	q.seqMu.Lock()
	defer q.seqMu.Unlock()
	next := q.assigned.Load() + 1
	w := &written{reqs: batch, committed: q.assigned.Load()}
	txn := q.db.NewTransaction(true)
	defer func() { txn.Discard() }()
	var err error
	pending := 0 // events set in txn but not yet committed
	flush := func() error {
		// The head goes with its events. Only when they fill the
		// transaction to its last bytes does it take one of its own: Open
		// would find the head from the last event key, but not once
		// compaction has deleted every event.
		headErr := txn.Set(keyHead, u64(next-1))
		if headErr != nil && !errors.Is(headErr, badger.ErrTxnTooBig) {
			return fmt.Errorf("set head: %w", headErr)
		}
		if err := txn.Commit(); err != nil {
			return err
		}
		w.committed = next - 1
		pending = 0
		txn = q.db.NewTransaction(true)
		if headErr != nil {
			if err := q.db.Update(func(txn *badger.Txn) error { return txn.Set(keyHead, u64(next-1)) }); err != nil {
				return fmt.Errorf("set head: %w", err)
			}
		}
		return nil
	}
	// set adds one entry; on ErrTxnTooBig it commits what it has and retries
	// in a fresh transaction.
	set := func(e *badger.Entry) error {
		err := txn.SetEntry(e)
		if errors.Is(err, badger.ErrTxnTooBig) && pending > 0 {
			if err := flush(); err != nil {
				return err
			}
			err = txn.SetEntry(e)
		}
		return err
	}
	for _, r := range batch {
		if err != nil {
			r.err = err
			continue
		}
		if s, ok := seen[r.ev.ID]; ok {
			r.seq, r.dup = s, true
			continue
		}
		item, gerr := txn.Get(idKey(r.ev.ID))
		if gerr == nil {
			gerr = item.Value(func(v []byte) error {
				seq, _, err := decodeIDValue(v)
				if err != nil {
					return fmt.Errorf("dedup entry of %q: %w", r.ev.ID, err)
				}
				r.seq, r.dup = seq, true
				return nil
			})
			if gerr != nil {
				r.err = gerr
			}
			continue
		}
		if !errors.Is(gerr, badger.ErrKeyNotFound) {
			r.err = fmt.Errorf("dedup lookup: %w", gerr)
			continue
		}
		r.ev.Seq = next
		start := len(arena)
		arena = appendEvent(arena, r.ev)
		val := arena[start:len(arena):len(arena)]
		if err = set(badger.NewEntry(eventKey(next), val)); err == nil {
			start = len(arena)
			arena = appendIDValue(arena, next, r.ev.Type)
			err = set(badger.NewEntry(idKey(r.ev.ID), arena[start:len(arena):len(arena)]).WithTTL(q.opts.DedupWindow))
		}
		if err != nil {
			r.err = err
			continue
		}
		seen[r.ev.ID] = next
		r.seq = next
		pending++
		next++
		w.events = append(w.events, r.ev)
	}
	if err == nil && pending > 0 {
		err = flush()
	}
	w.err = err
	q.assigned.Store(w.committed)
	// Events past the last committed transaction were never written.
	for len(w.events) > 0 && w.events[len(w.events)-1].Seq > w.committed {
		w.events = w.events[:len(w.events)-1]
	}
	return w, arena
}

// publish makes a written batch visible once it is durable: it advances
// the head, hands the events to OnCommit and answers every appender.
func (q *Queue) publish(w *written, syncErr error) {
	if w.committed > q.head.Load() {
		q.head.Store(w.committed)
	}
	if len(w.events) > 0 && q.opts.OnCommit != nil {
		q.opts.OnCommit(w.events)
	}
	for _, r := range w.reqs {
		switch {
		case r.err != nil:
		case r.seq > w.committed:
			r.err = fmt.Errorf("append: %w", w.err)
		case syncErr != nil && !r.dup:
			// Written but not known to be on disk: the producer retries with
			// the same id and gets a duplicate answer, so nothing is lost.
			r.err = fmt.Errorf("append: sync: %w", syncErr)
		}
		r.done <- struct{}{}
	}
}

// Lookup returns the sequence number of the event with this id, and its
// type ("" for an entry written by format 1), while the id is remembered
// (the dedup window); ErrNotFound after.
func (q *Queue) Lookup(id string) (seq uint64, typ string, err error) {
	err = q.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(idKey(id))
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			var t []byte
			seq, t, err = decodeIDValue(v)
			typ = string(t)
			return err
		})
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, "", ErrNotFound
	}
	return seq, typ, err
}

// Event reads one event by sequence number.
func (q *Queue) Event(seq uint64) (*Event, error) {
	var ev *Event
	err := q.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(eventKey(seq))
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		ev, err = decodeEvent(seq, v)
		return err
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, fmt.Errorf("event %d: %w", seq, ErrNotFound)
	}
	return ev, err
}

// maxScan bounds how many non-matching events one Events call walks past,
// so a lane far behind on a type it rarely matches yields between pages.
const maxScan = 8192

// Events returns up to limit events with from <= seq <= to whose type
// satisfies match (nil matches all), and the sequence number to continue
// from. Fewer than limit events with next <= to means the scan stopped at
// its bound, not that there is nothing left.
func (q *Queue) Events(from, to uint64, limit int, match func(typ []byte) bool) (evs []*Event, next uint64, err error) {
	from = max(from, q.low.Load())
	next = from
	if from > to {
		return nil, next, nil
	}
	// Read the head before the snapshot: every event up to it was
	// committed before the read began, so the snapshot holds them all. Read
	// after, it could name events the snapshot cannot see.
	head := q.head.Load()
	err = q.db.View(func(txn *badger.Txn) error {
		opts := badger.IteratorOptions{Prefix: prefixEvent}
		if match == nil {
			opts.PrefetchValues, opts.PrefetchSize = true, min(limit, 100)
		}
		it := txn.NewIterator(opts)
		defer it.Close()
		scanned := 0
		for it.Seek(eventKey(from)); it.Valid() && len(evs) < limit && scanned < maxScan; it.Next() {
			item := it.Item()
			seq := seqFromEventKey(item.Key())
			if seq > to {
				next = to + 1
				return nil
			}
			next = seq + 1
			scanned++
			if match != nil {
				var ok bool
				if err := item.Value(func(v []byte) error {
					typ, err := eventType(v)
					ok = err == nil && match(typ)
					return err
				}); err != nil {
					return fmt.Errorf("event %d: %w", seq, err)
				}
				if !ok {
					continue
				}
			}
			v, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			ev, err := decodeEvent(seq, v)
			if err != nil {
				return err
			}
			evs = append(evs, ev)
		}
		if !it.Valid() {
			// Nothing more is written yet: everything up to the head seen by
			// this read has been scanned.
			next = max(next, min(to, head)+1)
		}
		return nil
	})
	return evs, next, err
}

// CountEvents counts the events with from <= seq <= to whose type satisfies
// match (nil matches all), stopping once the count passes limit.
func (q *Queue) CountEvents(from, to uint64, match func(typ []byte) bool, limit int) (int, error) {
	from = max(from, q.low.Load())
	if from > to {
		return 0, nil
	}
	if match == nil {
		return int(min(to-from+1, uint64(limit)+1)), nil
	}
	n := 0
	err := q.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixEvent})
		defer it.Close()
		for it.Seek(eventKey(from)); it.Valid() && n <= limit; it.Next() {
			if seqFromEventKey(it.Item().Key()) > to {
				return nil
			}
			if err := it.Item().Value(func(v []byte) error {
				typ, err := eventType(v)
				if err == nil && match(typ) {
					n++
				}
				return err
			}); err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}

// Memberships returns every subscription the log knows, with its cursor.
// Two sequential scans (memberships, cursors) rather than a lookup per
// subscription: start-up reads 50,000 of them.
func (q *Queue) Memberships() ([]Membership, error) {
	var out []Membership
	err := q.db.View(func(txn *badger.Txn) error {
		cursors := map[string]uint64{}
		cit := txn.NewIterator(badger.IteratorOptions{Prefix: prefixCursor, PrefetchValues: true})
		for cit.Rewind(); cit.Valid(); cit.Next() {
			sub := string(cit.Item().Key()[len(prefixCursor):])
			if err := cit.Item().Value(func(v []byte) error {
				if len(v) != 8 {
					return fmt.Errorf("cursor %s: %w", sub, ErrCorrupt)
				}
				cursors[sub] = binary.BigEndian.Uint64(v)
				return nil
			}); err != nil {
				cit.Close()
				return err
			}
		}
		cit.Close()
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixMember, PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			m := Membership{Subscription: string(it.Item().Key()[len(prefixMember):])}
			var rec memberRecord
			if err := it.Item().Value(func(v []byte) error { return json.Unmarshal(v, &rec) }); err != nil {
				return fmt.Errorf("membership %s: %v: %w", m.Subscription, err, ErrCorrupt)
			}
			c, ok := cursors[m.Subscription]
			if !ok {
				return fmt.Errorf("cursor %s: missing: %w", m.Subscription, ErrCorrupt)
			}
			m.From, m.Left, m.Until, m.Paused, m.Snapshot, m.Cursor = rec.From, rec.Left, rec.Until, rec.Paused, []byte(rec.Snapshot), c
			out = append(out, m)
		}
		return nil
	})
	return out, err
}

func readMembership(txn *badger.Txn, sub string) (Membership, error) {
	m := Membership{Subscription: sub}
	item, err := txn.Get(memberKey(sub))
	if err != nil {
		return m, err
	}
	var rec memberRecord
	if err := item.Value(func(v []byte) error { return json.Unmarshal(v, &rec) }); err != nil {
		return m, fmt.Errorf("membership %s: %v: %w", sub, err, ErrCorrupt)
	}
	m.From, m.Left, m.Until, m.Paused, m.Snapshot = rec.From, rec.Left, rec.Until, rec.Paused, []byte(rec.Snapshot)
	item, err = txn.Get(cursorKey(sub))
	if err != nil {
		return m, fmt.Errorf("cursor %s: %w", sub, err)
	}
	return m, item.Value(func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("cursor %s: %w", sub, ErrCorrupt)
		}
		m.Cursor = binary.BigEndian.Uint64(v)
		return nil
	})
}

func writeMembership(txn *badger.Txn, m Membership) error {
	v, err := json.Marshal(memberRecord{V: recordVersion, From: m.From, Left: m.Left, Until: m.Until, Paused: m.Paused, Snapshot: m.Snapshot})
	if err != nil {
		return err
	}
	return txn.Set(memberKey(m.Subscription), v)
}

// JoinRequest asks for one subscription to be a member, with its config
// snapshot.
type JoinRequest struct {
	Subscription string
	Snapshot     []byte
	// Known, when set, is the membership as Memberships returned it, which
	// saves reading it again (the caller must be its only writer).
	Known *Membership
}

// Join makes sub a member: a new subscription is entitled to every event
// appended from now on (From = head+1; invariant 7). For a known one it
// updates the snapshot; one that was leaving (not yet retired) becomes
// active again and is entitled to the events in between as well.
func (q *Queue) Join(sub string, snapshot []byte) (Membership, error) {
	ms, err := q.JoinAll([]JoinRequest{{Subscription: sub, Snapshot: snapshot}})
	if err != nil {
		return Membership{}, err
	}
	return ms[0], nil
}

// JoinAll is Join for many subscriptions in one batch and one sync, so a
// config with 50,000 subscriptions starts in a moment. Unchanged
// memberships are not rewritten.
func (q *Queue) JoinAll(reqs []JoinRequest) ([]Membership, error) {
	q.seqMu.Lock()
	defer q.seqMu.Unlock()
	out := make([]Membership, len(reqs))
	changed := make([]bool, len(reqs))
	isNew := make([]bool, len(reqs))
	head := q.assigned.Load()
	err := q.db.View(func(txn *badger.Txn) error {
		for i, r := range reqs {
			var m Membership
			var err error
			if r.Known != nil {
				m = *r.Known
			} else {
				m, err = readMembership(txn, r.Subscription)
			}
			switch {
			case errors.Is(err, badger.ErrKeyNotFound):
				m = Membership{Subscription: r.Subscription, From: head + 1, Cursor: head}
				changed[i], isNew[i] = true, true
			case err != nil:
				return err
			default:
				changed[i] = m.Left || !bytes.Equal(m.Snapshot, r.Snapshot)
			}
			m.Left, m.Until, m.Snapshot = false, 0, r.Snapshot
			out[i] = m
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	wb := q.db.NewWriteBatch()
	defer wb.Cancel()
	n := 0
	for i, m := range out {
		if !changed[i] {
			continue
		}
		v, err := json.Marshal(memberRecord{V: recordVersion, From: m.From, Paused: m.Paused, Snapshot: m.Snapshot})
		if err != nil {
			return nil, fmt.Errorf("join %s: %w", m.Subscription, err)
		}
		if err := wb.Set(memberKey(m.Subscription), v); err != nil {
			return nil, fmt.Errorf("join %s: %w", m.Subscription, err)
		}
		// A known member's cursor belongs to its lane (the flusher may be
		// writing a newer one); only a new member starts one.
		if isNew[i] {
			if err := wb.Set(cursorKey(m.Subscription), u64(m.Cursor)); err != nil {
				return nil, fmt.Errorf("join %s: %w", m.Subscription, err)
			}
		}
		n++
	}
	if n == 0 {
		return out, nil
	}
	if err := wb.Flush(); err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	if q.opts.Sync {
		if err := q.db.Sync(); err != nil {
			return nil, fmt.Errorf("join: sync: %w", err)
		}
	}
	return out, nil
}

// Leave ends sub's entitlement at the current head: it still receives every
// event it was entitled to (Until = head), then the caller retires it.
func (q *Queue) Leave(sub string) (Membership, error) {
	q.seqMu.Lock()
	defer q.seqMu.Unlock()
	var m Membership
	err := q.db.Update(func(txn *badger.Txn) error {
		var err error
		if m, err = readMembership(txn, sub); err != nil {
			return err
		}
		if !m.Left {
			m.Left, m.Until = true, q.assigned.Load()
		}
		return writeMembership(txn, m)
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return m, fmt.Errorf("leave %s: %w", sub, ErrNotFound)
	}
	if err != nil {
		return m, fmt.Errorf("leave %s: %w", sub, err)
	}
	return m, nil
}

// SetPaused records why sub's deliveries are paused at run time ("" to
// resume), so a pause (a 410 Gone, an operator) survives a restart.
func (q *Queue) SetPaused(sub, reason string) error {
	q.seqMu.Lock()
	defer q.seqMu.Unlock()
	err := q.db.Update(func(txn *badger.Txn) error {
		m, err := readMembership(txn, sub)
		if err != nil {
			return err
		}
		m.Paused = reason
		return writeMembership(txn, m)
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return fmt.Errorf("pause %s: %w", sub, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("pause %s: %w", sub, err)
	}
	return nil
}

// Retire forgets a subscription that has drained. Its dead letters stay.
func (q *Queue) Retire(sub string) error {
	err := q.db.Update(func(txn *badger.Txn) error {
		if err := txn.Delete(memberKey(sub)); err != nil {
			return err
		}
		return txn.Delete(cursorKey(sub))
	})
	if err != nil {
		return fmt.Errorf("retire %s: %w", sub, err)
	}
	return nil
}

// cursorSyncInterval bounds how stale the on-disk cursors may be after a
// power loss when nothing else syncs (with Sync). Under load the appends'
// own syncs cover cursor writes (Badger's log is written in commit order),
// so SaveCursors adds no fsync of its own: one every flush interval stole
// the disk from appends and showed as ingest latency spikes.
const cursorSyncInterval = time.Second

// SaveCursors writes the given cursors in one transaction. Retry records
// and dead letters written before it become durable no later than the
// cursors (commit order). With Sync, the write is fsynced by the next
// append group, or by SaveCursors itself if none came within
// cursorSyncInterval. A lost cursor write means redelivery, never loss.
func (q *Queue) SaveCursors(cursors map[string]uint64) error {
	if len(cursors) == 0 {
		return nil
	}
	wb := q.db.NewWriteBatch()
	defer wb.Cancel()
	for sub, c := range cursors {
		if err := wb.Set(cursorKey(sub), u64(c)); err != nil {
			return fmt.Errorf("save cursors: %w", err)
		}
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("save cursors: %w", err)
	}
	if q.opts.Sync && time.Since(time.Unix(0, q.lastSync.Load())) > cursorSyncInterval {
		if err := q.db.Sync(); err != nil {
			return fmt.Errorf("save cursors: sync: %w", err)
		}
		q.lastSync.Store(time.Now().UnixNano())
	}
	return nil
}

// Record writes the outcome of one delivery attempt in one transaction:
// after a crash either all of it happened or none.
//
//   - Acked deletes the retry record the attempt came from (o.From), if
//     any, and for a replay sets DeliveredAt = o.At on its dead letter.
//   - RetryScheduled writes o.Retry in place of o.From.
//   - DeadLettered writes o.DeadLetter in place of o.From. A letter already
//     kept for the seq keeps its replay history (Replays, ReplayedAt):
//     without it a replayed letter that failed again could be replayed
//     again without force.
//   - o.Pause, when set, records the subscription as paused too.
//
// An Acked outcome of a first attempt without Pause writes nothing.
func (q *Queue) Record(o Outcome) error {
	var rv []byte
	switch o.Kind {
	case Acked:
		if o.From == nil && o.Pause == "" {
			return nil
		}
	case RetryScheduled:
		if o.Retry == nil || o.Retry.Subscription != o.Subscription || o.Retry.Seq != o.Seq {
			return fmt.Errorf("record %s/%d: a scheduled retry needs its record, for the same delivery", o.Subscription, o.Seq)
		}
		var err error
		if rv, err = encodeRetry(*o.Retry); err != nil {
			return fmt.Errorf("record %s/%d: %w", o.Subscription, o.Seq, err)
		}
	case DeadLettered:
		if o.DeadLetter == nil || o.DeadLetter.Subscription != o.Subscription || o.DeadLetter.Seq != o.Seq {
			return fmt.Errorf("record %s/%d: a dead-lettering needs its letter, for the same delivery", o.Subscription, o.Seq)
		}
	default:
		return fmt.Errorf("record %s/%d: unknown outcome kind %d", o.Subscription, o.Seq, o.Kind)
	}
	if o.From != nil && (o.From.Subscription != o.Subscription || o.From.Seq != o.Seq) {
		return fmt.Errorf("record %s/%d: the retry it came from is %s/%d", o.Subscription, o.Seq, o.From.Subscription, o.From.Seq)
	}
	if o.Pause != "" {
		q.seqMu.Lock() // memberships are written under seqMu (JoinAll, Leave)
		defer q.seqMu.Unlock()
	}
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	if o.Kind == RetryScheduled {
		// Count the reference before the write, so compaction cannot
		// delete the event between the write and the count.
		q.ref(o.Seq, 1)
	}
	var fromFound bool
	err := q.db.Update(func(txn *badger.Txn) error {
		var err error
		if o.From != nil {
			if fromFound, err = deleteRetry(txn, o.Subscription, dueNanos(o.From.Due), o.Seq); err != nil {
				return err
			}
		}
		switch o.Kind {
		case Acked:
			if o.From != nil && o.From.Replay {
				d, err := readDeadLetter(txn, o.Subscription, o.Seq)
				if errors.Is(err, badger.ErrKeyNotFound) {
					break // retired with its letters purged: nothing to note
				}
				if err != nil {
					return err
				}
				d.DeliveredAt = o.At
				if err := writeDeadLetter(txn, d); err != nil {
					return err
				}
			}
		case RetryScheduled:
			if err := putRetry(txn, o.Subscription, dueNanos(o.Retry.Due), o.Seq, rv); err != nil {
				return err
			}
		case DeadLettered:
			d := *o.DeadLetter
			old, err := readDeadLetter(txn, o.Subscription, o.Seq)
			switch {
			case err == nil:
				d.Replays, d.ReplayedAt = old.Replays, old.ReplayedAt
				if d.EventID == "" {
					// A letter written without the event (event_missing)
					// keeps the copy the old one has.
					d.EventID, d.Type, d.ContentType, d.AcceptedAt, d.Body = old.EventID, old.Type, old.ContentType, old.AcceptedAt, old.Body
				}
			case !errors.Is(err, badger.ErrKeyNotFound):
				return err
			}
			if err := writeDeadLetter(txn, &d); err != nil {
				return err
			}
		}
		if o.Pause != "" {
			m, err := readMembership(txn, o.Subscription)
			if err != nil {
				return err
			}
			m.Paused = o.Pause
			return writeMembership(txn, m)
		}
		return nil
	})
	if err != nil {
		if o.Kind == RetryScheduled {
			q.ref(o.Seq, -1)
		}
		if errors.Is(err, badger.ErrKeyNotFound) {
			err = ErrNotFound // the membership Pause names
		}
		return fmt.Errorf("record %s/%d: %w", o.Subscription, o.Seq, err)
	}
	if fromFound {
		q.ref(o.Seq, -1)
	}
	return nil
}

func encodeRetry(r Retry) ([]byte, error) {
	return json.Marshal(retryRecord{V: recordVersion, Attempt: r.Attempt, FirstAttempt: r.FirstAttempt.UnixNano(), LastStatus: r.LastStatus, LastError: r.LastError, Replay: r.Replay})
}

func decodeRetry(sub string, seq uint64, due time.Time, v []byte) (Retry, error) {
	var rec retryRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return Retry{}, fmt.Errorf("retry %s/%d: %v: %w", sub, seq, err, ErrCorrupt)
	}
	return Retry{
		Subscription: sub, Seq: seq, Due: due, Attempt: rec.Attempt, Replay: rec.Replay,
		FirstAttempt: time.Unix(0, rec.FirstAttempt), LastStatus: rec.LastStatus, LastError: rec.LastError,
	}, nil
}

// putRetry writes a retry record and its index entry.
func putRetry(txn *badger.Txn, sub string, due, seq uint64, v []byte) error {
	if err := txn.Set(retryKeyAt(sub, due, seq), v); err != nil {
		return err
	}
	return txn.Set(retryIndexKey(sub, seq), u64(due))
}

// deleteRetry deletes a retry record and its index entry, and reports
// whether the record was there (for the reference count).
func deleteRetry(txn *badger.Txn, sub string, due, seq uint64) (found bool, err error) {
	k := retryKeyAt(sub, due, seq)
	switch _, err := txn.Get(k); {
	case errors.Is(err, badger.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	if err := txn.Delete(k); err != nil {
		return false, err
	}
	// The index names this record unless a second record of the seq was
	// written after it (only ever by the replay race this index closes,
	// in a dir of an older format); then it names that one and stays.
	ik := retryIndexKey(sub, seq)
	item, err := txn.Get(ik)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	var same bool
	if err := item.Value(func(v []byte) error {
		same = len(v) == 8 && binary.BigEndian.Uint64(v) == due
		return nil
	}); err != nil {
		return false, err
	}
	if same {
		return true, txn.Delete(ik)
	}
	return true, nil
}

// retryDue returns the due of sub's retry of seq, from the index; ok is
// false when there is none.
func retryDue(txn *badger.Txn, sub string, seq uint64) (due uint64, ok bool, err error) {
	item, err := txn.Get(retryIndexKey(sub, seq))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	err = item.Value(func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("retry index %s/%d: %w", sub, seq, ErrCorrupt)
		}
		due = binary.BigEndian.Uint64(v)
		return nil
	})
	return due, err == nil, err
}

// ScheduleRetry records r. When prev is not nil (the record this attempt
// came from) it is replaced in the same transaction.
//
// Deprecated: use Record with RetryScheduled.
func (q *Queue) ScheduleRetry(r Retry, prev *Retry) error {
	return q.Record(Outcome{Kind: RetryScheduled, Subscription: r.Subscription, Seq: r.Seq, From: prev, Retry: &r})
}

// AckReplay deletes the retry record of an acknowledged replay and records
// the delivery on its dead letter, in one transaction.
//
// Deprecated: use Record with Acked.
func (q *Queue) AckReplay(r Retry, at time.Time) error {
	r.Replay = true
	return q.Record(Outcome{Kind: Acked, Subscription: r.Subscription, Seq: r.Seq, From: &r, At: at})
}

// DropRetry deletes a retry record whose delivery has been acknowledged.
//
// Deprecated: use Record with Acked.
func (q *Queue) DropRetry(r Retry) error {
	r.Replay = false
	return q.Record(Outcome{Kind: Acked, Subscription: r.Subscription, Seq: r.Seq, From: &r})
}

// AddDeadLetter stores d (with its body copy) and, when prev is not nil,
// deletes the retry record the failed attempt came from, in one transaction.
//
// Deprecated: use Record with DeadLettered.
func (q *Queue) AddDeadLetter(d *DeadLetter, prev *Retry) error {
	return q.Record(Outcome{Kind: DeadLettered, Subscription: d.Subscription, Seq: d.Seq, From: prev, DeadLetter: d})
}

// ref counts d more (or fewer) retry records of seq. A seq below the
// compaction boundary whose last reference goes is released: the next
// Compact deletes its event.
func (q *Queue) ref(seq uint64, d int32) {
	q.refMu.Lock()
	if n := q.retryRefs[seq] + d; n > 0 {
		q.retryRefs[seq] = n
	} else {
		delete(q.retryRefs, seq)
		if _, ok := q.held[seq]; ok {
			delete(q.held, seq)
			q.released = append(q.released, seq)
		}
	}
	q.refMu.Unlock()
}

// DueRetries returns up to limit of sub's retries due at or before now,
// earliest first, skipping those for which skip (may be nil) is true, and
// the due time of the first retry it left for later (zero if none is known).
func (q *Queue) DueRetries(sub string, now time.Time, limit int, skip func(seq uint64) bool) ([]Retry, time.Time, error) {
	var (
		out  []Retry
		next time.Time
	)
	err := q.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: retryPrefix(sub), PrefetchValues: true, PrefetchSize: min(limit+1, 64)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			due, seq, err := parseRetryKey(sub, it.Item().Key())
			if err != nil {
				return err
			}
			if due.After(now) || len(out) >= limit {
				next = due
				return nil
			}
			if skip != nil && skip(seq) {
				continue
			}
			var r Retry
			if err := it.Item().Value(func(v []byte) error {
				var err error
				r, err = decodeRetry(sub, seq, due, v)
				return err
			}); err != nil {
				return err
			}
			out = append(out, r)
		}
		return nil
	})
	return out, next, err
}

// Retries returns sub's scheduled retries, earliest first, at most limit.
func (q *Queue) Retries(sub string, limit int) ([]Retry, error) {
	out, _, err := q.DueRetries(sub, time.Unix(0, 1<<62), limit, nil)
	return out, err
}

// RetryOf returns sub's scheduled retry of seq; nil when there is none.
// Two point lookups (the index, then the record): the completion ledger
// calls it for every lane an event was for.
func (q *Queue) RetryOf(sub string, seq uint64) (*Retry, error) {
	var r *Retry
	err := q.db.View(func(txn *badger.Txn) error {
		due, ok, err := retryDue(txn, sub, seq)
		if !ok || err != nil {
			return err
		}
		item, err := txn.Get(retryKeyAt(sub, due, seq))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return fmt.Errorf("retry index %s/%d names no record: %w", sub, seq, ErrCorrupt)
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			rr, err := decodeRetry(sub, seq, time.Unix(0, int64(due)), v)
			r = &rr
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("retry of %s/%d: %w", sub, seq, err)
	}
	return r, nil
}

// RetrySummary is what start-up needs of one subscription's retry schedule.
type RetrySummary struct {
	// Count is how many retries are scheduled.
	Count int
	// Ahead holds the seqs above the subscription's durable cursor that
	// have a retry record: first attempts that failed after the cursor was
	// last written. A lane resuming from the cursor must not send them
	// again as first attempts, or the event would be in flight twice (the
	// fresh copy and the retry) and, failing, start a second retry chain.
	Ahead map[uint64]struct{}
}

// RetrySummaries summarises every subscription's retry schedule in one
// key-only scan, for start-up. cursors holds the durable cursors
// (Membership.Cursor); a subscription missing from it has Ahead nil.
func (q *Queue) RetrySummaries(cursors map[string]uint64) (map[string]*RetrySummary, error) {
	out := map[string]*RetrySummary{}
	err := q.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefixRetry})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if len(k) < len(prefixRetry)+18 {
				return fmt.Errorf("retry key: %w", ErrCorrupt)
			}
			sub := k[len(prefixRetry) : len(k)-17]
			rs := out[string(sub)]
			if rs == nil {
				rs = &RetrySummary{}
				out[string(sub)] = rs
			}
			rs.Count++
			seq := binary.BigEndian.Uint64(k[len(k)-8:])
			if c, ok := cursors[string(sub)]; ok && seq > c {
				if rs.Ahead == nil {
					rs.Ahead = map[uint64]struct{}{}
				}
				rs.Ahead[seq] = struct{}{}
			}
		}
		return nil
	})
	return out, err
}

// Replay schedules a dead letter for delivery again and records the
// replay on it, in one transaction: after a crash either both happened or
// neither. The retry is due at `due` with attempt count 0, so the next try
// is attempt 1 of a fresh schedule; the dead letter stays (with its body,
// which the lane uses if the log has compacted the event).
//
// The check and the write are one step under stateMu: replays of one
// letter that race schedule it once. A letter already replayed answers
// ErrReplayed unless force; one whose seq has a retry scheduled (a replay
// not yet resolved, or a retry of its own) answers ErrRetryScheduled
// whatever force says. Both refusals return the letter as it is.
func (q *Queue) Replay(sub string, seq uint64, due time.Time, force bool) (*DeadLetter, error) {
	rv, err := encodeRetry(Retry{FirstAttempt: due, Replay: true})
	if err != nil {
		return nil, fmt.Errorf("replay %s/%d: %w", sub, seq, err)
	}
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	q.ref(seq, 1)
	var (
		d       *DeadLetter
		refused error
	)
	err = q.db.Update(func(txn *badger.Txn) error {
		var err error
		if d, err = readDeadLetter(txn, sub, seq); err != nil {
			return err
		}
		if d.Replays > 0 && !force {
			refused = ErrReplayed
			return nil
		}
		if _, ok, err := retryDue(txn, sub, seq); err != nil {
			return err
		} else if ok {
			refused = ErrRetryScheduled
			return nil
		}
		r := *d
		r.Replays++
		r.ReplayedAt = due
		if err := writeDeadLetter(txn, &r); err != nil {
			return err
		}
		d = &r
		return putRetry(txn, sub, dueNanos(due), seq, rv)
	})
	if err != nil || refused != nil {
		q.ref(seq, -1)
	}
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
		return nil, fmt.Errorf("replay %s/%d: %w", sub, seq, ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("replay %s/%d: %w", sub, seq, err)
	case refused != nil:
		return d, fmt.Errorf("replay %s/%d: %w", sub, seq, refused)
	}
	return d, nil
}

// DeadLetters lists dead letters of sub ("" for all subscriptions) in key
// order, starting after the given subscription/seq position, at most limit.
func (q *Queue) DeadLetters(sub string, afterSub string, afterSeq uint64, limit int) ([]*DeadLetter, error) {
	var out []*DeadLetter
	prefix := prefixDeadLetter
	if sub != "" {
		prefix = deadLetterPrefix(sub)
	}
	err := q.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true})
		defer it.Close()
		start := prefix
		if afterSub != "" {
			start = deadLetterKey(afterSub, afterSeq+1)
		}
		for it.Seek(start); it.Valid() && len(out) < limit; it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			d, err := decodeDeadLetter(v)
			if err != nil {
				return err
			}
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

// readDeadLetter reads and decodes one dead letter in txn; the error is
// badger.ErrKeyNotFound when there is none.
func readDeadLetter(txn *badger.Txn, sub string, seq uint64) (*DeadLetter, error) {
	item, err := txn.Get(deadLetterKey(sub, seq))
	if err != nil {
		return nil, err
	}
	// A copy: the decoded Body aliases the value, which Badger reuses.
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, err
	}
	return decodeDeadLetter(v)
}

func writeDeadLetter(txn *badger.Txn, d *DeadLetter) error {
	v, err := appendDeadLetter(nil, d)
	if err != nil {
		return err
	}
	return txn.Set(deadLetterKey(d.Subscription, d.Seq), v)
}

// DeadLetter reads one dead letter; ErrNotFound when there is none.
func (q *Queue) DeadLetter(sub string, seq uint64) (*DeadLetter, error) {
	var d *DeadLetter
	err := q.db.View(func(txn *badger.Txn) error {
		var err error
		d, err = readDeadLetter(txn, sub, seq)
		return err
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, fmt.Errorf("dead letter %s/%d: %w", sub, seq, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("dead letter %s/%d: %w", sub, seq, err)
	}
	return d, nil
}

// GetDeadLetter reads one dead letter.
//
// Deprecated: use DeadLetter.
func (q *Queue) GetDeadLetter(sub string, seq uint64) (*DeadLetter, error) {
	return q.DeadLetter(sub, seq)
}

// Compact deletes the events below seq `below` that no retry still needs.
// The caller passes the smallest durable cursor+1 over every entitled lane.
// Events a retry holds stay until their last retry is resolved; a later
// Compact deletes them.
//
// The work goes in chunks of compactChunk seqs, each decided under refMu
// and deleted in a transaction of its own: every retry write takes refMu,
// and a range of 100,000 seqs decided at once held it for as long as the
// whole range took.
func (q *Queue) Compact(below uint64) (int, error) {
	q.compactMu.Lock()
	defer q.compactMu.Unlock()
	below = min(below, q.head.Load()+1)
	low := q.low.Load()
	q.refMu.Lock()
	released := q.released
	q.released = nil
	q.refMu.Unlock()
	n := 0
	// Deletes go in small transactions: Badger writes one request at a
	// time, and one request of thousands of deletes would hold appends
	// behind it for milliseconds.
	for i := 0; i < len(released); i += compactChunk {
		chunk := released[i:min(i+compactChunk, len(released))]
		if err := q.deleteEvents(chunk); err != nil {
			q.refMu.Lock()
			q.released = append(q.released, released[i:]...)
			q.refMu.Unlock()
			return n, fmt.Errorf("compact: %w", err)
		}
		n += len(chunk)
	}
	if below <= low {
		return n, nil
	}
	freed := make([]uint64, 0, compactChunk)
	for from := low; from < below; from += compactChunk {
		to := min(from+compactChunk, below)
		freed = freed[:0]
		q.refMu.Lock()
		for seq := from; seq < to; seq++ {
			if q.retryRefs[seq] > 0 {
				q.held[seq] = struct{}{}
			} else {
				freed = append(freed, seq)
			}
		}
		q.refMu.Unlock()
		if err := q.deleteEvents(freed); err != nil {
			return n, fmt.Errorf("compact: %w", err)
		}
		n += len(freed)
	}
	if err := q.db.Update(func(txn *badger.Txn) error { return txn.Set(keyLow, u64(below)) }); err != nil {
		return n, fmt.Errorf("compact: %w", err)
	}
	q.low.Store(below)
	return n, nil
}

func (q *Queue) deleteEvents(seqs []uint64) error {
	if len(seqs) == 0 {
		return nil
	}
	return q.db.Update(func(txn *badger.Txn) error {
		for _, seq := range seqs {
			if err := txn.Delete(eventKey(seq)); err != nil {
				return err
			}
		}
		return nil
	})
}

// compactChunk is how many deletes one compaction transaction carries.
const compactChunk = 256

// badgerLogger passes Badger's warnings and errors to slog; its info and
// debug chatter is dropped.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any)   { b.l.Error("badger: " + fmt.Sprintf(f, a...)) }
func (b badgerLogger) Warningf(f string, a ...any) { b.l.Warn("badger: " + fmt.Sprintf(f, a...)) }
func (b badgerLogger) Infof(string, ...any)        {}
func (b badgerLogger) Debugf(string, ...any)       {}
