package delivery

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/queue"
)

// TestDeliverWritesOnce: a delivery of a typical body (900 B)
// or of a 16 KiB one writes its request line, headers and body in one
// write on the connection, and deliveries after the first reuse that
// connection.
func TestDeliverWritesOnce(t *testing.T) {
	for _, size := range []int{900, 16 << 10} {
		t.Run(strconv.Itoa(size), func(t *testing.T) { testDeliverWritesOnce(t, size) })
	}
}

func testDeliverWritesOnce(t *testing.T, size int) {
	e, sub, ev := deliverFixture(t, deliverReceiver(t), size)
	t.Cleanup(e.client.CloseIdleConnections)
	var writes, dials atomic.Int64
	countWrites(e.client, &writes)
	dial := e.client.DialTimeout
	e.client.DialTimeout = func(addr string, timeout time.Duration) (net.Conn, error) {
		dials.Add(1)
		return dial(addr, timeout)
	}
	var w workerState
	const n = 20
	for i := range n {
		if res := e.deliver(&job{sub: sub, ev: ev, attempt: 1}, &w); res.Status != 200 {
			t.Fatalf("delivery %d: %+v", i, res)
		}
	}
	if got := writes.Load(); got != n {
		t.Errorf("%d writes for %d deliveries, want one each", got, n)
	}
	if got := dials.Load(); got != 1 {
		t.Errorf("%d connections dialled for %d sequential deliveries, want 1 (kept alive)", got, n)
	}
}

// blockingReceiver answers each request once release is closed, and
// records the most requests it held at once. arrived gets a value per
// request as it comes in.
type blockingReceiver struct {
	url      string
	release  chan struct{}
	arrived  chan struct{}
	cur, max atomic.Int64
}

func newBlockingReceiver(t *testing.T) *blockingReceiver {
	t.Helper()
	r := &blockingReceiver{release: make(chan struct{}), arrived: make(chan struct{}, 1024)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(*fasthttp.RequestCtx) {
		n := r.cur.Add(1)
		for m := r.max.Load(); n > m && !r.max.CompareAndSwap(m, n); m = r.max.Load() {
		}
		r.arrived <- struct{}{}
		<-r.release
		r.cur.Add(-1)
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	r.url = "http://" + ln.Addr().String()
	return r
}

// TestDeliverHostCapHolds: deliveries to one host beyond the client's
// per-host cap wait for a free slot; the endpoint never sees more than
// the cap at once, and every delivery ends delivered.
func TestDeliverHostCapHolds(t *testing.T) {
	const hostCap, n = 4, 24
	r := newBlockingReceiver(t)
	e, sub, ev := deliverFixture(t, r.url, 512)
	e.client = egress.NewClient(hostCap, true)
	t.Cleanup(e.client.CloseIdleConnections)
	var wg sync.WaitGroup
	results := make([]result, n)
	for i := range n {
		wg.Go(func() {
			var w workerState
			results[i] = e.deliver(&job{sub: sub, ev: ev, attempt: 1}, &w)
		})
	}
	for range hostCap {
		<-r.arrived
	}
	close(r.release) // the cap is full: let everything through
	wg.Wait()
	for i, res := range results {
		if res.Status != 200 || res.Outcome != policy.Ack {
			t.Errorf("delivery %d: %+v", i, res)
		}
	}
	if m := r.max.Load(); m > hostCap {
		t.Errorf("the endpoint held %d requests at once; the per-host cap is %d", m, hostCap)
	}
}

// TestDeliverHostCapWaitTimesOut: a delivery that finds the host's cap
// full for its whole timeout is not sent, and fails as a timeout (a
// retry, which the breaker counts), as fasthttp's own wait reported it.
func TestDeliverHostCapWaitTimesOut(t *testing.T) {
	r := newBlockingReceiver(t)
	e, sub, ev := deliverFixture(t, r.url, 512)
	e.client = egress.NewClient(1, true)
	t.Cleanup(e.client.CloseIdleConnections)
	first := make(chan result, 1)
	go func() {
		var w workerState
		first <- e.deliver(&job{sub: sub, ev: ev, attempt: 1}, &w)
	}()
	<-r.arrived // the one slot is taken
	quick := &Subscription{ID: sub.ID, URL: sub.URL, Secrets: sub.Secrets, Timeout: 50 * time.Millisecond}
	var w workerState
	res := e.deliver(&job{sub: quick, ev: ev, attempt: 1}, &w)
	if res.Failure != policy.FailTimeout || res.Outcome != policy.Retry || res.Status != 0 {
		t.Errorf("delivery past a full cap: %+v, want a timeout to retry", res)
	}
	close(r.release)
	if res := <-first; res.Status != 200 {
		t.Errorf("first delivery: %+v", res)
	}
	if m := r.max.Load(); m != 1 {
		t.Errorf("the endpoint held %d requests at once; the per-host cap is 1", m)
	}
	// The slot came back: the next delivery goes through.
	if res := e.deliver(&job{sub: sub, ev: ev, attempt: 1}, &w); res.Status != 200 {
		t.Errorf("delivery after the wait: %+v", res)
	}
}

// TestDeliverAllocatesNothing: once the connection is up and the pools
// are warm, a signed delivery allocates nothing (the body is the stored
// slice, headers and signature go into the worker's buffers). The count
// is the process's, the loopback receiver's (fasthttp: none) included.
func TestDeliverAllocatesNothing(t *testing.T) {
	if testwait.RaceEnabled() {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	e, sub, ev := deliverFixture(t, deliverReceiver(t), 900)
	if n := allocsPerDelivery(t, e, sub, ev); n != 0 {
		t.Errorf("%.0f allocations per delivery, want 0", n)
	}
}

// allocsPerDelivery delivers ev to sub ten times to warm the connection
// and the pools, then counts the allocations of one delivery.
func allocsPerDelivery(t *testing.T, e *engine, sub *Subscription, ev *queue.Event) float64 {
	t.Helper()
	t.Cleanup(e.client.CloseIdleConnections)
	var w workerState
	deliverOnce := func() {
		if res := e.deliver(&job{sub: sub, ev: ev, attempt: 1}, &w); res.Status != 200 {
			t.Fatalf("delivery: %+v", res)
		}
	}
	for range 10 {
		deliverOnce()
	}
	return testing.AllocsPerRun(200, deliverOnce)
}
