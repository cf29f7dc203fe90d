package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// DeadLetter reads one dead letter; ErrNotFound when there is none.
func (s *Store) DeadLetter(sub string, seq uint64) (*queue.DeadLetter, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := checkSub(sub); err != nil {
		return nil, fmt.Errorf("dead letter: %w", err)
	}
	e, err := s.get(s.st.ctx, deadKey(sub, seq))
	if err != nil {
		return nil, fmt.Errorf("dead letter %s/%d: %w", sub, seq, s.stateErr(err))
	}
	if !e.exists() {
		return nil, fmt.Errorf("dead letter %s/%d: %w", sub, seq, queue.ErrNotFound)
	}
	d, err := decodeDeadLetter(e.data)
	if err != nil {
		return nil, fmt.Errorf("dead letter %s/%d: %w", sub, seq, err)
	}
	return d, nil
}

// deadFetchers bounds the gets in flight of one DeadLetters page.
const deadFetchers = 8

// DeadLetters lists dead letters of sub ("" for all subscriptions) in key
// order (subscription, then seq), starting after the given position, at
// most limit. The keys come from one scan without values (dead.<sub>.*
// or dead.>); only the page's letters are read, with their bodies, a few
// gets at a time. A page costs a scan of every key it may come from: the
// KV has no ordered range reads.
func (s *Store) DeadLetters(sub, afterSub string, afterSeq uint64, limit int) ([]*queue.DeadLetter, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	filter := keyDead + ">"
	if sub != "" {
		if err := checkSub(sub); err != nil {
			return nil, fmt.Errorf("dead letters: %w", err)
		}
		filter = keyDead + sub + ".*"
	}
	if limit <= 0 {
		return nil, nil
	}
	set := map[retryRef]struct{}{}
	err := s.scanKeys([]string{filter}, true, func(key string, _ uint64, _ []byte, deleted bool) error {
		ksub, seq, ok := splitSeqKey(keyDead, key)
		if !ok {
			return fmt.Errorf("dead letter key %q: %w", key, queue.ErrCorrupt)
		}
		k := retryRef{ksub, seq}
		switch {
		case deleted:
			delete(set, k)
		case afterSub == "" || ksub > afterSub || ksub == afterSub && seq > afterSeq:
			set[k] = struct{}{}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", s.stateErr(err))
	}
	keys := make([]retryRef, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b retryRef) int {
		if c := cmpString(a.sub, b.sub); c != 0 {
			return c
		}
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	keys = keys[:min(limit, len(keys))]

	out := make([]*queue.DeadLetter, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(deadFetchers, len(keys)) {
		wg.Go(func() {
			for i := range next {
				out[i], errs[i] = s.DeadLetter(keys[i].sub, keys[i].seq)
			}
		})
	}
	for i := range keys {
		next <- i
	}
	close(next)
	wg.Wait()
	page := out[:0]
	for i, d := range out {
		switch {
		case errs[i] == nil:
			page = append(page, d)
		case errors.Is(errs[i], queue.ErrNotFound):
			// Gone since the scan.
		default:
			return nil, fmt.Errorf("dead letters: %w", errs[i])
		}
	}
	return page, nil
}

// Replay schedules a dead letter for delivery again, due at `due`, and
// records the replay on it (Replays+1, ReplayedAt = due), in one atomic
// batch whose check is part of the write: the letter's update expects the
// revision read, the retry's create expects the retry key absent (as
// read: never written, or a delete marker). Of concurrent replays, from
// any nodes, one is stored; the others conflict, read again and answer
// ErrReplayed (or ErrRetryScheduled). A letter already replayed answers
// ErrReplayed unless force; one with a retry scheduled answers
// ErrRetryScheduled whatever force says; both refusals return the letter
// as it is. A missing letter answers ErrNotFound.
//
// Replay is not fenced by a lease (any node's admin API may replay); it
// tells the lane's owner, wherever it runs, to read the schedule again.
func (s *Store) Replay(sub string, seq uint64, due time.Time, force bool) (*queue.DeadLetter, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := checkSub(sub); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	retry := queue.Retry{Subscription: sub, Seq: seq, Due: due, FirstAttempt: due, Replay: true}
	rv, err := encodeRetry(retry)
	if err != nil {
		return nil, fmt.Errorf("replay %s/%d: %w", sub, seq, err)
	}
	if retry, err = decodeRetry(sub, seq, rv); err != nil { // as a read returns it
		return nil, err
	}
	ctx := s.st.ctx
	l := s.st.lane(sub)
	l.wmu.Lock()
	var (
		d       *queue.DeadLetter
		refused error
	)
	deadline := time.Now().Add(s.opts.RequestTimeout)
	for attempt := 0; ; attempt++ {
		de, err := s.get(ctx, deadKey(sub, seq))
		if err == nil && !de.exists() {
			err = queue.ErrNotFound
		}
		if err == nil {
			d, err = decodeDeadLetter(de.data)
		}
		var re entry
		if err == nil && (d.Replays == 0 || force) {
			re, err = s.get(ctx, retryKey(sub, seq))
		}
		if err != nil {
			l.wmu.Unlock()
			return nil, fmt.Errorf("replay %s/%d: %w", sub, seq, s.stateErr(err))
		}
		if d.Replays > 0 && !force {
			refused = queue.ErrReplayed
			break
		}
		if re.exists() {
			// The two reads are no snapshot: a replay stored between them
			// shows as a retry of a letter read before it. Refuse only
			// when the letter is still as read; else look again.
			again, err := s.get(ctx, deadKey(sub, seq))
			if err != nil {
				l.wmu.Unlock()
				return nil, fmt.Errorf("replay %s/%d: %w", sub, seq, s.stateErr(err))
			}
			if again.rev == de.rev {
				refused = queue.ErrRetryScheduled
				break
			}
			continue
		}
		r := *d
		r.Replays++
		r.ReplayedAt = due
		dv, err := encodeDeadLetter(&r)
		if err != nil {
			l.wmu.Unlock()
			return nil, fmt.Errorf("replay %s/%d: %w", sub, seq, err)
		}
		dm := s.newPut(deadKey(sub, seq), dv)
		expectRev(dm, de.rev)
		rm := s.newPut(retryKey(sub, seq), rv)
		expectRev(rm, re.rev)
		err = s.commit(ctx, []write{{m: dm, cas: true}, {m: rm, cas: true}})
		if err == nil {
			d = &r
			s.indexed(sub, func(ix *retryIndex) { ix.put(retry) })
			break
		}
		if apiCode(err) != codeWrongLastSeq && !casRetryable(err) {
			l.wmu.Unlock()
			return nil, fmt.Errorf("replay %s/%d: %w", sub, seq, s.stateErr(err))
		}
		if time.Now().After(deadline) {
			l.wmu.Unlock()
			return nil, fmt.Errorf("replay %s/%d: %w: conflicting writes for %s", sub, seq, queue.ErrUnavailable, s.opts.RequestTimeout)
		}
		if casRetryable(err) {
			if err := s.pause(ctx, attempt); err != nil {
				l.wmu.Unlock()
				return nil, err
			}
		}
	}
	l.wmu.Unlock()
	if refused != nil {
		return d, fmt.Errorf("replay %s/%d: %w", sub, seq, refused)
	}
	s.notifyChanged(sub)
	return d, nil
}

// trimBatch bounds the purges of one atomic batch of TrimDeadLetters.
const trimBatch = 64

// TrimDeadLetters implements queue.DeadLetterTrimmer: the keys of sub's
// letters from one metadata-only scan, then the oldest past keep purged in
// batches, each fenced by this node's lease on sub (writeLane), as every
// write of the lane's state is. A letter whose seq has a retry scheduled
// (a replay in flight needs its body) is kept; the check is made under
// sub's wmu, which Replay holds too.
func (s *Store) TrimDeadLetters(sub string, keep int) (int, error) {
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	if err := checkSub(sub); err != nil {
		return 0, fmt.Errorf("trim dead letters: %w", err)
	}
	keep = max(keep, 0)
	live := map[uint64]struct{}{}
	err := s.scanKeys([]string{keyDead + sub + ".*"}, true, func(key string, _ uint64, _ []byte, deleted bool) error {
		_, seq, ok := splitSeqKey(keyDead, key)
		if !ok {
			return fmt.Errorf("dead letter key %q: %w", key, queue.ErrCorrupt)
		}
		if deleted {
			delete(live, seq)
		} else {
			live[seq] = struct{}{}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("trim dead letters of %s: %w", sub, s.stateErr(err))
	}
	if len(live) <= keep {
		return 0, nil
	}
	seqs := make([]uint64, 0, len(live))
	for seq := range live {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	old := seqs[:len(seqs)-keep]
	l := s.st.lane(sub)
	l.wmu.Lock()
	defer l.wmu.Unlock()
	deleted := 0
	for len(old) > 0 {
		batch := old[:min(len(old), trimBatch)]
		old = old[len(batch):]
		n := 0
		err := s.writeLane(sub, func(ctx context.Context) ([]write, error) {
			n = 0
			var ws []write
			for _, seq := range batch {
				re, err := s.get(ctx, retryKey(sub, seq))
				if err != nil {
					return nil, err
				}
				if re.exists() {
					continue
				}
				ws = append(ws, write{m: s.newPurge(deadKey(sub, seq))})
				n++
			}
			return ws, nil
		})
		if err != nil {
			return deleted, fmt.Errorf("trim dead letters of %s: %w", sub, s.stateErr(err))
		}
		deleted += n
	}
	return deleted, nil
}
