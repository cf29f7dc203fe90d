package main

import (
	"io"
	"log/slog"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/proxy/egress"
)

// TestEgressWiring: the top-level egress becomes Options.Egress, and a
// subscription's own egress, tls and auth reach its delivery.Subscription.
func TestEgressWiring(t *testing.T) {
	dir := t.TempDir()
	creds, secret := filepath.Join(dir, "creds"), filepath.Join(dir, "secret")
	writeFile(t, creds, "sluice:pass\n")
	writeFile(t, secret, "s3cret\n")
	path := filepath.Join(dir, "sluice.json")
	writeFile(t, path, `{"egress": {"proxy": "http://proxy.internal:3128", "proxy_credentials_file": "`+creds+`", "no_proxy": [".corp"]},
		"subscriptions": [
			{"id": "a", "url": "https://a.example.com/h", "secret": "`+e2eSecret+`",
			 "tls": {"server_name": "hooks.internal"},
			 "auth": {"oauth2": {"token_url": "https://idp.example.com/token", "client_id": "sluice", "client_secret_file": "`+secret+`"}}},
			{"id": "b", "url": "https://b.example.com/h", "secret": "`+e2eSecret+`", "egress": {"direct": true}}]}`)
	cfg, err := config.Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := serverOptions(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if want := (&egress.Egress{Proxy: "http://proxy.internal:3128", CredentialsFile: creds, NoProxy: []string{".corp"}}); !reflect.DeepEqual(opts.Egress, want) {
		t.Errorf("Options.Egress = %+v, want %+v", opts.Egress, want)
	}
	subs := subscriptions(cfg)
	a, b := subs[0], subs[1]
	if a.Egress != nil || a.TLS == nil || a.TLS.ServerName != "hooks.internal" || a.Auth == nil || a.Auth.ClientSecretFile != secret {
		t.Errorf("a: egress %+v tls %+v auth %+v", a.Egress, a.TLS, a.Auth)
	}
	if b.Egress == nil || b.Egress.Proxy != "" || b.TLS != nil || b.Auth != nil {
		t.Errorf("b: egress %+v (want direct) tls %+v auth %+v", b.Egress, b.TLS, b.Auth)
	}
}
