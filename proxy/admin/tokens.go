package admin

import (
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// Tenant tokens: those of the config (admin.tokens, replaced whole by
// SetTenantTokens on a reload) and those issued through the API, whose
// SHA-256 the store keeps under "token.<hex>" (shared by every node in
// fleet mode). An issued token has an id, the first tokenIDLen hex digits
// of that hash: enough to name it among a tenant's tokens, useless for
// finding the token.

// tenantTokenPrefix marks the tokens sluice issues, so a leaked one is
// recognisable (secret scanners key on such prefixes).
const tenantTokenPrefix = "sltk_"

const (
	// tokenRecheck is how long a node trusts an issued token it looked
	// up before reading its record again: a revoke made through another
	// node of the fleet (or by hand in the store) takes effect here
	// within it. The node that revokes forgets the token at once. Short
	// enough that a leaked token dies with the revoke, long enough that
	// a busy portal does not read the store on every request.
	tokenRecheck = 5 * time.Second
	// maxTokenLifetime bounds an issued token's expiry: a token meant to
	// lapse should not live for decades by a typo. Tokens issued with no
	// expiry live until revoked.
	maxTokenLifetime = 366 * 24 * time.Hour
	// tokenIDLen is the hex digits of a token's hash that make its id
	// (48 bits: a collision within one tenant's tokens is not a concern,
	// and revoke only acts on the tenant's own).
	tokenIDLen = 12
)

const tokenKeyPrefix = "token."

// tokenRecord is what the store keeps of an issued tenant token, under
// tokenKey(token). IssuedAt keeps its name from before expiry existed,
// so older records read the same.
type tokenRecord struct {
	Tenant    string     `json:"tenant"`
	IssuedAt  time.Time  `json:"issued_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

func (r *tokenRecord) expired(now time.Time) bool {
	return r.ExpiresAt != nil && !now.Before(*r.ExpiresAt)
}

func tokenKey(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return tokenKeyPrefix + hex.EncodeToString(h[:])
}

// tokenID is the id of the token stored under key.
func tokenID(key string) string {
	h := strings.TrimPrefix(key, tokenKeyPrefix)
	return h[:min(len(h), tokenIDLen)]
}

func validTokenID(id string) bool {
	if len(id) != tokenIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// tokenCache holds the config's tenant tokens and the issued ones this
// node has looked up, by tokenKey.
type tokenCache struct {
	mu     sync.RWMutex
	config map[string]configToken
	issued map[string]issuedToken
	// gen counts forgets: a lookup that read a record before a revoke
	// must not put it back after (lookup and revoke race on one node).
	gen uint64
}

type configToken struct {
	tenant string
	index  int // in admin.tokens
}

type issuedToken struct {
	rec     tokenRecord
	checked time.Time // when the record was read
}

func (c *tokenCache) setConfig(toks []TenantToken) {
	m := make(map[string]configToken, len(toks))
	for i, t := range toks {
		m[tokenKey(t.Token)] = configToken{tenant: t.Tenant, index: i}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.config = m
}

func (c *tokenCache) configured(key string) (configToken, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	t, ok := c.config[key]
	return t, ok
}

func (c *tokenCache) configTokens() []configToken {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]configToken, 0, len(c.config))
	for _, t := range c.config {
		out = append(out, t)
	}
	return out
}

// fresh returns the cached record of key if it was read less than
// tokenRecheck before now, and the generation to pass to remember.
func (c *tokenCache) fresh(key string, now time.Time) (*tokenRecord, uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.issued[key]
	// A clock stepped back makes an entry look young for ever: re-read.
	if age := now.Sub(e.checked); ok && age >= 0 && age < tokenRecheck {
		return &e.rec, c.gen
	}
	return nil, c.gen
}

// remember caches rec under key, unless a forget came since gen.
func (c *tokenCache) remember(key string, rec tokenRecord, now time.Time, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return
	}
	if c.issued == nil {
		c.issued = map[string]issuedToken{}
	}
	c.issued[key] = issuedToken{rec: rec, checked: now}
}

// forget drops key and keeps any lookup already under way from caching
// it again: a revoke here takes effect at once.
func (c *tokenCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	delete(c.issued, key)
}

// drop drops key when a lookup found no record. Unlike forget it leaves
// the generation be: wrong tokens, which any client may send, must not
// keep every other lookup from caching.
func (c *tokenCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.issued, key)
}

// SetTenantTokens replaces the tenant tokens of the config (admin.tokens):
// a token no longer among them is refused from the next request, a new
// one works from then. A reload calls it; issued tokens are not touched.
// Safe for concurrent use.
func (s *API) SetTenantTokens(toks []TenantToken) {
	s.tokens.setConfig(toks)
}

// tokenVerdict is what a bearer token that is not the operator's is.
type tokenVerdict struct {
	tenant  string // "" when it is no tenant's (or expired)
	expired bool
}

// tenantOfToken judges tok: a config token's tenant, or an issued
// token's read from the store (cached for tokenRecheck), unless expired.
func (s *API) tenantOfToken(tok string) (tokenVerdict, error) {
	key := tokenKey(tok)
	if t, ok := s.tokens.configured(key); ok {
		return tokenVerdict{tenant: t.tenant}, nil
	}
	now := s.opts.Now()
	rec, gen := s.tokens.fresh(key, now)
	if rec == nil {
		recs, ok := s.q.(queue.Records)
		if !ok {
			return tokenVerdict{}, nil
		}
		v, err := recs.GetRecord(key)
		if errors.Is(err, queue.ErrNotFound) {
			s.tokens.drop(key) // revoked through another node, or never issued
			return tokenVerdict{}, nil
		}
		if err != nil {
			return tokenVerdict{}, err
		}
		var r tokenRecord
		if err := json.Unmarshal(v, &r); err != nil || r.Tenant == "" {
			return tokenVerdict{}, fmt.Errorf("token record: %v", err)
		}
		s.tokens.remember(key, r, now, gen)
		rec = &r
	}
	if rec.expired(now) {
		return tokenVerdict{expired: true}, nil
	}
	return tokenVerdict{tenant: rec.Tenant}, nil
}

// tokenRoutes registers the tenant tokens' routes, the operator's only
// (none is in tenantRoutes): a tenant neither issues tokens nor sees
// which exist.
func (s *API) tokenRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/tenants/{tenant}/tokens", s.issueTenantToken)
	mux.HandleFunc("GET /v1/tenants/{tenant}/tokens", s.listTenantTokens)
	mux.HandleFunc("GET /v1/tokens", s.listTenantTokens)
	mux.HandleFunc("DELETE /v1/tenants/{tenant}/tokens/{id}", s.revokeTenantToken)
}

// pathTenant is the {tenant} of r's path, answered 400 when it is no
// tenant id.
func pathTenant(w http.ResponseWriter, r *http.Request) (string, bool) {
	tenant := r.PathValue("tenant")
	if !policy.ValidTenant(tenant) {
		writeError(w, http.StatusBadRequest, "tenant: must match ^[a-z0-9][a-z0-9._-]{0,63}$, got "+strconv.Quote(tenant))
		return "", false
	}
	return tenant, true
}

// tokenStore is the store as queue.Records, answered 501 when it keeps
// no records.
func (s *API) tokenStore(w http.ResponseWriter) (queue.Records, bool) {
	recs, ok := s.q.(queue.Records)
	if !ok {
		writeError(w, http.StatusNotImplemented, "this log keeps no records: tenant tokens can only come from admin.tokens")
	}
	return recs, ok
}

// issueTenantToken serves POST /v1/tenants/{tenant}/tokens with an
// optional IssueTokenRequest: a new token scoped to the tenant, shown
// once; the store keeps only its SHA-256. A tenant not listed in the
// config's tenants may have tokens: tenant_defaults bound it.
func (s *API) issueTenantToken(w http.ResponseWriter, r *http.Request) {
	tenant, ok := pathTenant(w, r)
	if !ok {
		return
	}
	var req api.IssueTokenRequest
	if !decodeBody(w, r, &req, true) {
		return
	}
	now := s.opts.Now().UTC()
	expires, err := tokenExpiry(req, now)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if s.opts.AdminToken == "" {
		// Without an operator token a request with no token acts as the
		// operator: a tenant token would scope nothing.
		writeError(w, http.StatusConflict, "tenant tokens need an operator token: set admin.token_file first")
		return
	}
	recs, ok := s.tokenStore(w)
	if !ok {
		return
	}
	raw := make([]byte, 32)
	rand.Read(raw) // never fails (crypto/rand)
	tok := tenantTokenPrefix + base64.RawURLEncoding.EncodeToString(raw)
	key := tokenKey(tok)
	v, _ := json.Marshal(tokenRecord{Tenant: tenant, IssuedAt: now, ExpiresAt: expires})
	if err := recs.PutRecord(key, v); err != nil {
		registryResult(w, 0, fmt.Errorf("store the token: %w", err), nil)
		return
	}
	s.log.Info("tenant token issued", "tenant", tenant, "token_id", tokenID(key), "expires_at", expires)
	writeJSON(w, http.StatusCreated, api.TokenAnswer{Tenant: tenant, Token: tok, ID: tokenID(key), CreatedAt: now, ExpiresAt: expires})
}

// tokenExpiry is the expiry req asks for, nil for none.
func tokenExpiry(req api.IssueTokenRequest, now time.Time) (*time.Time, error) {
	var at time.Time
	switch {
	case req.ExpiresIn != "" && req.ExpiresAt != nil:
		return nil, errors.New("expires_in and expires_at: give one of them")
	case req.ExpiresIn != "":
		d, err := time.ParseDuration(req.ExpiresIn)
		if err != nil || d <= 0 || d > maxTokenLifetime {
			return nil, fmt.Errorf("expires_in: want a duration from 1s to %s such as 720h, got %s", maxTokenLifetime, strconv.Quote(req.ExpiresIn))
		}
		at = now.Add(d)
	case req.ExpiresAt != nil:
		at = req.ExpiresAt.UTC()
		if !at.After(now) || at.Sub(now) > maxTokenLifetime {
			return nil, fmt.Errorf("expires_at: want a time after now and within %s of it, got %s", maxTokenLifetime, at.Format(time.RFC3339))
		}
	default:
		return nil, nil
	}
	at = at.Truncate(time.Second)
	return &at, nil
}

// listTenantTokens serves GET /v1/tokens (every tenant's) and GET
// /v1/tenants/{tenant}/tokens: a TokenList.
func (s *API) listTenantTokens(w http.ResponseWriter, r *http.Request) {
	tenant := ""
	if r.PathValue("tenant") != "" {
		var ok bool
		if tenant, ok = pathTenant(w, r); !ok {
			return
		}
	}
	now := s.opts.Now()
	out := api.TokenList{Tokens: []api.TokenInfo{}} // never null: scripts take its length
	for _, t := range s.tokens.configTokens() {
		if tenant == "" || t.tenant == tenant {
			out.Tokens = append(out.Tokens, api.TokenInfo{ID: fmt.Sprintf("admin.tokens[%d]", t.index), Tenant: t.tenant, Source: "config"})
		}
	}
	if recs, ok := s.q.(queue.Records); ok {
		m, err := recs.ListRecords(tokenKeyPrefix)
		if err != nil {
			registryResult(w, 0, fmt.Errorf("list tokens: %w", err), nil)
			return
		}
		for key, v := range m {
			var rec tokenRecord
			if err := json.Unmarshal(v, &rec); err != nil || rec.Tenant == "" {
				s.log.Warn("unreadable token record; skipped", "token_id", tokenID(key), "err", err)
				continue
			}
			if tenant == "" || rec.Tenant == tenant {
				out.Tokens = append(out.Tokens, issuedInfo(key, rec, now))
			}
		}
	}
	slices.SortFunc(out.Tokens, func(a, b api.TokenInfo) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Source, b.Source),
			cmp.Compare(created(a).UnixNano(), created(b).UnixNano()), cmp.Compare(a.ID, b.ID))
	})
	writeJSON(w, http.StatusOK, out)
}

func created(t api.TokenInfo) time.Time {
	if t.CreatedAt == nil {
		return time.Time{}
	}
	return *t.CreatedAt
}

func issuedInfo(key string, rec tokenRecord, now time.Time) api.TokenInfo {
	at := rec.IssuedAt
	return api.TokenInfo{ID: tokenID(key), Tenant: rec.Tenant, Source: "issued", CreatedAt: &at, ExpiresAt: rec.ExpiresAt, Expired: rec.expired(now)}
}

// revokeTenantToken serves DELETE /v1/tenants/{tenant}/tokens/{id}: the
// issued token stops working at once on this node, and on the others of
// a fleet within tokenRecheck. A config token is revoked by removing it
// from admin.tokens and reloading.
func (s *API) revokeTenantToken(w http.ResponseWriter, r *http.Request) {
	tenant, ok := pathTenant(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if strings.HasPrefix(id, "admin.tokens[") {
		writeError(w, http.StatusConflict, fmt.Sprintf("token %s: %v: remove it from admin.tokens and reload (SIGHUP, or save the file)", id, ErrManagedByFile))
		return
	}
	if !validTokenID(id) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("id: want the %d hex digits the token list shows, got %s", tokenIDLen, strconv.Quote(id)))
		return
	}
	recs, ok := s.tokenStore(w)
	if !ok {
		return
	}
	m, err := recs.ListRecords(tokenKeyPrefix + id)
	if err != nil {
		registryResult(w, 0, fmt.Errorf("find token %s: %w", id, err), nil)
		return
	}
	var info *api.TokenInfo
	for key, v := range m {
		var rec tokenRecord
		if json.Unmarshal(v, &rec) != nil || rec.Tenant != tenant {
			continue // another tenant's token is none of this one's
		}
		if err := recs.DeleteRecord(key); err != nil {
			registryResult(w, 0, fmt.Errorf("revoke token %s: %w", id, err), nil)
			return
		}
		s.tokens.forget(key)
		ti := issuedInfo(key, rec, s.opts.Now())
		ti.Revoked = true
		info = &ti
		s.log.Info("tenant token revoked", "tenant", tenant, "token_id", id)
	}
	if info == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("token %s of tenant %s: %v", id, tenant, ErrNotFound))
		return
	}
	writeJSON(w, http.StatusOK, info)
}
