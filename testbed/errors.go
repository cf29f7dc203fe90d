package testbed

import "errors"

var (
	// ErrUnknownMode means a mode name is not one of ok, fail, slow,
	// blackhole, ratelimit or flaky.
	ErrUnknownMode = errors.New("testbed: unknown mode")

	// ErrServerClosed is returned by Open on a Server that was closed or is
	// already open.
	ErrServerClosed = errors.New("testbed: server closed")
)
