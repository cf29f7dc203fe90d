// Package testwait holds what the tests of several packages wait with: a
// poll of a condition that has no notification, whether the binary was
// built with the race detector (which makes every request dearer, so
// tests size their load by it), and the goroutines of libraries that
// outlive a test by design, which a leak check ignores.
package testwait

import (
	"runtime/debug"
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

// LeakOptions ignore the goroutines Badger's caches and fasthttp keep at
// package level: what is left is a leak of sluice's.
var LeakOptions = []goleak.Option{
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
