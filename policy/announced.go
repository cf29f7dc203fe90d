package policy

import (
	"strconv"
	"strings"
	"time"
)

// An endpoint may say how much more it will take, on any response, an
// acknowledgement as much as a 429: the IETF's RateLimit header fields
// (draft-ietf-httpapi-ratelimit-headers), in the structured form of its
// later drafts or the separate fields of its earlier ones, or the common
// X-RateLimit-Remaining and X-RateLimit-Reset. ParseAnnounced reads them;
// a lane whose endpoint says nothing remains holds back until the reset,
// rather than spending attempts on 429s. It never raises a subscription's
// own rate.

// Announced is an endpoint's own account of its limit after a response:
// how many more requests it takes, and when its window resets.
type Announced struct {
	Remaining int64
	Reset     time.Duration // from the response; 0 when it resets now
	// Source names the header fields it came from, for the lane's status.
	Source string
}

// Exhausted reports that the endpoint takes no more until Reset.
func (a Announced) Exhausted() bool { return a.Remaining <= 0 }

// epochSeconds tells an X-RateLimit-Reset given as a Unix time (GitHub's
// form) from one given as seconds to wait (most others): no window is a
// billion seconds (31 years) long, and no Unix time since 2001 is
// smaller.
const epochSeconds = 1_000_000_000

// ParseAnnounced reads an endpoint's announced limit from a response's
// header fields (get returns a field's value, "" when absent), in this
// order: RateLimit in the structured form ("default";r=0;t=30, the most
// restrictive member counting), RateLimit in the earlier drafts'
// dictionary form (limit=100, remaining=0, reset=30), RateLimit-Remaining
// with RateLimit-Reset, then X-RateLimit-Remaining with X-RateLimit-Reset
// (seconds, or a Unix time taken against the response's Date, else now).
// ok is false when no form is complete and well formed: a remaining count
// with no reset says nothing about when to go on.
func ParseAnnounced(get func(name string) string, now time.Time) (a Announced, ok bool) {
	if v := get("RateLimit"); v != "" {
		if a, ok := structuredLimit(v); ok {
			a.Source = "RateLimit"
			return a, true
		}
	}
	if r, t := get("RateLimit-Remaining"), get("RateLimit-Reset"); r != "" && t != "" {
		rem, ok1 := count(r)
		reset, ok2 := seconds(t)
		if ok1 && ok2 {
			return Announced{Remaining: rem, Reset: reset, Source: "RateLimit-Remaining"}, true
		}
	}
	if r, t := get("X-RateLimit-Remaining"), get("X-RateLimit-Reset"); r != "" && t != "" {
		rem, ok1 := count(r)
		n, ok2 := count(strings.Trim(t, " \t"))
		if !ok1 || !ok2 {
			return Announced{}, false
		}
		reset := time.Duration(n) * time.Second
		if n >= epochSeconds {
			if d := strings.Trim(get("Date"), " \t"); d != "" {
				for _, layout := range httpDateLayouts {
					if t, err := time.Parse(layout, d); err == nil {
						now = t
						break
					}
				}
			}
			reset = max(time.Unix(n, 0).Sub(now), 0)
		}
		return Announced{Remaining: rem, Reset: reset, Source: "X-RateLimit-Remaining"}, true
	}
	return Announced{}, false
}

// structuredLimit reads a RateLimit field: a list of members each with
// parameters r (remaining) and t (seconds to reset), as in
// `"default";r=0;t=30, "burst";r=5;t=1`, or the earlier drafts'
// dictionary `limit=100, remaining=0, reset=30`. Of several members the
// most restrictive counts: the fewest remaining, and of those the latest
// reset.
func structuredLimit(v string) (Announced, bool) {
	var best Announced
	found := false
	dict := map[string]string{}
	for _, member := range strings.Split(v, ",") {
		member = strings.Trim(member, " \t")
		if k, val, isDict := strings.Cut(member, "="); isDict && !strings.Contains(k, ";") {
			dict[strings.ToLower(strings.Trim(k, " \t"))] = val
			continue
		}
		params := strings.Split(member, ";")[1:]
		var rem, reset string
		for _, p := range params {
			k, val, _ := strings.Cut(strings.Trim(p, " \t"), "=")
			switch k {
			case "r":
				rem = val
			case "t":
				reset = val
			}
		}
		if rem == "" || reset == "" {
			continue
		}
		r, ok1 := count(rem)
		t, ok2 := seconds(reset)
		if !ok1 || !ok2 {
			return Announced{}, false
		}
		if !found || r < best.Remaining || r == best.Remaining && t > best.Reset {
			best, found = Announced{Remaining: r, Reset: t}, true
		}
	}
	if found {
		return best, true
	}
	if r, t := dict["remaining"], dict["reset"]; r != "" && t != "" {
		rem, ok1 := count(r)
		reset, ok2 := seconds(t)
		if ok1 && ok2 {
			return Announced{Remaining: rem, Reset: reset}, true
		}
	}
	return Announced{}, false
}

// count reads a non-negative decimal count.
func count(v string) (int64, bool) {
	v = strings.Trim(v, " \t")
	if v == "" || v[0] < '0' || v[0] > '9' {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// seconds reads delay-seconds, saturating as Retry-After's do.
func seconds(v string) (time.Duration, bool) {
	v = strings.Trim(v, " \t")
	if v == "" || v[0] < '0' || v[0] > '9' {
		return 0, false
	}
	return parseDelaySeconds(v)
}
