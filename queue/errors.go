package queue

import "errors"

var (
	// ErrClosed is returned by operations on a closed (or closing) queue.
	ErrClosed = errors.New("queue closed")
	// ErrCorrupt marks a record that cannot be decoded.
	ErrCorrupt = errors.New("corrupt record")
	// ErrNotFound is returned when an event, membership or dead letter does not exist.
	ErrNotFound = errors.New("not found")
	// ErrNewerFormat is returned by Open for a data dir written by a newer sluice.
	ErrNewerFormat = errors.New("data dir written by a newer format version")
)
