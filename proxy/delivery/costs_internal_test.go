package delivery

// Costs that must grow with what changed, not with the number of lanes or
// the size of a backlog.

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// countStore records the ranges CountEvents is asked for.
type countStore struct {
	queue.Store
	mu     sync.Mutex
	ranges [][2]uint64
}

func (c *countStore) CountEvents(from, to uint64, match queue.Match, limit int) (int, error) {
	c.mu.Lock()
	c.ranges = append(c.ranges, [2]uint64{from, to})
	c.mu.Unlock()
	return c.Store.CountEvents(from, to, match, limit)
}

func (c *countStore) counted() [][2]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][2]uint64(nil), c.ranges...)
}

func postType(t *testing.T, s *Server, typ, key string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/"+typ, strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("ingest %s: %d", key, resp.StatusCode)
	}
}

// TestBacklogQuotaCountsOnlyNewEvents: a paused, filtered lane over its
// backlog quota is checked every second; each check counts only the
// events appended since the last one, never a range twice (it re-read up
// to max_events+1024 values per filtered lane every second, so the check
// that dead-letters the three new events counted the five old ones again).
func TestBacklogQuotaCountsOnlyNewEvents(t *testing.T) {
	url, _ := endpoint(t, http.StatusOK)
	sub := testSub("a", url)
	sub.Types = []string{"t"}
	sub.Backlog = BacklogQuota{MaxEvents: 5}
	c := &countStore{}
	s := startWith(t, func(st queue.Store) queue.Store { c.Store = st; return c }, sub)
	if err := s.Pause("a", ""); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		postType(t, s, "t", fmt.Sprintf("t-%d", i))
		postType(t, s, "u", fmt.Sprintf("u-%d", i))
	}
	testwait.Await(t, "the quota enforced", func() bool { return laneOf(s, "a").QuotaDropped == 15 })
	for i := range 3 {
		postType(t, s, "t", fmt.Sprintf("t2-%d", i))
	}
	testwait.Await(t, "the quota enforced on the new events", func() bool { return laneOf(s, "a").QuotaDropped == 18 })
	ranges := c.counted()
	var last uint64
	for _, r := range ranges {
		if r[0] <= last {
			t.Fatalf("counted %v after counting up to %d: a range counted twice (all: %v)", r, last, ranges)
		}
		last = r[1]
	}
	if st := laneOf(s, "a"); st.QuotaDropped != 18 {
		t.Fatalf("quota rejections %d; want 18", st.QuotaDropped)
	}
}

// len is how many entries the heap holds, stale ones included.
func (t *timerHeap) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.h.Len()
}

// TestTimerHeapOneLiveEntryPerLane: asking a lane's wake-up again and
// again keeps one live entry (they were never de-duplicated: one per
// request); an earlier one replaces it, and the replaced one is dropped
// when it comes up.
func TestTimerHeapOneLiveEntryPerLane(t *testing.T) {
	th := &timerHeap{wake: make(chan struct{}, 1)}
	l := &lane{}
	t0 := time.Unix(1_000_000, 0)
	for i := range 1000 {
		th.add(l, t0.Add(time.Duration(i)*time.Millisecond))
	}
	if n := th.len(); n != 1 {
		t.Fatalf("%d entries after 1000 later wake-ups of one lane; want 1", n)
	}
	th.add(l, t0.Add(-time.Second))
	if n := th.len(); n != 2 || l.timerAt != t0.Add(-time.Second).UnixNano() {
		t.Fatalf("after an earlier wake-up: %d entries, armed at %d", n, l.timerAt)
	}
	other := &lane{}
	th.add(other, t0)
	if n := th.len(); n != 3 {
		t.Fatalf("a second lane: %d entries; want 3", n)
	}
}

// eventCountStore counts the events read from the log.
type eventCountStore struct {
	queue.Store
	reads atomic.Int64
}

func (c *eventCountStore) Event(seq uint64) (*queue.Event, error) {
	c.reads.Add(1)
	return c.Store.Event(seq)
}

// TestScrapeReadsTheLogOnlyWhenTheCursorMoved: the oldest-age gauge of a
// lane with a backlog is read from the log once per position of its
// cursor, not once per scrape (each scrape read the log once per lane
// with a backlog).
func TestScrapeReadsTheLogOnlyWhenTheCursorMoved(t *testing.T) {
	st := queuetest.MustOpen(t, "", badger.Options{})
	for i := range 3 {
		queuetest.MustAppend(t, st, queuetest.Event(fmt.Sprintf("e-%d", i), "t", `{}`))
	}
	c := &eventCountStore{Store: st}
	// An engine made after the appends: its ring is empty, so every read
	// of an event goes to the log.
	e := newEngine(c, nil, discardLogger(), time.Now, 4, 0, policy.BudgetConfig{})
	l := newLane(e, queue.Membership{Subscription: "a", From: 1}, testSub("a", "http://127.0.0.1:1"))
	now := time.Now()
	for range 5 {
		if got := l.withOldestAge(api.LaneStatus{Cursor: 0, Backlog: 3}, now); got.OldestAge < 0 {
			t.Fatalf("oldest age %v", got.OldestAge)
		}
	}
	if n := c.reads.Load(); n != 1 {
		t.Fatalf("5 scrapes at one cursor read the log %d times; want 1", n)
	}
	l.withOldestAge(api.LaneStatus{Cursor: 1, Backlog: 2}, now)
	if n := c.reads.Load(); n != 2 {
		t.Fatalf("after the cursor moved: %d reads; want 2", n)
	}
	if got := l.withOldestAge(api.LaneStatus{Cursor: 3}, now); got.OldestAge != 0 || c.reads.Load() != 2 {
		t.Fatalf("caught up: age %v, %d reads; want 0 and no read", got.OldestAge, c.reads.Load())
	}
}
