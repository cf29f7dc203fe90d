package client

// The subscription API: creating, reading, changing, deleting
// subscriptions at run time, their secrets, recovery of what they missed,
// and tenant tokens.
//
// Which calls are sent again after a lost answer (see the package doc):
//
//   - Reads, a PATCH (a JSON merge patch applied twice is applied once),
//     a DELETE (the subscription is draining either way) and recover
//     (each dead letter is replayed at most once) are resent like reads.
//   - A create is not: if its answer was lost, the subscription may exist,
//     and a create sent again answers 409, which would hide that it was
//     this call that made it, and with which secret. When the sidecar
//     generated the secret, the lost answer was its only copy. So a
//     create is retried only when the connection was never made (the
//     sidecar cannot have seen it); any other failure is returned, and
//     IsMaybeDone tells the caller to look (Subscription) before trying
//     again. A 409 from CreateSubscription therefore always means the id
//     existed before the call.
//   - rotate-secret and a tenant token are not resent either: each call
//     makes a new secret, and one sent twice would leave a secret signing
//     (or a token valid) that nobody was shown.

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/proxy/api"
)

// mergePatch is the media type of a JSON merge patch (RFC 7396).
const mergePatch = "application/merge-patch+json"

func subPath(id string) string { return "/v1/subscriptions/" + url.PathEscape(id) }

// CreateSubscription creates a subscription (POST /v1/subscriptions) from
// doc, one subscription in the config file's keys (id, url, secret or
// secrets, types, tenant, ...), encoded as JSON: a map, a struct, or a
// json.RawMessage sent as it is. Without a secret the sidecar generates
// one and returns it in the answer's Secret, this once.
//
// An invalid doc is an *APIError with Status 400 whose message names the
// key; an id that exists already, 409. The request is not sent again once
// it may have reached the sidecar (see the file comment): after an error
// for which IsMaybeDone is true, read the subscription before creating it
// again.
func (c *Client) CreateSubscription(ctx context.Context, doc any) (*api.SubscriptionInfo, error) {
	var v api.SubscriptionInfo
	if err := c.send(ctx, request{method: http.MethodPost, path: "/v1/subscriptions", body: doc}, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Subscription returns one subscription (GET /v1/subscriptions/{id}): its
// lane and its settings, secrets redacted. An unknown id (or one of
// another tenant, for a tenant token) is an *APIError with Status 404.
func (c *Client) Subscription(ctx context.Context, id string) (*api.SubscriptionInfo, error) {
	var v api.SubscriptionInfo
	if err := c.get(ctx, subPath(id), &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// SubscriptionsOfTenant is Subscriptions limited to the subscriptions of
// tenant (GET /v1/subscriptions?tenant=T); "" lists every one the token
// may see.
func (c *Client) SubscriptionsOfTenant(ctx context.Context, tenant string) (*api.SubscriptionList, error) {
	path := "/v1/subscriptions"
	if tenant != "" {
		path += "?" + url.Values{"tenant": {tenant}}.Encode()
	}
	var v api.SubscriptionList
	if err := c.get(ctx, path, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// UpdateSubscription changes subscription id by a JSON merge patch (PATCH
// /v1/subscriptions/{id}, RFC 7396): patch's keys replace the
// subscription's, a null removes one, and an object merges into the one
// it names. patch is encoded as JSON like CreateSubscription's doc. A
// subscription of the config file is an *APIError with Status 409 (change
// the file); an invalid result, 400 naming the key.
func (c *Client) UpdateSubscription(ctx context.Context, id string, patch any) (*api.SubscriptionInfo, error) {
	var v api.SubscriptionInfo
	r := request{method: http.MethodPatch, path: subPath(id), body: patch, contentType: mergePatch, resend: true}
	if err := c.send(ctx, r, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// DeleteSubscription deletes subscription id (DELETE
// /v1/subscriptions/{id}): it takes no new events, delivers those it was
// owed (State "draining" in the answer) and then goes. Sent again after a
// lost answer it answers the same; once the drained subscription is gone,
// 404.
func (c *Client) DeleteSubscription(ctx context.Context, id string) (*api.SubscriptionInfo, error) {
	var v api.SubscriptionInfo
	if err := c.do(ctx, http.MethodDelete, subPath(id), nil, &v, true, false); err != nil {
		return nil, err
	}
	return &v, nil
}

// RotateSecret gives subscription id a new generated secret (POST
// /v1/subscriptions/{id}/rotate-secret), returned this once; its old
// secrets keep signing beside it for grace. A negative grace asks for the
// sidecar's default (api.RotateRequest), 0 retires them at once. The
// request is not sent again once it may have reached the sidecar.
func (c *Client) RotateSecret(ctx context.Context, id string, grace time.Duration) (*api.RotateAnswer, error) {
	var req api.RotateRequest
	if grace >= 0 {
		req.Grace = grace.String()
	}
	var v api.RotateAnswer
	if err := c.send(ctx, request{method: http.MethodPost, path: subPath(id) + "/rotate-secret", body: req}, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Recover replays the dead letters of subscription id whose events were
// accepted in [since, until) (POST /v1/subscriptions/{id}/recover); a zero
// until means now. Each letter is replayed at most once, so the call is
// sent again after a lost answer like a read; like Replay, only ctx bounds
// it.
func (c *Client) Recover(ctx context.Context, id string, since, until time.Time) (*api.RecoverAnswer, error) {
	var v api.RecoverAnswer
	r := request{method: http.MethodPost, path: subPath(id) + "/recover",
		body: api.RecoverRequest{Since: since, Until: until}, resend: true, long: true}
	if err := c.send(ctx, r, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// UndeliveredQuery selects a page of GET /v1/undelivered.
type UndeliveredQuery struct {
	// Subscription is required.
	Subscription string
	// Since, when not zero, leaves out events accepted before it.
	Since time.Time
	// Limit is the page size; 0 means the server's.
	Limit int
	// Cursor is the Next of the previous page; "" starts at the first.
	Cursor string
}

// Undelivered returns one page of the events owed to a subscription that
// are not acknowledged: retrying first, then dead-lettered. Follow Next
// until it is "" for all.
func (c *Client) Undelivered(ctx context.Context, q UndeliveredQuery) (*api.UndeliveredPage, error) {
	v := url.Values{"subscription": {q.Subscription}}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.Format(time.RFC3339Nano))
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Cursor != "" {
		v.Set("cursor", q.Cursor)
	}
	var page api.UndeliveredPage
	if err := c.get(ctx, "/v1/undelivered?"+v.Encode(), &page); err != nil {
		return nil, err
	}
	return &page, nil
}

// IssueTenantToken issues a new admin token scoped to tenant (POST
// /v1/tenants/{tenant}/tokens), returned this once: the sidecar keeps
// only its hash. The request is not sent again once it may have reached
// the sidecar.
func (c *Client) IssueTenantToken(ctx context.Context, tenant string) (*api.TokenAnswer, error) {
	var v api.TokenAnswer
	if err := c.send(ctx, request{method: http.MethodPost, path: "/v1/tenants/" + url.PathEscape(tenant) + "/tokens"}, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// IssueTenantTokenExpiring is IssueTenantToken for a token that stops
// working after expiresIn (at most a year; 0: never).
func (c *Client) IssueTenantTokenExpiring(ctx context.Context, tenant string, expiresIn time.Duration) (*api.TokenAnswer, error) {
	var body any
	if expiresIn != 0 {
		body = api.IssueTokenRequest{ExpiresIn: expiresIn.String()}
	}
	var v api.TokenAnswer
	if err := c.send(ctx, request{method: http.MethodPost, path: "/v1/tenants/" + url.PathEscape(tenant) + "/tokens", body: body}, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// TenantTokens lists the tenant tokens of tenant, or of every tenant
// when tenant is "" (GET /v1/tenants/{tenant}/tokens, GET /v1/tokens):
// their ids, never the tokens. Operator only.
func (c *Client) TenantTokens(ctx context.Context, tenant string) (*api.TokenList, error) {
	path := "/v1/tokens"
	if tenant != "" {
		path = "/v1/tenants/" + url.PathEscape(tenant) + "/tokens"
	}
	var v api.TokenList
	if err := c.get(ctx, path, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// RevokeTenantToken revokes tenant's issued token id (DELETE
// /v1/tenants/{tenant}/tokens/{id}); it stops working at once. Sent
// again after a lost answer like a read: a second revoke answers 404.
func (c *Client) RevokeTenantToken(ctx context.Context, tenant, id string) (*api.TokenInfo, error) {
	var v api.TokenInfo
	if err := c.do(ctx, http.MethodDelete, "/v1/tenants/"+url.PathEscape(tenant)+"/tokens/"+url.PathEscape(id), nil, &v, true, false); err != nil {
		return nil, err
	}
	return &v, nil
}

// WhoAmI says whom the client's token acts for (GET /v1/whoami): the
// operator, or one tenant.
func (c *Client) WhoAmI(ctx context.Context) (*api.WhoAmI, error) {
	var v api.WhoAmI
	if err := c.get(ctx, "/v1/whoami", &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// IsMaybeDone reports whether err, from a call that is not sent again
// once it may have reached the sidecar (CreateSubscription, RotateSecret,
// IssueTenantToken, a forced Replay), leaves it unknown whether the
// sidecar acted: the connection was made but no answer came, the sidecar
// answered 5xx, or the error does not say (the context ended). It is
// false for an *APIError of 4xx or 501 (the sidecar refused) and for a
// connection that was never made.
func IsMaybeDone(err error) bool {
	if err == nil {
		return false
	}
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status >= 500 && ae.Status != http.StatusNotImplemented
	}
	var op *net.OpError
	return !(errors.As(err, &op) && op.Op == "dial")
}
