package badger

import (
	"errors"
	"fmt"
	"sync"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

type appendReq struct {
	ev   *queue.Event
	seq  uint64
	dup  bool
	err  error
	done chan struct{}
}

var reqPool = sync.Pool{New: func() any { return &appendReq{done: make(chan struct{}, 1)} }}

// Append makes ev durable and returns its sequence number. ev.ID must be set
// (the proxy generates one when the producer gave none) and ev.AcceptedAt
// too. If the id was appended within the dedup window, Append returns the
// original sequence number with dup = true and writes nothing.
// After Append returns, ev belongs to the queue: its Body is shared with the
// lanes and must not be modified.
func (l *Log) Append(ev *queue.Event) (seq uint64, dup bool, err error) {
	if err := l.disk.admit(len(ev.Body)); err != nil {
		return 0, false, err
	}
	start := time.Now()
	r := reqPool.Get().(*appendReq)
	r.ev = ev
	l.closeMu.RLock()
	if l.closed {
		l.closeMu.RUnlock()
		reqPool.Put(r)
		return 0, false, queue.ErrClosed
	}
	l.reqs <- r
	l.closeMu.RUnlock()
	<-r.done
	// Timed from the hand-off to the committer: a refusal by the disk
	// guard or after Close answers at once and is not counted.
	l.m.append.Observe(time.Since(start).Seconds())
	seq, dup, err = r.seq, r.dup, r.err
	*r = appendReq{done: r.done}
	reqPool.Put(r)
	return seq, dup, err
}

// written is a batch whose transaction is committed, waiting for its sync.
type written struct {
	reqs      []*appendReq
	events    []*queue.Event // the new events, in seq order
	committed uint64         // last seq actually written
	err       error          // the write error, for requests past committed
}

// committer gathers waiting appends into batches and writes each in one
// transaction. With Sync, it hands written batches to the syncer and goes
// on gathering the next batch while the sync runs: the write of batch n+1
// overlaps the fsync of batch n, and one fsync covers every batch written
// before it started.
func (l *Log) committer() {
	var (
		arena []byte
		seen  = map[string]uint64{}
		syncs chan *written
		done  = make(chan struct{})
	)
	if l.opts.Sync {
		syncs = make(chan *written, 8)
		go l.syncer(syncs, done)
	} else {
		close(done)
	}
	defer func() {
		if syncs != nil {
			close(syncs)
		}
		<-done
		close(l.done)
	}()
	for r := range l.reqs {
		batch := []*appendReq{r}
		size := r.ev.Size()
	gather:
		for len(batch) < maxBatchEvents && size < maxBatchBytes {
			select {
			case r, ok := <-l.reqs:
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
		w, arena = l.write(batch, arena[:0], seen)
		clear(seen)
		if syncs != nil && w.committed > l.head.Load() {
			syncs <- w
		} else {
			l.publish(w, nil)
		}
	}
}

// syncer fsyncs written batches, as many per fsync as have queued up.
func (l *Log) syncer(in <-chan *written, done chan<- struct{}) {
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
		err := l.sync()
		l.lastSync.Store(time.Now().UnixNano())
		for _, w := range ws {
			l.publish(w, err)
		}
		clear(ws)
	}
}

// write assigns sequence numbers and writes one batch in as few
// transactions as Badger allows.
func (l *Log) write(batch []*appendReq, arena []byte, seen map[string]uint64) (*written, []byte) {
	l.seqMu.Lock()
	defer l.seqMu.Unlock()
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	next := l.assigned.Load() + 1
	w := &written{reqs: batch, committed: l.assigned.Load()}
	txn := l.db.NewTransaction(true)
	defer func() { txn.Discard() }()
	var err error
	pending := 0 // events set in txn but not yet committed
	flush := func() error {
		// The head goes with its events. Only when they fill the
		// transaction to its last bytes does it take one of its own: Open
		// would find the head from the last event key, but not once
		// compaction has deleted every event.
		headErr := txn.Set(keyHead, u64(next-1))
		if headErr != nil && !errors.Is(headErr, badgerdb.ErrTxnTooBig) {
			return fmt.Errorf("set head: %w", headErr)
		}
		if err := txn.Commit(); err != nil {
			return err
		}
		w.committed = next - 1
		pending = 0
		txn = l.db.NewTransaction(true)
		if headErr != nil {
			if err := l.db.Update(func(txn *badgerdb.Txn) error { return txn.Set(keyHead, u64(next-1)) }); err != nil {
				return fmt.Errorf("set head: %w", err)
			}
		}
		return nil
	}
	// set adds one entry; on ErrTxnTooBig it commits what it has and retries
	// in a fresh transaction.
	set := func(e *badgerdb.Entry) error {
		err := txn.SetEntry(e)
		if errors.Is(err, badgerdb.ErrTxnTooBig) && pending > 0 {
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
		if !errors.Is(gerr, badgerdb.ErrKeyNotFound) {
			r.err = fmt.Errorf("dedup lookup: %w", gerr)
			continue
		}
		r.ev.Seq = next
		start := len(arena)
		arena = appendEvent(arena, r.ev)
		val := arena[start:len(arena):len(arena)]
		if err = set(badgerdb.NewEntry(eventKey(next), val)); err == nil {
			start = len(arena)
			arena = appendIDValue(arena, next, r.ev.Type)
			err = set(badgerdb.NewEntry(idKey(r.ev.ID), arena[start:len(arena):len(arena)]).WithTTL(l.opts.DedupWindow))
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
	l.assigned.Store(w.committed)
	// Events past the last committed transaction were never written.
	for len(w.events) > 0 && w.events[len(w.events)-1].Seq > w.committed {
		w.events = w.events[:len(w.events)-1]
	}
	return w, arena
}

// publish makes a written batch visible once it is durable: it advances
// the head, hands the events to OnCommit and answers every appender.
func (l *Log) publish(w *written, syncErr error) {
	if w.committed > l.head.Load() {
		l.head.Store(w.committed)
	}
	if len(w.events) > 0 && l.opts.OnCommit != nil {
		l.opts.OnCommit(w.events)
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
