// Package queuetest holds the contract suite every queue.Store backend
// runs (Run, Crash) and helpers for tests that need a real log in a
// temporary directory (MustOpen, Event, MustAppend), as net/http/httptest
// does for servers.
//
// A backend's test package runs the suite against real parts, no mocks:
//
//	func TestContract(t *testing.T) { queuetest.Run(t, backend) }
//	func TestCrash(t *testing.T)    { queuetest.Crash(t, backend) }
package queuetest

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
)

// Backend is what the suite needs of one queue.Store implementation.
type Backend struct {
	// NewPlace returns a place no other test uses: where a store lives (a
	// data dir for Badger, a stream name for JetStream). The suite passes
	// it to Open again to reopen the same store.
	NewPlace func(tb testing.TB) string
	// Open opens the store at place, creating it if it is new, and closes
	// it when the test ends (tb.Cleanup). It fails tb if it cannot. The
	// suite closes the store itself before it reopens one place, and may
	// call Close twice.
	Open func(tb testing.TB, place string, opts Options) queue.Store
}

// Options are the few settings the suite varies.
type Options struct {
	// Sync: an acknowledged append survives power loss, not only a crash
	// of the process (durability: fsync).
	Sync bool
	// DedupWindow is how long an event id is remembered; the backend's
	// default (queue.DefaultDedupWindow) if 0.
	DedupWindow time.Duration
	// OnCommit, when set, is called with each group of new events, in seq
	// order, once they are durable; the proxy hands them to caught-up
	// lanes from there. Badger calls it before the appends return; the
	// fleet backend may return an append first when the seq below it is
	// another node's event its follower has not brought yet (OnCommit then
	// gets both, in order).
	OnCommit func([]*queue.Event)
}

// MustOpen opens a Badger log in dir (t.TempDir() when empty) and closes
// it when the test ends.
func MustOpen(tb testing.TB, dir string, opts badger.Options) *badger.Log {
	tb.Helper()
	if dir == "" {
		dir = tb.TempDir()
	}
	opts.Dir = dir
	q, err := badger.Open(opts)
	if err != nil {
		tb.Fatalf("open queue: %v", err)
	}
	tb.Cleanup(func() { q.Close() })
	return q
}

// Event returns an event with the given id, type and body, accepted now.
func Event(id, typ, body string) *queue.Event {
	return &queue.Event{ID: id, Type: typ, ContentType: "application/json", AcceptedAt: time.Now(), Body: []byte(body)}
}

// MustAppend appends and fails the test on error.
func MustAppend(tb testing.TB, q queue.Log, ev *queue.Event) (seq uint64, dup bool) {
	tb.Helper()
	seq, dup, err := q.Append(ev)
	if err != nil {
		tb.Fatalf("append %s: %v", ev.ID, err)
	}
	return seq, dup
}
