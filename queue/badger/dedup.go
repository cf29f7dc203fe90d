package badger

import (
	"errors"
	"fmt"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

// The dedup index (format 5).
//
// Until format 4 the committer wrote i/<id> with every event and read it
// before: per event one LSM lookup and a second entry through Badger's
// WAL and memtable, all on the one goroutine every append waits for (the
// lookup alone was half of its CPU). Now:
//
//   - The appender looks its id up in the LSM itself, before the hand-off,
//     in parallel with every other appender; a duplicate of an event
//     already durable is answered there and never reaches the committer.
//   - The committer writes only e/<seq>. It remembers the ids it wrote in
//     memory (recent) and checks each append against them: they cover the
//     events whose i/ entries an appender's lookup may not have seen.
//   - The indexer writes the i/ entries of published events in batches,
//     with m/indexed (every event up to it has its i/ entry) in the same
//     transaction, off the append path. Its entries expire when the
//     committer's would have: the batch's write time + the window.
//   - After a crash, Open writes the i/ entries of the events past
//     m/indexed (the log's tail, still in the log: see below) before it
//     takes appends, with the window counted from the Open.
//   - Compact deletes no event past m/indexed: it indexes first. So an
//     event compacted within the window has its i/ entry, and an event not
//     yet indexed is still in the log for Open to index.
//
// Why an appender's lookup plus recent is exact: the appender loads
// indexed before it opens its snapshot, so the snapshot holds the i/
// entry of every event up to that mark (their transactions committed
// before the mark moved). recent holds every event past idsLow, and the
// committer falls back to an LSM lookup for the rare append whose mark is
// below idsLow. Generations of recent are dropped only once indexed,
// never while an event of theirs lacks its i/ entry.

// recentKeep is how many ids one generation of recent holds before the
// committer starts the next: two generations (8,192 ids, about 1 MiB)
// cover appends that waited behind several full batches.
const recentKeep = 4096

// idEntry is what recent remembers of one event.
type idEntry struct {
	seq     uint64
	typ     string
	tenant  string
	expires int64 // unix seconds; forgotten at or after it, as Badger's TTL does
}

func (e idEntry) live(now int64) bool { return e.expires > now }

// recentID returns the remembered entry of id, if it is still in the
// window, or not yet published (a window under a second would otherwise
// expire an id before its own batch is done). The caller holds idsMu.
func (l *Log) recentID(id string, now int64, head uint64) (idEntry, bool) {
	if e, ok := l.ids[id]; ok && (e.live(now) || e.seq > head) {
		return e, true
	}
	if e, ok := l.idsOld[id]; ok && (e.live(now) || e.seq > head) {
		return e, true
	}
	return idEntry{}, false
}

// rotateRecent starts a new generation of recent once the current one is
// full and the older one is indexed. The caller holds idsMu for writing.
func (l *Log) rotateRecent() {
	if len(l.ids) < recentKeep || l.idsOldMax > l.indexed.Load() {
		return
	}
	l.idsLow = l.idsOldMax
	l.idsOld, l.idsOldMax = l.ids, l.idsMax
	l.ids = make(map[string]idEntry, recentKeep)
}

// lookupIndexed reads id's i/ entry, key, in a snapshot.
func lookupIndexed(txn *badgerdb.Txn, key []byte, id string) (seq uint64, typ, tenant string, found bool, err error) {
	item, err := txn.Get(key)
	if errors.Is(err, badgerdb.ErrKeyNotFound) {
		return 0, "", "", false, nil
	}
	if err != nil {
		return 0, "", "", false, fmt.Errorf("dedup lookup: %w", err)
	}
	err = item.Value(func(v []byte) error {
		s, t, tn, err := decodeIDValue(v)
		if err != nil {
			return fmt.Errorf("dedup entry of %q: %w", id, err)
		}
		seq, typ, tenant = s, string(t), string(tn)
		return nil
	})
	return seq, typ, tenant, err == nil, err
}

// indexBatch is a published batch's events, waiting for their i/ entries.
type indexBatch struct {
	events  []*queue.Event
	expires int64
}

// queueIndex hands published events to the indexer. It runs before the
// head moves past them, so that Compact, which indexes what is queued
// before it deletes, never sees an event it cannot index.
func (l *Log) queueIndex(events []*queue.Event, expires int64) {
	if len(events) == 0 {
		return
	}
	l.pendMu.Lock()
	l.pend = append(l.pend, indexBatch{events, expires})
	l.pendMu.Unlock()
	select {
	case l.indexKick <- struct{}{}:
	default:
	}
}

// indexLinger is how long the indexer lets published batches gather
// before it writes their i/ entries. At low load every batch is one
// event, and a Badger transaction per event for the index cost as much as
// the append's own: a runtime trace of a sidecar at 200 events/s counted
// 24 goroutine wake-ups per event, 16 of them in Badger's commit path
// (its watermarks, doWrites, the value-threshold listener), and two of
// the three transactions per event were the append and its index entry.
// Nothing waits on the index: until it is written the committer's recent
// ids answer for the events (dedup.go), and Compact and Close index what
// is queued themselves. A variable only so tests can hold the index back.
var indexLinger = 50 * time.Millisecond

// indexer writes queued i/ entries until stop is closed; Close indexes
// what is left after the committer has stopped.
func (l *Log) indexer(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	linger := time.NewTimer(indexLinger)
	linger.Stop()
	defer linger.Stop()
	for {
		select {
		case <-stop:
			return
		case <-l.indexKick:
			linger.Reset(indexLinger)
			select {
			case <-stop:
				return
			case <-linger.C:
			}
			if err := l.index(); err != nil {
				// Nothing is lost: the events stay queued and in the log,
				// Compact refuses to pass them, and Open indexes them.
				l.log.Error("queue: index event ids", "err", err)
			}
		}
	}
}

// index writes the i/ entries of every queued event, and m/indexed with
// them, in as few transactions as Badger allows.
func (l *Log) index() error {
	l.indexMu.Lock()
	defer l.indexMu.Unlock()
	l.pendMu.Lock()
	batches := l.pend
	l.pend = nil
	l.pendMu.Unlock()
	if len(batches) == 0 {
		return nil
	}
	last := batches[len(batches)-1].events
	err := l.writeIndex(batches, last[len(last)-1].Seq)
	if err != nil {
		l.pendMu.Lock()
		l.pend = append(batches, l.pend...)
		l.pendMu.Unlock()
	}
	return err
}

// writeIndex writes the i/ entries of batches (in seq order) and moves
// indexed past each transaction that commits, to through with the last.
func (l *Log) writeIndex(batches []indexBatch, through uint64) error {
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	txn := l.db.NewTransaction(true)
	defer func() { txn.Discard() }()
	// Keys, values and entries in one arena and one slab, reused by the
	// next write (indexMu): Badger is done with them once Commit returns.
	n := 0
	for _, b := range batches {
		n += len(b.events)
	}
	if cap(l.idxEnts) < n {
		l.idxEnts = make([]badgerdb.Entry, 0, n)
	}
	ents, arena := l.idxEnts[:0], l.idxArena[:0]
	defer func() { l.idxEnts, l.idxArena = ents[:0], arena[:0] }()
	var last uint64 // last seq set in txn
	commit := func() error {
		// The mark goes with its entries. Only when they fill the
		// transaction to its last bytes does it take one of its own,
		// after them: refused there, it failed every index write from
		// then on, each retry carrying more entries than the last
		// (batch ingest at 60k events/s filled a transaction within
		// one indexLinger), and Compact with it.
		markErr := txn.Set(keyIndexed, u64(last))
		if markErr != nil && !errors.Is(markErr, badgerdb.ErrTxnTooBig) {
			return markErr
		}
		if err := txn.Commit(); err != nil {
			return err
		}
		if markErr != nil {
			if err := l.db.Update(func(txn *badgerdb.Txn) error { return txn.Set(keyIndexed, u64(last)) }); err != nil {
				return err
			}
		}
		l.indexed.Store(last)
		txn = l.db.NewTransaction(true)
		return nil
	}
	for _, b := range batches {
		for _, ev := range b.events {
			start := len(arena)
			arena = append(append(arena, prefixID...), ev.ID...)
			key := arena[start:len(arena):len(arena)]
			start = len(arena)
			arena = appendIDValue(arena, ev.Seq, ev.Type, ev.Tenant)
			ents = append(ents, badgerdb.Entry{Key: key, Value: arena[start:len(arena):len(arena)], ExpiresAt: uint64(b.expires)})
			e := &ents[len(ents)-1]
			err := txn.SetEntry(e)
			if errors.Is(err, badgerdb.ErrTxnTooBig) && last > 0 {
				if err = commit(); err == nil {
					err = txn.SetEntry(e)
				}
			}
			if err != nil {
				return fmt.Errorf("index %q: %w", ev.ID, err)
			}
			last = ev.Seq
		}
	}
	last = through
	if err := commit(); err != nil {
		return fmt.Errorf("index event ids: %w", err)
	}
	return nil
}

// indexTail writes the i/ entries of the events after indexed up to head
// (those of a process that stopped before its indexer wrote them), on
// Open, before any append. Their window counts from now: the write times
// died with the process, and remembering an id a little longer than the
// window only errs on the side of at most one event per id.
//
// An event whose record is damaged (a value log cut by the crash) is
// left out: its id cannot be read, so a retry of it would be accepted
// again, and its lanes dead-letter it as corrupt when they reach it
// (read.go). The tail is the last indexLinger of appends, so a crash
// that damaged the log's end mostly damaged events in it; refusing the
// whole dir for them would lose every other event too.
func (l *Log) indexTail(indexed, head uint64) error {
	if indexed >= head {
		return nil
	}
	var evs []*queue.Event
	var unreadable []uint64
	err := l.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixEvent, PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Seek(eventKey(indexed + 1)); it.Valid(); it.Next() {
			item := it.Item()
			if err := item.Value(func(v []byte) error {
				return records(seqFromEventKey(item.Key()), v, func(seq uint64, rec []byte) error {
					if seq <= indexed {
						return nil
					}
					id, typ, tenant, err := eventIDType(rec)
					if errors.Is(err, queue.ErrCorrupt) {
						unreadable = append(unreadable, seq)
						return nil
					}
					if err != nil {
						return fmt.Errorf("event %d: %w", seq, err)
					}
					evs = append(evs, &queue.Event{Seq: seq, ID: id, Type: typ, Tenant: tenant})
					return nil
				})
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("index the log's tail: %w", err)
	}
	if len(unreadable) > 0 {
		l.log.Warn("queue: events at the log's tail are damaged; their ids are not remembered, and their lanes will dead-letter them as corrupt",
			"events", len(unreadable), "first_seq", unreadable[0], "last_seq", unreadable[len(unreadable)-1])
	}
	exp := time.Now().Add(l.opts.DedupWindow).Unix()
	if err := l.writeIndex([]indexBatch{{evs, exp}}, head); err != nil {
		return fmt.Errorf("index the log's tail: %w", err)
	}
	return nil
}
