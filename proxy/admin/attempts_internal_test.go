package admin

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/proxy/delivery"
)

// TestAttemptRoutesScopedToTheTenant: a tenant asking for another tenant's
// subscription gets the same 404 as for an unknown id; its own answers.
// (The principal is set on the request here; requireToken resolving a
// tenant token into one is tested where it is built.)
func TestAttemptRoutesScopedToTheTenant(t *testing.T) {
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(rcv.Close)
	mine := &delivery.Subscription{ID: "mine", URL: rcv.URL, Tenant: "acme"}
	theirs := &delivery.Subscription{ID: "theirs", URL: rcv.URL, Tenant: "other"}
	s := openTestServer(t, Options{Subscriptions: []*delivery.Subscription{mine, theirs}})
	mux := http.NewServeMux()
	s.api.attemptRoutes(mux)
	get := func(p principal, path string) (int, string) {
		r := withPrincipal(httptest.NewRequest("GET", path, nil), p)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	acme := principal{tenant: "acme"}
	for _, route := range []string{"attempts", "series"} {
		code, body := get(acme, "/v1/subscriptions/mine/"+route)
		if code != http.StatusOK || !strings.Contains(body, `"subscription": "mine"`) {
			t.Errorf("acme's own %s: %d %s", route, code, body)
		}
		code, hidden := get(acme, "/v1/subscriptions/theirs/"+route)
		codeU, unknown := get(acme, "/v1/subscriptions/nope/"+route)
		if code != http.StatusNotFound || codeU != http.StatusNotFound ||
			strings.ReplaceAll(hidden, "theirs", "X") != strings.ReplaceAll(unknown, "nope", "X") {
			t.Errorf("another tenant's %s: %d %q; unknown: %d %q; want the same 404", route, code, hidden, codeU, unknown)
		}
		if code, _ := get(principal{}, "/v1/subscriptions/theirs/"+route); code != http.StatusOK {
			t.Errorf("the operator's %s of theirs: %d", route, code)
		}
	}
}
