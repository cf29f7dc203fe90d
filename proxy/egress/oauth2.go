package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

// OAuth2 is a subscription's OAuth 2.0 client-credentials grant (RFC 6749
// §4.4), for endpoints that want a bearer token beside (or instead of)
// the signature: each delivery carries Authorization: Bearer <token>.
//
// One token serves every subscription with the same settings. It is
// fetched when first needed and again in the background once three
// quarters of its life (at most five minutes before its expiry) have
// passed, so deliveries wait for the token endpoint only for the first
// token and after a 401. A 401 from the endpoint triggers one refresh: the
// token it was sent with is dropped, a new one fetched, and the request
// sent once more within the same attempt (and its timeout); that second
// answer is classified as usual (a second 401 is dead-lettered like any
// 4xx: the credentials themselves are wrong). A token endpoint that gives
// no token fails the attempt with oauth2_token, retried like a connect
// error; nothing reaches the endpoint.
//
// The token endpoint is the operator's, like the proxy: the SSRF guard
// does not judge it. It is reached through the subscription's egress
// proxy (unless its host is in no_proxy), with the system's roots.
// Neither the token nor the client secret is ever logged.
type OAuth2 struct {
	// TokenURL is the token endpoint.
	TokenURL string `json:"token_url"`
	// ClientID identifies sluice to the token endpoint.
	ClientID string `json:"client_id"`
	// ClientSecretFile holds the client secret on one line; it is read at
	// each token request, so a rotated secret is used from the next one.
	ClientSecretFile string `json:"client_secret_file"`
	// Scopes are requested with each token; none: the endpoint's default.
	Scopes []string `json:"scopes,omitempty"`
}

// CheckOAuth2 reads o's client secret file as a token request would; a
// problem is a *FileError. config calls it to refuse a bad file at
// start-up and reload with its key named.
func CheckOAuth2(o OAuth2) error {
	_, err := readClientSecret(o.ClientSecretFile)
	return err
}

func readClientSecret(path string) (string, error) {
	b, err := readEgressFile("client_secret_file", path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	switch {
	case s == "":
		return "", &FileError{Key: "client_secret_file", Path: path, Err: errors.New("is empty")}
	case strings.ContainsAny(s, "\r\n"):
		return "", &FileError{Key: "client_secret_file", Path: path, Err: errors.New("must hold the secret on one line")}
	}
	return s, nil
}

// TokenError is an attempt that got no token from the token endpoint: the
// endpoint was not contacted. Its text names the token endpoint's host,
// and the token endpoint's error code or status, never a secret.
type TokenError struct {
	Host string
	Err  error
}

func (e *TokenError) Error() string { return "oauth2 token from " + e.Host + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *TokenError) Unwrap() error { return e.Err }

// Token timing. tokenTimeout bounds one token request; tokenErrorHold is
// how long a failed request's error is returned before another is made,
// so that a lane's workers do not each ask a failing token endpoint;
// maxRefreshAhead bounds how early a long-lived token is refreshed, and
// maxExpiryMargin how long before its expiry it stops being sent (clocks
// differ, and a request takes time to arrive).
const (
	tokenTimeout    = 30 * time.Second
	tokenErrorHold  = time.Second
	maxRefreshAhead = 5 * time.Minute
	maxExpiryMargin = 10 * time.Second
)

// grantKey is one distinct token: the grant and the egress its requests
// take.
type grantKey struct {
	url, clientID, secretFile, scopes string
	proxy, credentials, proxyCA       string
}

func newGrantKey(o OAuth2, eg *Egress) grantKey {
	k := grantKey{url: o.TokenURL, clientID: o.ClientID, secretFile: o.ClientSecretFile, scopes: strings.Join(o.Scopes, " ")}
	if eg != nil && eg.Proxy != "" && !eg.bypass(URLHost(o.TokenURL)) {
		k.proxy, k.credentials, k.proxyCA = eg.Proxy, eg.CredentialsFile, eg.CAFile
	}
	return k
}

// tokenSource caches one token and fetches the next, one request at a
// time.
type tokenSource struct {
	g          *Routes
	cfg        clientcredentials.Config // ClientSecret set before each request, by the one request in flight
	secretFile string
	host       string
	http       *http.Client

	// cur is the token deliveries read without the lock; written under
	// mu. Nil when none is usable.
	cur atomic.Pointer[bearerToken]

	mu       sync.Mutex
	fetching chan struct{} // closed when the request in flight ends; nil when none is
	err      error         // the last request's failure, returned until errUntil
	errUntil time.Time

	use sweepMark // under egress.mu
}

func newTokenSource(g *Routes, o OAuth2, eg *Egress) *tokenSource {
	k := newGrantKey(o, eg)
	s := &tokenSource{
		g:          g,
		cfg:        clientcredentials.Config{ClientID: o.ClientID, TokenURL: o.TokenURL, Scopes: o.Scopes},
		secretFile: o.ClientSecretFile,
		host:       URLHost(o.TokenURL),
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConns:        2,
		IdleConnTimeout:     90 * time.Second,
	}
	if k.proxy != "" {
		tr.Proxy = func(*http.Request) (*url.URL, error) {
			u, err := url.Parse(k.proxy)
			if err != nil {
				return nil, err
			}
			if k.credentials != "" {
				// Read at each request (one per token): a rotated file is
				// used at once. net/http sends the URL's user as
				// Proxy-Authorization, to a CONNECT and in the absolute form.
				user, pass, err := readProxyCredentials(k.credentials)
				if err != nil {
					return nil, err
				}
				u.User = url.UserPassword(user, pass)
			}
			return u, nil
		}
		if k.proxyCA != "" {
			// One TLS configuration verifies the proxy and the token
			// endpoint: the system's roots and the proxy's CA.
			roots, err := x509.SystemCertPool()
			if err != nil || roots == nil {
				roots = x509.NewCertPool()
			}
			if b, err := readEgressFile("proxy_ca_file", k.proxyCA); err == nil {
				roots.AppendCertsFromPEM(b)
			}
			tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
		}
	}
	s.http = &http.Client{Transport: tr, Timeout: tokenTimeout,
		// The token endpoint's answer is the answer: a redirect is not followed.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return s
}

// bearerToken is a cached token.
type bearerToken struct {
	bearer  string    // "Bearer <token>"
	expiry  time.Time // when it stops being sent; zero: it does not expire
	refresh time.Time // when a background request starts; zero: never
}

func (b *bearerToken) usable(now time.Time) bool {
	return b != nil && (b.expiry.IsZero() || now.Before(b.expiry))
}

// get returns the "Bearer <token>" to send, waiting until deadline for a
// request to the token endpoint only when no usable token is cached. A
// usable one is read without a lock.
func (s *tokenSource) get(deadline time.Time) (string, error) {
	now := time.Now()
	if b := s.cur.Load(); b.usable(now) {
		if !b.refresh.IsZero() && !now.Before(b.refresh) {
			s.mu.Lock()
			if s.cur.Load() == b {
				s.startLocked() // in the background: this token is still good
			}
			s.mu.Unlock()
		}
		return b.bearer, nil
	}
	s.mu.Lock()
	if b := s.cur.Load(); b.usable(now) { // fetched meanwhile
		s.mu.Unlock()
		return b.bearer, nil
	}
	if s.err != nil && now.Before(s.errUntil) {
		err := s.err
		s.mu.Unlock()
		return "", err
	}
	done := s.startLocked()
	s.mu.Unlock()
	if done == nil {
		return "", &TokenError{Host: s.host, Err: errors.New("shutting down")}
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return "", &TokenError{Host: s.host, Err: errors.New("no token within the delivery's timeout")}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.cur.Load(); b != nil {
		return b.bearer, nil
	}
	if s.err != nil {
		return "", s.err
	}
	return "", &TokenError{Host: s.host, Err: errors.New("no token")}
}

// invalidate drops bearer, which the endpoint refused, unless a newer
// token has replaced it already (several deliveries may come back with
// the same 401).
func (s *tokenSource) invalidate(bearer string) {
	s.mu.Lock()
	if b := s.cur.Load(); b != nil && b.bearer == bearer {
		s.cur.Store(nil)
		s.err = nil // a token the endpoint refused is no token endpoint failure
	}
	s.mu.Unlock()
}

// startLocked starts a token request unless one is in flight, and
// returns the channel closed when it ends; nil after stop.
func (s *tokenSource) startLocked() chan struct{} {
	if s.fetching != nil {
		return s.fetching
	}
	if s.g.ctx.Err() != nil {
		return nil
	}
	done := make(chan struct{})
	s.fetching = done
	s.g.wg.Go(func() { s.fetch(done) })
	return done
}

// fetch makes one token request and keeps its result.
func (s *tokenSource) fetch(done chan struct{}) {
	defer close(done)
	ctx, cancel := context.WithTimeout(s.g.ctx, tokenTimeout)
	defer cancel()
	tok, err := s.request(ctx)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fetching = nil
	if err != nil {
		s.err, s.errUntil = err, now.Add(tokenErrorHold)
		if b := s.cur.Load(); b != nil {
			// A token still cached is used until it expires, and asked
			// for again then.
			s.cur.Store(&bearerToken{bearer: b.bearer, expiry: b.expiry})
		}
		s.g.log.Warn("oauth2 token request failed", "token_host", s.host, "err", err)
		return
	}
	s.err = nil
	b := &bearerToken{bearer: "Bearer " + tok.AccessToken}
	if !tok.Expiry.IsZero() {
		life := tok.Expiry.Sub(now)
		b.expiry = tok.Expiry.Add(-min(maxExpiryMargin, max(life/10, 0)))
		b.refresh = tok.Expiry.Add(-min(maxRefreshAhead, max(life/4, 0)))
	}
	s.cur.Store(b)
}

// request asks the token endpoint for a token with the client secret as
// the file holds it now.
func (s *tokenSource) request(ctx context.Context) (*oauth2.Token, error) {
	secret, err := readClientSecret(s.secretFile)
	if err != nil {
		return nil, &TokenError{Host: s.host, Err: err}
	}
	s.cfg.ClientSecret = secret
	tok, err := s.cfg.Token(context.WithValue(ctx, oauth2.HTTPClient, s.http))
	if err != nil {
		return nil, &TokenError{Host: s.host, Err: tokenCause(err)}
	}
	if tok.AccessToken == "" {
		return nil, &TokenError{Host: s.host, Err: errors.New("the answer holds no access_token")}
	}
	return tok, nil
}

// tokenCause keeps of a token request's error what may be logged: the
// token endpoint's status and error code, not its body (which may echo
// the request), and a transport error without the URL.
func tokenCause(err error) error {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		msg := "answered"
		if re.Response != nil {
			msg += " " + re.Response.Status
		}
		if re.ErrorCode != "" {
			msg += " (" + re.ErrorCode + ")"
		}
		return errors.New(msg)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// do makes the exchange with a bearer token: one refresh and one more
// send after a 401, within the same deadline.
func (s *tokenSource) do(c *fasthttp.Client, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	bearer, err := s.get(deadline)
	if err != nil {
		return err
	}
	req.Header.Set(fasthttp.HeaderAuthorization, bearer)
	if err := c.DoDeadline(req, resp, deadline); err != nil || resp.StatusCode() != fasthttp.StatusUnauthorized {
		return err
	}
	s.invalidate(bearer)
	if bearer, err = s.get(deadline); err != nil {
		return err
	}
	req.Header.Set(fasthttp.HeaderAuthorization, bearer)
	return c.DoDeadline(req, resp, deadline)
}
