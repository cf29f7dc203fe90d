package jetstream

// STUB: replaced by the state side (state.go, retry.go, deadletter.go).

import (
	"time"

	"github.com/sluicehq/sluice/queue"
)

// stateSide is the delivery state's memory: the retry index of the lanes
// this node serves.
type stateSide struct{}

func (s *Store) setUpBuckets() error { panic("todo") }
func (s *Store) openState() error    { panic("todo") }
func (s *Store) closeState()         {}

// retentionFloor is the lowest seq any membership or retry still needs:
// Compact purges below it and no further.
func (s *Store) retentionFloor() (uint64, error) { panic("todo") }

// dropIndex forgets sub's in-memory retry index (its lease moved, or
// another node changed its schedule); the next read loads it again.
func (s *Store) dropIndex(sub string) {}

func (s *Store) Memberships() ([]queue.Membership, error)                     { panic("todo") }
func (s *Store) JoinAll(reqs []queue.JoinRequest) ([]queue.Membership, error) { panic("todo") }
func (s *Store) Leave(sub string) (queue.Membership, error)                   { panic("todo") }
func (s *Store) SetPaused(sub, reason string) error                           { panic("todo") }
func (s *Store) Retire(sub string) error                                      { panic("todo") }
func (s *Store) SaveCursors(cursors map[string]uint64) error                  { panic("todo") }
func (s *Store) Record(o queue.Outcome) error                                 { panic("todo") }
func (s *Store) DueRetries(sub string, now time.Time, limit int, skip func(uint64) bool) ([]queue.Retry, time.Time, error) {
	panic("todo")
}
func (s *Store) Retries(sub string, limit int) ([]queue.Retry, error) { panic("todo") }
func (s *Store) RetryOf(sub string, seq uint64) (*queue.Retry, error) { panic("todo") }
func (s *Store) RetrySummaries(c map[string]uint64) (map[string]*queue.RetrySummary, error) {
	panic("todo")
}
func (s *Store) DeadLetter(sub string, seq uint64) (*queue.DeadLetter, error) { panic("todo") }
func (s *Store) DeadLetters(sub, afterSub string, afterSeq uint64, limit int) ([]*queue.DeadLetter, error) {
	panic("todo")
}
func (s *Store) Replay(sub string, seq uint64, due time.Time, force bool) (*queue.DeadLetter, error) {
	panic("todo")
}
func (s *Store) Lane(sub string) (queue.Membership, *queue.RetrySummary, error) { panic("todo") }
