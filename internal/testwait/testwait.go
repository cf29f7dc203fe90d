// Package testwait holds what the tests of several packages wait with: a
// poll of a condition that has no notification, whether the binary was
// built with the race detector (which makes every request dearer, so
// tests size their load by it), a TestMain that fails on a leaked
// goroutine, ignoring those of libraries that outlive a test by design,
// and loopback ports to listen on.
package testwait

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Await polls cond (a server's own state, which has no notification)
// until it holds, failing the test after 20 s.
func Await(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// RaceEnabled reports whether the test binary was built with -race.
func RaceEnabled() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
	}
	return false
}

// leakOptions ignore the goroutines Badger's caches and fasthttp keep at
// package level: what is left is a leak of sluice's.
var leakOptions = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/dgraph-io/ristretto/v2.(*defaultPolicy[...]).processItems"),
	goleak.IgnoreAnyFunction("github.com/dgraph-io/ristretto/v2.(*Cache[...]).processItems"),
	// fasthttp's client and server keep package-level cleaners.
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*Client).mCleaner"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.init.func1"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
}

// Main runs m's tests and then, when they passed, fails the binary on a
// goroutine sluice leaked. The tests' own HTTP clients keep idle
// connections, each with a goroutine parked on its socket: they are
// closed first (http.DefaultClient's, and clients' given), so that a
// goroutine leaked on a socket shows (ignoring internal/poll's wait, as
// this once did, let every such leak pass).
func Main(m *testing.M, clients ...*http.Client) {
	code := m.Run()
	http.DefaultClient.CloseIdleConnections()
	for _, c := range clients {
		c.CloseIdleConnections()
	}
	if code == 0 {
		if err := goleak.Find(leakOptions...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// FreePort returns a loopback address nothing listens on right now, never
// one it returned before in this test binary: a port closed before the
// next call can be handed out again, and a sidecar given the same address
// for ingest and admin refuses its config (the fleet demo's nodes once did).
func FreePort(t testing.TB) string {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		handedOut.Lock()
		dup := handedOut.m[addr]
		handedOut.m[addr] = true
		handedOut.Unlock()
		if !dup {
			return addr
		}
	}
}

// handedOut are the addresses FreePort returned.
var handedOut = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}
