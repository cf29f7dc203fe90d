package proxy_test

import (
	"context"
	"crypto/tls"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/egress"
)

// BenchmarkEgress is the cost of a proxy hop and of TLS, in one run:
// events delivered end to end to one subscription (cap 32,
// 32 producers, 512-byte bodies) over plain HTTP, over HTTPS with
// keep-alive (one handshake per connection), over HTTPS whose endpoint
// closes every connection (one handshake per delivery), and both schemes
// through the test's forward proxy (absolute form and CONNECT). The
// receiver is a fasthttp server counting requests; conns/delivery counts
// the connections it accepted (for https, the TLS handshakes) per
// delivery. Allocations are the
// process's: they include the in-process proxy's (net/http, per request
// in the absolute form; a tunnel only copies bytes).
func BenchmarkEgress(b *testing.B) {
	ca := newTestCA(b, "bench CA")
	caFile := writeTemp(b, b.TempDir(), "ca.pem", ca.pem)
	cert := ca.serverCert(b, leaf{cn: "bench", ips: []net.IP{net.IPv4(127, 0, 0, 1)}})
	for _, c := range []struct {
		name         string
		tls, proxied bool
		close        bool // the endpoint closes each connection
	}{
		{"http/direct", false, false, false},
		{"http/proxy", false, true, false},
		{"https/direct", true, false, false},
		{"https/direct/no-reuse", true, false, true},
		{"https/proxy", true, true, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			var delivered, accepted atomic.Int64
			srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
				delivered.Add(1)
				if c.close {
					ctx.SetConnectionClose()
				}
			}}
			ln := &countingListener{Listener: listenOn(b, netipLoopback), n: &accepted}
			scheme := "http"
			var serveLn net.Listener = ln
			if c.tls {
				scheme = "https"
				serveLn = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
			}
			go srv.Serve(serveLn)
			defer srv.Shutdown()
			sb := sub("bench", scheme+"://"+ln.Addr().String()+"/hook")
			sb.MaxConcurrency = 32
			if c.tls {
				sb.TLS = &egress.ClientTLS{CAFile: caFile}
			}
			opts := proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: b.TempDir(), Sync: true,
				Subscriptions: []*delivery.Subscription{sb}, Logger: quietLogger()}
			if c.proxied {
				px := startTestProxy(b, "", "")
				opts.Egress = &egress.Egress{Proxy: px.URL()}
			}
			s := proxy.New(opts)
			if err := s.Open(); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				s.Close(ctx)
			})
			body := []byte(strings.Repeat("x", 512))
			var ms0, ms1 runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms0)
			b.ResetTimer()
			start := time.Now()
			produce(b, s, 32, b.N, body)
			deadline := time.Now().Add(5 * time.Minute)
			tick := time.NewTicker(time.Millisecond)
			for delivered.Load() < int64(b.N) {
				if time.Now().After(deadline) {
					b.Fatalf("deliveries: %d of %d", delivered.Load(), b.N)
				}
				<-tick.C
			}
			tick.Stop()
			el := time.Since(start)
			b.StopTimer()
			runtime.ReadMemStats(&ms1)
			n := float64(b.N)
			b.ReportMetric(n/el.Seconds(), "deliveries/s")
			b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/n, "B/delivery")
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/n, "allocs/delivery")
			b.ReportMetric(float64(accepted.Load())/n, "conns/delivery")
		})
	}
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}
