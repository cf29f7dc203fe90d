package badger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

type appendReq struct {
	ev *queue.Event
	// checked: the appender found no i/ entry of the id in a snapshot
	// taken once every event up to checked was indexed (dedup.go).
	checked uint64
	seq     uint64
	dup     bool
	err     error
	// done is signalled once the answer is in; nil for the members of a
	// batch but its last, whose done answers them all (AppendBatch).
	done chan struct{}
	key  []byte // i/<id>, for the appender's lookup
	hash uint64 // of the id, in the filter (idfilter.go)
	// batch, on the last request of an AppendBatch (the one it sends),
	// is every request of the batch the committer takes, itself last.
	batch []*appendReq
}

// addTo appends to b what the committer takes from r: r alone, or its
// batch.
func (r *appendReq) addTo(b []*appendReq) []*appendReq {
	if r.batch != nil {
		return append(b, r.batch...)
	}
	return append(b, r)
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
	l.closeMu.RLock()
	if l.closed {
		l.closeMu.RUnlock()
		return 0, false, queue.ErrClosed
	}
	r := reqPool.Get().(*appendReq)
	r.ev, r.hash = ev, l.filter.hash(ev.ID)
	var txn *badgerdb.Txn
	send := l.precheck(r, &txn, l.assigned.Load(), l.indexed.Load())
	if txn != nil {
		txn.Discard()
	}
	if !send {
		l.closeMu.RUnlock()
		seq, dup, err = r.seq, r.dup, r.err
		*r = appendReq{done: r.done, key: r.key[:0]}
		reqPool.Put(r)
		if err == nil {
			l.m.append.Observe(time.Since(start).Seconds())
		}
		return seq, dup, err
	}
	l.reqs <- r
	l.closeMu.RUnlock()
	return l.await(r, start)
}

// precheck is an appender's dedup check of r (its ev and hash set),
// Append's and AppendBatch's alike. The check is the appender's, not the
// committer's: appenders make it in parallel, and a duplicate of a durable
// event is answered here. An id the filter has never seen needs no
// lookup; the committer checks it against what it wrote after assigned,
// which the caller reads before the filter is asked (idfilter.go).
// Otherwise the id is looked up in a snapshot, *txn, opened here at the
// first need (the caller discards it), after the caller read checked, the
// indexer's mark (dedup.go).
//
// It reports whether r goes to the committer; when not, r.seq, r.dup and
// r.err are its answer (a duplicate of a published event, or the lookup's
// failure).
func (l *Log) precheck(r *appendReq, txn **badgerdb.Txn, assigned, checked uint64) bool {
	if !l.filter.mayContain(r.hash) {
		r.checked = assigned
		return true
	}
	if *txn == nil {
		*txn = l.db.NewTransaction(false)
	}
	r.key = append(append(r.key[:0], prefixID...), r.ev.ID...)
	seq, _, _, found, err := lookupIndexed(*txn, r.key, r.ev.ID)
	switch {
	case err != nil:
		r.err = err
		return false
	case found && seq <= l.head.Load():
		r.seq, r.dup = seq, true
		return false
	case found:
		// Indexed, yet not published: the indexer writes only published
		// events, so this should not be; were it so, the committer
		// answers it after the sync that covers the original.
		r.seq, r.dup = seq, true
	}
	r.checked = checked
	return true
}

// AppendBatch appends evs as Append appends each (queue.Log), handing
// them to the committer at once: they go in one of its batches, so they
// get consecutive seqs (less the duplicates), share its transactions and
// one sync, and cost the committer one wake-up instead of one per event.
// The disk guard admits the batch whole or refuses it whole. An id that
// repeats within evs is a duplicate of its first event: the committer's
// recent ids (dedup.go) hold an id from the moment it is assigned.
func (l *Log) AppendBatch(evs []*queue.Event, res []queue.AppendResult) {
	if len(evs) == 0 {
		return
	}
	fail := func(err error) {
		for i := range evs {
			res[i] = queue.AppendResult{Err: err}
		}
	}
	if err := l.disk.admitAll(evs); err != nil {
		fail(err)
		return
	}
	start := time.Now()
	l.closeMu.RLock()
	if l.closed {
		l.closeMu.RUnlock()
		fail(queue.ErrClosed)
		return
	}
	// Append's dedup check for every event, in one snapshot.
	reqs := make([]appendReq, len(evs))
	send := make([]*appendReq, 0, len(evs))
	assigned, checked := l.assigned.Load(), l.indexed.Load()
	var txn *badgerdb.Txn
	for i, ev := range evs {
		r := &reqs[i]
		r.ev, r.hash = ev, l.filter.hash(ev.ID)
		if l.precheck(r, &txn, assigned, checked) {
			send = append(send, r)
		}
	}
	if txn != nil {
		txn.Discard()
	}
	if len(send) > 0 {
		last := send[len(send)-1]
		last.done, last.batch = make(chan struct{}, 1), send
		l.reqs <- last
		l.closeMu.RUnlock()
		<-last.done
	} else {
		l.closeMu.RUnlock()
	}
	d := time.Since(start).Seconds()
	for i := range reqs {
		r := &reqs[i]
		res[i] = queue.AppendResult{Seq: r.seq, Dup: r.dup, Err: r.err}
		if r.err == nil {
			l.m.append.Observe(d)
		}
	}
}

// await waits for the committer's answer to r and puts r back.
func (l *Log) await(r *appendReq, start time.Time) (seq uint64, dup bool, err error) {
	<-r.done
	// Timed from the hand-off to the committer: a refusal by the disk
	// guard or after Close answers at once and is not counted.
	l.m.append.Observe(time.Since(start).Seconds())
	seq, dup, err = r.seq, r.dup, r.err
	*r = appendReq{done: r.done, key: r.key[:0]}
	reqPool.Put(r)
	return seq, dup, err
}

// written is a batch whose transaction is committed, waiting for its sync.
type written struct {
	reqs      []*appendReq
	events    []*queue.Event // the new events, in seq order
	committed uint64         // last seq actually written
	err       error          // the write error, for requests past committed
	expires   int64          // unix seconds when the ids of events expire
}

// committer gathers waiting appends into batches and writes each in one
// transaction. With Sync, it hands written batches to the syncer and goes
// on gathering the next batch while the sync runs: the write of batch n+1
// overlaps the fsync of batch n, and one fsync covers every batch written
// before it started.
func (l *Log) committer() {
	var (
		arena []byte
		ents  []badgerdb.Entry
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
		batch := r.addTo(make([]*appendReq, 0, 1))
		size := 0
		for _, m := range batch {
			size += m.ev.Size()
		}
	gather:
		for len(batch) < maxBatchEvents && size < maxBatchBytes {
			select {
			case r, ok := <-l.reqs:
				if !ok {
					break gather
				}
				n := len(batch)
				batch = r.addTo(batch)
				for _, m := range batch[n:] {
					size += m.ev.Size()
				}
			default:
				break gather
			}
		}
		var w *written
		w, arena, ents = l.write(batch, arena[:0], ents)
		if l.vlogWritten >= l.vlogSize/2 {
			l.vlogWritten = 0
			l.kickGC()
		}
		switch {
		case syncs == nil || w.committed <= l.head.Load():
			l.publish(w, nil)
		case l.syncing.Load() == 0 && len(l.reqs) == 0:
			// Nothing to overlap the sync with: no append waits and the
			// syncer has published every batch before this one. Syncing
			// here spares the hand-off, a goroutine wake-up per event at
			// low load, where every batch is one event.
			err := l.sync()
			l.lastSync.Store(time.Now().UnixNano())
			l.publish(w, err)
		default:
			l.syncing.Add(1)
			syncs <- w
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
		l.syncing.Add(-int64(len(ws)))
		clear(ws)
	}
}

// write assigns sequence numbers and writes one batch in as few
// transactions as Badger allows.
//
// The keys and values of a batch go in arena and its entries in ents,
// both the committer's and reused: Badger is done with them once the
// transaction's Commit has returned.
func (l *Log) write(batch []*appendReq, arena []byte, ents []badgerdb.Entry) (*written, []byte, []badgerdb.Entry) {
	if cap(ents) < len(batch) {
		ents = make([]badgerdb.Entry, 0, len(batch))
	}
	ents = ents[:0]
	l.seqMu.Lock()
	defer l.seqMu.Unlock()
	// Held across the batch, so that Lookup never sees an id of this
	// batch that its transaction then failed to write.
	l.idsMu.Lock()
	defer l.idsMu.Unlock()
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	next := l.assigned.Load() + 1
	now := time.Now()
	w := &written{reqs: batch, committed: l.assigned.Load(), expires: now.Add(l.opts.DedupWindow).Unix()}
	head := l.head.Load()
	txn := l.db.NewTransaction(true)
	defer func() { txn.Discard() }()
	var (
		err     error
		pending = 0           // records set in txn but not yet committed
		through = w.committed // last seq of the records set in txn
		g       groupWriter   // the group being built (g.n events)
		gsize   int           // bytes of its events
	)
	flush := func() error {
		// The head goes with its events. Only when they fill the
		// transaction to its last bytes does it take one of its own: Open
		// would find the head from the last event key, but not once
		// compaction has deleted every event.
		headErr := txn.Set(keyHead, u64(through))
		if headErr != nil && !errors.Is(headErr, badgerdb.ErrTxnTooBig) {
			return fmt.Errorf("set head: %w", headErr)
		}
		if err := txn.Commit(); err != nil {
			return err
		}
		w.committed = through
		pending = 0
		txn = l.db.NewTransaction(true)
		if headErr != nil {
			if err := l.db.Update(func(txn *badgerdb.Txn) error { return txn.Set(keyHead, u64(through)) }); err != nil {
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
	// closeGroup sets the group built so far as one record under the key
	// of its last seq (next-1), or the event alone as its own record.
	closeGroup := func() error {
		if g.n == 0 {
			return nil
		}
		val := g.value(arena)
		if len(val) >= valueThreshold {
			l.vlogWritten += int64(len(val))
		}
		start := len(arena)
		arena = binary.BigEndian.AppendUint64(append(arena, prefixEvent...), next-1)
		ents = append(ents, badgerdb.Entry{Key: arena[start:len(arena):len(arena)], Value: val})
		g.n = 0
		if err := set(&ents[len(ents)-1]); err != nil {
			return err
		}
		through = next - 1
		pending++
		return nil
	}
	for _, r := range batch {
		if err != nil {
			r.err = err
			continue
		}
		if r.dup {
			continue
		}
		if e, ok := l.recentID(r.ev.ID, now.Unix(), head); ok {
			r.seq, r.dup = e.seq, true
			continue
		}
		if r.checked < l.idsLow {
			// The appender's snapshot is older than what recent holds.
			// An append the filter cleared comes without its key.
			r.key = append(append(r.key[:0], prefixID...), r.ev.ID...)
			seq, _, _, found, gerr := lookupIndexed(txn, r.key, r.ev.ID)
			if gerr != nil || found {
				r.seq, r.dup, r.err = seq, found, gerr
				continue
			}
		}
		size := r.ev.Size()
		if g.n > 0 && gsize+size > groupMaxBytes {
			if err = closeGroup(); err != nil {
				r.err = err
				continue
			}
		}
		if g.n == 0 {
			arena, gsize = g.begin(arena), 0
		}
		r.ev.Seq = next
		arena = g.add(arena, r.ev)
		gsize += size
		l.ids[r.ev.ID] = idEntry{seq: next, typ: r.ev.Type, tenant: r.ev.Tenant, expires: w.expires}
		l.filter.add(r.hash, now.UnixNano())
		r.seq = next
		next++
		w.events = append(w.events, r.ev)
		if gsize >= groupMaxBytes {
			// A failure here fails this group's appends in publish (their
			// seqs are past what was committed) and the rest below.
			err = closeGroup()
		}
	}
	if err == nil {
		err = closeGroup()
	}
	if err == nil && pending > 0 {
		err = flush()
	}
	w.err = err
	l.assigned.Store(w.committed)
	// Events past the last committed transaction were never written.
	for len(w.events) > 0 && w.events[len(w.events)-1].Seq > w.committed {
		delete(l.ids, w.events[len(w.events)-1].ID)
		w.events = w.events[:len(w.events)-1]
	}
	if len(w.events) > 0 {
		l.idsMax = w.committed
	}
	l.rotateRecent()
	l.filter.expire(now.UnixNano())
	return w, arena, ents
}

// publish makes a written batch visible once it is durable: it advances
// the head, hands the events to OnCommit and answers every appender.
func (l *Log) publish(w *written, syncErr error) {
	l.queueIndex(w.events, w.expires)
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
		if r.done != nil {
			r.done <- struct{}{}
		}
	}
}
