package egress

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/policy"
)

// ForbiddenTargetError is a delivery refused by the SSRF guard: every
// address the endpoint's host resolved to is loopback, private, link-local
// or otherwise not a public target, and Options.AllowPrivateTargets is off.
// Its text names the host, never the URL (which may carry tokens).
type ForbiddenTargetError struct {
	Host   string
	Reason string // from policy.ForbiddenTarget, for the last address refused
}

func (e *ForbiddenTargetError) Error() string {
	return "refusing to connect to " + e.Host + ": it resolves to " + e.Reason + " (set allow_private_targets: true to allow)"
}

// guardedResolver filters what the system resolver answers. The check is in
// the resolver the dialer connects with, not in config validation, so the
// address judged is the address dialled: a name that resolves to a public
// address at start-up and to 169.254.169.254 a minute later (DNS rebinding)
// is refused at that moment. When a name has public and private addresses,
// only the public ones are dialled. forbidden is policy.ForbiddenTarget
// when nil (tests of the egress proxy allow one loopback address with it).
type guardedResolver struct {
	forbidden func(netip.Addr) string
}

func (g guardedResolver) LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error) {
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil, err
	}
	kept := addrs[:0]
	var why string
	forbidden := g.forbidden
	if forbidden == nil {
		forbidden = policy.ForbiddenTarget
	}
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP)
		if r := forbidden(ip); r != "" {
			why = r
			continue
		}
		kept = append(kept, a)
	}
	if len(kept) == 0 {
		return nil, &ForbiddenTargetError{Host: host, Reason: why}
	}
	return kept, nil
}

// newDialer returns the dial function of the shared client. Both modes use
// fasthttp's TCPDialer, so connection set-up and its DNS cache are the same
// whether or not the guard is on; the cache holds filtered answers only.
//
// It dials dual-stack. fasthttp's plain Dial drops every IPv6 address a
// host resolves to, so an endpoint at [::1] or on an IPv6-only name failed
// every attempt with "couldn't find dns entries" (last_error transport);
// dual-stack tries each address the name has, IPv6 and IPv4, in turn, so
// a name whose AAAA address refuses the connection is still reached over
// IPv4 within the same attempt.
func newDialer(allowPrivate bool) fasthttp.DialFuncWithTimeout {
	d := &fasthttp.TCPDialer{DNSCacheDuration: time.Minute}
	if !allowPrivate {
		d.Resolver = guardedResolver{}
	}
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		c, err := d.DialDualStackTimeout(addr, timeout)
		if err != nil {
			return nil, err
		}
		return handshakeBoundConn{c}, nil
	}
}

// handshakeBoundConn gives reads the write deadline too. fasthttp runs the
// TLS handshake inside the request's first write and sets only a write
// deadline before it, so the handshake's reads had none: an https endpoint
// that accepted the connection and never answered the handshake held its
// slot until the peer closed, whatever the subscription's timeout
// (TestEndpointBlackHoleTimesOut/https). fasthttp sets the read deadline
// itself before reading the response, so nothing else changes.
type handshakeBoundConn struct{ net.Conn }

func (c handshakeBoundConn) SetWriteDeadline(t time.Time) error { return c.Conn.SetDeadline(t) }
