package proxy_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/testbed"
)

// Benchmarks of the hot path, in-process over real loopback. The machine
// is shared and noisy: compare figures from the same run (see
// docs/benchmarks.md), never against fixed numbers.

// BenchmarkIngest measures durable appends through the HTTP ingest path
// with 64 concurrent keep-alive producers and no subscriptions. The
// per-event figures are the process's, the producers' included: compare
// them with BenchmarkIngestNoop's of the same run, whose difference is
// the sidecar's cost.
func BenchmarkIngest(b *testing.B) {
	for _, sync := range []bool{true, false} {
		name := map[bool]string{true: "fsync", false: "async"}[sync]
		b.Run(name, func(b *testing.B) {
			s := benchServer(b, sync)
			body := []byte(strings.Repeat("x", 512))
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			perEvent(b, func() { produce(b, s, 64, b.N, body) })
		})
	}
}

// perEvent runs f, which makes b.N events (or exchanges), and reports the
// process's CPU time and allocations per event.
func perEvent(b *testing.B, f func()) {
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	cpu0 := processCPU()
	b.ResetTimer()
	f()
	b.StopTimer()
	cpu := processCPU() - cpu0
	runtime.ReadMemStats(&ms1)
	n := float64(b.N)
	b.ReportMetric(float64(cpu)/float64(time.Microsecond)/n, "cpu-µs/event")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/n, "allocs/event")
}

// BenchmarkIngestNoop is the ceiling for BenchmarkIngest in the same run: a
// fasthttp server that answers 202 without doing anything.
func BenchmarkIngestNoop(b *testing.B) {
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(202)
		ctx.SetBodyString(`{"id":"x","seq":1}`)
	}}
	ln, err := listenLoopback()
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Shutdown()
	body := []byte(strings.Repeat("x", 512))
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	perEvent(b, func() { produceTo(b, "http://"+ln.Addr().String(), 64, b.N, body) })
}

// BenchmarkDelivery measures events delivered end to end (ingest, log,
// lanes, signed HTTP delivery, receiver) per fan-out and body size. The
// metric B/delivery shows that bytes allocated per delivery do not grow
// with the body: every lane sends the one stored slice.
func BenchmarkDelivery(b *testing.B) {
	for _, fan := range []int{1, 10} {
		for _, size := range []int{512, 64 << 10} {
			b.Run(fmt.Sprintf("fanout=%d/body=%d", fan, size), func(b *testing.B) {
				benchDelivery(b, fan, []byte(strings.Repeat("x", size)), nil)
			})
		}
	}
}

// BenchmarkDeliveryFiltered is fan-out 10 of a 512-byte JSON body with and
// without a body filter on one of the ten subscriptions (one that passes
// every event, so both deliver the same): what a filter costs the lanes
// that have none, since bodies are then decoded at commit.
func BenchmarkDeliveryFiltered(b *testing.B) {
	body := []byte(`{"type":"geofence.enter","data":{"depot":"A","speed":42,"kind":"alarm.high","pad":"` + strings.Repeat("x", 420) + `"}}`)
	for _, filtered := range []bool{false, true} {
		b.Run(fmt.Sprintf("filtered=%v", filtered), func(b *testing.B) {
			benchDelivery(b, 10, body, func(subs []*delivery.Subscription) {
				if !filtered {
					return
				}
				f, err := policy.ParseFilter(map[string]any{"data.depot": map[string]any{"$in": []any{"A", "B"}}})
				if err != nil {
					b.Fatal(err)
				}
				subs[0].Filter = f
			})
		})
	}
}

// BenchmarkDeliveryTenant is fan-out 10 of a 512-byte body to the
// operator's subscriptions (platform events, no tenant check on any
// path) against ten subscriptions of one tenant receiving that tenant's
// events: what the tenant rule (a tenant's subscription
// receives only its tenant's events) costs a delivery, the
// Sluice-Tenant header on ingest and the entitlement every lane checks
// included.
func BenchmarkDeliveryTenant(b *testing.B) {
	body := []byte(strings.Repeat("x", 512))
	for _, tenant := range []bool{false, true} {
		b.Run(fmt.Sprintf("tenant=%v", tenant), func(b *testing.B) {
			var hdr map[string]string
			if tenant {
				hdr = map[string]string{ingest.HeaderTenant: "acme"}
			}
			benchDeliveryHeaders(b, 10, body, 0, 0, hdr, func(subs []*delivery.Subscription) {
				for _, s := range subs {
					if tenant {
						s.Tenant = "acme"
					}
				}
			})
		})
	}
}

// BenchmarkDeliveryOrdered is fan-out 1 of a 512-byte body, every event
// with an Ordering-Key drawn round-robin from keys distinct keys, to one
// subscription with a cap of 32, with ordering: key against the same run
// with ordering: none, at a receiver that answers at once and
// at one that takes 1 ms. One key is one delivery at a time; with 100 or
// 10,000 keys up to the cap run at once and the cost is the gate's
// bookkeeping and the events parked behind a busy key. Give the 1 ms runs
// a smaller -benchtime: one key delivers under 1,000 a second there.
func BenchmarkDeliveryOrdered(b *testing.B) {
	body := []byte(strings.Repeat("x", 512))
	for _, latency := range []time.Duration{0, time.Millisecond} {
		for _, keys := range []int{1, 100, 10_000} {
			for _, mode := range []string{delivery.OrderingNone, delivery.OrderingKey} {
				b.Run(fmt.Sprintf("latency=%v/keys=%d/ordering=%s", latency, keys, mode), func(b *testing.B) {
					benchDeliveryKeyed(b, 1, body, keys, latency, func(subs []*delivery.Subscription) { subs[0].Ordering = mode })
				})
			}
		}
	}
}

func benchDelivery(b *testing.B, fan int, body []byte, adjust func([]*delivery.Subscription)) {
	benchDeliveryKeyed(b, fan, body, 0, 0, adjust)
}

// benchDeliveryKeyed is benchDelivery with an Ordering-Key on every event,
// from keys distinct ones (none if 0), to a receiver that takes latency to
// answer.
func benchDeliveryKeyed(b *testing.B, fan int, body []byte, keys int, latency time.Duration, adjust func([]*delivery.Subscription)) {
	benchDeliveryHeaders(b, fan, body, keys, latency, nil, adjust)
}

// benchDeliveryHeaders is benchDeliveryKeyed with hdr on every ingest
// request.
func benchDeliveryHeaders(b *testing.B, fan int, body []byte, keys int, latency time.Duration, hdr map[string]string, adjust func([]*delivery.Subscription)) {
	// A lean receiver, polled through its cheap totals: the allocations
	// counted are the process's, and the testbed's Stats (a copy of every
	// path's maps per change) would otherwise be most of them.
	opts := testbed.Options{Lean: true}
	if latency > 0 {
		opts.Mode, opts.Delay = testbed.ModeSlow, latency
	}
	tb := testbed.New(opts)
	if err := tb.Open("127.0.0.1:0"); err != nil {
		b.Fatal(err)
	}
	defer tb.Close()
	var subs []*delivery.Subscription
	for i := range fan {
		sb := sub(fmt.Sprintf("s%d", i), fmt.Sprintf("%s/s%d", tb.URL(), i))
		sb.MaxConcurrency = 32
		subs = append(subs, sb)
	}
	if adjust != nil {
		adjust(subs)
	}
	s := benchServer(b, true, subs...)
	want := int64(b.N)
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	cpu0 := processCPU()
	b.ResetTimer()
	start := time.Now()
	produceKeyed(b, s.URL(), 32, b.N, body, keys, hdr)
	deadline := time.Now().Add(5 * time.Minute)
	tick := time.NewTicker(time.Millisecond)
	for tb.Totals().Accepted < want*int64(fan) {
		if time.Now().After(deadline) {
			b.Fatalf("deliveries: %+v of %d", tb.Totals(), want*int64(fan))
		}
		<-tick.C
	}
	tick.Stop()
	el := time.Since(start)
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	deliveries := float64(b.N * fan)
	b.ReportMetric(deliveries/el.Seconds(), "deliveries/s")
	b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/deliveries, "B/delivery")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/deliveries, "allocs/delivery")
	// Throughput is bound by the producer's fsynced appends; the CPU the
	// whole process spent (producer, ingest, lanes, receiver) shows the
	// cost of a delivery.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/deliveries, "cpu-µs/delivery")
}

// processCPU is the user and system CPU time the process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchServer(b *testing.B, sync bool, subs ...*delivery.Subscription) *proxy.Server {
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: b.TempDir(), Sync: sync,
		Subscriptions: subs, Logger: quietLogger()})
	if err := s.Open(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
	})
	return s
}

var benchRun atomic.Int64

func produce(b *testing.B, s *proxy.Server, conc, n int, body []byte) {
	produceTo(b, s.URL(), conc, n, body)
}

// produceTo posts n events from conc keep-alive connections.
func produceTo(b *testing.B, base string, conc, n int, body []byte) {
	produceKeyed(b, base, conc, n, body, 0, nil)
}

// produceKeyed posts n events from conc producers; with keys > 0 each
// carries one of that many Ordering-Keys, and hdr is set on every event.
func produceKeyed(b *testing.B, base string, conc, n int, body []byte, keys int, hdr map[string]string) {
	produceEach(b, conc, n, func(req *fasthttp.Request) {
		req.SetRequestURI(base + "/v1/events/bench.event")
		req.Header.SetContentType("application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		req.SetBodyRaw(body)
	}, func(req *fasthttp.Request, i int64, id []byte) {
		req.Header.SetBytesV("Idempotency-Key", id)
		if keys > 0 {
			var kb [24]byte // on the stack: the producers' cost stays out of the figures
			req.Header.SetBytesV("Ordering-Key", strconv.AppendInt(append(kb[:0], 'k'), i%int64(keys), 10))
		}
	})
}

func listenLoopback() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
