package delivery

import (
	"iter"

	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// What the admin API sees of the engine: lanes by subscription id, as
// values read under each lane's lock, never the lanes themselves.

// View is one lane as the admin API sees it: its subscription as the lane
// holds it now (never written again: a change replaces it), whether it
// was deleted and drains what it was owed (Left), and whether another
// fleet node delivers it (Foreign).
type View struct {
	Sub     *Subscription
	Left    bool
	Foreign bool
}

func (l *lane) view() View {
	l.mu.Lock()
	defer l.mu.Unlock()
	return View{Sub: l.sub, Left: l.left, Foreign: l.foreign}
}

// View returns the lane of subscription id; false when there is none.
func (d *Dispatcher) View(id string) (View, bool) {
	l := d.lane(id)
	if l == nil {
		return View{}, false
	}
	return l.view(), true
}

// Views yields every lane, in no particular order, each read under its
// lock as it comes: a registry check over 50,000 lanes copies none of
// them into a slice.
func (d *Dispatcher) Views() iter.Seq[View] {
	return func(yield func(View) bool) {
		for _, l := range d.laneList() {
			if !yield(l.view()) {
				return
			}
		}
	}
}

// Status returns the status line of subscription id; false when no lane
// has it.
func (d *Dispatcher) Status(id string) (api.LaneStatus, bool) {
	l := d.lane(id)
	if l == nil {
		return api.LaneStatus{}, false
	}
	return d.statusOf(l), true
}

// StatusesOfTenant returns the status lines of tenant's subscriptions,
// sorted by id.
func (d *Dispatcher) StatusesOfTenant(tenant string) []api.LaneStatus {
	return d.statuses(func(l *lane) bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.sub.Tenant == tenant
	})
}

// Head is the seq of the last event committed to the log.
func (d *Dispatcher) Head() uint64 { return d.feed.head.Load() }

// LoggedEvent returns the event at seq, from the ring when it is still
// there, else from the log.
func (d *Dispatcher) LoggedEvent(seq uint64) (*queue.Event, error) { return d.feed.event(seq) }

// Fleet is the store as a fleet (who owns which lane), nil when this node
// owns every lane.
func (d *Dispatcher) Fleet() queue.Fleet { return d.fleet }

// LockSet and UnlockSet hold the set of subscriptions still: a reload of
// the file, a fleet membership change and the admin API's creates,
// updates and deletes each change it under this lock, so the API's checks
// (an id free, a tenant's room) hold until its Join or Leave.
func (d *Dispatcher) LockSet()   { d.reg.Lock() }
func (d *Dispatcher) UnlockSet() { d.reg.Unlock() }

// Join makes sub a member, or gives its lane the new settings when it is
// one; create refuses an id another node made meanwhile (queue.ErrExists,
// fleet mode). The set must be locked (LockSet).
func (d *Dispatcher) Join(sub *Subscription, create bool) error {
	return d.join([]*Subscription{sub}, nil, create)
}

// Leave ends subscription id's entitlement at the head: it takes no new
// events, drains what it is owed, then retires. The set must be locked
// (LockSet).
func (d *Dispatcher) Leave(id string) error {
	l := d.lane(id)
	if l == nil {
		return queue.ErrNotFound
	}
	_, err := d.leave(l)
	return err
}

// TakeRotating reports, and clears, whether a lane took a subscription
// whose old secrets expire (a rotation's grace) since the last call;
// MarkRotating sets it again for secrets still in their grace.
func (d *Dispatcher) TakeRotating() bool { return d.rotating.Swap(false) }
func (d *Dispatcher) MarkRotating()      { d.rotating.Store(true) }
