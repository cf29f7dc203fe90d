package delivery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// Fleet mode: when the store is a queue.Fleet, every node
// keeps a lane for every subscription, but a lane delivers only while this
// node holds its lease. A lane this node does not own is foreign: it sends
// nothing, counts nothing against quotas and pins no compaction; its
// status comes from the snapshot its owner publishes. The dispatcher is
// the store's queue.OwnerHandler.

// snapshotInterval is how often an owner publishes the status of the lanes
// it owns (only those that changed, and each at least every
// snapshotRefresh so the snapshots' TTL never drops a live lane).
const (
	snapshotInterval = 250 * time.Millisecond
	snapshotRefresh  = 15 * time.Second
)

var _ queue.OwnerHandler = (*Dispatcher)(nil)

// Gained makes the lane of sub deliver from the state its previous owner
// left: the cursor, the retry schedule, the pause, all read after the
// lease was taken, so nothing the old owner wrote is missed. The settings
// are the membership's too: the member watch may not have told this node
// of a change yet (a subscription created or patched through another
// node a moment ago), and the lease's read is the newest there is.
func (d *Dispatcher) Gained(sub string) {
	var (
		m   queue.Membership
		rs  *queue.RetrySummary
		err error
	)
	for wait := 100 * time.Millisecond; ; wait = min(wait*2, 2*time.Second) {
		if m, rs, err = d.fleet.Lane(sub); err == nil || d.stopping.Load() {
			break
		}
		if errors.Is(err, queue.ErrNotFound) {
			// Retired meanwhile (its drain ended): no state will come, and
			// retrying for ever would hold up this lease's Release.
			d.log.Info("gained lane has no membership any more: retired", "subscription", sub)
			return
		}
		d.log.Error("read gained lane", "subscription", sub, "err", err)
		select {
		case <-time.After(wait):
		case <-d.quit:
			return
		}
	}
	if err != nil {
		return
	}
	// Under reg, as memberChanged: the two must not both make the lane,
	// nor apply settings over each other's. The membership is read again
	// under it: memberChanged may have applied a change (a PATCH, a
	// DELETE) written after the read above, which that older read must
	// not undo, since no later call would set it right.
	d.reg.Lock()
	switch cur, err := d.fleet.Member(sub); {
	case err == nil:
		cur.Cursor = m.Cursor // the one the retry summary was made against
		m = cur
	case errors.Is(err, queue.ErrNotFound):
		d.reg.Unlock()
		d.log.Info("gained lane has no membership any more: retired", "subscription", sub)
		return
	default:
		d.log.Warn("read gained lane's membership again; the first read stands", "subscription", sub, "err", err)
	}
	l := d.lane(sub)
	if l == nil {
		// Joined on another node (a config this node has not seen yet):
		// its snapshot says how to deliver.
		s, err := decodeSnapshot(sub, m.Snapshot)
		if err != nil {
			d.reg.Unlock()
			d.log.Error("gained lane has a bad snapshot", "subscription", sub, "err", err)
			return
		}
		d.feed.watchTypes(s)
		l = newLane(d.engine, m, s)
		d.mu.Lock()
		d.lanes[sub] = l
		d.laneSlice = nil
		d.mu.Unlock()
	} else if err := d.applySnapshot(l, m.Snapshot); err != nil {
		d.log.Error("gained lane has a bad snapshot; it keeps the settings it had", "subscription", sub, "err", err)
	}
	d.reg.Unlock()
	l.mu.Lock()
	l.takeOver(m, rs)
	l.mu.Unlock()
	d.log.Info("lane gained", "subscription", sub, "cursor", m.Cursor, "retries", rs.Count)
	l.pump()
}

// takeOver resets what the lane knows of the log to the durable state m
// and rs, and lets it deliver. Deliveries still in flight from an earlier
// ownership keep their count (their finish decrements it). l.mu is held.
func (l *lane) takeOver(m queue.Membership, rs *queue.RetrySummary) {
	l.fromSeq, l.left, l.until = m.From, m.Left, m.Until
	l.leaving.Store(m.Left)
	l.cursor, l.next = m.Cursor, m.Cursor+1
	l.saved.Store(m.Cursor)
	l.buf, l.window, l.retrying, l.unrecorded, l.memo = nil, nil, nil, nil, nil
	l.pausedBy = m.Paused
	l.ahead, l.nextDue = nil, time.Time{}
	l.scheduled.Store(0)
	if rs != nil {
		l.scheduled.Store(int64(rs.Count))
		l.ahead = rs.Ahead
		if rs.Count > 0 {
			l.nextDue = time.Unix(0, 1) // some may be due already: look at once
		}
	}
	l.foreign = false
	l.releasing.Store(false)
}

// Release stops the lane of sub starting deliveries, waits for those in
// flight until ctx ends, and writes its cursor while the lease is still
// held, so the next owner resends nothing that was acknowledged.
//
// A lease lost (ctx already done) gets its cursor written too: the store
// tries it under the lease's last revision, which the servers refuse if
// another node wrote the lease since. A lease dropped for want of renewal
// is most often still this node's there, and the cursor it could not
// write while the renewal lagged would otherwise make its next owner
// (often this node again) resend everything acknowledged meanwhile.
// Deliveries still in flight move the cursor when they end; the flush
// writes it the same way. Not when the lease is held again already: this
// call then ends a holding the store never got to report, and a later one
// began, perhaps after another owner's, whose cursor this one's must not
// replace (Gained reads it).
func (d *Dispatcher) Release(ctx context.Context, sub string) {
	l := d.lane(sub)
	if l == nil {
		return
	}
	// Before taking mu, which a lane may hold for a whole store write:
	// whatever holds it then starts nothing more.
	l.releasing.Store(true)
	l.mu.Lock()
	// A lane that never took over (Gained found its membership retired,
	// or its snapshot bad) has no cursor of its own to write: its stale
	// one, written under the lease, would outlive the retired membership
	// and be read as the cursor of a later subscription with the id.
	delivered := !l.foreign
	l.foreign = true
	l.mu.Unlock()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		l.mu.Lock()
		n, c := l.inFlight, l.cursor
		l.mu.Unlock()
		if n == 0 || ctx.Err() != nil {
			lost := errors.Is(context.Cause(ctx), queue.ErrFenced)
			if delivered && !(lost && d.fleet.Owns(sub)) {
				if err := d.store.SaveCursors(map[string]uint64{sub: c}); err != nil {
					d.log.Warn("save cursor of released lane", "subscription", sub, "err", err)
				} else {
					l.saved.Store(c)
				}
			}
			if n > 0 {
				d.log.Warn("lane lost with deliveries in flight; its next owner sends them again", "subscription", sub, "in_flight", n, "cursor", c)
			} else {
				d.log.Info("lane released", "subscription", sub, "cursor", c)
			}
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
}

// Changed re-reads what another node changed of an owned lane: a pause or
// resume, or a replay that scheduled a retry.
func (d *Dispatcher) Changed(sub string) {
	l := d.lane(sub)
	if l == nil {
		return
	}
	m, rs, err := d.fleet.Lane(sub)
	if err != nil {
		d.log.Error("re-read changed lane", "subscription", sub, "err", err)
		return
	}
	l.mu.Lock()
	if !l.foreign {
		l.pausedBy = m.Paused
		if rs != nil {
			l.scheduled.Store(int64(rs.Count))
		}
		l.nextDue = time.Unix(0, 1) // a retry may have been scheduled: look at once
	}
	l.mu.Unlock()
	l.pump()
}

// isForeign reports whether another node owns the lane (fleet mode).
func (l *lane) isForeign() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.foreign
}

// fenced reports whether err says the lane moved to another node: the
// outcome is dropped, not retried (the new owner resends what is
// unresolved).
func fenced(err error) bool { return errors.Is(err, queue.ErrFenced) }

// snapshotLoop publishes the status of the lanes this node owns for the
// other nodes' admin API and dashboard.
func (d *Dispatcher) snapshotLoop() {
	defer d.wg.Done()
	t := time.NewTicker(snapshotInterval)
	defer t.Stop()
	last := map[string]string{}
	lastAt := map[string]time.Time{}
	for {
		select {
		case <-t.C:
		case <-d.quit:
			return
		}
		now := d.now()
		snaps := map[string][]byte{}
		for _, l := range d.laneList() {
			foreign := l.isForeign()
			if foreign {
				continue
			}
			st := l.withOldestAge(l.status(), now)
			st.Owner = d.fleet.NodeID()
			b, err := json.Marshal(st)
			if err != nil {
				continue
			}
			if last[st.Subscription] == string(b) && now.Sub(lastAt[st.Subscription]) < snapshotRefresh {
				continue
			}
			snaps[st.Subscription] = b
		}
		if len(snaps) == 0 {
			continue
		}
		if err := d.fleet.PublishLanes(snaps); err != nil {
			d.log.Warn("publish lane snapshots", "err", err)
			continue
		}
		for id, b := range snaps {
			last[id], lastAt[id] = string(b), now
		}
	}
}

// foreignStatus is a foreign lane's status from its owner's snapshot, or
// what this node knows of it (owner named, counters zero) when none is
// published yet.
func (d *Dispatcher) foreignStatus(l *lane, snaps map[string]queue.LaneSnapshot) api.LaneStatus {
	if sn, ok := snaps[l.id]; ok {
		var st api.LaneStatus
		if err := json.Unmarshal(sn.Data, &st); err == nil && st.Subscription == l.id {
			st.Owner = sn.Node
			if l.leaving.Load() {
				// The membership says so, and it is newer than the owner's
				// snapshot (published every snapshotInterval): a DELETE
				// through this node answers "draining", as on the owner.
				st.State = "draining"
			}
			return st
		}
	}
	st := l.status()
	st.InFlight = 0
	st.Owner = d.fleet.Owner(l.id)
	return st
}

// ownersCursors returns the cursor each lane's owner last published (fleet
// mode; nil otherwise).
func (d *Dispatcher) ownersCursors() map[string]uint64 {
	if d.fleet == nil {
		return nil
	}
	snaps, err := d.fleet.LaneSnapshots()
	if err != nil {
		d.log.Warn("read lane snapshots", "err", err)
		return nil
	}
	out := make(map[string]uint64, len(snaps))
	for id, sn := range snaps {
		var st struct {
			Cursor uint64 `json:"cursor"`
		}
		if json.Unmarshal(sn.Data, &st) == nil {
			out[id] = st.Cursor
		}
	}
	return out
}

// MembersChanged applies memberships other nodes wrote (queue.MemberWatcher):
// a subscription created through another node's API gets a lane here
// (foreign until its lease is gained, so that every node's admin API
// answers for it), one changed takes its new settings, one deleted
// drains, one retired by its owner goes. The initial call lists every
// membership; only those this node does not know yet are read.
func (d *Dispatcher) MembersChanged(subs []string, initial bool) {
	for _, sub := range subs {
		if d.stopping.Load() {
			return
		}
		if initial && d.lane(sub) != nil {
			continue
		}
		d.memberChangedOrRetry(sub)
	}
	if initial {
		// A lane start read from the store whose membership was retired
		// before the watch began (its drain ended on its owner meanwhile)
		// is in no call, initial or later: look at it now, or this node
		// serves a retired subscription, and refuses its id, for ever.
		listed := make(map[string]bool, len(subs))
		for _, sub := range subs {
			listed[sub] = true
		}
		for _, l := range d.laneList() {
			if !listed[l.id] && !d.stopping.Load() {
				d.memberChangedOrRetry(l.id)
			}
		}
	}
}

// memberChangedOrRetry applies sub's membership, or, when it cannot be
// read now, has memberRetryLoop read it again: the watch tells of each
// write once, and a subscription nobody changes again would otherwise
// stay unknown to this node (or, retired, served by it) for good.
func (d *Dispatcher) memberChangedOrRetry(sub string) {
	if err := d.memberChanged(sub); err != nil {
		d.log.Warn("read a membership another node wrote; reading it again", "subscription", sub, "err", err)
		d.memberRetries.add(sub)
	}
}

// memberRetries are the subscriptions whose membership must be read again
// (memberChangedOrRetry).
type memberRetries struct {
	mu      sync.Mutex
	pending map[string]bool
	wake    chan struct{} // capacity 1
}

func newMemberRetries() *memberRetries {
	return &memberRetries{pending: map[string]bool{}, wake: make(chan struct{}, 1)}
}

func (r *memberRetries) add(sub string) {
	r.mu.Lock()
	r.pending[sub] = true
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *memberRetries) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	subs := make([]string, 0, len(r.pending))
	for sub := range r.pending {
		subs = append(subs, sub)
	}
	clear(r.pending)
	return subs
}

// memberRetry bounds the wait before a membership that could not be read
// is read again: the first retry soon (one request lost to a leader
// election), later ones no more often than memberRetryMax while the state
// stays out of reach.
const (
	memberRetryMin = 100 * time.Millisecond
	memberRetryMax = 2 * time.Second
)

// memberRetryLoop reads again the memberships memberChangedOrRetry could
// not read, until each is read or the dispatcher stops. Each read is of
// the membership as it is now, so a retry that comes after a newer change
// was applied applies the same again; it never brings back older settings.
func (d *Dispatcher) memberRetryLoop() {
	defer d.wg.Done()
	wait := memberRetryMin
	var failed int
	var loggedAt time.Time
	for {
		select {
		case <-d.memberRetries.wake:
		case <-d.quit:
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-d.quit:
			t.Stop()
			return
		}
		var lastErr error
		for _, sub := range d.memberRetries.take() {
			if d.stopping.Load() {
				return
			}
			if err := d.memberChanged(sub); err != nil {
				lastErr = err
				d.memberRetries.add(sub)
			}
		}
		if lastErr == nil {
			if failed > 0 {
				d.log.Info("memberships read again", "failures", failed)
			}
			wait, failed = memberRetryMin, 0
			continue
		}
		wait = min(wait*2, memberRetryMax)
		// Logged at most every few seconds: the state out of reach fails
		// every retry.
		if failed++; time.Since(loggedAt) >= 5*time.Second {
			d.log.Warn("read memberships again", "err", lastErr, "failures", failed)
			loggedAt = time.Now()
		}
	}
}

// memberChanged applies sub's membership as it is now. It returns an error
// only when the membership could not be read and may be read later; one
// that was read but cannot be applied (a bad snapshot) is logged and
// waits for its next write.
func (d *Dispatcher) memberChanged(sub string) error {
	// Member, not Lane: Lane loads the retry schedule's index afresh, a
	// scan of the subscription's retries for every change, on every node,
	// one change after another (about 30 ms each on loopback: a PATCH
	// reached its owner only after events posted after its 200 were sent
	// with the old settings, and 10,000 creates would take the other
	// nodes minutes to hear of).
	// Read under reg, so that it is not older than what this node's own
	// API wrote meanwhile (applying it would undo that write).
	d.reg.Lock()
	defer d.reg.Unlock()
	m, err := d.fleet.Member(sub)
	l := d.lane(sub)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		if l != nil && l.isForeign() {
			// Retired by its owner: nothing is owed here any more.
			d.mu.Lock()
			delete(d.lanes, sub)
			d.laneSlice = nil
			d.mu.Unlock()
			l.mu.Lock()
			l.retired = true
			l.mu.Unlock()
		}
		return nil
	case errors.Is(err, queue.ErrClosed), errors.Is(err, queue.ErrCorrupt):
		// Closing, or a record no read will mend (its next write is
		// heard of like this one).
		d.log.Warn("read a membership another node wrote", "subscription", sub, "err", err)
		return nil
	case err != nil:
		return err
	}
	if l == nil {
		s, err := decodeSnapshot(sub, m.Snapshot)
		if err != nil {
			d.log.Error("membership has a bad snapshot", "subscription", sub, "err", err)
			return nil
		}
		d.feed.watchTypes(s)
		l = newLane(d.engine, m, s)
		d.mu.Lock()
		d.lanes[sub] = l // reg is held: nobody else makes lanes meanwhile
		d.laneSlice = nil
		d.mu.Unlock()
		return nil
	}
	if err := d.applySnapshot(l, m.Snapshot); err != nil {
		d.log.Error("membership has a bad snapshot", "subscription", sub, "err", err)
		return nil
	}
	l.mu.Lock()
	if !l.sub.ManagedByAPI() {
		// The config file's: this node's file says how it delivers and
		// whether it stays (see applySnapshot).
		l.mu.Unlock()
		return nil
	}
	if m.Left && !l.left {
		l.left, l.until = true, m.Until
		l.leaving.Store(true)
	} else if !m.Left && l.left {
		l.left, l.until = false, 0
		l.leaving.Store(false)
	}
	l.mu.Unlock()
	l.pump()
	return nil
}

// applySnapshot gives l the settings of a membership's snapshot, when they
// differ from its own (a breaker or limiter whose settings stay is kept).
// d.reg is held.
//
// Only for the API's subscriptions: the shared record is what the API
// wrote. A subscription of the config file is each node's file's, and
// nodes may differ in it on purpose (the fencing tests give each node an
// X-Node header of its own) or for a while (a rollout of a new config);
// the record holds whichever node joined last, which must not overwrite
// the settings of this node's file.
func (d *Dispatcher) applySnapshot(l *lane, snap []byte) error {
	l.mu.Lock()
	same, byFile := bytes.Equal(encodeSnapshot(l.sub), snap), !l.sub.ManagedByAPI()
	l.mu.Unlock()
	if same || byFile {
		return nil
	}
	s, err := decodeSnapshot(l.id, snap)
	if err != nil {
		return err
	}
	if !s.ManagedByAPI() {
		return nil // the file's now, on another node: this node's file decides
	}
	d.feed.watchTypes(s)
	l.mu.Lock()
	l.setPolicies(s)
	l.match = d.feed.matcherFor(s)
	if l.memo != nil {
		l.memo.backlogTo, l.memo.backlogN = 0, 0 // the filter may have changed: count afresh
	}
	l.mu.Unlock()
	return nil
}
