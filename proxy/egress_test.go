package proxy_test

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/egress"
)

// Egress through a forward proxy, against a forward proxy the
// test starts on 127.0.0.1, with the SSRF guard on: the endpoints listen
// on guardedAddr, which the tests let the egress proxy's guard allow, so
// that the proxy's own address and every other loopback target stay
// refused.

// TestEgressHTTPSThroughProxyUsesCONNECT: every delivery to an https
// endpoint went through the proxy in a CONNECT tunnel (TLS end to end,
// verified against the subscription's CA file), with the credentials from
// the file; each tunnel was asked for the address the guard judged; the
// proxy itself is on a loopback address the guard refuses for endpoints.
func TestEgressHTTPSThroughProxyUsesCONNECT(t *testing.T) {
	ca := newTestCA(t, "endpoint CA")
	rec := &endpointLog{}
	ep := startEndpoint(t, guardedAddr, &tls.Config{Certificates: []tls.Certificate{
		ca.serverCert(t, leaf{cn: "endpoint", ips: []net.IP{guardedAddr.AsSlice()}}),
	}}, rec)
	px := startTestProxy(t, "sluice", "s3cret")
	dir := t.TempDir()
	sb := sub("https", ep.URL+"/hook")
	sb.TLS = &egress.ClientTLS{CAFile: writeTemp(t, dir, "ca.pem", ca.pem)}
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb},
		Egress: &egress.Egress{Proxy: px.URL(), CredentialsFile: writeTemp(t, dir, "proxy-credentials", []byte("sluice:s3cret\n"))}}, true)

	publish(t, s, "t", "e", 20)
	eventually(t, "20 deliveries", func() bool { return lane(s, "https").Delivered == 20 })
	reqs := rec.all()
	if len(reqs) != 20 {
		t.Fatalf("endpoint got %d requests, want 20", len(reqs))
	}
	for _, r := range reqs {
		if !px.via(r.remote) {
			t.Fatalf("a request reached the endpoint from %s, not through the proxy", r.remote)
		}
	}
	connects, forwards, denied := px.counts()
	if connects == 0 || connects > 20 || forwards != 0 || denied != 0 {
		t.Fatalf("proxy carried %d tunnels and %d plain requests, refused %d; want tunnels only, all authenticated", connects, forwards, denied)
	}
	targets, _ := px.targets()
	for _, tg := range targets {
		if tg != ep.Listener.Addr().String() {
			t.Fatalf("CONNECT %s, want the address judged, %s", tg, ep.Listener.Addr())
		}
	}
}

// TestEgressHTTPThroughProxyUsesAbsoluteForm: an http endpoint's
// deliveries are sent to the proxy in the absolute form, with the
// endpoint's Host, and reach the endpoint only through it.
func TestEgressHTTPThroughProxyUsesAbsoluteForm(t *testing.T) {
	rec := &endpointLog{}
	ep := startEndpoint(t, guardedAddr, nil, rec)
	px := startTestProxy(t, "sluice", "s3cret")
	sb := sub("plain", ep.URL+"/hook?tenant=a")
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb},
		Egress: &egress.Egress{Proxy: px.URL(), CredentialsFile: writeTemp(t, t.TempDir(), "creds", []byte("sluice:s3cret"))}}, true)

	publish(t, s, "t", "e", 10)
	eventually(t, "10 deliveries", func() bool { return lane(s, "plain").Delivered == 10 })
	_, forwards := px.targets()
	if len(forwards) != 10 {
		t.Fatalf("proxy carried %d absolute-form requests, want 10: %q", len(forwards), forwards)
	}
	for _, f := range forwards {
		if f != ep.URL+"/hook?tenant=a" {
			t.Fatalf("request target %q, want the absolute form %q", f, ep.URL+"/hook?tenant=a")
		}
	}
	host := strings.TrimPrefix(ep.URL, "http://")
	for _, r := range rec.all() {
		if !px.via(r.remote) || r.host != host {
			t.Fatalf("request from %s with Host %q: want through the proxy with Host %q", r.remote, r.host, host)
		}
	}
	if connects, _, denied := px.counts(); connects != 0 || denied != 0 {
		t.Fatalf("proxy carried %d tunnels, refused %d; want none", connects, denied)
	}
}

// TestEgressNoProxyHostGoesDirect: a host in no_proxy is reached without
// the proxy, while another subscription on the same sidecar still goes
// through it; a subscription's own egress with no proxy (direct) goes
// direct whatever the top level says.
func TestEgressNoProxyHostGoesDirect(t *testing.T) {
	rec := &endpointLog{}
	ep := startEndpoint(t, guardedAddr, nil, rec)
	px := startTestProxy(t, "", "")
	// Private targets allowed: the direct path keeps the real guard.
	listed := sub("listed", ep.URL+"/listed")
	own := sub("own", ep.URL+"/own")
	own.Egress = &egress.Egress{} // direct
	proxied := sub("proxied", ep.URL+"/proxied")
	proxied.Egress = &egress.Egress{Proxy: px.URL()} // its own, without the top level's no_proxy
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{listed, own, proxied},
		Egress: &egress.Egress{Proxy: px.URL(), NoProxy: []string{"example.com", guardedAddr.String()}}}, false)

	publish(t, s, "t", "e", 5)
	eventually(t, "15 deliveries", func() bool {
		return lane(s, "listed").Delivered == 5 && lane(s, "own").Delivered == 5 && lane(s, "proxied").Delivered == 5
	})
	_, forwards := px.targets()
	if len(forwards) != 5 {
		t.Fatalf("proxy carried %d requests, want the 5 of the subscription with its own proxy: %q", len(forwards), forwards)
	}
	for _, f := range forwards {
		if !strings.HasSuffix(f, "/proxied") {
			t.Fatalf("proxy carried %q: a no_proxy host or a direct subscription went through it", f)
		}
	}
	for _, r := range rec.all() {
		if want := r.path == "/proxied"; px.via(r.remote) != want {
			t.Fatalf("%s came through the proxy: %v, want %v", r.path, !want, want)
		}
	}
}

// TestEgressGuardRefusesTargetThroughProxy: the SSRF guard judges the
// endpoint, not the proxy: a loopback endpoint (by address or by the name
// localhost) and the cloud metadata address are refused before any
// tunnel or request is asked of the proxy, and dead-lettered with
// forbidden_target, over https and http alike.
func TestEgressGuardRefusesTargetThroughProxy(t *testing.T) {
	rec := &endpointLog{}
	ep := startEndpoint(t, netipLoopback, nil, rec)
	port := ep.URL[strings.LastIndexByte(ep.URL, ':')+1:]
	px := startTestProxy(t, "", "")
	var subs []*delivery.Subscription
	for id, u := range map[string]string{
		"loopback-http":  "http://127.0.0.1:" + port + "/hook",
		"loopback-https": "https://127.0.0.1:" + port + "/hook",
		"localhost":      "https://localhost:" + port + "/hook",
		"metadata":       "http://169.254.169.254/latest/meta-data/",
		"metadata-https": "https://169.254.169.254/",
	} {
		sb := sub(id, u)
		sb.Retry, sb.Breaker = fastRetry(2), noBreaker
		subs = append(subs, sb)
	}
	s := startEgressServer(t, proxy.Options{Subscriptions: subs, Egress: &egress.Egress{Proxy: px.URL()}}, true)
	publish(t, s, "t", "e", 2)
	for _, sb := range subs {
		checkDeadLetters(t, deadLettered(t, s, sb.ID, 2), "forbidden_target", 2)
	}
	if connects, forwards, _ := px.counts(); connects != 0 || forwards != 0 {
		t.Fatalf("the proxy was asked for %d tunnels and %d requests to forbidden targets", connects, forwards)
	}
	if n := rec.count(); n != 0 {
		t.Fatalf("a forbidden endpoint got %d requests", n)
	}
}

// TestEgressProxyAuthRequired: a proxy that wants credentials and gets
// none answers 407, to a CONNECT and to an absolute-form request alike:
// a transport failure named proxy_auth, retried and then dead-lettered,
// not a 4xx of the endpoint's.
func TestEgressProxyAuthRequired(t *testing.T) {
	ca := newTestCA(t, "endpoint CA")
	rec := &endpointLog{}
	plain := startEndpoint(t, guardedAddr, nil, rec)
	secure := startEndpoint(t, guardedAddr, &tls.Config{Certificates: []tls.Certificate{
		ca.serverCert(t, leaf{cn: "endpoint", ips: []net.IP{guardedAddr.AsSlice()}}),
	}}, rec)
	px := startTestProxy(t, "sluice", "s3cret")
	a, b := sub("http", plain.URL+"/hook"), sub("https", secure.URL+"/hook")
	b.TLS = &egress.ClientTLS{CAFile: writeTemp(t, t.TempDir(), "ca.pem", ca.pem)}
	for _, sb := range []*delivery.Subscription{a, b} {
		sb.Retry, sb.Breaker = fastRetry(2), noBreaker
	}
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{a, b}, Egress: &egress.Egress{Proxy: px.URL()}}, true)
	publish(t, s, "t", "e", 2)
	checkDeadLetters(t, deadLettered(t, s, "http", 2), "proxy_auth", 2)
	checkDeadLetters(t, deadLettered(t, s, "https", 2), "proxy_auth", 2)
	if _, _, denied := px.counts(); denied < 8 {
		t.Fatalf("proxy refused %d requests, want every attempt's (8)", denied)
	}
	if n := rec.count(); n != 0 {
		t.Fatalf("endpoints got %d requests past a proxy that refused them", n)
	}
}

// TestEgressProxyDown: a proxy that refuses connections fails the
// attempt as "proxy", not as the endpoint's connection_refused.
func TestEgressProxyDown(t *testing.T) {
	ln := listenOn(t, netipLoopback)
	addr := ln.Addr().String()
	ln.Close()
	sb := sub("down", "http://"+guardedAddr.String()+":9/hook")
	sb.Retry, sb.Breaker = fastRetry(2), noBreaker
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb}, Egress: &egress.Egress{Proxy: "http://" + addr}}, true)
	publish(t, s, "t", "e", 1)
	checkDeadLetters(t, deadLettered(t, s, "down", 1), "proxy", 2)
}
