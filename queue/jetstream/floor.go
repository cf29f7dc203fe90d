package jetstream

// The retention floor.
//
// retentionFloor is asked every few seconds, and a scan of every
// membership, cursor and retry each time would cost as much as a start-up.
// A follower instead keeps what the floor needs: one ordered consumer on
// member.>, cursor.> and retry.> (one, so what it has seen is a prefix of
// the bucket's history: a cursor past a seq is never seen before the
// retry of that seq written ahead of it), started on the first call and
// followed from then on. A follower that lags is safe: it has not yet
// seen cursors move on or retries resolve, which only lowers the floor.
// The follower starts over after a reconnect of the connection (deletes
// whose markers expired meanwhile would otherwise be missed) or when its
// consumer ends. It reflects at least every write of this Store answered
// before the call (it waits for the follower to get that far), so a
// Compact right after this node's Record sees the Record.

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// floorFollower is the follower's state.
type floorFollower struct {
	mu         sync.Mutex
	w          jetstream.KeyWatcher // nil: not running
	ready      chan struct{}        // closed when the initial values are in
	stopped    chan struct{}        // closed when its goroutine ended
	reconnects uint64
	seen       uint64        // the follower has seen the bucket up to this stream seq
	moved      chan struct{} // closed (and replaced) when seen grows

	members map[string]floorMember
	cursors map[string]uint64
	retries map[retryRef]struct{}
	held    map[uint64]int // seq → retries of it
	low     seqHeap        // seqs of held, lazily cleaned: may hold seqs no longer held
	subs    map[string]string
}

type floorMember struct {
	from, until uint64
	left        bool
}

type retryRef struct {
	sub string
	seq uint64
}

// retentionFloor is the lowest seq any membership or retry still needs:
// a membership its cursor+1 (one that left, only while its cursor is
// below its Until), a retry its seq. ^uint64(0) when nothing needs any
// event. Compact purges below it and no further.
func (s *Store) retentionFloor() (uint64, error) {
	var floor uint64
	err := s.floorView(func(f *floorFollower) {
		floor = min(f.memberFloorLocked(), f.retryFloorLocked())
	})
	if err != nil {
		return 0, fmt.Errorf("retention floor: %w", err)
	}
	return floor, nil
}

// retentionHolds is what Compact's deletes above the floor need, from the
// follower rather than scans: the lowest seq a membership still needs
// (^uint64(0) if none) and the seqs in [from, to) that retries hold.
func (s *Store) retentionHolds(from, to uint64) (memberFloor uint64, held map[uint64]struct{}, err error) {
	held = map[uint64]struct{}{}
	err = s.floorView(func(f *floorFollower) {
		memberFloor = f.memberFloorLocked()
		if to > from && to-from < uint64(len(f.held)) {
			for seq := from; seq < to; seq++ {
				if f.held[seq] > 0 {
					held[seq] = struct{}{}
				}
			}
			return
		}
		for seq := range f.held {
			if seq >= from && seq < to {
				held[seq] = struct{}{}
			}
		}
	})
	if err != nil {
		return 0, nil, fmt.Errorf("retention holds: %w", err)
	}
	return memberFloor, held, nil
}

// floorView calls fn with the follower's state (f.mu held) once it is
// current: started, its initial values in, every write of this Store
// answered before the call seen.
func (s *Store) floorView(fn func(f *floorFollower)) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	f := &s.st.floor
	f.mu.Lock()
	if f.w != nil && s.nc.Stats().Reconnects != f.reconnects {
		f.stopLocked()
	}
	if f.w == nil {
		if err := s.startFloorLocked(); err != nil {
			f.mu.Unlock()
			return s.stateErr(err)
		}
	}
	ready, stopped := f.ready, f.stopped
	f.mu.Unlock()

	// The initial values can be many (every retry): allow them time.
	wait := 4 * s.opts.RequestTimeout
	t := time.NewTimer(wait)
	defer t.Stop()
	await := func(ch <-chan struct{}) error {
		select {
		case <-ch:
			return nil
		case <-stopped:
			return fmt.Errorf("%w: the state follower ended", queue.ErrUnavailable)
		case <-t.C:
			return fmt.Errorf("%w: the state follower has not caught up within %s", queue.ErrUnavailable, wait)
		case <-s.st.ctx.Done():
			return queue.ErrClosed
		}
	}
	if err := await(ready); err != nil {
		return err
	}
	own := s.st.ownSeq.Load()
	f.mu.Lock()
	for f.seen < own {
		moved := f.moved
		f.mu.Unlock()
		if err := await(moved); err != nil {
			return err
		}
		f.mu.Lock()
	}
	defer f.mu.Unlock()
	fn(f)
	return nil
}

func (f *floorFollower) memberFloorLocked() uint64 {
	floor := ^uint64(0)
	for sub, m := range f.members {
		c, ok := f.cursors[sub]
		if !ok && m.from > 0 {
			c = m.from - 1
		}
		if m.left && c >= m.until {
			continue // drained: owed nothing more
		}
		floor = min(floor, c+1)
	}
	return floor
}

func (f *floorFollower) retryFloorLocked() uint64 {
	for len(f.low) > 0 && f.held[f.low[0]] == 0 {
		heap.Pop(&f.low)
	}
	if len(f.low) > 0 {
		return f.low[0]
	}
	return ^uint64(0)
}

// startFloorLocked starts the follower; f.mu is held.
func (s *Store) startFloorLocked() error {
	f := &s.st.floor
	f.members, f.cursors = map[string]floorMember{}, map[string]uint64{}
	f.retries, f.held, f.low, f.subs = map[retryRef]struct{}{}, map[uint64]int{}, nil, map[string]string{}
	f.reconnects = s.nc.Stats().Reconnects
	// The follower's consumer may sit on a replica that lags the leader.
	// It has seen the bucket up to the leader's last seq now (base) once
	// it has delivered the last followed message there was (upTo): every
	// followed message up to base was in the stream when upTo was read.
	ctx, cancel := context.WithTimeout(s.st.ctx, s.opts.RequestTimeout)
	defer cancel()
	info, err := s.st.stream.Info(ctx)
	if err != nil {
		return err
	}
	base := info.State.LastSeq
	filters := []string{keyMember + ">", keyCursor + ">", keyRetry + ">"}
	upTo, err := s.lastOf(ctx, filters)
	if err != nil {
		return err
	}
	w, err := s.state.WatchFiltered(s.st.ctx, filters)
	if err != nil {
		return err
	}
	f.w, f.ready, f.stopped, f.seen, f.moved = w, make(chan struct{}), make(chan struct{}), 0, make(chan struct{})
	ready, stopped := f.ready, f.stopped
	s.st.wg.Add(1)
	go func() {
		defer s.st.wg.Done()
		defer close(stopped)
		initial, caught, last := true, false, uint64(0)
		for e := range w.Updates() {
			f.mu.Lock()
			if f.w == w {
				seen := f.seen
				if e == nil {
					initial = false
				} else {
					f.applyLocked(e)
					last = max(last, e.Revision())
					if caught {
						seen = max(seen, e.Revision())
					}
				}
				if !caught && !initial && last >= upTo {
					caught = true
					seen = max(last, base)
				}
				if seen > f.seen {
					f.seen = seen
					close(f.moved)
					f.moved = make(chan struct{})
				}
			}
			f.mu.Unlock()
			if caught && ready != nil {
				close(ready)
				ready = nil
			}
		}
		f.mu.Lock()
		if f.w == w {
			f.w = nil
		}
		f.mu.Unlock()
	}()
	return nil
}

// applyLocked takes one change into the follower's state.
func (f *floorFollower) applyLocked(e jetstream.KeyValueEntry) {
	k := e.Key()
	del := e.Operation() != jetstream.KeyValuePut
	switch {
	case len(k) > len(keyMember) && k[:len(keyMember)] == keyMember:
		sub := k[len(keyMember):]
		if del {
			delete(f.members, sub)
			return
		}
		m, err := decodeMember(sub, e.Value())
		if err != nil {
			return // unreadable: it holds nothing (Memberships reports it)
		}
		f.members[sub] = floorMember{from: m.From, until: m.Until, left: m.Left}
	case len(k) > len(keyCursor) && k[:len(keyCursor)] == keyCursor:
		sub := k[len(keyCursor):]
		if del {
			delete(f.cursors, sub)
			return
		}
		if c, err := decodeCursor(sub, e.Value()); err == nil {
			f.cursors[sub] = c
		}
	default:
		sub, seq, ok := splitSeqKey(keyRetry, k)
		if !ok {
			return
		}
		if s, ok := f.subs[sub]; ok {
			sub = s // one copy of each id
		} else {
			f.subs[sub] = sub
		}
		r := retryRef{sub, seq}
		_, had := f.retries[r]
		switch {
		case del && had:
			delete(f.retries, r)
			if f.held[seq]--; f.held[seq] <= 0 {
				delete(f.held, seq)
			}
		case !del && !had:
			f.retries[r] = struct{}{}
			if f.held[seq]++; f.held[seq] == 1 {
				heap.Push(&f.low, seq)
			}
		}
	}
}

// stopLocked stops the follower; f.mu is held.
func (f *floorFollower) stopLocked() {
	if f.w != nil {
		stopWatch(f.w)
		f.w = nil
	}
	f.members, f.cursors, f.retries, f.held, f.low, f.subs = nil, nil, nil, nil, nil, nil
}

func (s *Store) stopFloor() {
	f := &s.st.floor
	f.mu.Lock()
	f.stopLocked()
	f.mu.Unlock()
}

// seqHeap is a min-heap of seqs.
type seqHeap []uint64

func (h seqHeap) Len() int           { return len(h) }
func (h seqHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h seqHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *seqHeap) Push(x any)        { *h = append(*h, x.(uint64)) }
func (h *seqHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
