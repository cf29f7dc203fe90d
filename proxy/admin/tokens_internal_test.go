package admin

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// tokenWorld is a sidecar with an operator token, acme's config token
// and a clock the test moves.
type tokenWorld struct {
	s   *sidecar
	off atomic.Int64
}

func startTokenWorld(t *testing.T) *tokenWorld {
	t.Helper()
	w := &tokenWorld{}
	w.s = newSidecar(Options{AdminListen: "127.0.0.1:0", DataDir: t.TempDir(),
		AdminToken: "op", TenantTokens: []TenantToken{{Token: "acme-conf", Tenant: "acme"}},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now:    func() time.Time { return time.Now().Add(time.Duration(w.off.Load())) }})
	if err := w.s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.s.Close(t.Context()) })
	return w
}

func (w *tokenWorld) call(t *testing.T, token, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, w.s.AdminURL()+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (w *tokenWorld) issue(t *testing.T, tenant, body string) api.TokenAnswer {
	t.Helper()
	code, ans := w.call(t, "op", "POST", "/v1/tenants/"+tenant+"/tokens", body)
	var tok api.TokenAnswer
	if code != http.StatusCreated || json.Unmarshal([]byte(ans), &tok) != nil {
		t.Fatalf("issue a token of %s (%s): %d %s", tenant, body, code, ans)
	}
	return tok
}

// works reports whether token acts for tenant, and the refusal's body.
func (w *tokenWorld) works(t *testing.T, token, tenant string) (bool, string) {
	t.Helper()
	code, body := w.call(t, token, "GET", "/v1/whoami", "")
	var who api.WhoAmI
	json.Unmarshal([]byte(body), &who)
	return code == http.StatusOK && who.Tenant == tenant, body
}

func (w *tokenWorld) list(t *testing.T, path string) []api.TokenInfo {
	t.Helper()
	code, body := w.call(t, "op", "GET", path, "")
	var l api.TokenList
	if code != http.StatusOK || json.Unmarshal([]byte(body), &l) != nil {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	return l.Tokens
}

// TestTenantTokenRevokeAndExpiry: an issued token has an id, a creation
// time and an optional expiry; the operator lists and revokes tokens,
// never seeing a token or its hash; a revoked token stops working at
// once, an expired one is refused 401, and a record removed by another
// node stops working here within tokenRecheck. None of these routes
// exists for a tenant's token.
func TestTenantTokenRevokeAndExpiry(t *testing.T) {
	w := startTokenWorld(t)
	plain := w.issue(t, "acme", "")
	if !validTokenID(plain.ID) || plain.CreatedAt.IsZero() || plain.ExpiresAt != nil || tokenID(tokenKey(plain.Token)) != plain.ID {
		t.Fatalf("issued %+v: want an id of the token's hash, a creation time, no expiry", plain)
	}
	if ok, body := w.works(t, plain.Token, "acme"); !ok {
		t.Fatalf("the issued token: %s", body)
	}

	t.Run("expiry", func(t *testing.T) {
		short := w.issue(t, "acme", `{"expires_in":"1h"}`)
		if short.ExpiresAt == nil || short.ExpiresAt.Sub(short.CreatedAt) < time.Hour-time.Second || short.ExpiresAt.Sub(short.CreatedAt) > time.Hour {
			t.Fatalf("expires_in 1h: %+v", short)
		}
		at := w.issue(t, "acme", `{"expires_at":"`+time.Now().Add(48*time.Hour).UTC().Format(time.RFC3339)+`"}`)
		for _, tok := range []string{short.Token, at.Token} {
			if ok, body := w.works(t, tok, "acme"); !ok {
				t.Fatalf("before its expiry: %s", body)
			}
		}
		w.off.Add(int64(time.Hour + time.Second))
		defer w.off.Store(0)
		code, body := w.call(t, short.Token, "GET", "/v1/subscriptions", "")
		if code != http.StatusUnauthorized || !strings.Contains(body, "expired") {
			t.Errorf("an hour later, the 1h token: %d %s; want 401 naming the expiry", code, body)
		}
		if ok, body := w.works(t, at.Token, "acme"); !ok {
			t.Errorf("the 48h token after an hour: %s", body)
		}
		for _, ti := range w.list(t, "/v1/tenants/acme/tokens") {
			if ti.ID == short.ID && !ti.Expired {
				t.Errorf("the list does not show %s expired: %+v", ti.ID, ti)
			}
		}
		for _, bad := range []struct{ body, key string }{
			{`{"expires_in":"forever"}`, "expires_in"},
			{`{"expires_in":"-1h"}`, "expires_in"},
			{`{"expires_in":"9000h"}`, "expires_in"},
			{`{"expires_at":"2001-01-01T00:00:00Z"}`, "expires_at"},
			{`{"expires_in":"1h","expires_at":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `"}`, "expires_in and expires_at"},
			{`{"expires":"1h"}`, "expires"},
		} {
			if code, body := w.call(t, "op", "POST", "/v1/tenants/acme/tokens", bad.body); code != http.StatusBadRequest || !strings.Contains(body, bad.key) {
				t.Errorf("issue with %s: %d %s; want 400 naming %s", bad.body, code, body, bad.key)
			}
		}
	})

	globex := w.issue(t, "globex", "")
	t.Run("list", func(t *testing.T) {
		acme := w.list(t, "/v1/tenants/acme/tokens")
		if len(acme) != 4 || acme[0].Source != "config" || acme[0].ID != "admin.tokens[0]" || acme[1].ID != plain.ID || acme[1].Source != "issued" {
			t.Fatalf("acme's tokens: %+v; want the config one, then the issued ones oldest first", acme)
		}
		all := w.list(t, "/v1/tokens")
		if len(all) != 5 || all[4].ID != globex.ID || all[4].Tenant != "globex" {
			t.Fatalf("every token: %+v", all)
		}
		_, body := w.call(t, "op", "GET", "/v1/tokens", "")
		for _, secret := range []string{plain.Token, globex.Token, "acme-conf", strings.TrimPrefix(tokenKey(plain.Token), tokenKeyPrefix)} {
			if strings.Contains(body, secret) {
				t.Errorf("the list shows a token or its hash %q:\n%s", secret, body)
			}
		}
	})

	t.Run("tenants see none of it", func(t *testing.T) {
		for _, r := range []struct{ method, path string }{
			{"GET", "/v1/tokens"}, {"GET", "/v1/tenants/acme/tokens"}, {"DELETE", "/v1/tenants/acme/tokens/" + plain.ID},
		} {
			for _, tok := range []string{"acme-conf", plain.Token} {
				if code, body := w.call(t, tok, r.method, r.path, ""); code != http.StatusNotFound {
					t.Errorf("%s %s with acme's token: %d %s; want 404", r.method, r.path, code, body)
				}
			}
		}
	})

	t.Run("revoke", func(t *testing.T) {
		for _, bad := range []struct {
			path string
			code int
		}{
			{"/v1/tenants/acme/tokens/" + globex.ID, http.StatusNotFound}, // globex's, not acme's
			{"/v1/tenants/acme/tokens/000000000000", http.StatusNotFound},
			{"/v1/tenants/acme/tokens/xyz", http.StatusBadRequest},
			{"/v1/tenants/acme/tokens/admin.tokens[0]", http.StatusConflict},
			{"/v1/tenants/Bad/tokens/" + plain.ID, http.StatusBadRequest},
		} {
			if code, body := w.call(t, "op", "DELETE", bad.path, ""); code != bad.code {
				t.Errorf("DELETE %s: %d %s; want %d", bad.path, code, body, bad.code)
			}
		}
		if ok, _ := w.works(t, globex.Token, "globex"); !ok {
			t.Fatal("revoking globex's id under acme touched globex's token")
		}
		code, body := w.call(t, "op", "DELETE", "/v1/tenants/acme/tokens/"+plain.ID, "")
		var ti api.TokenInfo
		if json.Unmarshal([]byte(body), &ti); code != http.StatusOK || !ti.Revoked || ti.ID != plain.ID {
			t.Fatalf("revoke: %d %s", code, body)
		}
		// At once: the token was looked up (and cached) a moment ago.
		if code, _ := w.call(t, plain.Token, "GET", "/v1/whoami", ""); code != http.StatusUnauthorized {
			t.Errorf("the revoked token: %d, want 401", code)
		}
		if code, _ := w.call(t, "op", "DELETE", "/v1/tenants/acme/tokens/"+plain.ID, ""); code != http.StatusNotFound {
			t.Errorf("revoked twice: %d, want 404", code)
		}
		for _, ti := range w.list(t, "/v1/tokens") {
			if ti.ID == plain.ID {
				t.Errorf("the revoked token is still listed: %+v", ti)
			}
		}
	})

	t.Run("revoked through another node", func(t *testing.T) {
		tok := w.issue(t, "acme", "")
		if ok, body := w.works(t, tok.Token, "acme"); !ok { // cached now
			t.Fatal(body)
		}
		// What another node's revoke does to the shared store.
		if err := w.s.q.(queue.Records).DeleteRecord(tokenKey(tok.Token)); err != nil {
			t.Fatal(err)
		}
		w.off.Add(int64(tokenRecheck + time.Second))
		defer w.off.Store(0)
		if code, _ := w.call(t, tok.Token, "GET", "/v1/whoami", ""); code != http.StatusUnauthorized {
			t.Errorf("a token whose record went %s ago: %d, want 401", tokenRecheck+time.Second, code)
		}
	})

	t.Run("config tokens replaced by a reload", func(t *testing.T) {
		w.s.SetTenantTokens([]TenantToken{{Token: "acme-new", Tenant: "acme"}})
		if code, _ := w.call(t, "acme-conf", "GET", "/v1/whoami", ""); code != http.StatusUnauthorized {
			t.Errorf("a token dropped from admin.tokens: %d, want 401", code)
		}
		if ok, body := w.works(t, "acme-new", "acme"); !ok {
			t.Errorf("a token added to admin.tokens: %s", body)
		}
	})
}
