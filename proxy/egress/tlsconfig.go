package egress

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/policy"
)

// ClientTLS is how a subscription's connections to its https endpoint
// authenticate both sides: a client certificate for endpoints
// that require one (mTLS), the CAs that verify the endpoint instead of the
// system's, and the name its certificate must carry. The zero value is
// the default: no client certificate, the system's roots, the URL's host.
//
// The files are read when a lane first needs them, again when a reload
// (SIGHUP, a changed config file) comes, and whenever they change on disk
// (checked every DefaultEgressCheckInterval): new connections use the new
// files, connections open with the old ones finish what they carry. A
// change that does not load (a key that does not match its certificate,
// half of a rotation written) keeps the files in use and is logged.
type ClientTLS struct {
	// CertFile and KeyFile are the client certificate (PEM, the leaf
	// first, then any intermediates) and its private key (PEM). Both or
	// neither.
	CertFile string `json:"client_cert_file,omitempty"`
	KeyFile  string `json:"client_key_file,omitempty"`
	// CAFile holds the PEM certificates that verify the endpoint, in
	// place of the system's roots.
	CAFile string `json:"ca_file,omitempty"`
	// ServerName is the name the endpoint's certificate must be valid for,
	// and the SNI sent, in place of the URL's host.
	ServerName string `json:"server_name,omitempty"`
}

// FileError is a file of a subscription's egress, TLS or auth settings
// that cannot be used. Key is its setting, as the config file spells it
// ("client_key_file", "proxy_credentials_file", ...), so config can name
// the whole key; the error never shows the file's content.
type FileError struct {
	Key  string
	Path string
	Err  error
}

func (e *FileError) Error() string {
	return e.Key + " " + strconv.Quote(e.Path) + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *FileError) Unwrap() error { return e.Err }

// maxEgressFileBytes bounds what is read of a certificate, key, CA or
// credentials file: a CA bundle of the size a distribution ships fits
// many times over.
const maxEgressFileBytes = 4 << 20

// readEgressFile reads a small file named by setting key.
func readEgressFile(key, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &FileError{Key: key, Path: path, Err: unwrapPathError(err)}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxEgressFileBytes+1))
	if err != nil {
		return nil, &FileError{Key: key, Path: path, Err: unwrapPathError(err)}
	}
	if len(b) > maxEgressFileBytes {
		return nil, &FileError{Key: key, Path: path, Err: fmt.Errorf("larger than %d bytes", maxEgressFileBytes)}
	}
	return b, nil
}

// unwrapPathError drops the *fs.PathError's repetition of the path, which
// FileError already names, keeping the cause (fs.ErrNotExist and the like
// stay visible to errors.Is).
func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// loadCAs reads a PEM bundle of CA certificates.
func loadCAs(key, path string) (*x509.CertPool, error) {
	b, err := readEgressFile(key, path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, &FileError{Key: key, Path: path, Err: errors.New("holds no PEM certificate")}
	}
	return pool, nil
}

// CheckClientTLS reads and checks t's files as a delivery would load them:
// the certificate and key go together, parse and match, the certificate
// is valid at now, and the CA file holds certificates. It returns a
// *FileError naming the first file that fails, or an error naming the
// missing half of a certificate and key. config calls it to refuse a bad
// file at start-up and reload with its key named.
func CheckClientTLS(t ClientTLS, now time.Time) error {
	_, err := loadClientTLS(t, now)
	return err
}

// loadClientTLS builds the TLS configuration of t's connections.
func loadClientTLS(t ClientTLS, now time.Time) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pool, err := loadCAs("ca_file", t.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	switch {
	case t.CertFile == "" && t.KeyFile == "":
		return cfg, nil
	case t.KeyFile == "":
		return nil, errors.New("client_key_file is required with client_cert_file")
	case t.CertFile == "":
		return nil, errors.New("client_cert_file is required with client_key_file")
	}
	certPEM, err := readEgressFile("client_cert_file", t.CertFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readEgressFile("client_key_file", t.KeyFile)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// X509KeyPair's messages say which half is wrong; name that file.
		key, path := "client_key_file", t.KeyFile
		msg := strings.TrimPrefix(err.Error(), "tls: ")
		if strings.Contains(msg, "certificate") && !strings.Contains(msg, "private key") {
			key, path = "client_cert_file", t.CertFile
		}
		return nil, &FileError{Key: key, Path: path, Err: errors.New(msg)}
	}
	leaf := cert.Leaf // parsed by X509KeyPair since Go 1.23
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, &FileError{Key: "client_cert_file", Path: t.CertFile, Err: err}
		}
	}
	if now.After(leaf.NotAfter) {
		return nil, &FileError{Key: "client_cert_file", Path: t.CertFile,
			Err: fmt.Errorf("the certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))}
	}
	// Sent whatever CAs the endpoint says it accepts: the operator chose
	// this certificate for this endpoint, and an endpoint that lists an
	// intermediate (or nothing useful) would otherwise get none.
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	return cfg, nil
}

// configureHost returns the ConfigureClient of an outbound client: each of
// its host clients (one per endpoint host and scheme) dials through p, a
// forward proxy, when it is not nil, and an https one makes the TLS
// handshake in its dial (dialTLS) rather than leave it to fasthttp.
func configureHost(p *forwardProxy) func(*fasthttp.HostClient) error {
	return func(hc *fasthttp.HostClient) error {
		dial := hc.DialTimeout // the client's: the guarded direct dialer
		if p != nil {
			hc.Dial = nil
			if hc.IsTLS {
				dial = p.tunnel
			} else {
				dial = p.forward
				hc.Transport = absoluteForm{p}
			}
		}
		if hc.IsTLS {
			dial = dialTLS(dial, hc.TLSConfig)
			hc.Transport = certTransport{}
		}
		hc.DialTimeout = dial
		return nil
	}
}

// handshakeFallback bounds a TLS handshake whose dial was given no
// timeout (fasthttp dials for a request waiting on the per-host cap
// without one): the subscriptions' default timeout.
const handshakeFallback = 10 * time.Second

// dialTLS makes the TLS handshake right after dial, within the dial's
// timeout, and returns a connection that remembers whether the endpoint
// asked for a client certificate. That is what names a refused client
// certificate under TLS 1.3: the client's handshake ends before the
// server has judged its certificate, and a server that refuses it sends
// an alert and closes while the request it has not read is still in its
// socket, so the client usually sees a reset, not the alert (and fasthttp
// reports any failure of an answer's first byte as
// ErrConnectionClosed). A connection whose endpoint asked for a
// certificate and that failed before the first byte of an answer is
// therefore reported by certTransport as a ClientCertError
// (tls_client_cert) rather than connection_reset.
func dialTLS(dial fasthttp.DialFuncWithTimeout, base *tls.Config) fasthttp.DialFuncWithTimeout {
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		if timeout <= 0 {
			timeout = handshakeFallback
		}
		deadline := time.Now().Add(timeout)
		raw, err := dial(addr, timeout)
		if err != nil {
			return nil, err
		}
		ec := &endpointConn{}
		cfg := base.Clone()
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			cfg.ServerName = host
		}
		get := cfg.GetClientCertificate
		cfg.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			ec.asked = true
			if get == nil {
				return &tls.Certificate{}, nil // none to send, as crypto/tls would
			}
			c, err := get(cri)
			ec.sent = err == nil && c != nil && len(c.Certificate) > 0
			return c, err
		}
		tc := tls.Client(raw, cfg)
		tc.SetDeadline(deadline)
		if err := tc.Handshake(); err != nil {
			raw.Close()
			return nil, err // a timeout stays one (os.ErrDeadlineExceeded)
		}
		tc.SetDeadline(time.Time{})
		ec.Conn = tc
		return ec, nil
	}
}

// endpointConn is an endpoint's TLS connection (see dialTLS). Its
// Handshake method tells fasthttp the connection is TLS already; its
// LocalAddr leads back to it from the response (Response.LocalAddr), for
// certTransport. A connection is used by one request at a time.
type endpointConn struct {
	net.Conn       // the *tls.Conn
	asked    bool  // the endpoint asked for a client certificate
	sent     bool  // and got one
	answered bool  // a byte of an answer has arrived
	failed   error // the read or write that failed before any answer, on a connection asked for a certificate
}

func (c *endpointConn) Handshake() error { return c.Conn.(*tls.Conn).Handshake() }

func (c *endpointConn) LocalAddr() net.Addr { return connAddr{c.Conn.LocalAddr(), c} }

func (c *endpointConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.answered = true
	}
	c.note(err)
	return n, err
}

func (c *endpointConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.note(err)
	return n, err
}

func (c *endpointConn) note(err error) {
	if err != nil && c.asked && !c.answered && c.failed == nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		c.failed = err
	}
}

// connAddr is an endpointConn's local address.
type connAddr struct {
	net.Addr
	c *endpointConn
}

// certTransport is the round trip of an https host client: fasthttp's,
// with a failure on a connection whose endpoint asked for a client
// certificate and then closed it unanswered reported as a
// ClientCertError.
type certTransport struct{}

func (certTransport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (bool, error) {
	retry, err := fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
	if err != nil {
		if a, ok := resp.LocalAddr().(connAddr); ok && a.c.failed != nil {
			return false, &ClientCertError{Sent: a.c.sent, Err: a.c.failed}
		}
	}
	return retry, err
}

// ClientCertError is an endpoint that asked for a client certificate and
// closed the connection before answering: it refused the certificate
// sent (Sent), or the absence of one. Err is what the read or write got.
type ClientCertError struct {
	Sent bool
	Err  error
}

func (e *ClientCertError) Error() string {
	if e.Sent {
		return "the endpoint asked for a client certificate and closed the connection unanswered: it refused the one sent (" + e.Err.Error() + ")"
	}
	return "the endpoint asked for a client certificate and closed the connection unanswered; the subscription has none (" + e.Err.Error() + ")"
}

// Unwrap returns Err.
func (e *ClientCertError) Unwrap() error { return e.Err }

// tlsFailure names a certificate failure (FailTLSUnknownAuthority and the
// others) or returns NoFailure for an error that is none. The endpoint's
// certificate failing verification is this side's finding (an
// x509 error); an alert from the endpoint about a certificate is its
// verdict on the one sluice sent, or on its absence.
func tlsFailure(err error) policy.Failure {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var fe *FileError
	switch {
	case errors.As(err, new(*ClientCertError)):
		return policy.FailTLSClientCert
	case errors.As(err, &unknown):
		return policy.FailTLSUnknownAuthority
	case errors.As(err, &host):
		return policy.FailTLSHostname
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return policy.FailTLSExpired
	case errors.As(err, &fe):
		return policy.FailTLS // the subscription's own files do not load (logged when read)
	}
	// An alert about a certificate: "tls: certificate required" (TLS 1.3,
	// none sent), "tls: bad certificate", "tls: unknown certificate
	// authority", ... crypto/tls reports it as a *net.OpError "remote
	// error"; the text is the fallback where a layer above kept only that.
	var op *net.OpError
	remote := errors.As(err, &op) && op.Op == "remote error"
	if msg := err.Error(); (remote || strings.Contains(msg, "remote error: tls: ")) && strings.Contains(msg, "certificate") {
		return policy.FailTLSClientCert
	}
	return policy.NoFailure
}
