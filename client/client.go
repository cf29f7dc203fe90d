// Package client is the typed client of sluice's admin API.
// Each method calls one path and answers the wire type package proxy
// encodes there (api.SubscriptionList, api.DeadLetterPage,
// api.EventStatus...), so the CLI, the tests and the bench decode exactly
// what the server writes. An answer that is not 2xx is an *APIError.
//
// The package owns the retry policy of admin calls, made for a person (or a
// script) running a command while the sidecar restarts:
//
//   - Connection errors and 5xx answers other than 501 are tried again,
//     RetryMax times, after exponential waits from RetryWaitMin to
//     RetryWaitMax (by default 6 retries over about 5 s: a restart's worth,
//     while a sidecar that is gone still fails a command in under ten
//     seconds). A Retry-After header is honoured but held to RetryWaitMax.
//   - 4xx answers are never retried: asking again cannot change them.
//   - A request whose repetition is not harmless (a forced replay, which
//     would deliver the event once more; a create, a secret rotation, a
//     tenant token: subscriptions.go) is retried only when the connection
//     was never made, so the server cannot have seen it; IsMaybeDone tells
//     when a failure leaves it unknown whether the server acted. Every
//     other call is safe to repeat: reads, pause and resume (idempotent),
//     a replay without force and recover (the server skips what was
//     replayed), a merge patch and a delete.
//   - Nothing is retried once the call's context ends; the context bounds
//     the call with all its retries, AttemptTimeout each attempt.
//
// Every request carries the bearer token when one is set. Answers are read
// up to MaxResponseBytes; what an error answer says is kept to its "error"
// message, or the first 200 bytes of a body that has none.
//
// A Client is safe for concurrent use by several goroutines; OnRetry may be
// called from several at once.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
)

// Defaults for Options.
const (
	// DefaultRetryMax, DefaultRetryWaitMin and DefaultRetryWaitMax give
	// retries after 100ms, 200ms, 400ms, 800ms, 1.6s and 2s: 5.1 s of
	// waiting in all, which covers a sidecar restart (Badger reopens in well
	// under a second).
	DefaultRetryMax     = 6
	DefaultRetryWaitMin = 100 * time.Millisecond
	DefaultRetryWaitMax = 2 * time.Second
	// DefaultAttemptTimeout bounds one attempt of every call but Replay.
	DefaultAttemptTimeout = 5 * time.Second
	// DefaultMaxResponseBytes bounds what is read of an answer; a dead
	// letter with its body (up to the sidecar's max_body_bytes) is the
	// largest.
	DefaultMaxResponseBytes = 64 << 20
)

// errorSnippet bounds what an *APIError keeps of a body that is not an
// ErrorAnswer (a proxy's HTML page, say).
const errorSnippet = 200

// Options configures a Client. The zero value has the defaults above and no
// token.
type Options struct {
	// Token is the admin bearer token; "" sends none.
	Token string
	// Transport carries the requests; nil means one of the Client's own
	// (for a unix:// address, one that dials the socket).
	Transport http.RoundTripper
	// RetryMax is how many times a call is retried; 0 means
	// DefaultRetryMax, a negative value none.
	RetryMax int
	// RetryWaitMin and RetryWaitMax bound the wait before a retry; zero
	// means DefaultRetryWaitMin and DefaultRetryWaitMax.
	RetryWaitMin, RetryWaitMax time.Duration
	// AttemptTimeout bounds one attempt (connect to last byte) of every
	// call but Replay, which may touch many dead letters and is bounded by
	// its context alone. 0 means DefaultAttemptTimeout, a negative value
	// none.
	AttemptTimeout time.Duration
	// MaxResponseBytes bounds what is read of an answer; 0 means
	// DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// OnRetry, when set, is called before each retry with its number (from
	// 1) and why the previous attempt failed ("connection refused",
	// "answered 503 Service Unavailable"), so that a person waiting learns
	// why nothing happens yet.
	OnRetry func(retry int, reason string)
}

// Client calls one sidecar's admin API. Create it with New.
type Client struct {
	base     string
	token    string
	maxBytes int64
	onRetry  func(int, string)
	tr       http.RoundTripper
	// short bounds each attempt by AttemptTimeout; long (Replay) does not.
	// Both share tr, so their connections are pooled together.
	short, long *retryablehttp.Client
}

// New returns a client of the admin API at addr: a base URL
// ("http://127.0.0.1:8701", "https://..."), a bare "host:port" (plain
// HTTP), or a unix socket ("unix:///run/sluice-admin.sock", as admin.listen
// accepts). It makes no request.
func New(addr string, opts Options) (*Client, error) {
	c := &Client{token: opts.Token, maxBytes: opts.MaxResponseBytes, onRetry: opts.OnRetry, tr: opts.Transport}
	if c.maxBytes <= 0 {
		c.maxBytes = DefaultMaxResponseBytes
	}
	switch sock, unix := strings.CutPrefix(addr, "unix://"); {
	case unix:
		if sock == "" {
			return nil, fmt.Errorf("new admin client: %q names no socket", addr)
		}
		if c.tr != nil {
			return nil, fmt.Errorf("new admin client: %s: a unix socket takes no Transport (the client dials the socket)", addr)
		}
		c.base = "http://sluice" // any host: the socket is the address
		c.tr = &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
			MaxIdleConnsPerHost: 8,
			IdleConnTimeout:     90 * time.Second,
		}
	default:
		if !strings.Contains(addr, "://") {
			addr = "http://" + addr
		}
		u, err := url.Parse(addr)
		if err != nil {
			return nil, fmt.Errorf("new admin client: %w", err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("new admin client: %q: want http://HOST:PORT, https://... or unix:///PATH", addr)
		}
		c.base = strings.TrimRight(addr, "/")
		if c.tr == nil {
			c.tr = http.DefaultTransport.(*http.Transport).Clone()
		}
	}

	retryMax := opts.RetryMax
	switch {
	case retryMax == 0:
		retryMax = DefaultRetryMax
	case retryMax < 0:
		retryMax = 0
	}
	waitMin, waitMax := opts.RetryWaitMin, opts.RetryWaitMax
	if waitMin <= 0 {
		waitMin = DefaultRetryWaitMin
	}
	if waitMax <= 0 {
		waitMax = DefaultRetryWaitMax
	}
	attempt := opts.AttemptTimeout
	switch {
	case attempt == 0:
		attempt = DefaultAttemptTimeout
	case attempt < 0:
		attempt = 0
	}
	mk := func(timeout time.Duration) *retryablehttp.Client {
		return &retryablehttp.Client{
			HTTPClient:     &http.Client{Transport: c.tr, Timeout: timeout},
			RetryWaitMin:   waitMin,
			RetryWaitMax:   waitMax,
			RetryMax:       retryMax,
			CheckRetry:     checkRetry,
			Backoff:        cappedBackoff,
			RequestLogHook: c.logRetry,
			ErrorHandler: func(resp *http.Response, err error, tries int) (*http.Response, error) {
				if err != nil && tries > 1 {
					err = fmt.Errorf("gave up after %d attempts: %w", tries, err)
				}
				// A 5xx still failing after the last retry is answered
				// like any other: the caller reads its ErrorAnswer.
				return resp, err
			},
		}
	}
	c.short, c.long = mk(attempt), mk(0)
	return c, nil
}

// URL returns the base URL requests go to ("http://sluice" for a unix
// socket).
func (c *Client) URL() string { return c.base }

// CloseIdleConnections closes the pooled connections no call is using,
// for example after the sidecar was killed, so that the next call dials
// afresh instead of trying a dead connection first.
func (c *Client) CloseIdleConnections() {
	if t, ok := c.tr.(interface{ CloseIdleConnections() }); ok {
		t.CloseIdleConnections()
	}
}

// call is the state of one call with its retries, reached from the
// retryablehttp hooks through the request's context.
type call struct {
	noResend    bool   // repeating the request is not harmless
	lastFailure string // why the previous attempt is being retried
}

type callKey struct{}

// checkRetry retries connection errors and 5xx answers (but 501), never
// 4xx, never after the context ends, and for a call that must not be sent
// twice only errors of a connection that was never made.
func checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	cl, _ := ctx.Value(callKey{}).(*call)
	if cl == nil {
		cl = &call{}
	}
	if err != nil {
		var op *net.OpError
		if cl.noResend && !(errors.As(err, &op) && op.Op == "dial") {
			return false, nil
		}
		// The library's policy declines what cannot get better: bad
		// schemes, redirect loops, certificate errors.
		retry, _ := retryablehttp.DefaultRetryPolicy(ctx, resp, err)
		cl.lastFailure = err.Error()
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			cl.lastFailure = ue.Err.Error() // without the method and URL again
		}
		return retry, nil
	}
	if resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented && !cl.noResend {
		cl.lastFailure = "answered " + resp.Status
		return true, nil
	}
	return false, nil
}

// cappedBackoff is the library's exponential backoff, with a Retry-After
// held to max too: a command must not hang on a long Retry-After.
func cappedBackoff(lo, hi time.Duration, attempt int, resp *http.Response) time.Duration {
	return min(retryablehttp.DefaultBackoff(lo, hi, attempt, resp), hi)
}

func (c *Client) logRetry(_ retryablehttp.Logger, r *http.Request, retry int) {
	if retry == 0 || c.onRetry == nil {
		return
	}
	reason := ""
	if cl, _ := r.Context().Value(callKey{}).(*call); cl != nil {
		reason = cl.lastFailure
	}
	c.onRetry(retry, reason)
}

// do sends one request, body encoded as JSON when not nil, and decodes a 2xx
// answer into out when not nil. resend says whether repeating the request
// after a lost answer is harmless; long lifts the attempt timeout.
func (c *Client) do(ctx context.Context, method, path string, body, out any, resend, long bool) error {
	return c.send(ctx, request{method: method, path: path, body: body, resend: resend, long: long}, out)
}

// request is one call of send.
type request struct {
	method, path string
	// body is encoded as JSON when not nil (a json.RawMessage as it is).
	body any
	// contentType is the body's; "application/json" when "".
	contentType string
	// resend: repeating the request after a lost answer is harmless.
	resend bool
	// long lifts the attempt timeout.
	long bool
}

// send is do with every option: it sends r, and decodes a 2xx answer into
// out when not nil.
func (c *Client) send(ctx context.Context, r request, out any) error {
	method, path, body := r.method, r.path, r.body
	cl := &call{noResend: !r.resend}
	ctx = context.WithValue(ctx, callKey{}, cl)
	var raw any // nil, not a nil []byte: no body at all
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("%s %s: encode request: %w", method, path, err)
		}
		raw = b
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, method, c.base+path, raw)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		ct := r.contentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	rc := c.short
	if r.long {
		rc = c.long
	}
	resp, err := rc.Do(req)
	if err != nil {
		return fmt.Errorf("admin API at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBytes))
	if err != nil {
		return fmt.Errorf("admin API at %s: %s %s: read answer: %w", c.base, method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return newAPIError(resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("admin API at %s: %s %s: decode answer: %w", c.base, method, path, err)
		}
	}
	return nil
}

func (c *Client) get(ctx context.Context, path string, out any) error {
	return c.do(ctx, http.MethodGet, path, nil, out, true, false)
}

// Subscriptions returns every lane (GET /v1/subscriptions), sorted by
// subscription id, and the log's head seq.
func (c *Client) Subscriptions(ctx context.Context) (*api.SubscriptionList, error) {
	var v api.SubscriptionList
	if err := c.get(ctx, "/v1/subscriptions", &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Pause pauses subscription id (POST /v1/subscriptions/{id}/pause): its
// events are kept and wait. reason, when not empty, is shown as the lane's
// paused_by. An unknown id is an *APIError with Status 404.
func (c *Client) Pause(ctx context.Context, id, reason string) (*api.StateAnswer, error) {
	var body any
	if reason != "" {
		body = api.PauseRequest{Reason: reason}
	}
	var v api.StateAnswer
	if err := c.do(ctx, http.MethodPost, "/v1/subscriptions/"+url.PathEscape(id)+"/pause", body, &v, true, false); err != nil {
		return nil, err
	}
	return &v, nil
}

// Resume resumes subscription id (POST /v1/subscriptions/{id}/resume).
func (c *Client) Resume(ctx context.Context, id string) (*api.StateAnswer, error) {
	var v api.StateAnswer
	if err := c.do(ctx, http.MethodPost, "/v1/subscriptions/"+url.PathEscape(id)+"/resume", nil, &v, true, false); err != nil {
		return nil, err
	}
	return &v, nil
}

// Event returns the completion ledger of event id (GET /v1/events/{id}):
// one entry per entitled subscription. An id the sidecar does not know (or
// no longer, past dedup_window) is an *APIError with Status 404.
func (c *Client) Event(ctx context.Context, id string) (*api.EventStatus, error) {
	var v api.EventStatus
	if err := c.get(ctx, "/v1/events/"+url.PathEscape(id), &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// DeadLetterQuery selects a page of GET /v1/dead-letters.
type DeadLetterQuery struct {
	// Subscription and Reason filter the dead letters; "" is any.
	Subscription, Reason string
	// Limit is the page size, 1..1000; 0 means the server's 100.
	Limit int
	// Cursor is the Next of the previous page; "" starts at the first.
	Cursor string
}

// DeadLetters returns one page of dead letters (without their bodies),
// ordered by subscription and seq. Follow Next until it is "" for all.
func (c *Client) DeadLetters(ctx context.Context, q DeadLetterQuery) (*api.DeadLetterPage, error) {
	v := url.Values{}
	for k, s := range map[string]string{"subscription": q.Subscription, "reason": q.Reason, "cursor": q.Cursor} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	path := "/v1/dead-letters"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var page api.DeadLetterPage
	if err := c.get(ctx, path, &page); err != nil {
		return nil, err
	}
	return &page, nil
}

// DeadLetter returns one dead letter with its body (GET
// /v1/dead-letters/{subscription}/{seq}); one that does not exist is an
// *APIError with Status 404.
func (c *Client) DeadLetter(ctx context.Context, subscription string, seq uint64) (*api.DeadLetterInfo, error) {
	var v api.DeadLetterInfo
	if err := c.get(ctx, "/v1/dead-letters/"+url.PathEscape(subscription)+"/"+strconv.FormatUint(seq, 10), &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Replay replays dead letters (POST /v1/dead-letters/replay): one, a list,
// or all a filter matches. Each result says whether its dead letter was
// replayed or why it was skipped (replayed already without Force, not
// found). Only ctx bounds the call, which writes each dead letter durably;
// a forced replay is not resent once the request may have arrived.
func (c *Client) Replay(ctx context.Context, req api.ReplayRequest) (*api.ReplayAnswer, error) {
	var v api.ReplayAnswer
	if err := c.do(ctx, http.MethodPost, "/v1/dead-letters/replay", req, &v, !req.Force, true); err != nil {
		return nil, err
	}
	return &v, nil
}

// RetryBudget returns the shared retry budget's window (GET
// /v1/retry-budget).
func (c *Client) RetryBudget(ctx context.Context) (*policy.BudgetStats, error) {
	var v policy.BudgetStats
	if err := c.get(ctx, "/v1/retry-budget", &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// Healthz returns nil when the sidecar's process answers (GET /healthz,
// which needs no token).
func (c *Client) Healthz(ctx context.Context) error {
	return c.get(ctx, "/healthz", nil)
}

// Ready returns nil when the sidecar is ready (GET /readyz): its lanes are
// recovered. A draining sidecar is an *APIError with Status 503 and
// Message "draining" (retried like any 5xx).
func (c *Client) Ready(ctx context.Context) error {
	return c.get(ctx, "/readyz", nil)
}

// newAPIError reads what a non-2xx answer says.
func newAPIError(status int, body []byte) *APIError {
	e := &APIError{Status: status}
	var m struct {
		api.ErrorAnswer
		api.HealthAnswer
	}
	switch {
	case json.Unmarshal(body, &m) == nil && m.Error != "":
		e.Message = m.Error
	case m.Status != "":
		e.Message = m.Status // /readyz while draining
	default:
		e.Message = string(bytes.TrimSpace(body[:min(len(body), errorSnippet)]))
	}
	return e
}
