package jetstream

// STUB: replaced by the fleet side (lease.go, own.go).

import "github.com/sluicehq/sluice/queue"

// fleetSide is this node's place in the fleet: its heartbeat, the live set,
// the leases it holds and the handler it tells.
type fleetSide struct{}

func (s *Store) closeFleet() {}

// setUpFleet makes the <S>_NODES and <S>_LANES buckets.
func (s *Store) setUpFleet() error { panic("todo") }

// fence returns how to fence a write about sub: the lease subject and the
// revision this node holds (fenced true), or fenced false before Own (a
// store with one writer). It fails with queue.ErrFenced when this node
// does not hold sub's lease. done must be called once the write has its
// answer: a renewal (which changes the revision) waits for it.
func (s *Store) fence(sub string) (subject string, rev uint64, fenced bool, done func(), err error) {
	return "", 0, false, func() {}, nil
}

// notifyChanged tells sub's owner, wherever it runs, that its state was
// changed by another node (Replay, SetPaused).
func (s *Store) notifyChanged(sub string) {}

func (s *Store) Own(h queue.OwnerHandler) error                        { panic("todo") }
func (s *Store) Owner(sub string) string                               { return "" }
func (s *Store) Owns(sub string) bool                                  { return false }
func (s *Store) PublishLanes(snaps map[string][]byte) error            { return nil }
func (s *Store) LaneSnapshots() (map[string]queue.LaneSnapshot, error) { return nil, nil }
