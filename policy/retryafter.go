package policy

import (
	"math"
	"strings"
	"time"
)

// HTTP-date layouts (RFC 9110 §5.6.7): the preferred IMF-fixdate, then the
// obsolete RFC 850 and asctime forms that recipients must still accept.
// net/http's ParseTime knows the same three; it is not used so that policy
// does not import net/http (queue may import policy and must not depend on
// HTTP). Unlike ParseTime, RFC 850 dates must say GMT, as RFC 9110 requires,
// so a zone abbreviation is never resolved against the local time zone.
var httpDateLayouts = [...]string{
	"Mon, 02 Jan 2006 15:04:05 GMT",  // IMF-fixdate
	"Monday, 02-Jan-06 15:04:05 GMT", // RFC 850
	"Mon Jan _2 15:04:05 2006",       // asctime, always UTC
}

// ParseRetryAfter reads a Retry-After header value (RFC 9110 §10.2.3):
// delay-seconds ("120") or an HTTP-date, which is taken relative to now.
// Surrounding spaces and tabs are ignored.
//
// It returns ok=false for an empty value, garbage, a sign or fraction
// ("-5", "+5", "1.5"), or a date in none of the three formats. A date at or
// before now returns 0, true: the endpoint is ready now. A delay-seconds too
// large for a time.Duration saturates at the largest Duration; callers cap
// it anyway (RetryPolicy.Next).
//
// Which responses to read it from is the caller's choice; sluice honours
// it on 429 and 503.
func ParseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return 0, false
	}
	if c := v[0]; c >= '0' && c <= '9' {
		return parseDelaySeconds(v)
	}
	for _, layout := range httpDateLayouts {
		if t, err := time.Parse(layout, v); err == nil {
			// Sub saturates rather than overflowing for far-off dates.
			return max(t.Sub(now), 0), true
		}
	}
	return 0, false
}

// ParseRetryAfterAt is ParseRetryAfter for a response with a Date header:
// an HTTP-date Retry-After is taken relative to the response's own Date,
// so that a skew between the endpoint's clock and ours neither stretches
// nor cancels the wait (both dates come from the endpoint's clock). A
// missing or unparseable date falls back to now.
func ParseRetryAfterAt(v string, now time.Time, date string) (time.Duration, bool) {
	date = strings.Trim(date, " \t")
	for _, layout := range httpDateLayouts {
		if t, err := time.Parse(layout, date); err == nil {
			now = t
			break
		}
	}
	return ParseRetryAfter(v, now)
}

// parseDelaySeconds parses 1*DIGIT, saturating at the largest Duration.
func parseDelaySeconds(v string) (time.Duration, bool) {
	const maxSeconds = int64(math.MaxInt64 / time.Second)
	var n int64
	for i := range len(v) {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n <= maxSeconds { // stop accumulating once saturated
			n = n*10 + int64(c-'0')
		}
	}
	if n > maxSeconds {
		return math.MaxInt64, true
	}
	return time.Duration(n) * time.Second, true
}
