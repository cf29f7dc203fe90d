package policy

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
)

// Outcome is what a delivery attempt's result means. The zero value is not a
// valid Outcome.
type Outcome uint8

const (
	// Ack means the endpoint has the event; the delivery is done.
	Ack Outcome = iota + 1
	// Retry means the attempt failed in a way that may pass later; schedule
	// another attempt with RetryPolicy.Next.
	Retry
	// DeadLetter means the attempt failed in a way that will not change by
	// itself; keep the delivery as a dead letter with ReasonRejected.
	DeadLetter
)

// String returns "ack", "retry" or "dead_letter", the names used in
// configuration and as the outcome label of sluice_delivery_attempts_total.
// Invalid values print as "Outcome(N)".
func (o Outcome) String() string {
	switch o {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead_letter"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

func (o Outcome) valid() bool { return o >= Ack && o <= DeadLetter }

// ParseOutcome parses the String form of an Outcome. It accepts exactly
// "ack", "retry" and "dead_letter" (case-sensitive, no surrounding spaces);
// anything else returns an error that quotes s and wraps ErrUnknownOutcome.
func ParseOutcome(s string) (Outcome, error) {
	switch s {
	case "ack":
		return Ack, nil
	case "retry":
		return Retry, nil
	case "dead_letter":
		return DeadLetter, nil
	}
	return 0, fmt.Errorf("parse outcome %q: %w", s, ErrUnknownOutcome)
}

// Classify maps one HTTP exchange with an endpoint to an Outcome. status is
// the response status code and err the transport error, if any.
//
// Defaults (the response classification sluice documents):
//
//   - err != nil → Retry. Connection refused, reset, TLS failure or timeout:
//     there is no usable status, and a timeout is "unknown" (the endpoint
//     may have the event), so the delivery is tried again; receivers
//     deduplicate on the idempotency key. The status is ignored even when
//     one arrived before the error, because the exchange did not complete.
//   - 2xx → Ack.
//   - 408, 429, 5xx → Retry.
//   - other 4xx → DeadLetter: the endpoint rejected this request and will
//     reject it again.
//   - 3xx → DeadLetter. sluice does not follow redirects (Standard Webhooks
//     1.0, "Delivery success and failure": a 3xx is a failure, update the
//     URL instead), so a redirect will not turn into a 2xx by itself:
//     retrying would only spend attempts and retry budget until the delivery
//     dies of max_attempts or max_age, with a misleading reason. The operator
//     fixes the subscription's URL, then replays the dead letters.
//   - 1xx → Retry. An interim response is never a final answer; seeing one
//     as final is a protocol glitch (often in a proxy) that may pass.
//   - anything outside 100..599, including 0 with a nil err → Retry, for the
//     same reason: there is no valid status to judge.
//
// overrides (may be nil) maps an exact status code to an Outcome and wins
// over the defaults; it is not consulted when err != nil. Build it with
// ParseClassify. Invalid Outcome values in overrides are ignored.
//
// Classify does not know about context cancellation: callers must check
// their ctx first, because a cancelled attempt is not a failure: the
// endpoint did nothing wrong, sluice stopped waiting. Left to Classify, it would be a Retry, which is still safe.
//
// Classify does not allocate.
func Classify(status int, err error, overrides map[int]Outcome) Outcome {
	if err != nil {
		return Retry
	}
	if o, found := overrides[status]; found && o.valid() {
		return o
	}
	switch {
	case status >= 200 && status < 300:
		return Ack
	case status == 408, status == 429:
		return Retry
	case status >= 300 && status < 500:
		return DeadLetter
	default: // 1xx, 5xx and invalid codes
		return Retry
	}
}

// ParseClassify parses a subscription's classify configuration, such as
// {"409": "ack", "404": "dead_letter"}, into overrides for Classify.
//
// Keys are exact status codes written as three digits, 100 to 599; ranges
// such as "4xx", signs, spaces and leading zeros are rejected. Values are
// parsed with ParseOutcome. The error names the offending key or value and
// wraps ErrInvalidStatus or ErrUnknownOutcome; when several entries are bad,
// the one with the smallest key is reported, so the error is deterministic.
// An empty or nil m returns a nil map.
func ParseClassify(m map[string]string) (map[int]Outcome, error) {
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[int]Outcome, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		code, ok := parseStatus(k)
		if !ok {
			return nil, fmt.Errorf("parse classify key %q: %w", k, ErrInvalidStatus)
		}
		o, err := ParseOutcome(m[k])
		if err != nil {
			return nil, fmt.Errorf("parse classify %q: %w", k, err)
		}
		out[code] = o
	}
	return out, nil
}

// parseStatus accepts exactly three ASCII digits forming 100..599.
// strconv.Atoi alone would also accept "+404" and "0404".
func parseStatus(s string) (int, bool) {
	if len(s) != 3 {
		return 0, false
	}
	n := 0
	for i := range len(s) {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n >= 100 && n <= 599
}
