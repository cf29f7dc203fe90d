package queue

import (
	"errors"
	"fmt"
)

var (
	// ErrClosed is returned by operations on a closed (or closing) queue.
	ErrClosed = errors.New("queue closed")
	// ErrCorrupt marks a record that cannot be decoded and, from Open, a
	// data dir that looks damaged.
	ErrCorrupt = errors.New("corrupt record")
	// ErrNotFound is returned when an event, membership or dead letter does not exist.
	ErrNotFound = errors.New("not found")
	// ErrNewerFormat is returned by Open for a data dir written by a newer sluice.
	ErrNewerFormat = errors.New("data dir written by a newer format version")
	// ErrLocked is returned by Open when another process holds the data
	// dir's lock: most likely another sluice serving it.
	ErrLocked = errors.New("data dir in use by another process")
	// ErrNotDataDir is returned by Open for a path that is not a directory,
	// or a directory that holds someone else's files.
	ErrNotDataDir = errors.New("not a sluice data dir")
)

var (
	// ErrReplayed is returned by Replay for a dead letter already replayed
	// (without force): replaying twice must not deliver twice by accident.
	ErrReplayed = errors.New("dead letter already replayed")
	// ErrRetryScheduled is returned by Replay while the dead letter's event
	// already has a retry scheduled for that subscription.
	ErrRetryScheduled = errors.New("a retry is already scheduled")
)

// ErrDiskFull is returned by Append while the log is over its disk quota
// or the file system under it is below its free-space floor (Badger:
// Options.MaxDiskBytes, Options.MinFreeBytes). Nothing of the refused event is written; the
// producer keeps it and tries again later. Appends resume by themselves
// once usage is back under the limits.
var ErrDiskFull = errors.New("disk full")

// ErrExists is returned by JoinAll for a request with Create set whose
// subscription has a membership already: another node (fleet mode) made
// it first.
var ErrExists = errors.New("membership exists")

// ErrFenced is returned by a write about a subscription whose lane this
// node no longer owns (fleet mode): another node took its lease, or this
// one could not renew it. Nothing was written; the lane's new owner
// delivers whatever is unresolved (at-least-once), so the caller drops the
// outcome instead of trying again.
var ErrFenced = errors.New("lane owned by another node")

// ErrUnavailable is returned by Append while a shared log cannot take an
// event: its servers are unreachable or have no quorum. Nothing was
// accepted; the producer retries (ingest answers 503 with Retry-After).
var ErrUnavailable = errors.New("log unavailable")

// ErrBadKey is returned by the Records methods for a key that cannot name
// a record (CheckRecordKey); the error names the key.
var ErrBadKey = errors.New("bad record key")

// CorruptEventError is returned by a read of the log that met an event it
// cannot read (a value the disk damaged): the event is not lost, it is
// unreadable, and the caller decides what becomes of it (proxy
// dead-letters it, reason corrupt) rather than stalling on it. First and
// Last bound the sequence numbers of the unreadable record (one event, or
// a group whose header is damaged). errors.Is matches ErrCorrupt.
type CorruptEventError struct {
	First, Last uint64
	Err         error
}

func (e *CorruptEventError) Error() string {
	if e.First == e.Last {
		return fmt.Sprintf("event %d unreadable: %v", e.Last, e.Err)
	}
	return fmt.Sprintf("events %d..%d unreadable: %v", e.First, e.Last, e.Err)
}

func (e *CorruptEventError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }
