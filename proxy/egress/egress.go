// Package egress owns one outbound exchange: the shared client and its
// SSRF guard (dial.go), forward proxies (egress.go), endpoint TLS and
// client certificates (tlsconfig.go), OAuth2 bearer tokens (oauth2.go),
// and the routes that hold one client per distinct setting and reload
// their files (routes.go). It also names what went wrong: Failure gives a
// transport error its word for dead letters and metrics, TransportCause
// its line for the log.
//
// It promises: a request reaches only an address the SSRF guard allows
// (the operator's proxy and token endpoint excepted); a 3xx is never
// followed; no error it returns carries an endpoint's URL, a credential,
// a token or a file's content. It knows nothing of subscriptions, lanes
// or the log: the delivery engine hands it Settings and keeps the Binding
// it gets back.
package egress

import (
	"bufio"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/policy"
)

// Egress is how a subscription's requests leave the host:
// directly, or through a forward proxy — the usual way to give webhooks a
// fixed source address (the proxy's, or a NAT's behind it) that receivers
// can allow.
//
// Through a proxy, a request to an https endpoint goes through a CONNECT
// tunnel (TLS runs end to end, the proxy sees only the host and port) and
// one to an http endpoint is sent to the proxy in the absolute form
// ("POST http://host/path HTTP/1.1"). The SSRF guard still judges the
// endpoint: with private targets not allowed, the endpoint's host is
// resolved here and refused as it would be without the proxy, and a
// tunnel is asked for the address judged, not the name, so DNS cannot
// send the proxy elsewhere (an http endpoint's name is resolved again by
// the proxy: see docs/configuration.md, "Egress"). The proxy itself is the operator's and
// is dialled wherever it is, private addresses included.
type Egress struct {
	// Proxy is the forward proxy, "http://host:port" or
	// "https://host:port" (TLS to the proxy as well), without credentials.
	// "" means direct: a subscription whose Egress has no Proxy goes
	// direct whatever Options.Egress says.
	Proxy string `json:"proxy,omitempty"`
	// CredentialsFile holds "user:password" on one line, sent to the proxy
	// as Proxy-Authorization: Basic. It is read when the route is first
	// used and again when it changes on disk; its content is never logged.
	CredentialsFile string `json:"proxy_credentials_file,omitempty"`
	// CAFile holds the PEM certificates that verify an https:// proxy, in
	// place of the system's roots.
	CAFile string `json:"proxy_ca_file,omitempty"`
	// NoProxy lists endpoint hosts reached directly: a name ("hooks.corp",
	// which also covers its subdomains), a name with a leading dot
	// (".corp": subdomains only), an IP address, a CIDR prefix (matched
	// against IP-literal hosts only: nothing is resolved to decide), or
	// "*" for every host. Case does not matter; ports are not compared.
	NoProxy []string `json:"no_proxy,omitempty"`
}

// bypass reports whether host (an endpoint URL's) is in e's NoProxy.
func (e *Egress) bypass(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	ip, ipErr := netip.ParseAddr(strings.Trim(host, "[]"))
	for _, p := range e.NoProxy {
		p = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(p)), ".")
		switch {
		case p == "*":
			return true
		case strings.Contains(p, "/"):
			if pre, err := netip.ParsePrefix(p); err == nil && ipErr == nil && pre.Contains(ip.Unmap()) {
				return true
			}
		case ipErr == nil:
			if a, err := netip.ParseAddr(strings.Trim(p, "[]")); err == nil && a.Unmap() == ip.Unmap() {
				return true
			}
		case strings.HasPrefix(p, "."):
			if strings.HasSuffix(host, p) {
				return true
			}
		case p != "" && (host == p || strings.HasSuffix(host, "."+p)):
			return true
		}
	}
	return false
}

// CheckEgress checks e as a delivery would use it: the proxy URL parses,
// the credentials file holds "user:password" and the CA file
// certificates. File problems are *FileError naming the setting. config
// calls it to refuse a bad value at start-up and reload.
func CheckEgress(e Egress) error {
	if e.Proxy == "" {
		return nil
	}
	_, err := newForwardProxy(e, nil)
	return err
}

// ProxyError is a delivery the forward proxy did not carry: it could not
// be reached (Err), or it answered the tunnel's CONNECT, or an http
// request, with Status (407: it wants credentials). Its text names the
// proxy's address, never the endpoint's URL nor the credentials.
type ProxyError struct {
	Addr   string
	Status int
	Err    error
}

func (e *ProxyError) Error() string {
	if e.Status != 0 {
		return "egress proxy " + e.Addr + " answered " + strconv.Itoa(e.Status)
	}
	return "egress proxy " + e.Addr + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *ProxyError) Unwrap() error { return e.Err }

// egressFailure names a failure of the egress (the proxy, the endpoint's
// or sluice's certificate, the token endpoint), or returns NoFailure.
// failureOf asks it after timeouts, which stay timeouts wherever they
// happen (the breaker counts them apart).
func egressFailure(err error) policy.Failure {
	var pe *ProxyError
	var te *TokenError
	switch {
	case errors.As(err, &te):
		return policy.FailAuthToken
	case errors.As(err, &pe):
		if pe.Status == http.StatusProxyAuthRequired {
			return policy.FailProxyAuth
		}
		return policy.FailProxy
	}
	return tlsFailure(err)
}

// readProxyCredentials reads a credentials file: "user:password" on one
// line, surrounding whitespace ignored.
func readProxyCredentials(path string) (user, password string, err error) {
	b, err := readEgressFile("proxy_credentials_file", path)
	if err != nil {
		return "", "", err
	}
	s := strings.TrimSpace(string(b))
	user, password, ok := strings.Cut(s, ":")
	switch {
	case !ok || user == "":
		return "", "", &FileError{Key: "proxy_credentials_file", Path: path, Err: errors.New(`must hold "user:password" on one line`)}
	case strings.ContainsAny(s, "\r\n"):
		return "", "", &FileError{Key: "proxy_credentials_file", Path: path, Err: errors.New(`must hold one line, "user:password"`)}
	}
	return user, password, nil
}

// proxyAuthorization is the Proxy-Authorization value of a credentials
// file (RFC 7617 Basic).
func proxyAuthorization(path string) (string, error) {
	user, password, err := readProxyCredentials(path)
	if err != nil {
		return "", err
	}
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password)), nil
}

// forwardProxy dials endpoints through a forward proxy: a CONNECT tunnel
// for https endpoints, a plain connection to the proxy for http ones
// (absoluteForm writes their requests).
type forwardProxy struct {
	addr string      // host:port of the proxy
	tls  *tls.Config // for an https:// proxy; nil for http://
	auth string      // Proxy-Authorization value; "" without credentials
	dial *fasthttp.TCPDialer
	// judge returns the address to ask the proxy for, after the SSRF
	// guard approved it; nil when private targets are allowed (the name
	// is sent as it is).
	judge func(host string, timeout time.Duration) (string, error)
}

func newForwardProxy(e Egress, judge func(string, time.Duration) (string, error)) (*forwardProxy, error) {
	u, err := url.Parse(e.Proxy)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
		return nil, errors.New("proxy must be http://host:port or https://host:port, without credentials")
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	// The proxy is the operator's: no guard on its address, and its name
	// is resolved (and cached) like any.
	p := &forwardProxy{addr: net.JoinHostPort(u.Hostname(), port), dial: &fasthttp.TCPDialer{DNSCacheDuration: time.Minute}, judge: judge}
	if u.Scheme == "https" {
		p.tls = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname()}
		if e.CAFile != "" {
			if p.tls.RootCAs, err = loadCAs("proxy_ca_file", e.CAFile); err != nil {
				return nil, err
			}
		}
	}
	if e.CredentialsFile != "" {
		if p.auth, err = proxyAuthorization(e.CredentialsFile); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// connect opens a connection to the proxy itself, with TLS for an
// https:// proxy, within timeout.
func (p *forwardProxy) connect(timeout time.Duration) (net.Conn, time.Time, error) {
	if timeout <= 0 {
		timeout = fasthttp.DefaultDialTimeout
	}
	deadline := time.Now().Add(timeout)
	c, err := p.dial.DialDualStackTimeout(p.addr, timeout) // a proxy on IPv6 too (dial.go, newDialer)
	if err != nil {
		return nil, deadline, &ProxyError{Addr: p.addr, Err: err}
	}
	if p.tls != nil {
		tc := tls.Client(c, p.tls)
		tc.SetDeadline(deadline)
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, deadline, &ProxyError{Addr: p.addr, Err: err}
		}
		c = tc
	}
	return c, deadline, nil
}

// forward is the dial of an http endpoint through the proxy: the guard
// judges the endpoint's host, then the connection goes to the proxy. A
// host client holds connections for one endpoint host only, so every
// request on this connection is for the host judged.
func (p *forwardProxy) forward(addr string, timeout time.Duration) (net.Conn, error) {
	if p.judge != nil {
		host, _, _ := net.SplitHostPort(addr)
		if _, err := p.judge(host, timeout); err != nil {
			return nil, err
		}
	}
	c, _, err := p.connect(timeout)
	if err != nil {
		return nil, err
	}
	return handshakeBoundConn{c}, nil
}

// tunnel is the dial of an https endpoint through the proxy: the guard
// judges the endpoint's host, then the proxy is asked for a tunnel to the
// address judged (or, with private targets allowed, to the name). The
// returned connection carries the endpoint's TLS, which fasthttp starts
// with the endpoint's name (or tls.server_name).
func (p *forwardProxy) tunnel(addr string, timeout time.Duration) (net.Conn, error) {
	target := addr
	if p.judge != nil {
		host, port, _ := net.SplitHostPort(addr)
		ip, err := p.judge(host, timeout)
		if err != nil {
			return nil, err
		}
		target = net.JoinHostPort(ip, port)
	}
	c, deadline, err := p.connect(timeout)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(deadline)
	var b strings.Builder
	b.WriteString("CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\nUser-Agent: sluice\r\n")
	if p.auth != "" {
		b.WriteString("Proxy-Authorization: " + p.auth + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := c.Write([]byte(b.String())); err != nil {
		c.Close()
		return nil, &ProxyError{Addr: p.addr, Err: err}
	}
	br := bufio.NewReaderSize(c, 1024)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, &ProxyError{Addr: p.addr, Err: err}
	}
	resp.Body.Close() // a 2xx to CONNECT has none; another's is not needed
	if resp.StatusCode/100 != 2 {
		c.Close()
		return nil, &ProxyError{Addr: p.addr, Status: resp.StatusCode}
	}
	c.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		// The endpoint spoke before the client's hello: keep what was read.
		c = &bufferedConn{Conn: c, r: br}
	}
	return handshakeBoundConn{c}, nil
}

// bufferedConn reads what the CONNECT's reader buffered first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// absoluteForm sends an http endpoint's requests to the proxy in the
// absolute form ("POST http://host/path HTTP/1.1") with the proxy's
// credentials. fasthttp writes the request line from the URI's path as
// given (the client disables path normalising), so the scheme and the
// authority are put before the path for the write and taken off after.
type absoluteForm struct{ p *forwardProxy }

func (t absoluteForm) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (bool, error) {
	u := req.URI()
	path := append([]byte(nil), u.PathOriginal()...)
	abs := make([]byte, 0, len("http://")+len(u.Host())+len(path)+1)
	abs = append(append(abs, "http://"...), u.Host()...)
	if len(path) == 0 || path[0] != '/' {
		abs = append(abs, '/')
	}
	u.SetPathBytes(append(abs, path...))
	if t.p.auth != "" {
		req.Header.Set(fasthttp.HeaderProxyAuthorization, t.p.auth)
	}
	retry, err := fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
	u.SetPathBytes(path)
	req.Header.Del(fasthttp.HeaderProxyAuthorization)
	if err == nil && resp.StatusCode() == fasthttp.StatusProxyAuthRequired {
		// The proxy's answer, not the endpoint's: retried as a transport
		// failure (proxy_auth), not dead-lettered as a 4xx would be.
		return false, &ProxyError{Addr: t.p.addr, Status: fasthttp.StatusProxyAuthRequired}
	}
	return retry, err
}
