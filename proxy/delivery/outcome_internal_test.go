package delivery

// Tests of the outcome path that need a store fault on demand: a wrapper
// around the real Badger store (Server.wrapStore) that fails or holds
// chosen calls. Everything else is real: loopback endpoints, real lanes.

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// faultStore is the real store with hooks on the calls a test picks.
type faultStore struct {
	queue.Store
	record     func(o queue.Outcome) error // before the write; nil: pass through
	recorded   func(o queue.Outcome)       // after a successful write
	deadLetter func(sub string, seq uint64) (*queue.DeadLetter, error)
}

func (f *faultStore) Record(o queue.Outcome) error {
	if f.record != nil {
		if err := f.record(o); err != nil {
			return err
		}
	}
	err := f.Store.Record(o)
	if err == nil && f.recorded != nil {
		f.recorded(o)
	}
	return err
}

func (f *faultStore) DeadLetter(sub string, seq uint64) (*queue.DeadLetter, error) {
	if f.deadLetter != nil {
		return f.deadLetter(sub, seq)
	}
	return f.Store.DeadLetter(sub, seq)
}

func startWrapped(t *testing.T, f *faultStore, subs ...*Subscription) *Server {
	t.Helper()
	return startWith(t, func(st queue.Store) queue.Store { f.Store = st; return f }, subs...)
}

// startWith opens a sidecar whose engine drives wrap(the real store).
func startWith(t *testing.T, wrap func(queue.Store) queue.Store, subs ...*Subscription) *Server {
	t.Helper()
	return openTestServer(t, Options{Subscriptions: subs}, wrap)
}

// endpoint answers every request with status and counts them.
func endpoint(t *testing.T, status int) (url string, hits *atomic.Int64) {
	hits = new(atomic.Int64)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(status)
	}))
	t.Cleanup(rcv.Close)
	return rcv.URL, hits
}

func testSub(id, url string) *Subscription {
	return &Subscription{ID: id, URL: url, Timeout: 2 * time.Second,
		Retry: policy.RetryPolicy{MaxAttempts: 3, MaxAge: time.Hour, Backoff: policy.Backoff{Base: 5 * time.Millisecond, Cap: 20 * time.Millisecond}}}
}

func ingestOne(t *testing.T, s *Server, key string) {
	t.Helper()
	postType(t, s, "t", key)
}

func laneOf(s *Server, id string) api.LaneStatus {
	for _, l := range s.Lanes() {
		if l.Subscription == id {
			return l
		}
	}
	return api.LaneStatus{}
}

// TestRedoRecordsWithoutResending: when the outcome of an exchange cannot
// be written, the lane writes it again later; it does not send the request
// again (which skipped the breaker, the rate limit and the budget, and
// showed the endpoint the event twice).
func TestRedoRecordsWithoutResending(t *testing.T) {
	url, hits := endpoint(t, http.StatusBadRequest)
	var fails atomic.Int64
	fails.Store(2)
	var calls atomic.Int64
	f := &faultStore{record: func(o queue.Outcome) error {
		calls.Add(1)
		if o.Kind == queue.DeadLettered && fails.Add(-1) >= 0 {
			return errors.New("injected: store refuses the write")
		}
		return nil
	}}
	s := startWrapped(t, f, testSub("a", url))
	ingestOne(t, s, "e-1")
	testwait.Await(t, "the dead letter written", func() bool { return laneOf(s, "a").DeadLettered == 1 })
	if n := hits.Load(); n != 1 {
		t.Fatalf("endpoint got %d requests; want 1 (a redo records, it does not resend)", n)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("Record called %d times; want 3 (two refused, one written)", n)
	}
	dl, err := s.q.DeadLetter("a", 1)
	if err != nil || dl.Reason != policy.ReasonRejected || dl.Attempts != 1 || dl.LastStatus != 400 {
		t.Fatalf("dead letter %+v, %v", dl, err)
	}
	if st := laneOf(s, "a"); st.Attempts != 1 || st.Cursor != 1 {
		t.Fatalf("lane after the redo: %+v; want one attempt and the cursor past the event", st)
	}
}

// TestGonePauseAgainstConcurrentResume: a 410 pauses the subscription and
// an operator resumes it at the same moment. Memory and the log must agree
// afterwards. The pause was written before the lane's lock was taken and
// set in memory later, so a resume in between left memory paused and the
// log resumed.
func TestGonePauseAgainstConcurrentResume(t *testing.T) {
	url, _ := endpoint(t, http.StatusGone)
	inRecord, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	// Hold the lane right after the pause is written, where the old code
	// let go of everything before setting the pause in memory.
	f := &faultStore{recorded: func(o queue.Outcome) {
		if o.Pause != "" {
			once.Do(func() { close(inRecord); <-release })
		}
	}}
	s := startWrapped(t, f, testSub("a", url))
	ingestOne(t, s, "e-1")
	<-inRecord
	resumed := make(chan error, 1)
	go func() { resumed <- s.Resume("a") }()
	// Give the resume a moment to overtake the pause if it can; with the
	// fix it waits for the lane's lock, so this bound only sets how long
	// the test looks for the race.
	select {
	case <-resumed:
		resumed <- nil
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-resumed; err != nil {
		t.Fatal(err)
	}
	testwait.Await(t, "the 410 settled", func() bool { st := laneOf(s, "a"); return st.InFlight == 0 && st.DeadLettered == 1 })
	ms, err := s.q.Memberships()
	if err != nil || len(ms) != 1 {
		t.Fatalf("memberships %v, %v", ms, err)
	}
	if mem, disk := laneOf(s, "a").PausedBy, ms[0].Paused; mem != disk {
		t.Fatalf("pause in memory %q, in the log %q; want them equal", mem, disk)
	}
}

// TestLedgerReportsReadErrors: a dead letter that cannot be read is an
// error of GET /v1/events/{id}, not the state "delivered".
func TestLedgerReportsReadErrors(t *testing.T) {
	url, _ := endpoint(t, http.StatusOK)
	var broken atomic.Bool
	f := &faultStore{deadLetter: func(sub string, seq uint64) (*queue.DeadLetter, error) {
		if broken.Load() {
			return nil, errors.New("injected: read failed")
		}
		return nil, queue.ErrNotFound
	}}
	s := startWrapped(t, f, testSub("a", url))
	ingestOne(t, s, "e-1")
	testwait.Await(t, "delivered", func() bool { return laneOf(s, "a").Delivered == 1 && laneOf(s, "a").Cursor == 1 })
	st, err := s.Event("e-1")
	if err != nil || st.Deliveries[0].State != "delivered" {
		t.Fatalf("ledger %+v, %v", st, err)
	}
	broken.Store(true)
	if st, err := s.Event("e-1"); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("ledger with a failing read: %+v, %v; want the error", st, err)
	}
}

// compactStore holds every Compact until released, as a compaction that
// waits on a shared log's servers does.
type compactStore struct {
	queue.Store
	release chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (c *compactStore) Compact(below uint64) (int, error) {
	c.once.Do(func() { close(c.entered) })
	<-c.release
	return c.Store.Compact(below)
}

// TestCursorsWrittenWhileCompactionWaits: a compaction that does not
// return holds back no cursor write. Maintenance ran in the cursor
// flusher's loop, so in the fleet demo a compaction waiting on NATS
// stopped the owner's cursor for seconds, and its successor after a kill
// resent ~300 events.
func TestCursorsWrittenWhileCompactionWaits(t *testing.T) {
	url, _ := endpoint(t, http.StatusOK)
	c := &compactStore{release: make(chan struct{}), entered: make(chan struct{})}
	s := startWith(t, func(st queue.Store) queue.Store { c.Store = st; return c }, testSub("a", url))
	t.Cleanup(func() { close(c.release) }) // before the server closes (cleanups run last first)
	<-c.entered                            // maintenance is now stuck in Compact
	for i := range 20 {
		ingestOne(t, s, "e-"+string(rune('a'+i)))
	}
	testwait.Await(t, "the durable cursor at 20 while Compact waits", func() bool {
		ms, err := c.Store.Memberships()
		return err == nil && len(ms) == 1 && ms[0].Cursor >= 20
	})
}
