package egress

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/policy"
)

// Outbound limits.
const (
	// DefaultMaxConnsPerHost caps connections to one endpoint host across all
	// lanes: one shared client, no pool per tenant, no fd exhaustion.
	DefaultMaxConnsPerHost = 64
	// maxResponseBytes bounds how much of an endpoint's answer is read.
	maxResponseBytes = 64 << 10
	// writeBufferSize is the outbound request's write buffer: the request
	// line, headers and a body of up to about 19 KiB go out in one write
	// (TestDeliverWritesOnce), where fasthttp's default of 4 KiB split
	// every body past about 3.5 KiB into two. Measured with 16 KiB bodies,
	// one write instead of two took 9.5% less CPU per delivery (20.0 µs
	// against 22.1, 6 alternating runs of BenchmarkDeliverClient
	// body=16384 conc=32); 512 B and 64 KiB bodies did not move (8.7/8.9
	// µs, 54.4/55.4 µs). A 68 KiB buffer, for one write of 64 KiB bodies
	// too, was dropped: it copies the body into the buffer to save a
	// syscall and measured no better. The memory is small: writers are
	// pooled and held only while a request is written, not while its
	// answer is awaited.
	writeBufferSize = 20 << 10
)

// NewClient returns the one outbound client all lanes share. Redirects are
// not followed (Client.Do never does): per Standard Webhooks a 3xx is a
// failure, and following one would send signed payloads to a place nobody
// configured. Connections go through newDialer, which holds the SSRF guard.
func NewClient(maxConnsPerHost int, allowPrivate bool) *fasthttp.Client {
	return &fasthttp.Client{
		Name:                   "sluice",
		DialTimeout:            newDialer(allowPrivate),
		MaxConnsPerHost:        maxConnsPerHost,
		MaxConnWaitTimeout:     30 * time.Second,
		MaxIdleConnDuration:    30 * time.Second,
		MaxResponseBodySize:    maxResponseBytes,
		ReadBufferSize:         8 << 10,
		WriteBufferSize:        writeBufferSize,
		DisablePathNormalizing: true,
		TLSConfig:              &tls.Config{MinVersion: tls.VersionTLS12},
		ConfigureClient:        configureHost(nil), // tlsconfig.go: the TLS handshake in the dial
	}
}

// Failure classifies a transport error once, at the HTTP boundary; its
// word goes into dead letters, retry records and logs, which must never
// carry URLs or payloads.
func Failure(err error) policy.Failure {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, os.ErrDeadlineExceeded),
		// A connect that never completes (SYNs dropped) holds a slot for the
		// whole timeout, like any black hole: the breaker must see it so.
		errors.Is(err, fasthttp.ErrDialTimeout):
		return policy.FailTimeout
	case egressFailure(err) != policy.NoFailure: // the proxy, certificates, the token endpoint
		return egressFailure(err)
	case errors.Is(err, fasthttp.ErrNoFreeConns), errors.Is(err, fasthttp.ErrConnPoolStrategyNotImpl):
		return policy.FailNoFreeConns
	case errors.As(err, new(*ForbiddenTargetError)):
		return policy.FailForbiddenTarget
	case errors.As(err, &dnsErr):
		return policy.FailDNS
	case errors.Is(err, syscall.ECONNREFUSED):
		return policy.FailConnRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, fasthttp.ErrConnectionClosed):
		return policy.FailConnReset
	case errors.As(err, new(*tls.CertificateVerificationError)), strings.Contains(err.Error(), "tls:"):
		return policy.FailTLS
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return policy.FailConnect
	}
	return policy.FailTransport
}

// TransportCause describes a transport error Failure could not name
// ("transport: error when reading response headers: cannot find
// whitespace in the first line of response …"), for the log. The endpoint's host is cut out: fasthttp's
// errors name the address dialled, and logs name an endpoint by its
// subscription id. The URL itself, whose path or query may carry a token,
// is in none of the errors a request returns.
func TransportCause(err error, host string) string {
	var up *fasthttp.ErrDialWithUpstream
	msg := err.Error()
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Err != nil:
		msg = op.Op + ": " + op.Err.Error()
	case errors.As(err, &up) && errors.Unwrap(up) != nil:
		msg = "dial: " + errors.Unwrap(up).Error()
	}
	if host != "" {
		msg = strings.ReplaceAll(msg, host, "<endpoint>")
	}
	if len(msg) > 200 {
		msg = strings.ToValidUTF8(msg[:200], "") + "…"
	}
	return "transport: " + msg
}
