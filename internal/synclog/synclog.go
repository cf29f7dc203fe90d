// Package synclog holds Buffer, a log sink that a server's goroutines
// write while a test reads it: the one the tests of several packages
// share, where each had its own copy.
package synclog

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer safe for concurrent use; String reads what was
// written so far. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
