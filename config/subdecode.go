package config

import (
	"strings"
	"time"
)

// The subscriptions of a file are decoded by hand rather than by
// mapstructure: with 50,000 of them, mapstructure's reflection (a struct
// tag split for every field of every subscription) was 40% of the CPU of
// start-up. It is the one hand-written path left in front of a library
// here because the bound needs it: 50,000 file subscriptions must start in
// at most 3 s on 2 cores, and without it the lanes-50k start (process
// start to /readyz) was 2.6 s (YAML) and 2.8 s (JSON), medians on a loaded
// machine, against 1.3 s and 1.0 s with it; config.Load alone took 2.2 s
// against 0.5-0.7 s. The hand-written path is a fast path only, never a
// second set of rules: it takes a subscription only when every key and
// every value is of a shape that mapstructure decodes to the same value
// without help (a string into a string field, an int into an int field, a
// duration string that parses), and gives up on anything else (a key it
// does not know, a value of another type, a bad duration, null). A
// subscription it gives up on goes through mapstructure and decodeHook as
// before, and any error is reported by that path, so the checks and their
// messages stay where they were (decode.go, validate.go).
// FuzzDecodeSubFast checks that both paths give equal results wherever
// the fast one answers.

// slowSubKeys are the subscription keys the fast path leaves to
// mapstructure: sections rarely written by fleets of generated
// subscriptions, whose shapes are richer (filter's operators, egress's
// files). TestDecodeSubFastCoversKeys keeps this list and the switch in
// decodeSubFast covering every key of SubscriptionConfig together.
var slowSubKeys = []string{"filter", "body", "egress", "tls", "auth"}

// decodeSubFast decodes raw, one parsed subscription, into s, which must
// be zero, and reports whether it could. When it reports false s holds
// part of raw and must be discarded.
func decodeSubFast(raw any, s *SubscriptionConfig) bool {
	m, ok := raw.(map[string]any)
	if !ok {
		return false
	}
	for k, v := range m {
		switch k {
		case "id":
			ok = fastString(v, &s.ID)
		case "url":
			ok = fastString(v, &s.URL)
		case "secret":
			ok = fastString(v, &s.Secret)
		case "secrets":
			ok = fastStrings(v, &s.Secrets)
		case "secret_file":
			ok = fastString(v, &s.SecretFile)
		case "secret_env":
			ok = fastString(v, &s.SecretEnv)
		case "types":
			ok = fastStrings(v, &s.Types)
		case "tenant":
			ok = fastString(v, &s.Tenant)
		case "timeout":
			ok = fastDuration(v, &s.Timeout)
		case "rate":
			ok = fastSection(v, func(k string, v any) bool {
				switch k {
				case "per_second":
					return fastFloat(v, &s.Rate.PerSecond)
				case "burst":
					return fastInt(v, &s.Rate.Burst)
				}
				return false
			})
		case "concurrency":
			ok = fastSection(v, func(k string, v any) bool {
				c := &s.Concurrency
				switch k {
				case "auto":
					return fastBool(v, &c.Auto)
				case "min":
					return fastInt(v, &c.Min)
				case "max":
					return fastInt(v, &c.Max)
				case "headroom":
					return fastInt(v, &c.Headroom)
				}
				return false
			})
		case "retry":
			ok = fastSection(v, func(k string, v any) bool {
				r := &s.Retry
				switch k {
				case "max_attempts":
					return fastInt(v, &r.MaxAttempts)
				case "max_age":
					return fastDuration(v, &r.MaxAge)
				case "base":
					return fastDuration(v, &r.Base)
				case "cap":
					return fastDuration(v, &r.Cap)
				}
				return false
			})
		case "backlog":
			ok = fastSection(v, func(k string, v any) bool {
				switch k {
				case "max_events":
					var n int
					ok := fastInt(v, &n)
					s.Backlog.MaxEvents = int64(n)
					return ok
				case "max_age":
					return fastDuration(v, &s.Backlog.MaxAge)
				}
				return false
			})
		case "breaker":
			ok = fastSection(v, func(k string, v any) bool {
				b := &s.Breaker
				switch k {
				case "failure_ratio":
					return fastFloat(v, &b.FailureRatio)
				case "min_requests":
					return fastInt(v, &b.MinRequests)
				case "window":
					return fastDuration(v, &b.Window)
				case "consecutive_timeouts":
					return fastInt(v, &b.ConsecutiveTimeouts)
				case "cool_down":
					return fastDuration(v, &b.CoolDown)
				case "max_cool_down":
					return fastDuration(v, &b.MaxCoolDown)
				}
				return false
			})
		case "headers":
			ok = fastStringMap(v, &s.Headers)
		case "classify":
			ok = fastStringMap(v, &s.Classify)
		case "paused":
			ok = fastBool(v, &s.Paused)
		case "ordering":
			ok = fastString(v, &s.Ordering)
		case "format":
			ok = fastString(v, &s.Format)
		default: // slowSubKeys, and keys that are no key
			return false
		}
		if !ok {
			return false
		}
	}
	return true
}

// fastSection decodes a nested mapping key by key with set; a section
// that is not a mapping of string keys (null, a list, YAML's map[any]any)
// is mapstructure's.
func fastSection(v any, set func(key string, v any) bool) bool {
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	for k, e := range m {
		if !set(k, e) {
			return false
		}
	}
	return true
}

func fastString(v any, out *string) bool {
	s, ok := v.(string)
	*out = s
	return ok
}

// fastInt takes an int, the type both parsers give whole numbers in
// range; a float, a uint64 or a string is decodeHook's to judge.
func fastInt(v any, out *int) bool {
	n, ok := v.(int)
	*out = n
	return ok
}

// fastFloat takes a float64 or an int, as mapstructure converts one.
func fastFloat(v any, out *float64) bool {
	switch x := v.(type) {
	case float64:
		*out = x
		return true
	case int:
		*out = float64(x)
		return true
	}
	return false
}

func fastBool(v any, out *bool) bool {
	b, ok := v.(bool)
	*out = b
	return ok
}

// fastDuration parses a string as decodeDuration does; one that does not
// parse is left to decodeDuration, which words the error.
func fastDuration(v any, out *time.Duration) bool {
	s, ok := v.(string)
	if !ok {
		return false
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	*out = d
	return err == nil
}

// fastStrings takes a list of strings; mapstructure makes even an empty
// list a non-nil slice, and so does this.
func fastStrings(v any, out *[]string) bool {
	l, ok := v.([]any)
	if !ok {
		return false
	}
	ss := make([]string, len(l))
	for i, e := range l {
		if ss[i], ok = e.(string); !ok {
			return false
		}
	}
	*out = ss
	return true
}

// fastStringMap takes a mapping of strings to strings (not YAML's
// map[any]any of classify: {409: ack}, nor numbers as values, which
// decodeHook turns into strings); like mapstructure it makes even an
// empty mapping a non-nil map.
func fastStringMap(v any, out *map[string]string) bool {
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	sm := make(map[string]string, len(m))
	for k, e := range m {
		s, ok := e.(string)
		if !ok {
			return false
		}
		sm[k] = s
	}
	*out = sm
	return true
}
