package delivery

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// flakyFleet is a fleet whose membership reads fail a given number of
// times (the shared state out of reach for a moment: a leader election,
// a timeout on a busy machine) before they answer.
type flakyFleet struct {
	queue.Store
	mu     sync.Mutex
	fails  int
	reads  int
	member map[string]queue.Membership
}

func (f *flakyFleet) NodeID() string                       { return "node-test" }
func (f *flakyFleet) Own(queue.OwnerHandler) error         { return nil }
func (f *flakyFleet) Owner(string) string                  { return "" }
func (f *flakyFleet) Owns(string) bool                     { return false }
func (f *flakyFleet) LeaseExpiry(string) time.Time         { return time.Time{} }
func (f *flakyFleet) Ready() error                         { return nil }
func (f *flakyFleet) PublishLanes(map[string][]byte) error { return nil }
func (f *flakyFleet) LaneSnapshots() (map[string]queue.LaneSnapshot, error) {
	return nil, nil
}

func (f *flakyFleet) Lane(sub string) (queue.Membership, *queue.RetrySummary, error) {
	m, err := f.Member(sub)
	return m, &queue.RetrySummary{}, err
}

func (f *flakyFleet) Member(sub string) (queue.Membership, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.fails > 0 {
		f.fails--
		return queue.Membership{}, fmt.Errorf("member %s: timed out: %w", sub, queue.ErrUnavailable)
	}
	m, ok := f.member[sub]
	if !ok {
		return queue.Membership{}, fmt.Errorf("member %s: %w", sub, queue.ErrNotFound)
	}
	return m, nil
}

// TestMemberChangeOutlivesAFailedRead: the member watch tells a node of a
// subscription created through another node once. When the read of its
// membership fails then, the node must read it again later, or it never
// serves (nor lists, nor delivers when it gains the lease) a subscription
// nobody changes again. Likewise a retirement whose read failed must still
// remove the foreign lane.
func TestMemberChangeOutlivesAFailedRead(t *testing.T) {
	sub := &Subscription{ID: "acme-2", URL: "http://127.0.0.1:1/acme-2", Types: []string{"t.c"}, Timeout: time.Second,
		Tenant: "acme", ManagedBy: api.ManagedByAPI,
		Retry: policy.RetryPolicy{MaxAttempts: 3, MaxAge: time.Hour, Backoff: policy.Backoff{Base: 5 * time.Millisecond, Cap: 20 * time.Millisecond}}}
	f := &flakyFleet{
		Store:  queuetest.MustOpen(t, "", badger.Options{}),
		fails:  3,
		member: map[string]queue.Membership{sub.ID: {Subscription: sub.ID, From: 1, Snapshot: encodeSnapshot(sub)}},
	}
	d := newDispatcher(f, nil, discardLogger(), time.Now, 4, 0, time.Second, policy.BudgetConfig{})
	if d.fleet == nil {
		t.Fatal("the test's store is not a fleet")
	}
	d.wg.Add(1)
	go d.memberRetryLoop()
	defer func() {
		close(d.quit)
		d.wg.Wait()
	}()

	d.MembersChanged([]string{sub.ID}, false)
	testwait.Await(t, "a lane for "+sub.ID+" after its first reads failed", func() bool { return d.lane(sub.ID) != nil })
	l := d.lane(sub.ID)
	l.mu.Lock()
	tenant, api := l.sub.Tenant, l.sub.ManagedByAPI()
	l.mu.Unlock()
	if tenant != "acme" || !api {
		t.Errorf("lane of %s: tenant %q, managed by the API %v; want acme, true", sub.ID, tenant, api)
	}
	if !l.isForeign() {
		t.Errorf("lane of %s delivers without its lease", sub.ID)
	}

	// Retired by its owner: the foreign lane goes, though the first read
	// of the change fails.
	f.mu.Lock()
	delete(f.member, sub.ID)
	f.fails = 2
	f.mu.Unlock()
	d.MembersChanged([]string{sub.ID}, false)
	testwait.Await(t, "the retired "+sub.ID+" gone after its first reads failed", func() bool { return d.lane(sub.ID) == nil })
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fails != 0 {
		t.Errorf("%d failing reads left: the retries stopped early", f.fails)
	}
}
