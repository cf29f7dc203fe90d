package jetstream

import (
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// Hooks for the log tests of package jetstream_test (log_test.go).

// AfterConnect returns o with f to run once Open has connected, before
// it sets up the stream and the buckets.
func AfterConnect(o Options, f func()) Options {
	o.afterConnect = f
	return o
}

// OpenLog opens a Store with its connection and its log side only: the
// event stream, the follower, Append and the reads. The delivery state
// and the fleet are not opened; Compact asks ret (which may be nil when
// the test does not compact) instead of the delivery state. The store is
// closed at the end of the test (CloseLog), unless the test closed it.
func OpenLog(tb testing.TB, o Options, ret *Retention) (*Store, error) {
	tb.Helper()
	o.withDefaults()
	if err := o.check(); err != nil {
		return nil, err
	}
	s := &Store{opts: o, log: o.Logger, quit: make(chan struct{})}
	s.evSubj = o.Stream + ".ev."
	s.statePfx = "$KV." + o.Stream + "_STATE."
	if ret != nil {
		s.lg.ret = ret
	} else {
		s.lg.ret = &Retention{}
	}
	if err := s.connect(); err != nil {
		return nil, err
	}
	if err := s.setUpStream(); err != nil {
		s.nc.Close()
		return nil, err
	}
	if err := s.openLog(); err != nil {
		s.nc.Close()
		return nil, err
	}
	tb.Cleanup(func() { CloseLog(s) })
	return s, nil
}

// CloseLog is what Close does to a store OpenLog opened.
func CloseLog(s *Store) {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.quit)
		s.closeLog()
		s.nc.Close()
	})
}

// CountEventsDirect is CountEvents by direct get batches only, for
// BenchmarkEvents to compare with the consumer CountEvents uses for long
// ranges.
func CountEventsDirect(s *Store, from, to uint64, match queue.Match, limit int) (int, error) {
	return s.countDirect(from, to, match, limit)
}

// Retention is a delivery state for Compact to ask, set by the test: the
// floor, the memberships and the seqs each subscription's retries hold.
type Retention struct {
	mu      sync.Mutex
	floor   uint64 // 0: no membership or retry needs anything
	members []queue.Membership
	retries map[string][]uint64
}

// Set replaces what r answers.
func (r *Retention) Set(floor uint64, members []queue.Membership, retries map[string][]uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.floor, r.members, r.retries = floor, members, retries
}

func (r *Retention) retentionFloor() (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.floor == 0 {
		return ^uint64(0), nil
	}
	return r.floor, nil
}

func (r *Retention) retentionHolds(from, to uint64) (uint64, map[uint64]struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	floor := ^uint64(0)
	for _, m := range r.members {
		if m.Left && m.Cursor >= m.Until {
			continue
		}
		floor = min(floor, m.Cursor+1)
	}
	held := map[uint64]struct{}{}
	for _, seqs := range r.retries {
		for _, seq := range seqs {
			if seq >= from && seq < to {
				held[seq] = struct{}{}
			}
		}
	}
	return floor, held, nil
}

// OwnEarlierAttempt exposes how Append tells a duplicate PubAck for its own
// timed-out attempt from one for an earlier request with the same id.
func OwnEarlierAttempt(s *Store, seq uint64, ev *queue.Event) bool {
	return s.ownEarlierAttempt(seq, ev, time.Now().Add(time.Second))
}

// StopFollower stops the store's stream follower, as if it lagged behind
// the stream: OnCommit then sees no other node's events.
func StopFollower(s *Store) {
	f := &s.lg.fol
	f.mu.Lock()
	cc := f.cc
	f.cc = nil
	f.mu.Unlock()
	cc.Stop()
	<-cc.Closed()
}

// StartFollower starts the follower again, after the head.
func StartFollower(s *Store) error { return s.follow() }
