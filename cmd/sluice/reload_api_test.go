package main

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// TestReloadNeverTouchesAPISubscriptions: the file owns its
// subscriptions and only those. A reload whose list lacks an API
// subscription keeps it as it is, delivering; one that names an API
// subscription's id is refused whole, with ErrManagedByAPI naming it,
// and changes nothing (not the file's other changes either); an empty
// file drains the file's and leaves the API's.
func TestReloadNeverTouchesAPISubscriptions(t *testing.T) {
	tb := startReceiver(t)
	k, _ := signing.ParseSecret(e2eSecret)
	file := func(id, path string) *delivery.Subscription {
		return &delivery.Subscription{ID: id, URL: tb.URL() + path, Secrets: []signing.Secret{k}}
	}
	s := openAPISidecar(t, proxy.Options{AdminToken: apiOpToken, Subscriptions: []*delivery.Subscription{file("filed", "/filed")}})
	s.mustCall(t, "", "POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "api", "url": tb.URL() + "/api", "secret": e2eSecret,
		"headers": map[string]string{"X-From": "api"}}), 201, nil)
	apiLine := func() string {
		t.Helper()
		for _, line := range strings.Split(s.state(t), "\n") {
			if strings.HasPrefix(line, "api ") {
				return line
			}
		}
		t.Fatal("the API's subscription is gone")
		return ""
	}
	apiBefore := apiLine()
	delivered := func(what string, want map[string]int64) {
		t.Helper()
		waitFor(t, tb, what, func(m map[string]testbed.PathStats) bool {
			for p, n := range want {
				if m[p].Unique < n {
					return false
				}
			}
			return true
		})
		eventually(t, what+": every lane settled", func() bool {
			for _, l := range s.srv.Lanes() {
				if l.Backlog != 0 || l.InFlight != 0 {
					return false
				}
			}
			return true
		})
		st := tb.Stats()
		for p, n := range want {
			if st[p].Unique != n {
				t.Errorf("%s: %s received %d, want %d", what, p, st[p].Unique, n)
			}
		}
	}

	// A file that does not name it (it never does) keeps it.
	if err := s.srv.Reload([]*delivery.Subscription{file("filed", "/filed"), file("added", "/added")}); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if got := apiLine(); got != apiBefore {
		t.Fatalf("a reload changed the API's subscription:\n%s\nto\n%s", apiBefore, got)
	}
	s.publish(t, "t.e", "ev-1")
	delivered("after a reload without it", map[string]int64{"/api": 1, "/filed": 1, "/added": 1})

	// A file that names it is refused whole.
	before := s.state(t)
	err := s.srv.Reload([]*delivery.Subscription{file("filed", "/filed-moved"), file("api", "/hijack"), file("added", "/added"), file("brandnew", "/brandnew")})
	if !errors.Is(err, delivery.ErrManagedByAPI) || !strings.Contains(err.Error(), "api") {
		t.Fatalf("a reload naming the API's subscription: %v, want ErrManagedByAPI naming it", err)
	}
	if after := s.state(t); after != before {
		t.Fatalf("a refused reload changed the subscriptions:\nbefore:\n%safter:\n%s", before, after)
	}
	s.publish(t, "t.e", "ev-2")
	delivered("after the refused reload", map[string]int64{"/api": 2, "/filed": 2, "/added": 2, "/hijack": 0, "/brandnew": 0, "/filed-moved": 0})

	// An empty file: the file's drain and go, the API's stays.
	if err := s.srv.Reload(nil); err != nil {
		t.Fatalf("reload of an empty file: %v", err)
	}
	s.publish(t, "t.e", "ev-3")
	delivered("after an empty file", map[string]int64{"/api": 3, "/filed": 2, "/added": 2})
	if got := apiLine(); got != apiBefore {
		t.Fatalf("an empty file changed the API's subscription:\n%s\nto\n%s", apiBefore, got)
	}
	eventually(t, "the file's subscriptions to retire", func() bool {
		ids := s.ids(t, apiOpToken, "")
		return slices.Equal(ids, []string{"api"})
	})
	if r, ok := s.lane("api"); !ok || r.ManagedBy != api.ManagedByAPI || r.State != "active" {
		t.Fatalf("the API's lane: %+v", r)
	}
}

// TestReloadReplacesTenantTokens: a reload (SIGHUP, or the file changing)
// applies admin.tokens as well as the subscriptions: a token the file no
// longer lists is refused from then on, one it adds works.
func TestReloadReplacesTenantTokens(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	write := func(tenantToken string) {
		t.Helper()
		yaml := "listen: 127.0.0.1:0\ndata_dir: " + filepath.Join(dir, "data") + "\nadmin:\n  listen: 127.0.0.1:0\n  token: operator-token-0123456789\n" +
			"  tokens: [{token: " + tenantToken + ", tenant: acme}]\n"
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("acme-token-one-0123456789")
	load := func() (*config.Config, error) { return config.Load(path, nil, nil) }
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := proxy.New(serverOptions(cfg, subscriptions(cfg), log, nil))
	if err := srv.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(t.Context()) })
	whoami := func(token string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.AdminURL()+"/v1/whoami", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := whoami("acme-token-one-0123456789"); code != 200 {
		t.Fatalf("the configured token: %d", code)
	}
	write("acme-token-two-0123456789")
	reload(srv, cfg, load, log)
	if code := whoami("acme-token-one-0123456789"); code != 401 {
		t.Errorf("a token dropped from admin.tokens, after the reload: %d, want 401", code)
	}
	if code := whoami("acme-token-two-0123456789"); code != 200 {
		t.Errorf("a token added to admin.tokens, after the reload: %d, want 200", code)
	}
}
