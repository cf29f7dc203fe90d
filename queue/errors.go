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

// dirError is an Open failure about the data dir as a whole. Its message
// names the dir and tells the operator what to do; errors.Is matches its
// kind (ErrLocked, ErrCorrupt, ErrNotDataDir) and its cause.
type dirError struct {
	dir   string
	kind  error
	cause error
}

func (e *dirError) Error() string {
	switch e.kind {
	case ErrLocked:
		return fmt.Sprintf("data dir %s is in use by another process (is another sluice running?)", e.dir)
	case ErrNotDataDir:
		return fmt.Sprintf("data dir %s is not a sluice data dir: %v; point data_dir at an empty or new directory", e.dir, e.cause)
	default:
		return fmt.Sprintf("data dir %s looks damaged: %v; restore it from a backup, or move it aside "+
			"and start with an empty data dir", e.dir, e.cause)
	}
}

func (e *dirError) Unwrap() []error { return []error{e.kind, e.cause} }

var (
	// ErrReplayed is returned by Replay for a dead letter already replayed
	// (without force): replaying twice must not deliver twice by accident.
	ErrReplayed = errors.New("dead letter already replayed")
	// ErrRetryScheduled is returned by Replay while the dead letter's event
	// already has a retry scheduled for that subscription.
	ErrRetryScheduled = errors.New("a retry is already scheduled")
)
