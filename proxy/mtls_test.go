package proxy_test

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/egress"
)

// Client certificates (mTLS) and HTTPS delivery in general,
// against real TLS endpoints with certificates made in the test.

// mtlsFixture is an https endpoint that requires a client certificate
// signed by its client CA, and the files a subscription names.
type mtlsFixture struct {
	serverCA, clientCA *testCA
	ep                 *endpointLogServer
	dir, caFile        string
}

type endpointLogServer struct {
	URL string
	log *endpointLog
}

func newMTLSFixture(t *testing.T) *mtlsFixture {
	f := &mtlsFixture{serverCA: newTestCA(t, "server CA"), clientCA: newTestCA(t, "client CA"), dir: t.TempDir()}
	log := &endpointLog{}
	srv := startEndpoint(t, netipLoopback, &tls.Config{
		Certificates: []tls.Certificate{f.serverCA.serverCert(t, leaf{cn: "endpoint", ips: []net.IP{net.IPv4(127, 0, 0, 1)}})},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    f.clientCA.pool(),
	}, log)
	f.ep = &endpointLogServer{URL: srv.URL, log: log}
	f.caFile = writeTemp(t, f.dir, "server-ca.pem", f.serverCA.pem)
	return f
}

// clientFiles writes a client certificate for cn, signed by ca, and its
// key to the fixture's cert.pem and key.pem (replacing them), and returns
// the subscription's TLS settings naming them.
func (f *mtlsFixture) clientFiles(t *testing.T, ca *testCA, cn string) *egress.ClientTLS {
	c, k := ca.issue(t, leaf{cn: cn, client: true})
	return &egress.ClientTLS{CertFile: writeTemp(t, f.dir, "cert.pem", c), KeyFile: writeTemp(t, f.dir, "key.pem", k), CAFile: f.caFile}
}

// TestMTLSClientCertificateRequired: an endpoint that requires a client
// certificate gets the subscription's and answers; a subscription without
// one, or with one of a CA the endpoint does not trust, is refused in the
// handshake, and the failure is named tls_client_cert.
func TestMTLSClientCertificateRequired(t *testing.T) {
	f := newMTLSFixture(t)
	with := sub("with", f.ep.URL+"/with")
	with.TLS = f.clientFiles(t, f.clientCA, "client-1")
	without := sub("without", f.ep.URL+"/without")
	without.TLS = &egress.ClientTLS{CAFile: f.caFile}
	stranger := sub("stranger", f.ep.URL+"/stranger")
	other := newTestCA(t, "another CA")
	c, k := other.issue(t, leaf{cn: "stranger", client: true})
	stranger.TLS = &egress.ClientTLS{CertFile: writeTemp(t, f.dir, "s-cert.pem", c), KeyFile: writeTemp(t, f.dir, "s-key.pem", k), CAFile: f.caFile}
	for _, sb := range []*delivery.Subscription{without, stranger} {
		sb.Retry, sb.Breaker = fastRetry(2), noBreaker
	}
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{with, without, stranger}}, false)
	publish(t, s, "t", "e", 3)
	eventually(t, "3 deliveries with the certificate", func() bool { return lane(s, "with").Delivered == 3 })
	checkDeadLetters(t, deadLettered(t, s, "without", 3), "tls_client_cert", 2)
	checkDeadLetters(t, deadLettered(t, s, "stranger", 3), "tls_client_cert", 2)
	for _, r := range f.ep.log.all() {
		if r.path != "/with" || r.clientCN != "client-1" {
			t.Fatalf("endpoint answered %s with client certificate %q; want only /with, as client-1", r.path, r.clientCN)
		}
	}
}

// TestMTLSCertificateRotatedOnReload: a rotated certificate (new files
// renamed over the old, as a Secret update does) is used by the
// deliveries after a reload, connections open with the old one
// notwithstanding; between the rotation and the reload the old one
// still serves (the periodic check is off here).
func TestMTLSCertificateRotatedOnReload(t *testing.T) {
	f := newMTLSFixture(t)
	mk := func() *delivery.Subscription {
		sb := sub("mtls", f.ep.URL+"/hook")
		sb.TLS = &egress.ClientTLS{CertFile: f.dir + "/cert.pem", KeyFile: f.dir + "/key.pem", CAFile: f.caFile}
		return sb
	}
	f.clientFiles(t, f.clientCA, "client-1")
	s := startEgressServerEvery(t, proxy.Options{Subscriptions: []*delivery.Subscription{mk()}}, false, time.Hour)
	publish(t, s, "t", "a", 3)
	eventually(t, "3 deliveries", func() bool { return lane(s, "mtls").Delivered == 3 })

	f.clientFiles(t, f.clientCA, "client-2")
	publish(t, s, "t", "b", 2)
	eventually(t, "5 deliveries", func() bool { return lane(s, "mtls").Delivered == 5 })
	if err := s.Reload([]*delivery.Subscription{mk()}); err != nil {
		t.Fatal(err)
	}
	publish(t, s, "t", "c", 3)
	eventually(t, "8 deliveries", func() bool { return lane(s, "mtls").Delivered == 8 })
	got := f.ep.log.all()
	for i, r := range got {
		want := "client-1"
		if i >= 5 {
			want = "client-2"
		}
		if r.clientCN != want {
			t.Fatalf("delivery %d presented %q, want %q (rotated before delivery 4, reloaded after 5)", i+1, r.clientCN, want)
		}
	}
}

// TestMTLSCertificateRotatedWhenFilesChange: without a reload, a change
// of the files is seen by the periodic check: a half-written rotation
// (the new certificate beside the old key) does not load and keeps the
// old certificate in use; once the key follows, the new one is used.
func TestMTLSCertificateRotatedWhenFilesChange(t *testing.T) {
	f := newMTLSFixture(t)
	files := f.clientFiles(t, f.clientCA, "client-1")
	sb := sub("mtls", f.ep.URL+"/hook")
	sb.TLS = files
	var logs capture
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb}, Logger: logs.logger()}, false)
	var n atomic.Int64
	deliver := func() string {
		t.Helper()
		i := n.Add(1)
		publish(t, s, "t", fmt.Sprintf("e%d", i), 1)
		eventually(t, "delivery", func() bool { return lane(s, "mtls").Delivered == uint64(i) })
		all := f.ep.log.all()
		return all[len(all)-1].clientCN
	}
	if cn := deliver(); cn != "client-1" {
		t.Fatalf("first delivery presented %q", cn)
	}

	c2, k2 := f.clientCA.issue(t, leaf{cn: "client-2", client: true})
	writeFile(t, files.CertFile, c2) // the key is still the old one's
	// The check has seen the half-written pair once it says it keeps the
	// files in use; only then does the next delivery show what it kept.
	eventually(t, "the half-written rotation refused", func() bool {
		return strings.Contains(logs.String(), "egress files changed but do not load")
	})
	if cn := deliver(); cn != "client-1" {
		t.Fatalf("with a certificate that does not match its key, delivery presented %q; want the old client-1", cn)
	}
	writeFile(t, files.KeyFile, k2)
	deadline := time.Now().Add(10 * time.Second)
	for deliver() != "client-2" {
		if time.Now().After(deadline) {
			t.Fatal("the rotated certificate was never used")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHTTPSCertificateErrorsAreNamed: an endpoint whose certificate does
// not verify gets no request, and the failure says why: not from a CA
// trusted, not for this host, expired or not valid yet. Each is retried
// (a fixed certificate heals the lane) and then dead-lettered.
func TestHTTPSCertificateErrorsAreNamed(t *testing.T) {
	trusted, untrusted := newTestCA(t, "trusted"), newTestCA(t, "untrusted")
	dir := t.TempDir()
	caFile := writeTemp(t, dir, "ca.pem", trusted.pem)
	loop := []net.IP{net.IPv4(127, 0, 0, 1)}
	cases := []struct {
		id   string
		ca   *testCA
		leaf leaf
		want string
	}{
		{"unknown-ca", untrusted, leaf{cn: "endpoint", ips: loop}, "tls_unknown_authority"},
		{"hostname", trusted, leaf{cn: "endpoint", dns: []string{"other.example"}}, "tls_hostname"},
		{"expired", trusted, leaf{cn: "endpoint", ips: loop, notBefore: time.Now().Add(-48 * time.Hour), notAfter: time.Now().Add(-time.Hour)}, "tls_expired"},
		{"not-yet-valid", trusted, leaf{cn: "endpoint", ips: loop, notBefore: time.Now().Add(time.Hour)}, "tls_expired"},
	}
	var handled atomic.Int64
	var subs []*delivery.Subscription
	for _, c := range cases {
		srv := startEndpoint(t, netipLoopback, &tls.Config{Certificates: []tls.Certificate{c.ca.serverCert(t, c.leaf)}},
			http.HandlerFunc(func(http.ResponseWriter, *http.Request) { handled.Add(1) }))
		sb := sub(c.id, srv.URL+"/hook")
		sb.TLS = &egress.ClientTLS{CAFile: caFile}
		sb.Retry, sb.Breaker = fastRetry(2), noBreaker
		subs = append(subs, sb)
	}
	s := startEgressServer(t, proxy.Options{Subscriptions: subs}, false)
	publish(t, s, "t", "e", 2)
	for _, c := range cases {
		t.Run(c.id, func(t *testing.T) {
			checkDeadLetters(t, deadLettered(t, s, c.id, 2), c.want, 2)
		})
	}
	if n := handled.Load(); n != 0 {
		t.Fatalf("%d requests passed a certificate that does not verify", n)
	}
}

// TestHTTPSServerNameAndCAFile: an endpoint reached by address whose
// certificate names only a host name is verified against tls.server_name
// (sent as SNI too) and the subscription's CA file, not the system's.
func TestHTTPSServerNameAndCAFile(t *testing.T) {
	ca := newTestCA(t, "private CA")
	var sni atomic.Value
	srv := startEndpoint(t, netipLoopback, &tls.Config{Certificates: []tls.Certificate{ca.serverCert(t, leaf{cn: "hooks", dns: []string{"hooks.internal"}})}},
		http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { sni.Store(r.TLS.ServerName) }))
	sb := sub("named", srv.URL+"/hook")
	sb.TLS = &egress.ClientTLS{CAFile: writeTemp(t, t.TempDir(), "ca.pem", ca.pem), ServerName: "hooks.internal"}
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb}}, false)
	publish(t, s, "t", "e", 2)
	eventually(t, "2 deliveries", func() bool { return lane(s, "named").Delivered == 2 })
	if got := sni.Load(); got != "hooks.internal" {
		t.Fatalf("SNI %v, want hooks.internal", got)
	}
}

// TestMTLSThroughProxy: a client certificate and the subscription's CA
// work inside a CONNECT tunnel, with the SSRF guard on.
func TestMTLSThroughProxy(t *testing.T) {
	serverCA, clientCA := newTestCA(t, "server CA"), newTestCA(t, "client CA")
	log := &endpointLog{}
	srv := startEndpoint(t, guardedAddr, &tls.Config{
		Certificates: []tls.Certificate{serverCA.serverCert(t, leaf{cn: "endpoint", ips: []net.IP{guardedAddr.AsSlice()}})},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: clientCA.pool(),
	}, log)
	px := startTestProxy(t, "", "")
	dir := t.TempDir()
	c, k := clientCA.issue(t, leaf{cn: "client-1", client: true})
	sb := sub("mtls", srv.URL+"/hook")
	sb.TLS = &egress.ClientTLS{CertFile: writeTemp(t, dir, "c.pem", c), KeyFile: writeTemp(t, dir, "k.pem", k), CAFile: writeTemp(t, dir, "ca.pem", serverCA.pem)}
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb}, Egress: &egress.Egress{Proxy: px.URL()}}, true)
	publish(t, s, "t", "e", 3)
	eventually(t, "3 deliveries", func() bool { return lane(s, "mtls").Delivered == 3 })
	for _, r := range log.all() {
		if !px.via(r.remote) || r.clientCN != "client-1" {
			t.Fatalf("request from %s as %q: want through the proxy as client-1", r.remote, r.clientCN)
		}
	}
}
