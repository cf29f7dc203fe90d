package proxy_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
	"github.com/sluicehq/sluice/testbed"
)

// TestRetryAboveDurableCursorIsSentOnce builds the data dir a crash leaves
// when a first attempt failed and its retry record was written, but the
// cursor moved past it only in memory (cursors are written every 20 ms):
// the event sits above the durable cursor and has a retry record. After
// the restart the lane must not send it again as a first attempt while the
// retry sends it too (a delivery is in flight in one place at a time); it
// arrives
// once, as the retry, and its neighbours once each.
func TestRetryAboveDurableCursorIsSentOnce(t *testing.T) {
	dir := t.TempDir()
	q := queuetest.MustOpen(t, dir, badger.Options{Sync: true})
	if _, err := q.Join("a", nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"e-1", "e-2", "e-3"} {
		queuetest.MustAppend(t, q, queuetest.Event(id, "t", `{}`))
	}
	now := time.Now()
	if err := q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "a", Seq: 2, Retry: &queue.Retry{Subscription: "a", Seq: 2, Due: now, Attempt: 1, FirstAttempt: now, LastStatus: 503}}); err != nil {
		t.Fatal(err)
	}
	q.Close()

	tb := startTestbed(t, testbed.ModeOK)
	s := startServer(t, dir, sub("a", tb.URL()+"/a"))
	waitFor(t, tb, "all three events", uniqueAt("/a", 3))
	eventually(t, "the lane settles", func() bool {
		l := lane(s, "a")
		return l.InFlight == 0 && l.Scheduled == 0 && l.Backlog == 0
	})
	if st := tb.Stats()["/a"]; st.Requests != 3 || st.Duplicates != 0 {
		t.Fatalf("receiver got %d requests, %d duplicates; want 3 and 0 (e-2 sent as a first attempt and as its retry)", st.Requests, st.Duplicates)
	}
	if l := lane(s, "a"); l.Delivered != 3 || l.DeadLettered != 0 {
		t.Fatalf("lane after restart: %+v; want 3 delivered", l)
	}
}

// TestLedgerKnowsTypesAfterCompaction: once the log has compacted an event,
// the completion ledger still lists only the subscriptions whose types it
// matched (the dedup index keeps the type), not every type-filtered one as
// "delivered".
func TestLedgerKnowsTypesAfterCompaction(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	dir := t.TempDir()
	subs := func() []*delivery.Subscription {
		return []*delivery.Subscription{sub("all", tb.URL()+"/all"), sub("typed", tb.URL()+"/typed", "t.a")}
	}
	s := startServer(t, dir, subs()...)
	publish(t, s, "t.b", "b", 1)
	// A t.a event moves the typed lane past b-0 (a lane is woken by the
	// types it takes), so every lane has passed b-0 and it is compacted.
	publish(t, s, "t.a", "a", 1)
	waitFor(t, tb, "deliveries", func(m map[string]testbed.PathStats) bool {
		return m["/all"].Unique == 2 && m["/typed"].Unique == 1
	})
	// A restart empties the ring of recent events, which would otherwise
	// still answer for b-0 after the log compacted it.
	closeServer(t, s, 5*time.Second)
	s = startServer(t, dir, subs()...)
	var st *api.EventStatus
	eventually(t, "the event compacted away", func() bool {
		var err error
		st, err = s.Event("b-0")
		return err == nil && st.AcceptedAt == nil
	})
	if st.Type != "t.b" || len(st.Deliveries) != 1 || st.Deliveries[0].Subscription != "all" || st.Deliveries[0].State != "delivered" {
		t.Fatalf("ledger after compaction: %+v; want type t.b, delivered to all only", st)
	}
}
