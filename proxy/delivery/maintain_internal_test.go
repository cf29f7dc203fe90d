package delivery

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// compactLog records the floors the log was compacted below.
type compactLog struct {
	queue.Store
	below []uint64
}

func (c *compactLog) Compact(below uint64) (int, error) {
	c.below = append(c.below, below)
	return c.Store.Compact(below)
}

// TestMaintainSkipKeepsTheCompactionFloor: a maintenance pass that finds
// nothing changed is skipped and compacts below the last floor, but a
// cursor write or a lane that joins with a lower cursor is seen, so the
// log is never compacted past a durable cursor (compaction deletes below
// the smallest cursor of the lanes).
func TestMaintainSkipKeepsTheCompactionFloor(t *testing.T) {
	c := &compactLog{Store: queuetest.MustOpen(t, "", badger.Options{})}
	d := newDispatcher(c, nil, discardLogger(), time.Now, 4, 0, time.Second, policy.BudgetConfig{})
	add := func(id string, saved uint64) *lane {
		l := newLane(d.engine, queue.Membership{Subscription: id, From: 1}, testSub(id, "http://127.0.0.1:1"))
		l.saved.Store(saved)
		d.mu.Lock()
		d.lanes[id], d.laneSlice = l, nil
		d.mu.Unlock()
		return l
	}
	// Within compactSlack of the head: no pass pumps a lane.
	d.feed.head.Store(100)
	a := add("a", 40)
	add("b", 90)
	pass := func(want uint64, what string) {
		t.Helper()
		d.maintain()
		if got := c.below[len(c.below)-1]; got != want {
			t.Fatalf("%s: compacted below %d; want %d", what, got, want)
		}
	}
	pass(41, "first pass")
	a.saved.Store(50) // not through flush: the next pass cannot tell
	pass(41, "nothing flushed")
	a.saved.Store(60)
	d.flushes.Add(1) // as flush does
	pass(61, "after a cursor write")
	add("c", 10)
	pass(11, "after a lane joined with a lower cursor")
	pass(11, "again")
}
