package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io/fs"
	"math/big"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy/egress"
)

// Egress, tls and auth: each bad value is refused with its key
// named, files included, and a good config gives the proxy its settings.

// egressFiles writes the files the egress configs name and returns their
// paths by name: a CA, a client certificate and its key, another key, an
// expired certificate and its key, proxy credentials and a client secret.
func egressFiles(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(notAfter time.Time) (certPEM, keyPEM string) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "client"},
			NotBefore: notAfter.Add(-48 * time.Hour), NotAfter: notAfter, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(k)
		return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	}
	cert, key := leaf(time.Now().Add(time.Hour))
	_, otherKey := leaf(time.Now().Add(time.Hour))
	expired, expiredKey := leaf(time.Now().Add(-time.Hour))
	files := map[string]string{}
	for name, content := range map[string]string{
		"ca": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})), "cert": cert, "key": key, "other_key": otherKey,
		"expired": expired, "expired_key": expiredKey, "creds": "sluice:pr0xy-pass\n", "creds_bad": "no colon here\n",
		"secret": "client-s3cret\n", "empty": "\n", "not_pem": "hello\n",
	} {
		files[name] = filepath.Join(dir, name)
		writeFile(t, files[name], content)
	}
	files["missing"] = filepath.Join(dir, "no-such-file")
	return files
}

// egressYAML replaces {name} in doc with the file's path and writes it.
func egressYAML(t *testing.T, files map[string]string, doc string) string {
	t.Helper()
	for name, path := range files {
		doc = strings.ReplaceAll(doc, "{"+name+"}", path)
	}
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeFile(t, path, doc)
	return path
}

const egressSub = `
  - id: billing
    url: https://billing.example.com/hooks
    secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
`

func TestLoadConfigEgressBad(t *testing.T) {
	files := egressFiles(t)
	cases := []struct {
		name, doc string
		want      []string
		is        error
		notWant   []string
	}{
		{"proxy scheme", "egress: {proxy: socks5://p:1080}\n", []string{`egress.proxy: "socks5://p:1080": must be http://host:port or https://host:port`}, ErrInvalidValue, nil},
		{"proxy credentials in url", "egress: {proxy: 'http://bob:hunter2@p:3128'}\n", []string{`egress.proxy`, `use proxy_credentials_file`}, ErrInvalidValue, []string{"hunter2"}},
		{"proxy path", "egress: {proxy: 'http://p:3128/x'}\n", []string{`egress.proxy`, `only a scheme, host and port`}, ErrInvalidValue, nil},
		{"direct at the top", "egress: {direct: true}\n", []string{`egress.direct: true: only in a subscription's egress`}, ErrConflict, nil},
		{"no_proxy without proxy", "egress: {no_proxy: [a.example.com]}\n", []string{`egress.no_proxy: only with egress.proxy`}, ErrConflict, nil},
		{"no_proxy with a port", "egress: {proxy: 'http://p:3128', no_proxy: [ok.example.com, 'host:8080']}\n", []string{`egress.no_proxy[1]: "host:8080": must be a host name`}, ErrInvalidValue, nil},
		{"no_proxy bad cidr", "egress: {proxy: 'http://p:3128', no_proxy: ['10.0.0.0/33']}\n", []string{`egress.no_proxy[0]`}, ErrInvalidValue, nil},
		{"credentials missing", "egress: {proxy: 'http://p:3128', proxy_credentials_file: '{missing}'}\n", []string{`egress.proxy_credentials_file: "` + files["missing"] + `"`, "no such file"}, fs.ErrNotExist, nil},
		{"credentials malformed", "egress: {proxy: 'http://p:3128', proxy_credentials_file: '{creds_bad}'}\n", []string{`egress.proxy_credentials_file`, `must hold "user:password"`}, ErrInvalidValue, []string{"no colon here"}},
		{"proxy ca with http proxy", "egress: {proxy: 'http://p:3128', proxy_ca_file: '{ca}'}\n", []string{`egress.proxy_ca_file`, `only with an https:// proxy`}, ErrConflict, nil},
		{"proxy ca not pem", "egress: {proxy: 'https://p:3128', proxy_ca_file: '{not_pem}'}\n", []string{`egress.proxy_ca_file`, `holds no PEM certificate`}, ErrInvalidValue, nil},

		{"sub proxy empty", "subscriptions:" + egressSub + "    egress: {proxy: ''}\n", []string{`subscriptions[0].egress.proxy: "": must not be empty: set direct: true`}, ErrMissingValue, nil},
		{"sub egress without proxy", "subscriptions:" + egressSub + "    egress: {no_proxy: [a.example.com]}\n", []string{`subscriptions[0].egress.proxy: required: a subscription's egress replaces the top-level egress whole`}, ErrMissingValue, nil},
		{"sub direct and proxy", "subscriptions:" + egressSub + "    egress: {direct: true, proxy: 'http://p:3128'}\n", []string{`subscriptions[0].egress: direct: true sends the subscription directly`}, ErrConflict, nil},
		{"sub egress unknown key", "subscriptions:" + egressSub + "    egress: {proxy_url: 'http://p:3128'}\n", []string{`unknown key "subscriptions[0].egress.proxy_url"`}, ErrUnknownKey, nil},

		{"tls cert without key", "subscriptions:" + egressSub + "    tls: {client_cert_file: '{cert}'}\n", []string{`subscriptions[0].tls.client_key_file: required with client_cert_file`}, ErrMissingValue, nil},
		{"tls key without cert", "subscriptions:" + egressSub + "    tls: {client_key_file: '{key}'}\n", []string{`subscriptions[0].tls.client_cert_file: required with client_key_file`}, ErrMissingValue, nil},
		{"tls key does not match", "subscriptions:" + egressSub + "    tls: {client_cert_file: '{cert}', client_key_file: '{other_key}'}\n", []string{`subscriptions[0].tls.client_key_file: "` + files["other_key"] + `": private key does not match public key`}, ErrInvalidValue, nil},
		{"tls cert not pem", "subscriptions:" + egressSub + "    tls: {client_cert_file: '{not_pem}', client_key_file: '{key}'}\n", []string{`subscriptions[0].tls.client_cert_file`, `certificate`}, ErrInvalidValue, nil},
		{"tls key missing", "subscriptions:" + egressSub + "    tls: {client_cert_file: '{cert}', client_key_file: '{missing}'}\n", []string{`subscriptions[0].tls.client_key_file`, "no such file"}, fs.ErrNotExist, nil},
		{"tls cert expired", "subscriptions:" + egressSub + "    tls: {client_cert_file: '{expired}', client_key_file: '{expired_key}'}\n", []string{`subscriptions[0].tls.client_cert_file`, `the certificate expired at`}, ErrInvalidValue, nil},
		{"tls ca not pem", "subscriptions:" + egressSub + "    tls: {ca_file: '{not_pem}'}\n", []string{`subscriptions[0].tls.ca_file`, `holds no PEM certificate`}, ErrInvalidValue, nil},
		{"tls server name port", "subscriptions:" + egressSub + "    tls: {server_name: 'hooks.internal:443'}\n", []string{`subscriptions[0].tls.server_name: "hooks.internal:443": must be a host name`}, ErrInvalidValue, nil},
		{"tls on http", "subscriptions:\n  - id: plain\n    url: http://billing.example.com/hooks\n    secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n    tls: {ca_file: '{ca}'}\n", []string{`subscriptions[0].tls: only for an https:// url`}, ErrConflict, nil},
		{"tls unknown key", "subscriptions:" + egressSub + "    tls: {cert_file: '{cert}'}\n", []string{`unknown key "subscriptions[0].tls.cert_file"`}, ErrUnknownKey, nil},

		{"oauth2 no client id", "subscriptions:" + egressSub + "    auth: {oauth2: {token_url: 'https://idp.example.com/token', client_secret_file: '{secret}'}}\n", []string{`subscriptions[0].auth.oauth2.client_id: required with oauth2`}, ErrMissingValue, nil},
		{"oauth2 http token url", "subscriptions:" + egressSub + "    auth: {oauth2: {token_url: 'http://idp.example.com/token', client_id: c, client_secret_file: '{secret}'}}\n", []string{`subscriptions[0].auth.oauth2.token_url`, `must be https`}, ErrInvalidValue, nil},
		{"oauth2 secret missing", "subscriptions:" + egressSub + "    auth: {oauth2: {token_url: 'https://idp.example.com/token', client_id: c, client_secret_file: '{missing}'}}\n", []string{`subscriptions[0].auth.oauth2.client_secret_file`, "no such file"}, fs.ErrNotExist, nil},
		{"oauth2 secret empty", "subscriptions:" + egressSub + "    auth: {oauth2: {token_url: 'https://idp.example.com/token', client_id: c, client_secret_file: '{empty}'}}\n", []string{`subscriptions[0].auth.oauth2.client_secret_file`, "is empty"}, ErrInvalidValue, nil},
		{"oauth2 bad scope", "subscriptions:" + egressSub + "    auth: {oauth2: {token_url: 'https://idp.example.com/token', client_id: c, client_secret_file: '{secret}', scopes: [ok, 'a b']}}\n", []string{`subscriptions[0].auth.oauth2.scopes[1]: "a b": must be a scope token`}, ErrInvalidValue, nil},
		{"oauth2 and authorization header", "subscriptions:" + egressSub + "    headers: {Authorization: 'Bearer x'}\n    auth: {oauth2: {token_url: 'https://idp.example.com/token', client_id: c, client_secret_file: '{secret}'}}\n", []string{`subscriptions[0].headers[Authorization]: auth.oauth2 sets Authorization itself`}, ErrConflict, nil},
		{"oauth2 unknown key", "subscriptions:" + egressSub + "    auth: {oauth2: {token_endpoint: x}}\n", []string{`unknown key "subscriptions[0].auth.oauth2.token_endpoint"`}, ErrUnknownKey, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(egressYAML(t, files, c.doc), nil, nil)
			if err == nil {
				t.Fatalf("loaded:\n%s", c.doc)
			}
			msg := err.Error()
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q\ndoes not contain %q", msg, w)
				}
			}
			for _, s := range append(c.notWant, "pr0xy-pass", "client-s3cret", "PRIVATE KEY") {
				if strings.Contains(msg, s) {
					t.Errorf("error %q reveals %q", msg, s)
				}
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, c.is)
			}
			if !errors.As(err, new(*ValidationError)) {
				t.Errorf("error %T is not a *ValidationError", err)
			}
		})
	}
}

// TestLoadConfigEgressGood: the keys reach the proxy's settings: the
// top-level egress (from the file and the environment), a subscription's
// own proxy, direct, tls and oauth2; printing shows the file names, never
// what is in them.
func TestLoadConfigEgressGood(t *testing.T) {
	files := egressFiles(t)
	path := egressYAML(t, files, `
egress:
  proxy: http://proxy.internal:3128
  proxy_credentials_file: '{creds}'
  no_proxy: [internal.example.com, .svc.cluster.local, 10.0.0.0/8]
subscriptions:
  - id: a
    url: https://a.example.com/hooks
    secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
    tls: {client_cert_file: '{cert}', client_key_file: '{key}', ca_file: '{ca}', server_name: hooks.internal}
    auth:
      oauth2: {token_url: 'https://idp.example.com/token', client_id: sluice, client_secret_file: '{secret}', scopes: [webhooks]}
  - id: b
    url: https://b.example.com/hooks
    secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
    egress: {direct: true}
  - id: c
    url: http://c.example.com/hooks
    secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
    egress: {proxy: 'https://other-proxy:8443', proxy_ca_file: '{ca}'}
  - id: d
    url: https://d.example.com/hooks
    secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
`)
	cfg, err := Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := &egress.Egress{Proxy: "http://proxy.internal:3128", CredentialsFile: files["creds"], NoProxy: []string{"internal.example.com", ".svc.cluster.local", "10.0.0.0/8"}}
	if got := cfg.ProxyEgress(); !reflect.DeepEqual(got, want) {
		t.Errorf("top-level egress %+v, want %+v", got, want)
	}
	a, b, c, d := &cfg.Subscriptions[0], &cfg.Subscriptions[1], &cfg.Subscriptions[2], &cfg.Subscriptions[3]
	if a.ProxyEgress() != nil || d.ProxyEgress() != nil {
		t.Error("subscriptions without egress must take the top-level one (nil)")
	}
	if e := b.ProxyEgress(); e == nil || !reflect.DeepEqual(*e, egress.Egress{}) {
		t.Errorf("direct: %+v, want an Egress without proxy", e)
	}
	if e := c.ProxyEgress(); e == nil || e.Proxy != "https://other-proxy:8443" || e.CAFile != files["ca"] || e.NoProxy != nil {
		t.Errorf("own proxy: %+v", e)
	}
	if got := a.ClientTLS(); *got != (egress.ClientTLS{CertFile: files["cert"], KeyFile: files["key"], CAFile: files["ca"], ServerName: "hooks.internal"}) {
		t.Errorf("tls %+v", got)
	}
	if got := a.OAuth2(); got == nil || got.ClientID != "sluice" || got.ClientSecretFile != files["secret"] || !reflect.DeepEqual(got.Scopes, []string{"webhooks"}) {
		t.Errorf("oauth2 %+v", got)
	}
	if b.ClientTLS() != nil || b.OAuth2() != nil {
		t.Error("b sets neither tls nor auth")
	}
	out := cfg.String()
	for _, w := range []string{files["creds"], files["cert"], files["secret"], "proxy.internal:3128", "direct: true", "server_name: hooks.internal"} {
		if !strings.Contains(out, w) {
			t.Errorf("printed config lacks %q:\n%s", w, out)
		}
	}
	for _, leak := range []string{"pr0xy-pass", "client-s3cret", "PRIVATE KEY"} {
		if strings.Contains(out, leak) {
			t.Errorf("printed config reveals %q", leak)
		}
	}
	// Printed, it loads back to the same settings.
	again, err := Load(egressYAML(t, files, strings.ReplaceAll(out, "'[redacted]'", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")), nil, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !reflect.DeepEqual(again.ProxyEgress(), cfg.ProxyEgress()) || *again.Subscriptions[0].ClientTLS() != *a.ClientTLS() || again.Subscriptions[1].ProxyEgress() == nil {
		t.Error("printed and loaded again, the egress settings differ")
	}

	env, err := Load("", []string{"SLUICE_EGRESS__PROXY=https://p.example:8443", "SLUICE_EGRESS__NO_PROXY=a.example,10.0.0.0/8"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if e := env.ProxyEgress(); e == nil || e.Proxy != "https://p.example:8443" || !reflect.DeepEqual(e.NoProxy, []string{"a.example", "10.0.0.0/8"}) {
		t.Errorf("egress from the environment: %+v", e)
	}
}

// TestParseSubscriptionRefusesEgress: the API cannot set egress, tls or
// auth: they name files on the sidecar's host, and the egress is the
// operator's.
func TestParseSubscriptionRefusesEgress(t *testing.T) {
	for _, key := range []string{"egress", "tls", "auth"} {
		doc := `{"id":"a","url":"https://a.example.com/h","secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw","` + key + `":{}}`
		_, err := ParseSubscription([]byte(doc))
		if err == nil || !strings.HasPrefix(err.Error(), key+": not accepted over the API") {
			t.Errorf("%s: %v", key, err)
		}
	}
}
