// Package api holds the admin API's wire types, one type per answer or
// request body, shared by the server and its typed client (package
// client): the CLI, the tests and the bench decode exactly what the
// server encodes. It holds no behaviour beyond building a view, so the
// client needs nothing of the engine.
package api

import (
	"encoding/base64"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/queue"
)

// The on-disk records stay in queue; these are views of them.

// DeadLetterInfo is a dead letter as the admin API shows it. The body is
// included only by GET /v1/dead-letters/{subscription}/{seq}: as text when
// it is valid UTF-8, else as base64.
type DeadLetterInfo struct {
	Subscription string    `json:"subscription"`
	Seq          uint64    `json:"seq"`
	EventID      string    `json:"event_id"`
	Type         string    `json:"type"`
	AcceptedAt   time.Time `json:"accepted_at"`
	Reason       string    `json:"reason"`
	Attempts     int       `json:"attempts"`
	LastStatus   int       `json:"last_status"`
	LastError    string    `json:"last_error"`
	Response     string    `json:"response"`
	DeadAt       time.Time `json:"dead_at"`
	Replays      int       `json:"replays"`
	ReplayedAt   time.Time `json:"replayed_at,omitzero"`
	DeliveredAt  time.Time `json:"delivered_at,omitzero"` // when a replay was acknowledged
	BodyBytes    int       `json:"body_bytes"`
	ContentType  string    `json:"content_type,omitempty"`
	Body         *string   `json:"body,omitempty"`
	BodyBase64   string    `json:"body_base64,omitempty"`
}

// NewDeadLetterInfo is the API view of d, with its body when withBody.
func NewDeadLetterInfo(d *queue.DeadLetter, withBody bool) DeadLetterInfo {
	v := DeadLetterInfo{
		Subscription: d.Subscription, Seq: d.Seq, EventID: d.EventID, Type: d.Type,
		AcceptedAt: d.AcceptedAt, Reason: d.Reason, Attempts: d.Attempts, LastStatus: d.LastStatus,
		LastError: d.LastError, Response: d.Response, DeadAt: d.DeadAt, Replays: d.Replays,
		ReplayedAt: d.ReplayedAt, DeliveredAt: d.DeliveredAt, BodyBytes: len(d.Body),
	}
	if withBody {
		v.ContentType = d.ContentType
		if utf8.Valid(d.Body) {
			s := string(d.Body)
			v.Body = &s
		} else {
			v.BodyBase64 = base64.StdEncoding.EncodeToString(d.Body)
		}
	}
	return v
}

// DeadLetterPage answers GET /v1/dead-letters; Next, when not empty, is
// the cursor of the next page.
type DeadLetterPage struct {
	DeadLetters []DeadLetterInfo `json:"dead_letters"`
	Next        string           `json:"next"`
}

// ReplayRequest is the body of POST /v1/dead-letters/replay: one dead
// letter (Subscription and Seq), a list (Items), or every one a filter
// matches; Force replays letters already replayed.
type ReplayRequest struct {
	Subscription string        `json:"subscription,omitempty"`
	Seq          uint64        `json:"seq,omitempty"`
	Items        []ReplayItem  `json:"items,omitempty"`
	Filter       *ReplayFilter `json:"filter,omitempty"`
	Force        bool          `json:"force,omitempty"`
}

// ReplayItem names one dead letter.
type ReplayItem struct {
	Subscription string `json:"subscription"`
	Seq          uint64 `json:"seq"`
}

// ReplayFilter selects dead letters by subscription and reason ("" is any).
type ReplayFilter struct {
	Subscription string `json:"subscription"`
	Reason       string `json:"reason"`
}

// ReplayAnswer answers POST /v1/dead-letters/replay.
type ReplayAnswer struct {
	Replayed int            `json:"replayed"`
	Results  []ReplayResult `json:"results"`
}

// SubscriptionList answers GET /v1/subscriptions.
type SubscriptionList struct {
	Subscriptions []LaneStatus `json:"subscriptions"`
	Head          uint64       `json:"head"`
}

// PauseRequest is the optional body of POST /v1/subscriptions/{id}/pause;
// Reason is shown by GET /v1/subscriptions as the lane's paused_by.
type PauseRequest struct {
	Reason string `json:"reason,omitempty"`
}

// StateAnswer answers POST /v1/subscriptions/{id}/pause and /resume.
type StateAnswer struct {
	Subscription string `json:"subscription"`
	State        string `json:"state"`
}

// HealthAnswer answers GET /healthz ("ok") and GET /readyz ("ready", or
// "draining" with status 503 once the sidecar is stopping).
type HealthAnswer struct {
	Status string `json:"status"`
}

// ErrorAnswer is the body of every admin API error.
type ErrorAnswer struct {
	Error string `json:"error"`
}

// SubscriptionInfo answers GET, POST and PATCH of /v1/subscriptions/{id}:
// the lane's state, who manages the subscription, and its settings in the
// config file's keys with every secret redacted. Secret is set only in
// the answer that made the secret: a create without one (a generated
// whsec_ key) and rotate-secret; it is shown nowhere else, ever.
type SubscriptionInfo struct {
	LaneStatus
	// Config is the subscription as the config file or the API gave it,
	// in the config file's keys; "secret" and "secrets" are replaced by
	// "secrets_count".
	Config map[string]any `json:"config"`
	Secret string         `json:"secret,omitempty"`
	// PublicKeys are the whpk_ public keys of the subscription's Ed25519
	// (whsk_) secrets that sign now, in signing order: what its receiver
	// verifies v1a signatures with. Not secret.
	PublicKeys []string `json:"public_keys,omitempty"`
}

// Who manages a subscription (LaneStatus.ManagedBy).
const (
	ManagedByFile = "file" // the config file: the API may not change or delete it
	ManagedByAPI  = "api"  // the API: a reload of the file never touches it
)

// RotateRequest is the body of POST /v1/subscriptions/{id}/rotate-secret;
// Grace (a Go duration, "24h") is how long the old secrets keep signing
// beside the new one; default DefaultRotationGrace, "0s" retires them at
// once.
type RotateRequest struct {
	Grace string `json:"grace,omitempty"`
}

// RotateAnswer answers rotate-secret: the new secret, shown this once,
// and until when the old ones still sign. The new secret is of the newest
// old one's scheme: whsec_, or whsk_ with its whpk_ PublicKey for the
// receivers.
type RotateAnswer struct {
	Subscription string    `json:"subscription"`
	Secret       string    `json:"secret"`
	PublicKey    string    `json:"public_key,omitempty"`
	OldUntil     time.Time `json:"old_secrets_until,omitzero"`
}

// RecoverRequest is the body of POST /v1/subscriptions/{id}/recover: the
// dead letters of the subscription whose events were accepted in
// [Since, Until) are replayed, each at most once. Until defaults to now.
type RecoverRequest struct {
	Since time.Time `json:"since"`
	Until time.Time `json:"until,omitzero"`
}

// RecoverAnswer counts what recover did: Replayed letters scheduled
// again, Skipped ones in the range that were not (already replayed, or a
// retry scheduled), Matched = both. Delivered counts the letters in the
// range that an earlier replay delivered, which are not replayed again:
// without it, a range whose letters were all delivered would answer like
// one with no letters at all.
type RecoverAnswer struct {
	Subscription string `json:"subscription"`
	Matched      int    `json:"matched"`
	Replayed     int    `json:"replayed"`
	Skipped      int    `json:"skipped"`
	Delivered    int    `json:"delivered"`
}

// UndeliveredEvent is one event owed to a subscription that is not
// acknowledged: State "retrying" (a retry is scheduled at Due) or
// "dead_lettered" (Reason says why; a replay that was delivered is not
// listed).
type UndeliveredEvent struct {
	Seq        uint64    `json:"seq"`
	EventID    string    `json:"event_id"`
	Type       string    `json:"type"`
	AcceptedAt time.Time `json:"accepted_at,omitzero"`
	State      string    `json:"state"`
	Attempts   int       `json:"attempts"`
	LastStatus int       `json:"last_status,omitempty"`
	LastError  string    `json:"last_error,omitempty"`
	Due        time.Time `json:"due,omitzero"`
	Reason     string    `json:"reason,omitempty"`
}

// UndeliveredPage answers GET /v1/undelivered?subscription=S[&since=T]
// [&limit=N][&cursor=C]: retrying events first, then dead letters, each
// in seq order; Next, when not empty, is the cursor of the next page.
type UndeliveredPage struct {
	Subscription string             `json:"subscription"`
	Events       []UndeliveredEvent `json:"events"`
	Next         string             `json:"next"`
}

// TokenAnswer answers POST /v1/tenants/{tenant}/tokens: a new tenant
// token, shown this once (sluice keeps only its SHA-256). ID names it in
// the list and to revoke it; it is not secret. ExpiresAt is nil for a
// token that does not expire.
type TokenAnswer struct {
	Tenant    string     `json:"tenant"`
	Token     string     `json:"token"`
	ID        string     `json:"id,omitempty"`
	CreatedAt time.Time  `json:"created_at,omitzero"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// IssueTokenRequest is the optional body of POST
// /v1/tenants/{tenant}/tokens: when the token stops working, as a
// duration from now (ExpiresIn, "720h") or a time (ExpiresAt, RFC 3339);
// at most one of them, and no later than a year from now. Neither: the
// token works until it is revoked.
type IssueTokenRequest struct {
	ExpiresIn string     `json:"expires_in,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// TokenInfo describes a tenant token, never the token or its hash.
// Source is "issued" (through the API: ID is the first 12 hex digits of
// its SHA-256, which DELETE /v1/tenants/{tenant}/tokens/{id} takes) or
// "config" (admin.tokens: ID names its place there; it goes when the file
// drops it and sluice reloads). CreatedAt is nil for a config token.
type TokenInfo struct {
	ID        string     `json:"id"`
	Tenant    string     `json:"tenant"`
	Source    string     `json:"source"`
	CreatedAt *time.Time `json:"created_at,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Expired: past ExpiresAt, refused (401), still listed until revoked.
	Expired bool `json:"expired,omitempty"`
	// Revoked is set in the answer of a revoke.
	Revoked bool `json:"revoked,omitempty"`
}

// TokenList answers GET /v1/tokens and GET /v1/tenants/{tenant}/tokens,
// sorted by tenant, then config tokens before issued ones, oldest first.
type TokenList struct {
	Tokens []TokenInfo `json:"tokens"`
}

// WhoAmI answers GET /v1/whoami: the tenant a token is scoped to, or
// Operator for the admin token (and when no token is configured). The
// dashboard shows the tenant portal for a tenant token.
type WhoAmI struct {
	Operator bool   `json:"operator"`
	Tenant   string `json:"tenant,omitempty"`
}
