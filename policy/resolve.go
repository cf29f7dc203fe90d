package policy

import (
	"net/http"
	"strconv"
	"time"
)

// Failure is why an exchange with an endpoint got no usable answer. It is
// a closed set, so callers branch on a value rather than compare strings;
// its String is the word kept in retry records and dead letters and
// written to logs, which must never carry a URL or a payload.
type Failure uint8

const (
	// NoFailure: the endpoint answered (whatever the status).
	NoFailure Failure = iota
	// FailTimeout: no answer within the timeout, or a connect that never
	// completed. The endpoint may have the event; the breaker counts it
	// as a timeout and the auto cap halves on it.
	FailTimeout
	// FailNoFreeConns: the per-host connection cap was full for too long.
	FailNoFreeConns
	// FailForbiddenTarget: the SSRF guard refused the address dialled.
	FailForbiddenTarget
	// FailDNS: the host name did not resolve.
	FailDNS
	// FailConnRefused: nothing listens there.
	FailConnRefused
	// FailConnReset: the connection broke during the exchange.
	FailConnReset
	// FailTLS: the handshake or the certificate failed.
	FailTLS
	// FailConnect: another failure to connect.
	FailConnect
	// FailTransport: any other transport error.
	FailTransport

	// The certificate failures below are FailTLS made precise:
	// each is a configuration problem on one side or the other, retried
	// like a connect error so that a fixed certificate heals the lane.

	// FailTLSUnknownAuthority: the endpoint's certificate is not signed by
	// a CA sluice trusts (the system's, or the subscription's tls.ca_file).
	FailTLSUnknownAuthority
	// FailTLSHostname: the endpoint's certificate is not valid for the
	// URL's host (or the subscription's tls.server_name).
	FailTLSHostname
	// FailTLSExpired: the endpoint's certificate has expired or is not
	// valid yet.
	FailTLSExpired
	// FailTLSClientCert: the endpoint refused sluice's client certificate,
	// or wanted one and got none.
	FailTLSClientCert
	// FailProxy: the forward proxy (egress.proxy) could not be reached, or
	// it would not carry the request (a CONNECT answered other than 2xx).
	FailProxy
	// FailProxyAuth: the forward proxy asked for credentials it did not
	// get or did not accept (407).
	FailProxyAuth
	// FailAuthToken: the OAuth2 token endpoint gave no token, so nothing
	// was sent to the endpoint.
	FailAuthToken
)

var failureWords = [...]string{"", "timeout", "no_free_connections", "forbidden_target", "dns",
	"connection_refused", "connection_reset", "tls", "connect", "transport",
	"tls_unknown_authority", "tls_hostname", "tls_expired", "tls_client_cert", "proxy", "proxy_auth", "oauth2_token"}

// String returns the failure's word ("" for NoFailure).
func (f Failure) String() string {
	if int(f) < len(failureWords) {
		return failureWords[f]
	}
	return "Failure(" + strconv.Itoa(int(f)) + ")"
}

// Exchange is what one HTTP exchange came to, as far as the decision about
// it needs: Outcome from Classify, the status (0 without an answer), the
// endpoint's Retry-After (0 when none) and the transport failure.
type Exchange struct {
	Outcome    Outcome
	Status     int
	RetryAfter time.Duration
	Failure    Failure
}

// Timeout reports whether the exchange timed out: the breaker and the
// auto cap treat that apart from other failures.
func (x Exchange) Timeout() bool { return x.Failure == FailTimeout }

// Answered reports whether the endpoint answered with a status below 500:
// a success for the retry budget, 4xx included (it is alive and judging).
func (x Exchange) Answered() bool { return x.Status >= 200 && x.Status < 500 }

// PauseGone is the pause reason a 410 Gone records on its subscription.
const PauseGone = "endpoint answered 410 Gone"

// Resolution is the one decision about a delivery attempt: acknowledged,
// retried at Due, or dead-lettered with Reason; Pause, when not empty,
// also stops the subscription until an operator resumes it.
type Resolution struct {
	Outcome Outcome
	Due     time.Time // Retry only
	Reason  string    // DeadLetter only: one of the Reason constants
	Pause   string
}

// Resolve decides what happens to a delivery after attempt attempts (≥ 1),
// the first of which started at first: an Ack is done; a Retry is
// scheduled by p.Next or, when p allows no more, dead-lettered with its
// reason; a DeadLetter is ReasonRejected, or ReasonGone with a pause for a
// 410 (Standard Webhooks: the endpoint is gone for good, so stop sending
// and keep the backlog until an operator resumes). now is the caller's
// clock; Resolve reads none itself.
func Resolve(x Exchange, p RetryPolicy, attempt int, first, now time.Time) Resolution {
	switch x.Outcome {
	case Ack:
		return Resolution{Outcome: Ack}
	case Retry:
		due, reason, ok := p.Next(attempt, first, now, x.RetryAfter)
		if ok {
			return Resolution{Outcome: Retry, Due: due}
		}
		return Resolution{Outcome: DeadLetter, Reason: reason}
	}
	if x.Status == http.StatusGone {
		return Resolution{Outcome: DeadLetter, Reason: ReasonGone, Pause: PauseGone}
	}
	return Resolution{Outcome: DeadLetter, Reason: ReasonRejected}
}
