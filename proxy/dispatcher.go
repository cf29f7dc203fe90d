package proxy

import (
	"container/heap"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

// dispatcher owns the lanes and the machinery they share: the ring of recent
// events, the pool of delivery workers, the global in-flight limit, the
// retry timer, and the cursor flusher.
//
// Lock order: a lane's mu may be held while taking d.mu, never the reverse.
type dispatcher struct {
	q      queue.Store
	log    *slog.Logger
	now    func() time.Time
	client *fasthttp.Client
	ring   *ring
	head   atomic.Uint64 // last seq in the ring (or the log's head at start)

	mu        sync.Mutex
	lanes     map[string]*lane
	laneSlice []*lane            // cache of the lanes; nil when stale
	hungry    map[*lane]struct{} // lanes for all types with free slots, waiting for new events
	// hungryType holds filtered lanes waiting for an event of one of their
	// types; pendingTypes the types committed since the kick loop last ran.
	hungryType   map[string]map[*lane]struct{}
	pendingTypes map[string]struct{}
	committed    bool // something was committed since the kick loop last ran

	typeMu   sync.RWMutex
	typeSeq  map[string]*atomic.Uint64        // last committed seq of each filtered-on type
	matchers map[string]func(typ []byte) bool // one filter per distinct type list, shared by lanes
	dirty    map[*lane]struct{}               // lanes whose cursor moved since the last flush
	starved  map[*lane]struct{}               // lanes that found the global limit full

	maxInFlight int64
	inflight    atomic.Int64
	workers     atomic.Int64
	jobs        chan *job
	freed       chan struct{} // signalled when inflight drops to zero

	m      *metrics
	budget *policy.Budget // shared retry budget

	cursorInterval time.Duration
	timers         *timerHeap
	kick           chan struct{}
	stopping       atomic.Bool
	life           sync.RWMutex // finish holds it shared while writing outcomes and moving the cursor
	closed         bool
	quit           chan struct{}
	wg             sync.WaitGroup
}

func newDispatcher(q queue.Store, client *fasthttp.Client, log *slog.Logger, now func() time.Time, maxInFlight int, cursorInterval time.Duration, budget policy.BudgetConfig) *dispatcher {
	d := &dispatcher{
		q: q, log: log, now: now, client: client,
		ring:   newRing(ringSlots, ringBytes, q.Head()),
		lanes:  map[string]*lane{},
		hungry: map[*lane]struct{}{}, dirty: map[*lane]struct{}{}, starved: map[*lane]struct{}{},
		hungryType: map[string]map[*lane]struct{}{}, pendingTypes: map[string]struct{}{},
		typeSeq:        map[string]*atomic.Uint64{},
		matchers:       map[string]func(typ []byte) bool{},
		maxInFlight:    int64(maxInFlight),
		jobs:           make(chan *job, maxInFlight),
		freed:          make(chan struct{}, 1),
		cursorInterval: cursorInterval,
		kick:           make(chan struct{}, 1),
		quit:           make(chan struct{}),
	}
	d.head.Store(q.Head())
	d.timers = &timerHeap{wake: make(chan struct{}, 1)}
	d.budget = policy.NewBudget(budget, now)

	return d
}

// Ring bounds: enough to cover a few hundred milliseconds of a busy stream,
// so lanes that keep up never touch the disk.
const (
	ringSlots = 16384
	ringBytes = 64 << 20
)

// start recovers the lanes from the log, reconciles them with the config
// and starts the loops.
func (d *dispatcher) start(subs []*Subscription) error {
	ms, err := d.q.Memberships()
	if err != nil {
		return err
	}
	cursors := make(map[string]uint64, len(ms))
	for _, m := range ms {
		cursors[m.Subscription] = m.Cursor
	}
	retries, err := d.q.RetrySummaries(cursors)
	if err != nil {
		return err
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
		l := newLane(d, m, sub)
		if rs := retries[m.Subscription]; rs != nil {
			l.scheduled.Store(int64(rs.Count))
			l.ahead = rs.Ahead
			// Some may be due from before the restart: look at once.
			l.nextDue = time.Unix(0, 1)
		}
		d.lanes[m.Subscription] = l
		d.watchTypes(sub)
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
	// owes stays undelivered (invariant 7).
	for _, l := range d.laneList() {
		if l.leaving.Load() {
			l.pump()
		}
	}
	d.wg.Add(3)
	go d.kickLoop()
	go d.timerLoop()
	go d.flushLoop()
	return nil
}

// apply reconciles lanes with a new set of subscriptions: new ones join at
// the head, changed ones take their new settings, removed ones leave and
// drain what they were entitled to (invariant 7).
// known holds memberships just read from the log (at start-up), or nil.
func (d *dispatcher) apply(subs []*Subscription, known map[string]*queue.Membership) error {
	keep := map[string]bool{}
	reqs := make([]queue.JoinRequest, len(subs))
	for i, s := range subs {
		keep[s.ID] = true
		reqs[i] = queue.JoinRequest{Subscription: s.ID, Snapshot: encodeSnapshot(s), Known: known[s.ID]}
	}
	ms, err := d.q.JoinAll(reqs)
	if err != nil {
		return err
	}
	for i, s := range subs {
		d.watchTypes(s)
		d.mu.Lock()
		l := d.lanes[s.ID]
		if l == nil {
			l = newLane(d, ms[i], s)
			d.lanes[s.ID] = l
			d.laneSlice = nil
		}
		d.mu.Unlock()
		l.mu.Lock()
		l.setPolicies(s)
		l.match, l.left, l.until = d.matcherFor(s), false, 0
		l.leaving.Store(false)
		l.mu.Unlock()
		l.pump()
	}
	for _, l := range d.laneList() {
		l.mu.Lock()
		leaving := !keep[l.id] && !l.left
		l.mu.Unlock()
		if !leaving {
			continue
		}
		m, err := d.q.Leave(l.id)
		if err != nil {
			return err
		}
		l.mu.Lock()
		l.left, l.until = true, m.Until
		l.leaving.Store(true)
		l.mu.Unlock()
		d.log.Info("subscription removed; draining what it was entitled to", "subscription", l.id, "until_seq", m.Until)
		l.pump()
	}
	return nil
}

// watchTypes starts tracking the last seq of each type sub filters on. A
// type starts at the head: events of it may already be in the log.
func (d *dispatcher) watchTypes(sub *Subscription) {
	if slices.Contains(sub.Types, "*") {
		return
	}
	d.typeMu.Lock()
	defer d.typeMu.Unlock()
	for _, t := range sub.Types {
		if d.typeSeq[t] == nil {
			v := new(atomic.Uint64)
			v.Store(d.head.Load())
			d.typeSeq[t] = v
		}
	}
}

// matcherFor returns the type filter of sub, shared with every other lane
// that filters on the same list.
func (d *dispatcher) matcherFor(sub *Subscription) func(typ []byte) bool {
	key := strings.Join(sub.Types, "\x00")
	d.typeMu.Lock()
	defer d.typeMu.Unlock()
	m, ok := d.matchers[key]
	if !ok {
		m = sub.matcher()
		d.matchers[key] = m
	}
	return m
}

// seenSince reports whether an event of one of types may have been
// committed at or after seq.
func (d *dispatcher) seenSince(types []string, seq uint64) bool {
	d.typeMu.RLock()
	defer d.typeMu.RUnlock()
	for _, t := range types {
		if v := d.typeSeq[t]; v == nil || v.Load() >= seq {
			return true
		}
	}
	return false
}

// laneList returns every lane. The slice is shared and rebuilt only when
// lanes come or go, so periodic passes over 50,000 lanes allocate nothing;
// callers must not modify it.
func (d *dispatcher) laneList() []*lane {
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

func (d *dispatcher) lane(id string) *lane {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lanes[id]
}

// onCommit runs on the queue's committer goroutine: it must not block.
// Order matters: ring, then type seqs, then head, then the kick, so that a
// lane that reads the head also sees everything below it.
func (d *dispatcher) onCommit(evs []*queue.Event) {
	d.ring.put(evs)
	d.typeMu.RLock()
	for _, ev := range evs {
		if v := d.typeSeq[ev.Type]; v != nil {
			v.Store(ev.Seq)
		}
	}
	d.typeMu.RUnlock()
	d.head.Store(evs[len(evs)-1].Seq)
	d.mu.Lock()
	d.committed = true
	for _, ev := range evs {
		if _, ok := d.hungryType[ev.Type]; ok {
			d.pendingTypes[ev.Type] = struct{}{}
		}
	}
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// event returns one event, from memory if the ring still holds it.
func (d *dispatcher) event(seq uint64) (*queue.Event, error) {
	if ev, ok := d.ring.get(seq); ok {
		return ev, nil
	}
	return d.q.Event(seq)
}

// markHungry parks a lane that has free slots and nothing to send: a lane
// for all types wakes on any commit, a filtered one only on a commit of one
// of its types, so 50,000 idle lanes cost nothing per event.
func (d *dispatcher) markHungry(l *lane) {
	d.mu.Lock()
	if l.match == nil {
		d.hungry[l] = struct{}{}
	} else {
		for _, t := range l.sub.Types {
			set := d.hungryType[t]
			if set == nil {
				set = map[*lane]struct{}{}
				d.hungryType[t] = set
			}
			set[l] = struct{}{}
		}
	}
	d.mu.Unlock()
}

func (d *dispatcher) markDirty(l *lane) {
	d.mu.Lock()
	d.dirty[l] = struct{}{}
	d.mu.Unlock()
}

// acquire takes one slot of the process-wide in-flight limit. When none is
// free the lane is remembered, to be pumped when a slot frees up.
func (d *dispatcher) acquire(l *lane) bool {
	for {
		n := d.inflight.Load()
		if n >= d.maxInFlight {
			d.mu.Lock()
			d.starved[l] = struct{}{}
			d.mu.Unlock()
			return false
		}
		if d.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// giveBack returns a slot from inside a pump (a lane's mu held): starved
// lanes are handed to the kick loop rather than pumped here, which could
// be this very lane.
func (d *dispatcher) giveBack() {
	d.slotFreed()
	d.mu.Lock()
	wake := len(d.starved) > 0
	for l := range d.starved {
		d.hungry[l] = struct{}{}
	}
	clear(d.starved)
	if wake {
		d.committed = true // not a commit, but the kick loop must pump them
	}
	d.mu.Unlock()
	if wake {
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}
}

// release returns the slot of a finished delivery (no lane lock held) and
// pumps one lane that was waiting for a slot.
func (d *dispatcher) release() {
	d.slotFreed()
	var next *lane
	d.mu.Lock()
	for l := range d.starved {
		next = l
		delete(d.starved, l)
		break
	}
	d.mu.Unlock()
	if next != nil {
		next.pump()
	}
}

func (d *dispatcher) slotFreed() {
	if d.inflight.Add(-1) == 0 {
		select {
		case d.freed <- struct{}{}:
		default:
		}
	}
}

// submit hands a job to a worker. Workers are started on demand up to the
// in-flight limit and then kept: a delivery never spawns a goroutine of its
// own, and the channel never blocks because jobs never outnumber slots.
func (d *dispatcher) submit(j *job) {
	for {
		w := d.workers.Load()
		if w >= d.inflight.Load() {
			break
		}
		if d.workers.CompareAndSwap(w, w+1) {
			go d.worker()
			break
		}
	}
	d.jobs <- j
}

func (d *dispatcher) worker() {
	var w workerState
	for {
		select {
		case j := <-d.jobs:
			res := d.deliver(j, &w)
			j.lane.finish(j, res)
		case <-d.quit:
			return
		}
	}
}

// kickLoop pumps the lanes that wait for what was just committed.
func (d *dispatcher) kickLoop() {
	defer d.wg.Done()
	var wake []*lane
	for {
		select {
		case <-d.kick:
		case <-d.quit:
			return
		}
		d.mu.Lock()
		if d.committed || len(d.pendingTypes) > 0 {
			for l := range d.hungry {
				wake = append(wake, l)
			}
			clear(d.hungry)
		}
		for t := range d.pendingTypes {
			for l := range d.hungryType[t] {
				wake = append(wake, l)
			}
			delete(d.hungryType, t)
		}
		clear(d.pendingTypes)
		d.committed = false
		d.mu.Unlock()
		for i, l := range wake {
			l.pump()
			wake[i] = nil
		}
		wake = wake[:0]
	}
}

// flushLoop writes dirty cursors together, retires drained lanes and
// compacts the log.
func (d *dispatcher) flushLoop() {
	defer d.wg.Done()
	t := time.NewTicker(d.cursorInterval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-t.C:
		case <-d.quit:
			return
		}
		if err := d.flush(); err != nil {
			d.log.Error("save cursors", "err", err)
			continue
		}
		if time.Since(last) >= maintainInterval {
			d.maintain()
			last = time.Now()
		}
	}
}

// compactSlack is how far an idle lane's cursor may trail the head before
// maintain advances it.
const compactSlack = 4096

// maintainInterval is how often drained lanes are retired and the log is
// compacted; each pass touches every lane, so not much more often.
const maintainInterval = time.Second

// flush writes every dirty cursor in one transaction.
func (d *dispatcher) flush() error {
	d.mu.Lock()
	dirty := d.dirty
	d.dirty = make(map[*lane]struct{}, len(dirty))
	d.mu.Unlock()
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
	if err := d.q.SaveCursors(cursors); err != nil {
		for l := range dirty {
			l.mu.Lock()
			if !l.dirty {
				l.dirty = true
				d.markDirty(l)
			}
			l.mu.Unlock()
		}
		return err
	}
	for l := range dirty {
		l.saved.Store(cursors[l.id])
	}
	return nil
}

// maintain retires lanes that left and drained, then compacts the log below
// the smallest durable cursor.
func (d *dispatcher) maintain() {
	head := d.head.Load()
	below := head + 1
	now := d.now()
	for _, l := range d.laneList() {
		l.enforceQuota(now)
		// A filtered lane that sees none of its types sleeps with a stale
		// cursor; move it to the head now and then so it does not pin
		// compaction (its cursor write is one key).
		if l.saved.Load()+compactSlack < head {
			l.pump()
		}
		drained := false
		if l.leaving.Load() { // only lanes that left can retire; skip the lock for the rest
			l.mu.Lock()
			drained = l.drainedLocked() && l.saved.Load() >= l.until
			l.mu.Unlock()
		}
		if drained {
			if rs, err := d.q.Retries(l.id, 1); err == nil && len(rs) == 0 {
				if err := d.q.Retire(l.id); err != nil {
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
	if _, err := d.q.Compact(below); err != nil {
		d.log.Error("compact", "err", err)
	}
}

// stop starts no new deliveries, waits for those in flight until ctx ends,
// abandons the rest (they stay unresolved in the log and run again after a
// restart) and writes the final cursors. It returns how many were abandoned.
func (d *dispatcher) stop(ctx context.Context) int {
	d.stopping.Store(true)
wait:
	for d.inflight.Load() > 0 {
		select {
		case <-d.freed:
		case <-ctx.Done():
			break wait
		}
	}
	d.life.Lock()
	d.closed = true
	abandoned := int(d.inflight.Load())
	d.life.Unlock()
	close(d.quit)
	d.wg.Wait()
	if err := d.flush(); err != nil {
		d.log.Error("save cursors at shutdown", "err", err)
	}
	return abandoned
}

// timerHeap wakes lanes when their earliest retry (or a backed-off write)
// is due. Entries are not removed when a lane's due time changes: a wake-up
// that finds nothing to do is cheap.
type timerHeap struct {
	mu   sync.Mutex
	h    timerEntries
	wake chan struct{}
}

// maxTimerSleep bounds how long the timer loop sleeps without reading the
// clock again; an idle dispatcher wakes this often, which costs nothing.
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
	t.mu.Lock()
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

func (d *dispatcher) timerLoop() {
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
			due = append(due, heap.Pop(&t.h).(timerEntry).lane)
		}
		if t.h.Len() > 0 {
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
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-t.wake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		case <-d.quit:
			return
		}
	}
}

// statuses returns every lane's status, sorted by subscription id.
func (d *dispatcher) statuses() []LaneStatus {
	lanes := d.laneList()
	out := make([]LaneStatus, 0, len(lanes))
	now := d.now()
	for _, l := range lanes {
		out = append(out, d.withOldestAge(l.status(), now))
	}
	sortStatuses(out)
	return out
}

// withOldestAge fills st.OldestAge from the entry just past the cursor (the
// ring, or one read of the log).
func (d *dispatcher) withOldestAge(st LaneStatus, now time.Time) LaneStatus {
	if st.Backlog > 0 || st.InFlight > 0 {
		if ev, err := d.event(st.Cursor + 1); err == nil {
			st.OldestAge = max(now.Sub(ev.AcceptedAt).Seconds(), 0)
		}
	}
	return st
}
