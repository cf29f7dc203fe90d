package proxy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/egress"
)

// OAuth2 client credentials, against a real token endpoint and
// an endpoint that checks the bearer token, both started in the test.

const (
	oauthClientID     = "sluice-client"
	oauthClientSecret = "client-s3cret-never-logged"
)

// tokenEndpoint issues tokens tok-1, tok-2, ... to the test's client
// credentials, each valid for expiresIn seconds; webhook accepts only
// tokens it issued that are not expired nor revoked.
type tokenEndpoint struct {
	t         *testing.T
	expiresIn int
	fail      bool // answer 401 invalid_client to every request

	mu       sync.Mutex
	issued   map[string]time.Time // token → expiry
	revoked  map[string]bool
	requests int
	scopes   []string
	bad      []string // what a request got wrong
	unauth   int      // 401s the webhook answered
}

func startTokenEndpoint(t *testing.T, expiresIn int) (*tokenEndpoint, string) {
	te := &tokenEndpoint{t: t, expiresIn: expiresIn, issued: map[string]time.Time{}, revoked: map[string]bool{}}
	srv := startEndpoint(t, netipLoopback, nil, http.HandlerFunc(te.token))
	return te, srv.URL + "/oauth/token"
}

func (te *tokenEndpoint) token(w http.ResponseWriter, r *http.Request) {
	te.mu.Lock()
	defer te.mu.Unlock()
	te.requests++
	id, secret, ok := r.BasicAuth()
	if !ok {
		r.ParseForm()
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	}
	if err := r.ParseForm(); err != nil || r.PostForm.Get("grant_type") != "client_credentials" {
		te.bad = append(te.bad, "grant_type "+r.PostForm.Get("grant_type"))
	}
	te.scopes = append(te.scopes, r.PostForm.Get("scope"))
	if te.fail || id != oauthClientID || secret != oauthClientSecret {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, `{"error":"invalid_client","error_description":"echo %s"}`, secret)
		return
	}
	tok := fmt.Sprintf("tok-%d", len(te.issued)+1)
	te.issued[tok] = time.Now().Add(time.Duration(te.expiresIn) * time.Second)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": te.expiresIn})
}

// webhook answers 200 to a valid bearer token and 401 to any other.
func (te *tokenEndpoint) webhook(log *endpointLog) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		te.mu.Lock()
		exp, ok := te.issued[tok]
		valid := ok && !te.revoked[tok] && time.Now().Before(exp)
		if !valid {
			te.unauth++
		}
		te.mu.Unlock()
		if !valid {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		log.ServeHTTP(w, r)
	})
}

func (te *tokenEndpoint) stats() (requests, unauth int) {
	te.mu.Lock()
	defer te.mu.Unlock()
	if len(te.bad) > 0 {
		te.t.Errorf("token requests: %q", te.bad)
	}
	return te.requests, te.unauth
}

func (te *tokenEndpoint) revoke(tok string) {
	te.mu.Lock()
	te.revoked[tok] = true
	te.mu.Unlock()
}

// capture is a logger whose output the test reads.
type capture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Write(p)
}

func (c *capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

func (c *capture) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(c, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func oauthSub(t *testing.T, id, url, tokenURL string) *delivery.Subscription {
	sb := sub(id, url)
	sb.Auth = &egress.OAuth2{TokenURL: tokenURL, ClientID: oauthClientID, Scopes: []string{"webhooks:write", "events"},
		ClientSecretFile: writeTemp(t, t.TempDir(), "client-secret", []byte(oauthClientSecret+"\n"))}
	return sb
}

// TestOAuthBearerTokenReusedAndRefreshedOn401: every delivery carries the
// bearer token; one token serves them all (one token request); when the
// endpoint stops accepting it, the 401 fetches one new token and the
// request goes again in the same attempt, so nothing is retried or
// dead-lettered. Neither the token nor the client secret is logged.
func TestOAuthBearerTokenReusedAndRefreshedOn401(t *testing.T) {
	te, tokenURL := startTokenEndpoint(t, 3600)
	log := &endpointLog{}
	ep := startEndpoint(t, netipLoopback, nil, te.webhook(log))
	var logs capture
	s := startEgressServer(t, proxy.Options{Logger: logs.logger(), Subscriptions: []*delivery.Subscription{oauthSub(t, "oauth", ep.URL+"/hook", tokenURL)}}, false)

	publish(t, s, "t", "a", 10)
	eventually(t, "10 deliveries", func() bool { return lane(s, "oauth").Delivered == 10 })
	if req, unauth := te.stats(); req != 1 || unauth != 0 {
		t.Fatalf("%d token requests and %d 401s for 10 deliveries; want 1 and 0", req, unauth)
	}

	te.revoke("tok-1")
	publish(t, s, "t", "b", 5)
	eventually(t, "15 deliveries", func() bool { return lane(s, "oauth").Delivered == 15 })
	req, unauth := te.stats()
	if req != 2 || unauth < 1 {
		t.Fatalf("%d token requests and %d 401s after the revocation; want 2 (one refresh) and at least 1", req, unauth)
	}
	l := lane(s, "oauth")
	if l.Retried != 0 || l.DeadLettered != 0 {
		t.Fatalf("lane %+v: a refreshed token must make the same attempt succeed", l)
	}
	for i, r := range log.all() {
		want := "Bearer tok-1"
		if i >= 10 {
			want = "Bearer tok-2"
		}
		if r.auth != want || r.attempt != "1" {
			t.Fatalf("delivery %d: Authorization %q X-Attempt %s; want %q on attempt 1", i+1, r.auth, r.attempt, want)
		}
	}
	if got := te.scopes[0]; got != "webhooks:write events" {
		t.Errorf("scope %q", got)
	}
	for _, secret := range []string{oauthClientSecret, "tok-1", "tok-2"} {
		if strings.Contains(logs.String(), secret) {
			t.Fatalf("the log shows %q:\n%s", secret, logs.String())
		}
	}
}

// TestOAuthTokenRefreshedBeforeExpiry: a token that lives one second is
// replaced in the background before it expires; no delivery is ever
// sent an expired token.
func TestOAuthTokenRefreshedBeforeExpiry(t *testing.T) {
	te, tokenURL := startTokenEndpoint(t, 1)
	log := &endpointLog{}
	ep := startEndpoint(t, netipLoopback, nil, te.webhook(log))
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{oauthSub(t, "oauth", ep.URL+"/hook", tokenURL)}}, false)
	deadline := time.Now().Add(2500 * time.Millisecond)
	n := 0
	for time.Now().Before(deadline) {
		n++
		publish(t, s, "t", fmt.Sprintf("e%d", n), 1)
		eventually(t, "delivery", func() bool { return lane(s, "oauth").Delivered == uint64(n) })
		time.Sleep(50 * time.Millisecond)
	}
	req, unauth := te.stats()
	if req < 2 || unauth != 0 {
		t.Fatalf("%d token requests, %d 401s over %d deliveries in 2.5s of 1s tokens; want at least 2 and none", req, unauth, n)
	}
}

// TestOAuthTokenEndpointFailureIsNamed: a token endpoint that refuses the
// client fails each attempt as oauth2_token, retried then dead-lettered;
// the endpoint is never contacted, and the log names the token endpoint's
// error code without the secret it echoed.
func TestOAuthTokenEndpointFailureIsNamed(t *testing.T) {
	te, tokenURL := startTokenEndpoint(t, 3600)
	te.fail = true
	log := &endpointLog{}
	ep := startEndpoint(t, netipLoopback, nil, te.webhook(log))
	var logs capture
	sb := oauthSub(t, "oauth", ep.URL+"/hook", tokenURL)
	sb.Retry, sb.Breaker = fastRetry(2), noBreaker
	s := startEgressServer(t, proxy.Options{Logger: logs.logger(), Subscriptions: []*delivery.Subscription{sb}}, false)
	publish(t, s, "t", "e", 2)
	checkDeadLetters(t, deadLettered(t, s, "oauth", 2), "oauth2_token", 2)
	if n := log.count(); n != 0 {
		t.Fatalf("the endpoint got %d requests without a token", n)
	}
	if _, unauth := te.stats(); unauth != 0 {
		t.Fatalf("the endpoint got %d requests without a valid token", unauth)
	}
	out := logs.String()
	if !strings.Contains(out, "invalid_client") || strings.Contains(out, oauthClientSecret) {
		t.Fatalf("log should name invalid_client and never the secret:\n%s", out)
	}
}

// TestOAuthSecondUnauthorizedIsDeadLettered: an endpoint that refuses
// every token gets one refresh per attempt, then its 401 is classified as
// usual: dead-lettered at once, status 401.
func TestOAuthSecondUnauthorizedIsDeadLettered(t *testing.T) {
	te, tokenURL := startTokenEndpoint(t, 3600)
	ep := startEndpoint(t, netipLoopback, nil, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
	}))
	sb := oauthSub(t, "oauth", ep.URL+"/hook", tokenURL)
	s := startEgressServer(t, proxy.Options{Subscriptions: []*delivery.Subscription{sb}}, false)
	publish(t, s, "t", "e", 1)
	dls := deadLettered(t, s, "oauth", 1)
	if d := dls[0]; d.LastStatus != 401 || d.Attempts != 1 || d.Reason != "rejected" {
		t.Fatalf("dead letter %+v: want rejected after 1 attempt with status 401", d)
	}
	if req, _ := te.stats(); req != 2 {
		t.Fatalf("%d token requests, want 2: the first token and one refresh", req)
	}
}
