package delivery

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/queue"
)

// dispatcher owns the lanes: it recovers them from the store, reconciles
// them with the configured subscriptions, and runs the loops that serve
// them all (the kick loop that wakes lanes on commits, the retry timer,
// the cursor flusher with retirement and compaction). What the lanes share
// while they deliver is the embedded engine; a lane sees only that.
//
// Lock order: a lane's mu may be held while taking d.mu, never the reverse.
type Dispatcher struct {
	*engine

	// reg serialises the changes of the set of subscriptions: a reload
	// of the file and the API's creates, updates and deletes.
	reg sync.Mutex

	mu        sync.Mutex
	lanes     map[string]*lane
	laneSlice []*lane // cache of the lanes; nil when stale

	cursorInterval time.Duration
	wg             sync.WaitGroup
	// memberRetries are the memberships the member watch told of that
	// could not be read (fleet.go).
	memberRetries *memberRetries
	// flushes counts cursor writes and leaves the lanes that began to
	// leave: with the head and the lane set they tell maintain whether
	// anything its pass looks at changed since the last (lastPass).
	flushes, leaves atomic.Uint64
	lastPass        passMark // maintain's goroutine only
	// onMaintain, when set, runs at the end of each maintenance pass (the
	// server retires the secrets whose rotation grace ended).
	onMaintain func(now time.Time)
}

func newDispatcher(q queue.Store, client *fasthttp.Client, log *slog.Logger, now func() time.Time, maxInFlight int, ringBytes int64, cursorInterval time.Duration, budget policy.BudgetConfig) *Dispatcher {
	return &Dispatcher{
		engine:         newEngine(q, client, log, now, maxInFlight, ringBytes, budget),
		lanes:          map[string]*lane{},
		cursorInterval: cursorInterval,
		memberRetries:  newMemberRetries(),
	}
}

// start recovers the lanes from the log, reconciles them with the config
// and starts the loops.
func (d *Dispatcher) start(subs []*Subscription) error {
	ms, err := d.store.Memberships()
	if err != nil {
		return err
	}
	cursors := make(map[string]uint64, len(ms))
	for _, m := range ms {
		cursors[m.Subscription] = m.Cursor
	}
	var retries map[string]*queue.RetrySummary
	if d.fleet == nil {
		// In fleet mode a lane reads its schedule when its lease is gained
		// (Gained), from the state its previous owner left.
		if retries, err = d.store.RetrySummaries(cursors); err != nil {
			return err
		}
	}
	configured := map[string]*Subscription{}
	for _, s := range subs {
		configured[s.ID] = s
	}
	for _, m := range ms {
		sub := configured[m.Subscription]
		if sub == nil {
			if sub, err = decodeSnapshot(m.Subscription, m.Snapshot); err != nil {
				return err
			}
		}
		l := newLane(d.engine, m, sub)
		if rs := retries[m.Subscription]; rs != nil {
			l.scheduled.Store(int64(rs.Count))
			l.ahead = rs.Ahead
			// Some may be due from before the restart: look at once.
			l.nextDue = time.Unix(0, 1)
		}
		d.lanes[m.Subscription] = l
		d.feed.watchTypes(sub)
	}
	known := make(map[string]*queue.Membership, len(ms))
	for i := range ms {
		known[ms[i].Subscription] = &ms[i]
	}
	if err := d.apply(subs, known); err != nil {
		return err
	}
	// apply pumps the configured lanes and the ones it removes. A lane that
	// had left before this start (draining what it was owed when the
	// process stopped) is in neither set: pump it too, or it waits for a
	// wake-up nothing sends (no commit concerns it, no timer is set, and
	// maintain only pumps lanes compactSlack behind the head), and what it
	// owes stays undelivered, though a leaving subscription must still
	// receive what it was entitled to.
	// The API's lanes are not the file's either: pump them as well.
	for _, l := range d.laneList() {
		l.mu.Lock()
		api := l.sub.ManagedByAPI()
		l.mu.Unlock()
		if l.leaving.Load() || api {
			l.pump()
		}
	}
	d.wg.Add(4)
	go d.kickLoop()
	go d.timerLoop()
	go d.flushLoop()
	go d.maintainLoop()
	if d.fleet != nil {
		d.wg.Add(2)
		go d.snapshotLoop()
		go d.memberRetryLoop()
		// Lanes deliver once their leases are gained, from here on.
		if err := d.fleet.Own(d); err != nil {
			return err
		}
	}
	return nil
}

// apply reconciles lanes with the config file's subscriptions: new ones
// join at the head, changed ones take their new settings, removed ones
// leave and drain what they were entitled to (the membership cut-off:
// what was accepted while they were members). Lanes the API
// manages are not the file's: apply never changes or removes them, and a
// file that names one of them is refused whole.
// known holds memberships just read from the log (at start-up), or nil.
func (d *Dispatcher) apply(subs []*Subscription, known map[string]*queue.Membership) error {
	d.reg.Lock()
	defer d.reg.Unlock()
	keep := map[string]bool{}
	for _, s := range subs {
		keep[s.ID] = true
		if l := d.lane(s.ID); l != nil {
			l.mu.Lock()
			// Draining after a delete too: the file's subscription would
			// take over the lane's place in the log and what it still owes.
			api := l.sub.ManagedByAPI()
			l.mu.Unlock()
			if api {
				return fmt.Errorf("subscription %s: %w: it was created through the admin API; delete it there, or give the file's subscription another id", s.ID, ErrManagedByAPI)
			}
		}
	}
	if err := d.join(subs, known, false); err != nil {
		return err
	}
	for _, l := range d.laneList() {
		l.mu.Lock()
		leaving := !keep[l.id] && !l.left && !l.sub.ManagedByAPI()
		l.mu.Unlock()
		if leaving {
			if _, err := d.leave(l); err != nil {
				return err
			}
		}
	}
	return nil
}

// join makes each of subs a member (durably, before it returns) and gives
// its lane the subscription's settings, making the lane if it is new.
// create refuses one that has a membership already (queue.ErrExists).
// d.reg is held.
func (d *Dispatcher) join(subs []*Subscription, known map[string]*queue.Membership, create bool) error {
	reqs := make([]queue.JoinRequest, len(subs))
	for i, s := range subs {
		reqs[i] = queue.JoinRequest{Subscription: s.ID, Snapshot: encodeSnapshot(s), Known: known[s.ID], Create: create}
	}
	ms, err := d.store.JoinAll(reqs)
	if err != nil {
		return err
	}
	for i, s := range subs {
		d.feed.watchTypes(s)
		d.mu.Lock()
		l := d.lanes[s.ID]
		if l == nil {
			l = newLane(d.engine, ms[i], s)
			d.lanes[s.ID] = l
			d.laneSlice = nil
		}
		d.mu.Unlock()
		l.mu.Lock()
		l.setPolicies(s)
		l.match, l.left, l.until = d.feed.matcherFor(s), false, 0
		if l.memo != nil {
			l.memo.backlogTo, l.memo.backlogN = 0, 0 // the filter may have changed: count afresh
		}
		l.leaving.Store(false)
		l.mu.Unlock()
		l.pump()
	}
	return nil
}

// leave ends l's entitlement at the head: it drains what it was owed, then
// retires. d.reg is held.
func (d *Dispatcher) leave(l *lane) (queue.Membership, error) {
	m, err := d.store.Leave(l.id)
	if err != nil {
		return m, err
	}
	l.mu.Lock()
	l.left, l.until = true, m.Until
	l.leaving.Store(true)
	l.mu.Unlock()
	d.leaves.Add(1)
	d.log.Info("subscription removed; draining what it was entitled to", "subscription", l.id, "until_seq", m.Until)
	l.pump()
	return m, nil
}

// laneList returns every lane. The slice is shared and rebuilt only when
// lanes come or go, so periodic passes over 50,000 lanes allocate nothing;
// callers must not modify it.
func (d *Dispatcher) laneList() []*lane {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.laneSlice == nil {
		d.laneSlice = make([]*lane, 0, len(d.lanes))
		for _, l := range d.lanes {
			d.laneSlice = append(d.laneSlice, l)
		}
	}
	return d.laneSlice
}

// bindings yields the egress binding of every lane's subscription, for
// the egress routes' sweep: what no lane holds is dropped.
func (d *Dispatcher) bindings(yield func(egress.Binding) bool) {
	for v := range d.Views() {
		if !yield(v.Sub.binding) {
			return
		}
	}
}

func (d *Dispatcher) lane(id string) *lane {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lanes[id]
}

// kickLoop pumps the lanes that wait for what was just committed.
func (d *Dispatcher) kickLoop() {
	defer d.wg.Done()
	var wake []*lane
	for {
		select {
		case <-d.feed.kick:
		case <-d.quit:
			return
		}
		wake = d.feed.woken(wake)
		for i, l := range wake {
			l.pump()
			wake[i] = nil
		}
		wake = wake[:0]
	}
}

// flushLoop writes dirty cursors together, cursorInterval after the first
// of them moved: the same bound on what a crash sends again as a ticker
// of that interval, without its wake-ups while no cursor moves.
func (d *Dispatcher) flushLoop() {
	defer d.wg.Done()
	t := time.NewTimer(d.cursorInterval)
	t.Stop()
	defer t.Stop()
	var failed int
	var loggedAt time.Time
	for {
		select {
		case <-d.dirty.armed:
		case <-d.quit:
			return
		}
		t.Reset(d.cursorInterval)
		select {
		case <-t.C:
		case <-d.quit:
			return
		}
		// A failed flush marks its lanes again, which arms the next try
		// one interval later, as the ticker retried.
		if err := d.flush(); err != nil {
			// Logged at most every few seconds: a shared log out of reach
			// fails this every cursorInterval.
			if failed++; time.Since(loggedAt) >= 5*time.Second {
				d.log.Error("save cursors", "err", err, "failures", failed)
				failed, loggedAt = 0, time.Now()
			}
		}
	}
}

// maintainLoop retires drained lanes, enforces backlog quotas and
// compacts the log, apart from the flush loop: a compaction of a shared
// log waits on the network, and cursor writes must not wait for it (the
// fleet demo's owner stopped writing its cursor for seconds behind one,
// and its successor resent everything since).
func (d *Dispatcher) maintainLoop() {
	defer d.wg.Done()
	t := time.NewTicker(maintainInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-d.quit:
			return
		}
		d.maintain()
	}
}

// compactSlack is how far an idle lane's cursor may trail the head before
// maintain advances it.
const compactSlack = 4096

// maintainInterval is how often drained lanes are retired and the log is
// compacted; each pass touches every lane, so not much more often.
const maintainInterval = time.Second

// flush writes every dirty cursor in one transaction.
func (d *Dispatcher) flush() error {
	dirty := d.dirty.take()
	if len(dirty) == 0 {
		return nil
	}
	cursors := make(map[string]uint64, len(dirty))
	for l := range dirty {
		l.mu.Lock()
		cursors[l.id] = l.cursor
		l.dirty = false
		l.mu.Unlock()
	}
	if err := d.store.SaveCursors(cursors); err != nil {
		for l := range dirty {
			l.mu.Lock()
			if !l.dirty {
				l.dirty = true
				d.dirty.mark(l)
			}
			l.mu.Unlock()
		}
		return err
	}
	for l := range dirty {
		l.saved.Store(cursors[l.id])
	}
	d.flushes.Add(1)
	return nil
}

// passMark is what a maintenance pass started from, and the floor of the
// durable cursors it found.
type passMark struct {
	valid                 bool // the pass found no lane leaving, in a pass that can be skipped
	head, flushes, leaves uint64
	lanes                 []*lane // laneList's slice: a new one when lanes come or go
	below                 uint64
}

// maintain retires lanes that left and drained, then compacts the log below
// the smallest durable cursor.
func (d *Dispatcher) maintain() {
	head := d.feed.head.Load()
	below := head + 1
	now := d.now()
	// Without a fleet no lane is foreign, and without any quota there is
	// none to enforce: the pass then takes no lane's lock.
	fleet, quotas := d.fleet != nil, d.quotas.Load()
	lanes := d.laneList()
	mark := passMark{head: head, flushes: d.flushes.Load(), leaves: d.leaves.Load(), lanes: lanes}
	if p := d.lastPass; p.valid && !fleet && !quotas && p.head == head && p.flushes == mark.flushes &&
		p.leaves == mark.leaves && len(p.lanes) == len(lanes) && (len(lanes) == 0 || &p.lanes[0] == &lanes[0]) {
		// Nothing the loop looks at moved since the last pass: no event
		// was appended, no cursor written, no lane came, went or began to
		// leave. It would pump nothing and find the same floor, so skip
		// it (it read every one of 50,000 lanes each second when idle);
		// compaction still runs, for the events retries released.
		d.compact(p.below, now)
		return
	}
	leaving := false
	for _, l := range lanes {
		if fleet && l.isForeign() {
			// Its owner enforces its quota, retires it and keeps its
			// cursor; the shared store's compaction counts it from there.
			continue
		}
		if quotas {
			l.enforceQuota(now)
			l.trimLetters() // a tenant's lanes have quotas (tenantBound)
		}
		// A filtered lane that sees none of its types sleeps with a stale
		// cursor; move it to the head now and then so it does not pin
		// compaction (its cursor write is one key).
		if l.saved.Load()+compactSlack < head {
			l.pump()
		}
		drained := false
		if l.leaving.Load() { // only lanes that left can retire; skip the lock for the rest
			leaving = true
			l.mu.Lock()
			drained = l.drainedLocked() && l.saved.Load() >= l.until
			l.mu.Unlock()
		}
		if drained {
			if rs, err := d.store.Retries(l.id, 1); err == nil && len(rs) == 0 {
				if err := d.store.Retire(l.id); err != nil {
					d.log.Error("retire", "subscription", l.id, "err", err)
				} else {
					l.mu.Lock()
					l.retired = true
					l.mu.Unlock()
					d.mu.Lock()
					delete(d.lanes, l.id)
					d.laneSlice = nil
					d.mu.Unlock()
					d.log.Info("subscription drained and retired", "subscription", l.id)
					continue
				}
			}
		}
		below = min(below, l.saved.Load()+1)
	}
	// A leaving lane is watched every pass until it retires: what it
	// waits for (its retries, its last delivery) need not move a cursor.
	mark.valid, mark.below = !leaving, below
	d.lastPass = mark
	d.compact(below, now)
}

// compact ends a maintenance pass: the log below the floor of the durable
// cursors, then the server's own periodic duty.
func (d *Dispatcher) compact(below uint64, now time.Time) {
	if _, err := d.store.Compact(below); err != nil {
		d.log.Error("compact", "err", err)
	}
	if d.onMaintain != nil {
		d.onMaintain(now)
	}
}

// stop starts no new deliveries, waits for those in flight until ctx ends,
// abandons the rest (they stay unresolved in the log and run again after a
// restart) and writes the final cursors. It returns how many were abandoned.
func (d *Dispatcher) stop(ctx context.Context) int {
	d.stopping.Store(true)
wait:
	for d.slots.inflight.Load() > 0 {
		select {
		case <-d.slots.freed:
		case <-ctx.Done():
			break wait
		}
	}
	d.life.Lock()
	d.closed = true
	abandoned := int(d.slots.inflight.Load())
	d.life.Unlock()
	close(d.quit)
	d.wg.Wait()
	if err := d.flush(); err != nil {
		d.log.Error("save cursors at shutdown", "err", err)
	}
	return abandoned
}

// timerHeap wakes lanes when their earliest retry (or a backed-off write)
// is due. It holds at most one live entry per lane, the earliest asked
// for (lane.timerAt): a later wake-up is not needed, because a pump at the
// earlier one re-arms whatever the lane still waits for (pumpLocked ends
// by arming nextDue; a refused gate arms its own wake-up again). An entry
// replaced by an earlier one stays in the heap, stale, and is dropped
// when it comes up, so the heap grows with the lanes, not with the
// wake-ups asked for (it had one entry per request, never removed).
type timerHeap struct {
	mu   sync.Mutex
	h    timerEntries
	wake chan struct{}
}

// maxTimerSleep bounds how long the timer loop sleeps without reading the
// clock again while anything is scheduled; with nothing scheduled it
// sleeps until something is.
const maxTimerSleep = time.Second

type timerEntry struct {
	due  time.Time
	lane *lane
}

type timerEntries []timerEntry

func (h timerEntries) Len() int           { return len(h) }
func (h timerEntries) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h timerEntries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerEntries) Push(x any)        { *h = append(*h, x.(timerEntry)) }
func (h *timerEntries) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func (t *timerHeap) add(l *lane, due time.Time) {
	at := due.UnixNano()
	t.mu.Lock()
	if l.timerAt != 0 && l.timerAt <= at {
		t.mu.Unlock()
		return
	}
	l.timerAt = at
	heap.Push(&t.h, timerEntry{due: due, lane: l})
	first := t.h[0].lane == l && t.h[0].due.Equal(due)
	t.mu.Unlock()
	if first {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

func (d *Dispatcher) timerLoop() {
	defer d.wg.Done()
	t := d.timers
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := d.now()
		var due []*lane
		wait := time.Hour
		t.mu.Lock()
		// An entry far ahead of what its lane schedules predates a step
		// back of the wall clock: wake the lane now (lane.dueBy).
		for t.h.Len() > 0 && t.h[0].lane.dueBy(t.h[0].due, now) {
			e := heap.Pop(&t.h).(timerEntry)
			if e.lane.timerAt != e.due.UnixNano() {
				continue // replaced by an earlier wake-up, which has run
			}
			e.lane.timerAt = 0
			due = append(due, e.lane)
		}
		empty := t.h.Len() == 0
		if !empty {
			wait = t.h[0].due.Sub(now)
		}
		// Look again at least every maxTimerSleep: the wall clock may step
		// while we sleep, and a due time without a monotonic reading (a
		// retry record's, or any from an injected clock) then falls due
		// earlier, or later, than the sleep measured.
		wait = min(wait, maxTimerSleep)
		t.mu.Unlock()
		for _, l := range due {
			l.pump()
		}
		if len(due) > 0 {
			continue
		}
		if empty {
			// Nothing is scheduled, so no clock step can make anything
			// due: sleep until add wakes us (a quiet sidecar woke every
			// maxTimerSleep for nothing).
			select {
			case <-t.wake:
			case <-d.quit:
				return
			}
			continue
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-t.wake:
			timer.Stop()
		case <-d.quit:
			return
		}
	}
}

// statuses returns every lane's status, sorted by subscription id.
func (d *Dispatcher) statuses(keep func(*lane) bool) []api.LaneStatus {
	lanes := d.laneList()
	out := make([]api.LaneStatus, 0, len(lanes))
	snaps := d.laneSnapshots()
	for _, l := range lanes {
		if keep == nil || keep(l) {
			out = append(out, d.status(l, snaps))
		}
	}
	sortStatuses(out)
	return out
}

// statusOf is one lane's status.
func (d *Dispatcher) statusOf(l *lane) api.LaneStatus { return d.status(l, d.laneSnapshots()) }

// laneSnapshots are the owners' published lane statuses in fleet mode.
func (d *Dispatcher) laneSnapshots() map[string]queue.LaneSnapshot {
	if d.fleet == nil {
		return nil
	}
	snaps, err := d.fleet.LaneSnapshots()
	if err != nil {
		d.log.Warn("read lane snapshots", "err", err)
	}
	return snaps
}

func (d *Dispatcher) status(l *lane, snaps map[string]queue.LaneSnapshot) api.LaneStatus {
	var st api.LaneStatus
	switch {
	case d.fleet != nil && l.isForeign():
		st = d.foreignStatus(l, snaps)
	default:
		st = l.withOldestAge(l.status(), d.now())
		if d.fleet != nil {
			st.Owner = d.fleet.NodeID()
		}
	}
	l.mu.Lock()
	st.Tenant, st.ManagedBy = l.sub.Tenant, cmp.Or(l.sub.ManagedBy, api.ManagedByFile)
	l.mu.Unlock()
	return st
}

// withOldestAge fills st.OldestAge from the entry just past the cursor:
// remembered from the last time it was asked while the cursor has not
// moved, else from the ring or one read of the log.
func (l *lane) withOldestAge(st api.LaneStatus, now time.Time) api.LaneStatus {
	if st.Backlog == 0 && st.InFlight == 0 {
		return st
	}
	seq := st.Cursor + 1
	l.mu.Lock()
	var at int64
	known := l.memo != nil && l.memo.oldestSeq == seq
	if known {
		at = l.memo.oldestAt
	}
	l.mu.Unlock()
	if !known {
		ev, err := l.e.feed.event(seq)
		if err != nil {
			return st
		}
		at = ev.AcceptedAt.UnixNano()
		l.mu.Lock()
		m := l.memoized()
		m.oldestSeq, m.oldestAt = seq, at
		l.mu.Unlock()
	}
	st.OldestAge = max(now.Sub(time.Unix(0, at)).Seconds(), 0)
	return st
}
