package config

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/sluicehq/sluice/proxy/egress"
)

// Egress and endpoint authentication: the forward proxy
// deliveries leave through, a subscription's client certificate and CAs,
// and its OAuth2 client credentials. The files named are read and checked
// here with the proxy's own loaders (egress.CheckEgress, CheckClientTLS,
// CheckOAuth2), so a bad file is refused at start-up and at reload with
// its key named; the proxy reads them again when it uses them, and when
// they change.

// EgressConfig routes deliveries through a forward proxy: the top-level
// egress applies to every subscription without its own (and to the
// operational webhook); a subscription's egress replaces it whole (keys it
// leaves out are not inherited). Read at start: the top-level egress is
// not reloaded, a subscription's is.
type EgressConfig struct {
	// Proxy is "http://host:port" or "https://host:port" (TLS to the
	// proxy too), without credentials. Empty at the top level means
	// direct; in a subscription's egress it is required unless Direct.
	Proxy string `koanf:"proxy"`
	// ProxyCredentialsFile holds "user:password" on one line, sent as
	// Proxy-Authorization: Basic. Only with Proxy.
	ProxyCredentialsFile string `koanf:"proxy_credentials_file"`
	// ProxyCAFile holds the PEM certificates that verify an https://
	// proxy instead of the system's roots. Only with an https:// Proxy.
	ProxyCAFile string `koanf:"proxy_ca_file"`
	// NoProxy lists the endpoint hosts reached directly: a host name (and
	// its subdomains), ".suffix" (subdomains only), an IP address, a CIDR
	// prefix (matching IP-literal hosts only) or "*". Only with Proxy.
	NoProxy []string `koanf:"no_proxy"`
	// Direct, in a subscription's egress only, sends it directly, whatever
	// the top-level egress says. No other egress key goes with it.
	Direct bool `koanf:"direct"`
}

// EndpointTLSConfig is a subscription's TLS to its https endpoint
// (egress.ClientTLS). Every file must exist and parse; the client
// certificate and key go together and match, and the certificate must not
// have expired.
type EndpointTLSConfig struct {
	// ClientCertFile and ClientKeyFile are the client certificate (PEM,
	// leaf first) and its key, for endpoints that require mTLS.
	ClientCertFile string `koanf:"client_cert_file"`
	ClientKeyFile  string `koanf:"client_key_file"`
	// CAFile holds the PEM certificates that verify the endpoint instead
	// of the system's roots.
	CAFile string `koanf:"ca_file"`
	// ServerName is the name the endpoint's certificate must carry (and
	// the SNI) instead of the URL's host.
	ServerName string `koanf:"server_name"`
}

// AuthConfig is how a subscription authenticates to its endpoint beyond
// the signature.
type AuthConfig struct {
	// OAuth2 sends a bearer token from a client-credentials grant.
	OAuth2 OAuth2Config `koanf:"oauth2"`
}

// OAuth2Config is an OAuth 2.0 client-credentials grant (egress.OAuth2).
// TokenURL, ClientID and ClientSecretFile are required together.
type OAuth2Config struct {
	// TokenURL is the token endpoint: https, or http on a loopback host.
	TokenURL string `koanf:"token_url"`
	// ClientID identifies sluice to it.
	ClientID string `koanf:"client_id"`
	// ClientSecretFile holds the client secret on one line.
	ClientSecretFile string `koanf:"client_secret_file"`
	// Scopes are requested with each token (RFC 6749 scope tokens).
	Scopes []string `koanf:"scopes"`
}

// errFilesNotOverAPI refuses egress, tls and auth in a subscription
// document of the API: they name files on the sidecar's host, and the
// egress is the operator's to choose, not a tenant's to bypass.
var errFilesNotOverAPI = invalidf("not accepted over the API: it names files on the sidecar's host; set it in the config file")

// isZero reports whether no egress key is set.
func (e EgressConfig) isZero() bool {
	return e.Proxy == "" && e.ProxyCredentialsFile == "" && e.ProxyCAFile == "" && e.NoProxy == nil && !e.Direct
}

// ProxyEgress returns the top-level egress as the proxy takes it, or nil
// for direct delivery.
func (c *Config) ProxyEgress() *egress.Egress {
	if c.Egress.Proxy == "" {
		return nil
	}
	return c.Egress.proxy()
}

func (e EgressConfig) proxy() *egress.Egress {
	if e.Direct {
		return &egress.Egress{}
	}
	return &egress.Egress{Proxy: e.Proxy, CredentialsFile: e.ProxyCredentialsFile, CAFile: e.ProxyCAFile, NoProxy: e.NoProxy}
}

// ProxyEgress returns the subscription's own egress as the proxy takes it
// (a Proxy of "" for direct: true), or nil when it has none and the
// top-level egress applies.
func (s *SubscriptionConfig) ProxyEgress() *egress.Egress {
	if !s.hasEgress() {
		return nil
	}
	return s.Egress.proxy()
}

// hasEgress reports whether the subscription sets an egress of its own.
func (s *SubscriptionConfig) hasEgress() bool { return !s.Egress.isZero() || s.explicit.has(keyEgress) }

// ClientTLS returns the subscription's TLS settings as the proxy takes
// them, or nil for the defaults.
func (s *SubscriptionConfig) ClientTLS() *egress.ClientTLS {
	t := s.TLS
	if t == (EndpointTLSConfig{}) {
		return nil
	}
	return &egress.ClientTLS{CertFile: t.ClientCertFile, KeyFile: t.ClientKeyFile, CAFile: t.CAFile, ServerName: t.ServerName}
}

// OAuth2 returns the subscription's OAuth2 grant as the proxy takes it, or
// nil for none.
func (s *SubscriptionConfig) OAuth2() *egress.OAuth2 {
	o := s.Auth.OAuth2
	if o.isZero() {
		return nil
	}
	return &egress.OAuth2{TokenURL: o.TokenURL, ClientID: o.ClientID, ClientSecretFile: o.ClientSecretFile, Scopes: o.Scopes}
}

func (o OAuth2Config) isZero() bool {
	return o.TokenURL == "" && o.ClientID == "" && o.ClientSecretFile == "" && o.Scopes == nil
}

// validate checks an egress at p ("egress" or a subscription's
// "subscriptions[i].egress"); sub says it is a subscription's.
func (e EgressConfig) validate(p string, sub bool, explicitProxy bool) error {
	if !sub && e.Direct {
		return fieldErr(p+".direct", true, newReason(ErrConflict, "only in a subscription's egress; leave egress.proxy out to deliver directly"))
	}
	if e.Direct {
		if e.Proxy != "" || e.ProxyCredentialsFile != "" || e.ProxyCAFile != "" || e.NoProxy != nil || explicitProxy {
			return fieldErr(p, nil, newReason(ErrConflict, "direct: true sends the subscription directly; set no other egress key with it"))
		}
		return nil
	}
	if e.Proxy == "" {
		switch {
		case sub && explicitProxy:
			return fieldErr(p+".proxy", "", newReason(ErrMissingValue, "must not be empty: set direct: true to deliver directly, or leave egress out to use the top-level egress"))
		case sub:
			return fieldErr(p+".proxy", nil, newReason(ErrMissingValue, "required: a subscription's egress replaces the top-level egress whole; set proxy, or direct: true"))
		}
		for key, set := range map[string]bool{"proxy_credentials_file": e.ProxyCredentialsFile != "", "proxy_ca_file": e.ProxyCAFile != "", "no_proxy": e.NoProxy != nil} {
			if set {
				return fieldErr(p+"."+key, nil, newReason(ErrConflict, "only with %s.proxy", p))
			}
		}
		return nil
	}
	u, err := url.Parse(e.Proxy)
	switch {
	case err != nil:
		return fieldErr(p+".proxy", safeURL(e.Proxy), invalidf("not a valid URL"))
	case u.Scheme != "http" && u.Scheme != "https":
		return fieldErr(p+".proxy", safeURL(e.Proxy), invalidf(`must be http://host:port or https://host:port, like "http://proxy.internal:3128"`))
	case u.Opaque != "" || u.Hostname() == "":
		return fieldErr(p+".proxy", safeURL(e.Proxy), invalidf("must have a host"))
	case u.User != nil:
		return fieldErr(p+".proxy", safeURL(e.Proxy), invalidf("must not contain credentials (user:password@); use proxy_credentials_file"))
	case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || strings.Contains(e.Proxy, "#"):
		return fieldErr(p+".proxy", safeURL(e.Proxy), invalidf("must be only a scheme, host and port"))
	}
	if e.ProxyCAFile != "" && u.Scheme != "https" {
		return fieldErr(p+".proxy_ca_file", e.ProxyCAFile, newReason(ErrConflict, "only with an https:// proxy"))
	}
	for i, h := range e.NoProxy {
		if !validNoProxy(h) {
			return fieldErr(fmt.Sprintf("%s.no_proxy[%d]", p, i), h, invalidf(`must be a host name, ".suffix", an IP address, a CIDR prefix or "*" (no scheme, no port)`))
		}
	}
	return fileErr(p, egress.CheckEgress(egress.Egress{Proxy: e.Proxy, CredentialsFile: e.ProxyCredentialsFile, CAFile: e.ProxyCAFile}))
}

var hostLabels = regexp.MustCompile(`^\.?[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?$`)

// validNoProxy accepts the forms egress.Egress.NoProxy matches.
func validNoProxy(h string) bool {
	switch {
	case h == "*":
		return true
	case strings.Contains(h, "/"):
		_, err := netip.ParsePrefix(h)
		return err == nil
	}
	if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return true
	}
	return len(h) <= 253 && hostLabels.MatchString(h)
}

// fileErr turns a proxy loader's error into the ValidationError of the key
// under p it names; one that names no file falls on p.
func fileErr(p string, err error) error {
	if err == nil {
		return nil
	}
	var fe *egress.FileError
	if errors.As(err, &fe) {
		return fieldErr(p+"."+fe.Key, fe.Path, &reason{kind: ErrInvalidValue, msg: fe.Err.Error(), cause: err})
	}
	return fieldErr(p, nil, &reason{kind: ErrInvalidValue, msg: err.Error(), cause: err})
}

// validateEndpoint checks the subscription's egress, tls and auth (p is
// its key) and reads their files.
func (s *SubscriptionConfig) validateEndpoint(p string) error {
	if s.hasEgress() {
		if err := s.Egress.validate(p+".egress", true, s.explicit.has(keyEgressProxy)); err != nil {
			return err
		}
	}
	if err := s.validateTLS(p + ".tls"); err != nil {
		return err
	}
	return s.validateAuth(p + ".auth.oauth2")
}

func (s *SubscriptionConfig) validateTLS(p string) error {
	t := s.TLS
	if t == (EndpointTLSConfig{}) {
		return nil
	}
	if u, err := url.Parse(s.URL); err == nil && u.Scheme != "https" {
		return fieldErr(p, nil, newReason(ErrConflict, "only for an https:// url"))
	}
	switch {
	case t.ClientCertFile != "" && t.ClientKeyFile == "":
		return fieldErr(p+".client_key_file", nil, newReason(ErrMissingValue, "required with client_cert_file: the client certificate's private key"))
	case t.ClientKeyFile != "" && t.ClientCertFile == "":
		return fieldErr(p+".client_cert_file", nil, newReason(ErrMissingValue, "required with client_key_file: the client certificate"))
	}
	if n := t.ServerName; n != "" && !validServerName(n) {
		return fieldErr(p+".server_name", n, invalidf("must be a host name or an IP address, without a port"))
	}
	return fileErr(p, egress.CheckClientTLS(*s.ClientTLS(), time.Now()))
}

func validServerName(n string) bool {
	if _, err := netip.ParseAddr(n); err == nil {
		return true
	}
	return !strings.HasPrefix(n, ".") && len(n) <= 253 && hostLabels.MatchString(n)
}

func (s *SubscriptionConfig) validateAuth(p string) error {
	o := s.Auth.OAuth2
	if o.isZero() {
		return nil
	}
	for _, r := range []struct{ key, v string }{{"token_url", o.TokenURL}, {"client_id", o.ClientID}, {"client_secret_file", o.ClientSecretFile}} {
		if r.v == "" {
			return fieldErr(p+"."+r.key, nil, newReason(ErrMissingValue, "required with oauth2"))
		}
	}
	if err := validateURL(p+".token_url", o.TokenURL); err != nil {
		return err
	}
	if u, _ := url.Parse(o.TokenURL); u.Scheme != "https" && !loopbackHost(u.Hostname()) {
		return fieldErr(p+".token_url", safeURL(o.TokenURL), invalidf("must be https: the client secret goes in the request (http is accepted on a loopback host only)"))
	}
	if !validHeaderValue(o.ClientID) || strings.ContainsAny(o.ClientID, "\t") {
		return fieldErr(p+".client_id", o.ClientID, invalidf("must not contain control characters"))
	}
	for i, sc := range o.Scopes {
		if !validScope(sc) {
			return fieldErr(fmt.Sprintf("%s.scopes[%d]", p, i), sc, invalidf(`must be a scope token: printable ASCII without spaces, '"' or '\'`))
		}
	}
	for name := range s.Headers {
		if strings.EqualFold(name, "Authorization") {
			return fieldErr(strings.TrimSuffix(p, ".auth.oauth2")+".headers["+name+"]", nil, newReason(ErrConflict, "auth.oauth2 sets Authorization itself"))
		}
	}
	return fileErr(p, egress.CheckOAuth2(*s.OAuth2()))
}

// validScope is RFC 6749 §3.3's scope-token: %x21 / %x23-5B / %x5D-7E.
func validScope(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// loopbackHost reports localhost and loopback addresses.
func loopbackHost(h string) bool {
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(h)
	return err == nil && ip.Unmap().IsLoopback()
}

// egressMap is an egress as the config file spells it (nothing secret:
// file names), or nil when unset.
func (e EgressConfig) egressMap() map[string]any {
	if e.isZero() {
		return nil
	}
	m := map[string]any{}
	if e.Direct {
		m["direct"] = true
	}
	for k, v := range map[string]string{"proxy": safeURL(e.Proxy), "proxy_credentials_file": e.ProxyCredentialsFile, "proxy_ca_file": e.ProxyCAFile} {
		if v != "" {
			m[k] = v
		}
	}
	if e.NoProxy != nil {
		m["no_proxy"] = e.NoProxy
	}
	return m
}

// endpointToMap adds the subscription's egress, tls and auth to m, its
// printed form.
func (s SubscriptionConfig) endpointToMap(m map[string]any) {
	if e := s.Egress.egressMap(); e != nil {
		m["egress"] = e
	}
	tlsm := map[string]any{}
	for k, v := range map[string]string{"client_cert_file": s.TLS.ClientCertFile, "client_key_file": s.TLS.ClientKeyFile, "ca_file": s.TLS.CAFile, "server_name": s.TLS.ServerName} {
		if v != "" {
			tlsm[k] = v
		}
	}
	if len(tlsm) > 0 {
		m["tls"] = tlsm
	}
	if o := s.Auth.OAuth2; !o.isZero() {
		om := map[string]any{"token_url": safeURL(o.TokenURL), "client_id": o.ClientID, "client_secret_file": o.ClientSecretFile}
		if o.Scopes != nil {
			om["scopes"] = o.Scopes
		}
		m["auth"] = map[string]any{"oauth2": om}
	}
}
