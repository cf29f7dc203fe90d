// Package freshconn tracks the connections of a listener that have not
// sent a request yet, so a graceful shutdown can close them rather than
// wait for them: the ingest server's and the admin API's.
package freshconn

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Set holds the connections of a listener that have not sent a request yet.
//
// fasthttp's shutdown closes idle keep-alive connections at once, but a
// connection that never sent anything counts as idle only five seconds
// after it opened (as in net/http). HTTP clients dial spare connections
// they may never use (Go's Transport does when a request finds no idle
// connection at that instant), and one such connection held a drain for
// the whole 2 s bound of the ingest shutdown, which then failed: sluice
// exited 1 after a clean drain. Close shuts them instead. Nothing is lost:
// while draining every request is answered 503, so a connection whose
// first request was on its way gets a reset rather than a 503, and the
// producer retries either way.
type Set struct {
	mu sync.RWMutex
	m  map[net.Conn]struct{}
	// n is len(m), kept so that used can see without a lock that no
	// connection is fresh: the common case under load, where a producer's
	// pool was dialled long ago and every request would otherwise take
	// the shared lock, one cache line for every core.
	n atomic.Int64
}

// Track is the ingest server's ConnState hook. fasthttp calls it with
// StateActive on every request, not once per connection: a connection
// that is no longer fresh costs an atomic load while no connection is
// fresh, and a shared read lock otherwise, never the write lock.
func (f *Set) Track(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		f.opened(c)
	case fasthttp.StateIdle:
		// Only a connection that was active goes idle: not in m.
	default:
		f.used(c)
	}
}

// TrackHTTP is the same hook for the admin API's net/http server, whose
// Shutdown also waits (5 s) for connections that never sent a request.
func (f *Set) TrackHTTP(c net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		f.opened(c)
	case http.StateIdle:
	default:
		f.used(c)
	}
}

func (f *Set) opened(c net.Conn) {
	f.mu.Lock()
	if f.m == nil {
		f.m = make(map[net.Conn]struct{})
	}
	f.m[c] = struct{}{}
	f.n.Store(int64(len(f.m)))
	f.mu.Unlock()
}

// used forgets c. fasthttp reports a connection's StateNew (opened) before
// serving it, so while c is fresh n is at least 1 here.
func (f *Set) used(c net.Conn) {
	if f.n.Load() == 0 {
		return
	}
	f.mu.RLock()
	_, fresh := f.m[c]
	f.mu.RUnlock()
	if fresh {
		f.mu.Lock()
		delete(f.m, c)
		f.n.Store(int64(len(f.m)))
		f.mu.Unlock()
	}
}

// closeAll closes every connection that has not sent a request.
func (f *Set) closeAll() {
	f.mu.Lock()
	for c := range f.m {
		c.Close()
		delete(f.m, c)
	}
	f.n.Store(0)
	f.mu.Unlock()
}

// Shutdown runs a server's graceful shutdown (it closes the
// listeners, finishes requests in progress and closes idle connections);
// meanwhile the connections that never sent a request are closed here,
// including any accepted just before the listeners closed. A client's
// spare connection must not hold up a drain.
func Shutdown(ctx context.Context, shutdown func(context.Context) error, fresh *Set) error {
	done := make(chan error, 1)
	go func() { done <- shutdown(ctx) }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		fresh.closeAll()
		select {
		case err := <-done:
			return err
		case <-tick.C:
		}
	}
}
