package jetstream

import (
	"fmt"
	"sort"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// The retry schedule. A lane asks for its due retries whenever it has a
// free slot, so DueRetries answers from memory: an index of the lane's
// retries ordered by (due, seq), loaded on first use with one scan of
// retry.<sub>.*, kept current by this Store's own writes (Record, Replay)
// and forgotten by dropIndex when the lease moves or another node changed
// the lane. Only lanes this node may write (it holds the lease, or Own was
// not called) keep an index: another node's writes would leave one stale
// unseen. Other lanes are read afresh each time.
//
// Memory: every retry of an indexed lane, decoded (about 150 bytes each);
// a black-hole lane with a million retries holds about 150 MB while this
// node owns it.

// retryIndex is one lane's retry schedule.
type retryIndex struct {
	bySeq map[uint64]queue.Retry
	order chunks // (due, seq) of every retry in bySeq
}

func newRetryIndex() *retryIndex { return &retryIndex{bySeq: map[uint64]queue.Retry{}} }

func (ix *retryIndex) put(r queue.Retry) {
	if old, ok := ix.bySeq[r.Seq]; ok {
		ix.order.remove(slot{dueNanos(old.Due), old.Seq})
	}
	ix.bySeq[r.Seq] = r
	ix.order.insert(slot{dueNanos(r.Due), r.Seq})
}

func (ix *retryIndex) remove(seq uint64) {
	if old, ok := ix.bySeq[seq]; ok {
		ix.order.remove(slot{dueNanos(old.Due), old.Seq})
		delete(ix.bySeq, seq)
	}
}

// due: up to limit retries due at or before now, earliest first, those
// skip reports left out, and the due time of the first one left (zero if
// none).
func (ix *retryIndex) due(now time.Time, limit int, skip func(uint64) bool) ([]queue.Retry, time.Time) {
	var (
		out  []queue.Retry
		next time.Time
	)
	n := dueNanos(now)
	ix.order.ascend(func(k slot) bool {
		r := ix.bySeq[k.seq]
		if k.due > n || len(out) >= limit {
			next = r.Due
			return false
		}
		if skip == nil || !skip(k.seq) {
			out = append(out, r)
		}
		return true
	})
	return out, next
}

// slot orders the schedule: by due (unix ns), then seq.
type slot struct {
	due int64
	seq uint64
}

func (a slot) less(b slot) bool { return a.due < b.due || a.due == b.due && a.seq < b.seq }

// chunks is a sorted list of slots kept in chunks of at most chunkMax, so
// an insert or a delete moves at most a chunk (and, rarely, the list of
// chunks), not the whole schedule: a lane may hold a million retries.
type chunks struct {
	c [][]slot
}

const chunkMax = 512

// find returns the chunk that holds k or would: the first whose last slot
// is not below k, else the last.
func (cs *chunks) find(k slot) int {
	i := sort.Search(len(cs.c), func(i int) bool { ch := cs.c[i]; return !ch[len(ch)-1].less(k) })
	if i == len(cs.c) {
		i--
	}
	return i
}

func (cs *chunks) insert(k slot) {
	if len(cs.c) == 0 {
		cs.c = [][]slot{{k}}
		return
	}
	i := cs.find(k)
	ch := cs.c[i]
	j := sort.Search(len(ch), func(j int) bool { return !ch[j].less(k) })
	ch = append(ch, slot{})
	copy(ch[j+1:], ch[j:])
	ch[j] = k
	if len(ch) <= chunkMax {
		cs.c[i] = ch
		return
	}
	half := len(ch) / 2
	left := append([]slot(nil), ch[:half]...)
	right := append([]slot(nil), ch[half:]...)
	cs.c = append(cs.c, nil)
	copy(cs.c[i+2:], cs.c[i+1:])
	cs.c[i], cs.c[i+1] = left, right
}

func (cs *chunks) remove(k slot) {
	if len(cs.c) == 0 {
		return
	}
	i := cs.find(k)
	ch := cs.c[i]
	j := sort.Search(len(ch), func(j int) bool { return !ch[j].less(k) })
	if j == len(ch) || ch[j] != k {
		return
	}
	ch = append(ch[:j], ch[j+1:]...)
	if len(ch) > 0 {
		cs.c[i] = ch
		return
	}
	cs.c = append(cs.c[:i], cs.c[i+1:]...)
}

func (cs *chunks) ascend(fn func(slot) bool) {
	for _, ch := range cs.c {
		for _, k := range ch {
			if !fn(k) {
				return
			}
		}
	}
}

// loadRetries reads sub's schedule with one scan of retry.<sub>.* (the
// seq is the last token, so the filter names no other subscription's).
func (s *Store) loadRetries(sub string) (*retryIndex, error) {
	ix := newRetryIndex()
	err := s.scanKeys([]string{keyRetry + sub + ".*"}, false, func(key string, _ uint64, v []byte, deleted bool) error {
		ksub, seq, ok := splitSeqKey(keyRetry, key)
		if !ok || ksub != sub {
			return fmt.Errorf("retry key %q: %w", key, queue.ErrCorrupt)
		}
		if deleted {
			ix.remove(seq)
			return nil
		}
		r, err := decodeRetry(sub, seq, v)
		if err != nil {
			return err
		}
		ix.put(r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ix, nil
}

// mayIndex: this node may keep sub's index (it may write sub: it holds
// the lease, or Own was not called).
func (s *Store) mayIndex(sub string) bool {
	_, _, _, done, err := s.laneFence(sub)
	if done != nil {
		done()
	}
	return err == nil
}

// withIndex calls fn with sub's index, loading it first if needed; fn
// must not keep it. An index kept while this node may no longer write sub
// (a lane it never gained after Own, a dropIndex missed) is dropped.
func (s *Store) withIndex(sub string, fn func(*retryIndex)) error {
	l := s.st.lane(sub)
	may := s.mayIndex(sub)
	l.mu.Lock()
	if l.idx != nil && may {
		fn(l.idx)
		l.mu.Unlock()
		return nil
	}
	if !may {
		l.idx = nil
		l.gen++
	}
	l.mu.Unlock()
	// Loads hold wmu: none of this Store's writes about sub is in
	// flight, so the scan holds every one of them that was answered.
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return s.withIndexLocked(l, sub, fn)
}

// withIndexLocked is withIndex with l.wmu held.
func (s *Store) withIndexLocked(l *laneState, sub string, fn func(*retryIndex)) error {
	l.mu.Lock()
	if l.idx != nil {
		fn(l.idx)
		l.mu.Unlock()
		return nil
	}
	gen := l.gen
	l.mu.Unlock()
	keep := s.mayIndex(sub)
	ix, err := s.loadRetries(sub)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if keep && l.gen == gen {
		l.idx = ix
	}
	fn(ix)
	return nil
}

// indexed applies a write this Store made to sub's index, if loaded. The
// caller holds sub's wmu and the write was answered.
func (s *Store) indexed(sub string, fn func(*retryIndex)) {
	l := s.st.lane(sub)
	l.mu.Lock()
	if l.idx != nil {
		fn(l.idx)
	}
	l.mu.Unlock()
}

// dropIndex forgets sub's in-memory retry index (its lease moved, or
// another node changed its schedule); the next read loads it again.
func (s *Store) dropIndex(sub string) {
	s.st.mu.Lock()
	l := s.st.lanes[sub]
	s.st.mu.Unlock()
	if l == nil {
		return
	}
	l.mu.Lock()
	l.idx = nil
	l.gen++
	l.mu.Unlock()
}

// DueRetries returns up to limit of sub's retries due at or before now,
// earliest first, skipping those skip (may be nil) reports, and the due
// time of the first one left for later (zero if none is known). From the
// lane's index: no round trip once it is loaded.
func (s *Store) DueRetries(sub string, now time.Time, limit int, skip func(seq uint64) bool) ([]queue.Retry, time.Time, error) {
	if err := s.checkOpen(); err != nil {
		return nil, time.Time{}, err
	}
	if err := checkSub(sub); err != nil {
		return nil, time.Time{}, fmt.Errorf("due retries: %w", err)
	}
	var (
		out  []queue.Retry
		next time.Time
	)
	err := s.withIndex(sub, func(ix *retryIndex) { out, next = ix.due(now, limit, skip) })
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("due retries of %s: %w", sub, s.stateErr(err))
	}
	return out, next, nil
}

// allDue: every retry is due by then.
var allDue = time.Unix(0, 1<<62)

// Retries returns sub's scheduled retries, earliest first, at most limit.
func (s *Store) Retries(sub string, limit int) ([]queue.Retry, error) {
	out, _, err := s.DueRetries(sub, allDue, limit, nil)
	return out, err
}

// RetryOf returns sub's scheduled retry of seq; nil when there is none. A
// point lookup (one get from the leader), not a scan of the schedule: the
// completion ledger calls it for every lane an event was for.
func (s *Store) RetryOf(sub string, seq uint64) (*queue.Retry, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := checkSub(sub); err != nil {
		return nil, fmt.Errorf("retry of: %w", err)
	}
	e, err := s.get(s.st.ctx, retryKey(sub, seq))
	if err != nil {
		return nil, fmt.Errorf("retry of %s/%d: %w", sub, seq, s.stateErr(err))
	}
	if !e.exists() {
		return nil, nil
	}
	r, err := decodeRetry(sub, seq, e.data)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// RetrySummaries summarises every subscription's retry schedule, for
// start-up, with one scan of the keys of retry.> (no values: the key names
// the subscription and the seq). cursors holds the durable cursors; a
// subscription missing from it has Ahead nil.
func (s *Store) RetrySummaries(cursors map[string]uint64) (map[string]*queue.RetrySummary, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	keys := map[retryRef]struct{}{}
	err := s.scanKeys([]string{keyRetry + ">"}, true, func(key string, _ uint64, _ []byte, deleted bool) error {
		sub, seq, ok := splitSeqKey(keyRetry, key)
		if !ok {
			return fmt.Errorf("retry key %q: %w", key, queue.ErrCorrupt)
		}
		if deleted {
			delete(keys, retryRef{sub, seq})
		} else {
			keys[retryRef{sub, seq}] = struct{}{}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("retry summaries: %w", s.stateErr(err))
	}
	out := map[string]*queue.RetrySummary{}
	for k := range keys {
		rs := out[k.sub]
		if rs == nil {
			rs = &queue.RetrySummary{}
			out[k.sub] = rs
		}
		rs.Count++
		if c, ok := cursors[k.sub]; ok && k.seq > c {
			if rs.Ahead == nil {
				rs.Ahead = map[uint64]struct{}{}
			}
			rs.Ahead[k.seq] = struct{}{}
		}
	}
	return out, nil
}
