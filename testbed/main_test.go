package testbed_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that Close leaves no goroutine of ours behind: handlers,
// hijacked black-hole connections and slow waits must all be gone.
//
// Two fasthttp goroutines are ignored: the worker-pool cleaner notices Stop
// only after its current sleep (Server.MaxIdleWorkerDuration, 10 s by
// default) and then exits on its own; the Date-header updater is started once
// per process and never stops.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	)
}
