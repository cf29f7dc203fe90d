package proxy_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// ipv6Loopback is ::1, where the IPv6 tests' endpoints and proxy listen.
var ipv6Loopback = netip.IPv6Loopback()

// needIPv6 skips t on a machine without an IPv6 loopback (a container
// started with IPv6 disabled): there is nothing to dial there.
func needIPv6(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	ln.Close()
}

// startTestbedOn is startTestbed listening on addr.
func startTestbedOn(t *testing.T, addr string) *testbed.Server {
	t.Helper()
	tb := testbed.New(testbed.Options{Mode: testbed.ModeOK, Secrets: []signing.Secret{testSecret}})
	if err := tb.Open(addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })
	return tb
}

// settled waits until every one of n events of lane id is delivered or
// dead-lettered and fails t, naming the dead letters' last_error, unless
// all were delivered. It does not wait out the retries of a dialer that
// cannot reach the endpoint at all: those end as dead letters quickly
// with fastRetry.
func settled(t *testing.T, s *proxy.Server, id string, n uint64) {
	t.Helper()
	eventually(t, "every event of "+id+" delivered or dead-lettered", func() bool {
		l := lane(s, id)
		return l.Delivered+l.DeadLettered == n
	})
	if l := lane(s, id); l.Delivered != n {
		dls, _ := s.DeadLetters(id, 10)
		var why []string
		for _, d := range dls {
			why = append(why, d.LastError)
		}
		t.Fatalf("%s: %d of %d delivered; dead letters' last_error: %q", id, l.Delivered, n, why)
	}
}

// TestDeliversToIPv6Endpoint: a subscription to an IPv6 literal
// (http://[::1]:port/) is delivered to. The dialer was IPv4-only and
// dropped every IPv6 address, so each attempt failed with last_error
// "transport" and every event was dead-lettered.
func TestDeliversToIPv6Endpoint(t *testing.T) {
	needIPv6(t)
	tb := startTestbedOn(t, "[::1]:0")
	sb := sub("v6", tb.URL()+"/v6")
	sb.Retry = fastRetry(2)
	s := startServer(t, "", sb)
	t.Cleanup(func() { closeServer(t, s, 0) })

	publish(t, s, "t", "e", 3)
	settled(t, s, "v6", 3)
	waitFor(t, tb, "3 deliveries over IPv6", func(m map[string]testbed.PathStats) bool { return m["/v6"].Unique == 3 })
}

// TestSSRFGuardRefusesIPv6LoopbackAtConnect: dialling IPv6 does not open
// a way around the guard. With it on, [::1] and the IPv4-mapped
// [::ffff:127.0.0.1] are refused at connect (forbidden_target) and the
// receiver listening there sees nothing.
func TestSSRFGuardRefusesIPv6LoopbackAtConnect(t *testing.T) {
	needIPv6(t)
	v6 := startTestbedOn(t, "[::1]:0")
	v4 := startTestbed(t, testbed.ModeOK)
	_, v4port, _ := net.SplitHostPort(v4.Addr())
	subs := []*delivery.Subscription{sub("v6", v6.URL()+"/v6"), sub("mapped", "http://[::ffff:127.0.0.1]:"+v4port+"/mapped")}
	for _, sb := range subs {
		sb.Retry = fastRetry(2)
	}
	s := proxy.New(proxy.Options{Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(),
		Subscriptions: subs, Logger: quietLogger()})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	publish(t, s, "t", "e", 2)
	eventually(t, "both lanes dead-letter every event", func() bool {
		return lane(s, "v6").DeadLettered == 2 && lane(s, "mapped").DeadLettered == 2
	})
	dls, err := s.DeadLetters("", 100)
	if err != nil || len(dls) != 4 {
		t.Fatalf("dead letters: %d %v", len(dls), err)
	}
	for _, d := range dls {
		if d.LastError != "forbidden_target" {
			t.Errorf("dead letter %s/%d: last_error %q, want forbidden_target", d.Subscription, d.Seq, d.LastError)
		}
	}
	closeServer(t, s, 0)
	for _, tb := range []*testbed.Server{v6, v4} {
		for path, st := range tb.Stats() {
			if st.Requests != 0 {
				t.Fatalf("the guard let %d requests reach %s", st.Requests, path)
			}
		}
	}
}

// TestEgressProxyOnIPv6: an egress proxy listening on [::1] carries the
// deliveries. The proxy's dialer was IPv4-only as well, so every delivery
// through it failed with last_error "proxy".
func TestEgressProxyOnIPv6(t *testing.T) {
	needIPv6(t)
	rec := &endpointLog{}
	ep := startEndpoint(t, guardedAddr, nil, rec)
	px := startTestProxyOn(t, ipv6Loopback, "", "")
	sb := sub("via-v6", ep.URL+"/hook")
	sb.Retry = fastRetry(2)
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb}, Egress: &egress.Egress{Proxy: px.URL()}}, true)

	publish(t, s, "t", "e", 3)
	settled(t, s, "via-v6", 3)
	if _, forwards, _ := px.counts(); forwards != 3 {
		t.Fatalf("proxy carried %d requests, want 3", forwards)
	}
}
