// Package queuetest holds helpers for tests that need a real queue in a
// temporary directory.
package queuetest

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
)

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
