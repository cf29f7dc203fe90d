package jetstream

// STUB: replaced by the log side (stream.go, append.go, read.go, compact.go).

import (
	"time"

	"github.com/sluicehq/sluice/queue"
)

// logSide is the state of the event log: the publish window, the stream
// follower feeding OnCommit, the head.
type logSide struct{}

func (s *Store) setUpStream() error { panic("todo") }
func (s *Store) openLog() error     { panic("todo") }
func (s *Store) closeLog()          {}

func (s *Store) Append(ev *queue.Event) (uint64, bool, error) { panic("todo") }
func (s *Store) Head() uint64                                 { panic("todo") }
func (s *Store) Lookup(id string) (uint64, string, error)     { panic("todo") }
func (s *Store) Event(seq uint64) (*queue.Event, error)       { panic("todo") }
func (s *Store) Compact(below uint64) (int, error)            { panic("todo") }
func (s *Store) DiskUsage() queue.DiskUsage                   { panic("todo") }
func (s *Store) CountEvents(from, to uint64, match func([]byte) bool, limit int) (int, error) {
	panic("todo")
}
func (s *Store) Events(from, to uint64, limit int, match func([]byte) bool) ([]*queue.Event, uint64, error) {
	panic("todo")
}

var _ = time.Second
