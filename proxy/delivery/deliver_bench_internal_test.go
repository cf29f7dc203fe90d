package delivery

import (
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/signing"
)

// countingConn counts the Write calls made on a real connection: each is
// one write syscall (or more, for a partial write) on the socket.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// countWrites makes every connection client dials count its writes in n.
// The dial function stays the client's own (the guard, the handshake
// bound); only the connection it returns is wrapped.
func countWrites(c *fasthttp.Client, n *atomic.Int64) {
	dial := c.DialTimeout
	c.DialTimeout = func(addr string, timeout time.Duration) (net.Conn, error) {
		conn, err := dial(addr, timeout)
		if err != nil {
			return nil, err
		}
		return countingConn{conn, n}, nil
	}
}

// deliverReceiver is a real loopback endpoint answering 200 to every
// request with an empty body, the cheapest receiver there is.
func deliverReceiver(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(*fasthttp.RequestCtx) {}, NoDefaultServerHeader: true, NoDefaultDate: true}
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

func deliverFixture(tb testing.TB, url string, size int) (*engine, *Subscription, *queue.Event) {
	tb.Helper()
	secret, err := signing.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		tb.Fatal(err)
	}
	sub := &Subscription{ID: "bench", URL: url + "/hook", Secrets: []signing.Secret{secret}, Timeout: 5 * time.Second,
		Headers: map[string]string{"X-Tenant": "acme"}}
	// A JSON string of size bytes: a structured CloudEvent carries it as
	// JSON, as it would a JSON object.
	body := []byte(`"` + strings.Repeat("x", max(size-2, 0)) + `"`)[:size]
	ev := &queue.Event{ID: "01JC8Z4Q9Y3W2V1T0S9R8Q7P6N", Type: "bench.event", ContentType: "application/json",
		AcceptedAt: time.Now(), Body: body}
	e := &engine{client: egress.NewClient(egress.DefaultMaxConnsPerHost, true), now: time.Now}
	return e, sub, ev
}

// BenchmarkDeliverClient is the outbound half of a delivery alone: signed
// requests made by engine.deliver (headers, signature, the shared client)
// from conc workers to a real loopback receiver, against the bare
// client→server loop of the same run (baseline: a fasthttp.Client posting
// the same body with no signing and no headers of ours). Workers above
// DefaultMaxConnsPerHost wait on the per-host cap, as the lanes of a
// fan-out to one host do. The CPU is the process's, the receiver's
// included: compare the two in one run. writes/delivery counts the write
// calls on the client's connections.
//
// The format dimension (format=...) sends the same deliveries as
// "deliver" in a subscription's CloudEvents formats: the event is
// rendered once before the run, as the lane renders it once for every
// subscription, so what differs is the delivery's own work (the ce-
// headers copied in, the structured body's larger bytes signed and
// sent). What the rendering costs per event is BenchmarkRender in
// package cloudevents, and both together at fan-out 1 and 10
// BenchmarkDeliveryFormats in package proxy.
func BenchmarkDeliverClient(b *testing.B) {
	for _, size := range []int{512, 16 << 10, 64 << 10} {
		for _, conc := range []int{32, 256} {
			for _, mode := range []string{"baseline", "deliver", "format=" + FormatCloudEventsBinary, "format=" + FormatCloudEventsStructured} {
				b.Run(fmt.Sprintf("body=%d/conc=%d/%s", size, conc, mode), func(b *testing.B) {
					format, _ := strings.CutPrefix(mode, "format=")
					benchDeliverClient(b, size, conc, mode != "baseline", format)
				})
			}
		}
	}
}

func benchDeliverClient(b *testing.B, size, conc int, signed bool, format string) {
	e, sub, ev := deliverFixture(b, deliverReceiver(b), size)
	if format != "deliver" {
		sub.Format, e.ceSource = format, cloudevents.DefaultSource
		if _, err := e.render(sub, ev); err != nil { // as the lane does, once per event
			b.Fatal(err)
		}
	}
	var writes atomic.Int64
	countWrites(e.client, &writes)
	var next atomic.Int64
	one := func(w *workerState, req *fasthttp.Request, resp *fasthttp.Response) bool {
		if signed {
			res := e.deliver(&job{sub: sub, ev: ev, attempt: 1}, w)
			if res.Status != 200 {
				b.Errorf("deliver: %+v", res)
				return false
			}
			return true
		}
		if err := e.client.DoTimeout(req, resp, sub.Timeout); err != nil || resp.StatusCode() != 200 {
			b.Errorf("post: %v %d", err, resp.StatusCode())
			return false
		}
		return true
	}
	run := func(n int64) {
		next.Store(0)
		var wg sync.WaitGroup
		for range conc {
			wg.Go(func() {
				var w workerState
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				req.SetRequestURI(sub.URL)
				req.Header.SetMethod(fasthttp.MethodPost)
				req.Header.SetContentType(ev.ContentType)
				req.SetBodyRaw(ev.Body)
				for next.Add(1) <= n && one(&w, req, resp) {
				}
			})
		}
		wg.Wait()
	}
	run(int64(conc) * 4) // connections dialled, pools warm
	writes.Store(0)
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	cpu0 := rusageCPU()
	b.ResetTimer()
	run(int64(b.N))
	b.StopTimer()
	cpu := rusageCPU() - cpu0
	runtime.ReadMemStats(&ms1)
	n := float64(b.N)
	b.ReportMetric(float64(cpu)/float64(time.Microsecond)/n, "cpu-µs/delivery")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/n, "allocs/delivery")
	b.ReportMetric(float64(writes.Load())/n, "writes/delivery")
}

func rusageCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
