package jetstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// Memberships returns every subscription the store knows, with its
// durable cursor, in key order. One scan of member.> and cursor.> (an
// ordered consumer), not a get per key: start-up reads 50,000 of them.
func (s *Store) Memberships() ([]queue.Membership, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	ms, err := s.scanMembers()
	if err != nil {
		return nil, fmt.Errorf("memberships: %w", s.stateErr(err))
	}
	out := make([]queue.Membership, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.m)
	}
	slices.SortFunc(out, func(a, b queue.Membership) int { return cmpString(a.Subscription, b.Subscription) })
	return out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// member is a membership with the revision of its key.
type member struct {
	m   queue.Membership
	rev uint64
}

// scanMembers reads every membership with its cursor.
func (s *Store) scanMembers() (map[string]member, error) {
	ms := map[string]member{}
	cursors := map[string]uint64{}
	err := s.scanKeys([]string{keyMember + ">", keyCursor + ">"}, false, func(key string, rev uint64, v []byte, deleted bool) error {
		switch {
		case len(key) > len(keyMember) && key[:len(keyMember)] == keyMember:
			sub := key[len(keyMember):]
			if deleted {
				delete(ms, sub)
				return nil
			}
			m, err := decodeMember(sub, v)
			if err != nil {
				return err
			}
			ms[sub] = member{m, rev}
		case len(key) > len(keyCursor) && key[:len(keyCursor)] == keyCursor:
			sub := key[len(keyCursor):]
			if deleted {
				delete(cursors, sub)
				return nil
			}
			c, err := decodeCursor(sub, v)
			if err != nil {
				return err
			}
			cursors[sub] = c
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for sub, c := range cursors {
		if m, ok := ms[sub]; ok {
			m.m.Cursor = c
			ms[sub] = m
		}
	}
	return ms, nil
}

// readMember reads sub's membership and its cursor; ok is false when there
// is none (rev is then a delete marker's, or 0).
func (s *Store) readMember(ctx context.Context, sub string) (m member, ok bool, err error) {
	e, err := s.get(ctx, memberKey(sub))
	if err != nil || !e.exists() {
		return member{rev: e.rev}, false, err
	}
	mm, err := decodeMember(sub, e.data)
	if err != nil {
		return member{}, false, err
	}
	c, err := s.get(ctx, cursorKey(sub))
	if err != nil {
		return member{}, false, err
	}
	if c.exists() {
		if mm.Cursor, err = decodeCursor(sub, c.data); err != nil {
			return member{}, false, err
		}
	}
	return member{mm, e.rev}, true, nil
}

// JoinAll makes each requested subscription a member. A new one is
// created with a create-only write and From = the event stream's last seq
// + 1, read from the stream: whichever node sees the subscription first,
// every node then reads the same cut-off, and a create that loses the
// race takes the winner's (a request with Create set fails instead, with
// ErrExists). A known one takes the new snapshot and one that
// was leaving becomes active again, by compare-and-set on its revision
// (read again and retried on a conflict); unchanged ones are not
// rewritten. Writes are pipelined, so 50,000 new subscriptions cost a few
// round trips, not 50,000. A new member has no cursor key until its lane
// writes one (From-1 holds until then).
func (s *Store) JoinAll(reqs []queue.JoinRequest) ([]queue.Membership, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	for _, r := range reqs {
		if err := checkSub(r.Subscription); err != nil {
			return nil, fmt.Errorf("join: %w", err)
		}
	}
	ctx := s.st.ctx
	out := make([]queue.Membership, len(reqs))
	cur := make([]member, len(reqs)) // as last read
	found := make([]bool, len(reqs))
	read := make([]bool, len(reqs)) // cur holds a read with its revision

	// What is there. A known membership (the caller read it) needs no
	// read unless it changes; the others are read, all at once when many.
	var unknown []int
	for i, r := range reqs {
		if r.Known != nil {
			cur[i], found[i] = member{m: *r.Known}, true
		} else {
			unknown = append(unknown, i)
		}
	}
	if len(unknown) > joinScan {
		all, err := s.scanMembers()
		if err != nil {
			return nil, fmt.Errorf("join: %w", s.stateErr(err))
		}
		for _, i := range unknown {
			cur[i], found[i] = all[reqs[i].Subscription]
			read[i] = found[i] // a missing one's marker revision is not known: a create may conflict once
		}
	} else {
		for _, i := range unknown {
			m, ok, err := s.readMember(ctx, reqs[i].Subscription)
			if err != nil {
				return nil, fmt.Errorf("join %s: %w", reqs[i].Subscription, s.stateErr(err))
			}
			cur[i], found[i], read[i] = m, ok, true
		}
	}

	todo := make([]int, 0, len(reqs))
	for i := range reqs {
		todo = append(todo, i)
	}
	deadline := time.Now().Add(s.opts.RequestTimeout)
	for round := 0; len(todo) > 0; round++ {
		// A create finds one there (read first, or read again after its
		// create-only write lost to another node's): refused, not
		// overwritten, or both creators would be told 201 and one of
		// them would hold settings (a secret) the subscription lacks.
		for _, i := range todo {
			if found[i] && reqs[i].Create {
				return nil, fmt.Errorf("join %s: %w", reqs[i].Subscription, queue.ErrExists)
			}
		}
		// Known memberships that change: read for their revision.
		for _, i := range todo {
			if found[i] && !read[i] && changes(cur[i].m, reqs[i]) {
				m, ok, err := s.readMember(ctx, reqs[i].Subscription)
				if err != nil {
					return nil, fmt.Errorf("join %s: %w", reqs[i].Subscription, s.stateErr(err))
				}
				cur[i], found[i], read[i] = m, ok, true
			}
		}
		var last uint64
		for _, i := range todo {
			if !found[i] {
				var err error
				if last, err = s.eventsLastSeq(ctx); err != nil {
					return nil, fmt.Errorf("join: %w", s.stateErr(err))
				}
				break
			}
		}
		// The writes, pipelined; a conflict is read again for the next round.
		var (
			mu       sync.Mutex
			firstErr error
			again    []int
		)
		p := s.newPipe()
		for _, i := range todo {
			r := reqs[i]
			var m queue.Membership
			if found[i] {
				m = cur[i].m
				if !changes(m, r) {
					out[i] = m
					continue
				}
				m.Left, m.Until, m.Snapshot = false, 0, r.Snapshot
			} else {
				m = queue.Membership{Subscription: r.Subscription, From: last + 1, Cursor: last, Snapshot: r.Snapshot}
			}
			v, err := encodeMember(m)
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("join %s: %w", r.Subscription, err)
				}
				mu.Unlock()
				continue
			}
			msg := s.newPut(memberKey(r.Subscription), v)
			expectRev(msg, cur[i].rev)
			p.send(msg, func(err error) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					out[i] = m
				case apiCode(err) == codeWrongLastSeq || casRetryable(err):
					again = append(again, i)
				case firstErr == nil:
					firstErr = fmt.Errorf("join %s: %w", r.Subscription, s.stateErr(err))
				}
			})
		}
		p.wait()
		if firstErr != nil {
			return nil, firstErr
		}
		if len(again) > 0 && time.Now().After(deadline) {
			return nil, fmt.Errorf("join: %w: %d memberships kept conflicting for %s", queue.ErrUnavailable, len(again), s.opts.RequestTimeout)
		}
		for _, i := range again {
			m, ok, err := s.readMember(ctx, reqs[i].Subscription)
			if err != nil {
				return nil, fmt.Errorf("join %s: %w", reqs[i].Subscription, s.stateErr(err))
			}
			cur[i], found[i], read[i] = m, ok, true
		}
		todo = again
		if round > 0 && len(todo) > 0 {
			if err := s.pause(ctx, round); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// changes: a join of r rewrites m.
func changes(m queue.Membership, r queue.JoinRequest) bool {
	return m.Left || !bytes.Equal(m.Snapshot, r.Snapshot)
}

// updateMember changes sub's membership by compare-and-set, reading it
// again on a conflict. change returns false to write nothing.
func (s *Store) updateMember(sub string, change func(m *queue.Membership) (bool, error)) (queue.Membership, error) {
	ctx := s.st.ctx
	deadline := time.Now().Add(s.opts.RequestTimeout)
	for attempt := 0; ; attempt++ {
		cur, ok, err := s.readMember(ctx, sub)
		if err != nil {
			return queue.Membership{}, s.stateErr(err)
		}
		if !ok {
			return queue.Membership{}, queue.ErrNotFound
		}
		m := cur.m
		doWrite, err := change(&m)
		if err != nil || !doWrite {
			return m, s.stateErr(err)
		}
		v, err := encodeMember(m)
		if err != nil {
			return queue.Membership{}, err
		}
		msg := s.newPut(memberKey(sub), v)
		expectRev(msg, cur.rev)
		err = s.commit(ctx, []write{{m: msg, cas: true}})
		switch {
		case err == nil:
			return m, nil
		case apiCode(err) != codeWrongLastSeq && !casRetryable(err):
			return queue.Membership{}, s.stateErr(err)
		case time.Now().After(deadline):
			return queue.Membership{}, fmt.Errorf("%w: membership %s kept conflicting for %s", queue.ErrUnavailable, sub, s.opts.RequestTimeout)
		}
		if err := s.pause(ctx, attempt); err != nil {
			return queue.Membership{}, err
		}
	}
}

// Leave ends sub's entitlement at the event stream's last seq (Until),
// read from the stream as JoinAll's From is, and only once: a membership
// already leaving keeps its Until.
func (s *Store) Leave(sub string) (queue.Membership, error) {
	if err := s.checkOpen(); err != nil {
		return queue.Membership{}, err
	}
	if err := checkSub(sub); err != nil {
		return queue.Membership{}, fmt.Errorf("leave: %w", err)
	}
	m, err := s.updateMember(sub, func(m *queue.Membership) (bool, error) {
		if m.Left {
			return false, nil
		}
		last, err := s.eventsLastSeq(s.st.ctx)
		if err != nil {
			return false, err
		}
		m.Left, m.Until = true, last
		return true, nil
	})
	if err != nil {
		return m, fmt.Errorf("leave %s: %w", sub, err)
	}
	return m, nil
}

// SetPaused records why sub's deliveries are paused ("" resumes), by
// compare-and-set on the membership, and tells sub's owner wherever it
// runs.
func (s *Store) SetPaused(sub, reason string) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if err := checkSub(sub); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	changed := false
	_, err := s.updateMember(sub, func(m *queue.Membership) (bool, error) {
		changed = m.Paused != reason
		m.Paused = reason
		return changed, nil
	})
	if err != nil {
		return fmt.Errorf("pause %s: %w", sub, err)
	}
	if changed {
		s.notifyChanged(sub)
	}
	return nil
}

// Retire forgets a subscription that has drained: its membership and
// cursor go in one atomic batch (a crash between the two would leave a
// cursor a later membership of the same id would pick up). The cursor's
// delete is fenced like every cursor write. Its dead letters stay.
func (s *Store) Retire(sub string) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if err := checkSub(sub); err != nil {
		return fmt.Errorf("retire: %w", err)
	}
	l := s.st.lane(sub)
	l.wmu.Lock()
	err := s.writeLane(sub, func(context.Context) ([]write, error) {
		return []write{{m: s.newPurge(cursorKey(sub))}, {m: s.newPurge(memberKey(sub))}}, nil
	})
	l.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("retire %s: %w", sub, s.stateErr(err))
	}
	s.dropIndex(sub)
	return nil
}

// SaveCursors writes the given cursors, each fenced by this node's lease
// on its subscription and all pipelined (one round trip for the lot). A
// cursor whose lease this node does not hold is skipped, not an error: its
// lane moved, and the new owner resumes from the last cursor written (at
// least once). A lease dropped for want of renewal, which the servers may
// still hold at this node's revision, is tried under that revision
// (lastFence) and skipped if refused or unanswered. Other failures are
// returned, after every write had its answer.
func (s *Store) SaveCursors(cursors map[string]uint64) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if len(cursors) == 0 {
		return nil
	}
	subs := make([]string, 0, len(cursors))
	for sub := range cursors {
		if err := checkSub(sub); err != nil {
			return fmt.Errorf("save cursors: %w", err)
		}
		subs = append(subs, sub)
	}
	// In order: a sender holding some lanes' locks never waits for a lane
	// another sender holds while holding one that sender waits for.
	sort.Strings(subs)
	var (
		mu     sync.Mutex
		failed []string
		first  error
		again  []string // in flight elsewhere (10164): written once more, alone
	)
	fail := func(sub string, err error) {
		mu.Lock()
		defer mu.Unlock()
		failed = append(failed, sub)
		if first == nil {
			first = err
		}
	}
	p := s.newPipe()
	for _, sub := range subs {
		l := s.st.lane(sub)
		l.wmu.Lock()
		subj, rev, fenced, done, err := s.laneFence(sub)
		last := false
		if errors.Is(err, queue.ErrFenced) {
			subj, rev, done, last = s.lastFence(sub)
			if last {
				err = nil
			}
		}
		if err != nil {
			l.wmu.Unlock()
			if !errors.Is(err, queue.ErrFenced) {
				fail(sub, err)
			}
			continue
		}
		m := s.newPut(cursorKey(sub), encodeCursor(cursors[sub]))
		if fenced {
			setFence(m, subj, rev)
		}
		p.send(m, func(err error) {
			done()
			l.wmu.Unlock()
			switch {
			case err == nil:
			case last:
				// Under a lease this node no longer trusts: refused if it
				// moved on, lost with the link if NATS is out of reach;
				// either way the lane's next owner resends from the cursor
				// the servers have.
				if apiCode(err) != codeWrongLastSeq {
					s.log.Debug("cursor of a lost lease not written", "subscription", sub, "err", err)
				}
			case fenced && apiCode(err) == codeWrongLastSeq:
				// The lane moved: skipped.
			case casRetryable(err):
				mu.Lock()
				again = append(again, sub)
				mu.Unlock()
			default:
				fail(sub, err)
			}
		})
	}
	p.wait()
	for _, sub := range again {
		l := s.st.lane(sub)
		l.wmu.Lock()
		err := s.writeLane(sub, func(context.Context) ([]write, error) {
			return []write{{m: s.newPut(cursorKey(sub), encodeCursor(cursors[sub]))}}, nil
		})
		l.wmu.Unlock()
		if err != nil && !errors.Is(err, queue.ErrFenced) {
			fail(sub, err)
		}
	}
	if first != nil {
		return fmt.Errorf("save cursors: %d of %d failed (%s first): %w", len(failed), len(cursors), failed[0], s.stateErr(first))
	}
	return nil
}

// Member reads sub's membership and its cursor, and nothing of its retry
// schedule. Lane loads the schedule's index afresh (a scan of sub's
// retries, tens of ms, for every change another node makes, on every
// node); the member watch and a create's check need only the settings.
func (s *Store) Member(sub string) (queue.Membership, error) {
	if err := s.checkOpen(); err != nil {
		return queue.Membership{}, err
	}
	if err := checkSub(sub); err != nil {
		return queue.Membership{}, fmt.Errorf("member: %w", err)
	}
	m, ok, err := s.readMember(s.st.ctx, sub)
	if err != nil {
		return queue.Membership{}, fmt.Errorf("member %s: %w", sub, s.stateErr(err))
	}
	if !ok {
		return queue.Membership{}, fmt.Errorf("member %s: %w", sub, queue.ErrNotFound)
	}
	return m.m, nil
}

// Lane reads sub's durable state for a lane just gained on this node: its
// membership with the cursor, and its retry schedule, whose index it
// loads afresh (what another owner wrote before is in it).
func (s *Store) Lane(sub string) (queue.Membership, *queue.RetrySummary, error) {
	if err := s.checkOpen(); err != nil {
		return queue.Membership{}, nil, err
	}
	if err := checkSub(sub); err != nil {
		return queue.Membership{}, nil, fmt.Errorf("lane: %w", err)
	}
	m, ok, err := s.readMember(s.st.ctx, sub)
	if err != nil {
		return queue.Membership{}, nil, fmt.Errorf("lane %s: %w", sub, s.stateErr(err))
	}
	if !ok {
		return queue.Membership{}, nil, fmt.Errorf("lane %s: %w", sub, queue.ErrNotFound)
	}
	sum := &queue.RetrySummary{}
	s.dropIndex(sub)
	l := s.st.lane(sub)
	l.wmu.Lock()
	err = s.withIndexLocked(l, sub, func(ix *retryIndex) {
		sum.Count = len(ix.bySeq)
		for seq := range ix.bySeq {
			if seq > m.m.Cursor {
				if sum.Ahead == nil {
					sum.Ahead = map[uint64]struct{}{}
				}
				sum.Ahead[seq] = struct{}{}
			}
		}
	})
	l.wmu.Unlock()
	if err != nil {
		return queue.Membership{}, nil, fmt.Errorf("lane %s: %w", sub, s.stateErr(err))
	}
	return m.m, sum, nil
}
