package policy

import (
	"bytes"
	"fmt"
	"strings"
)

// MaxTypeLen bounds an event type, and a type pattern, in bytes.
const MaxTypeLen = 128

// ValidTypePattern checks one entry of a subscription's types:
//
//   - "*" alone, every type;
//   - an exact event type: a letter or a digit, then up to 127 letters,
//     digits and "._:-" (^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$);
//   - a pattern: dot-separated segments where a segment may be "*",
//     which stands for exactly one whole non-empty segment, as "*" does
//     in a NATS subject: "geofence.*" matches "geofence.enter" but neither
//     "geofence" nor "geofence.enter.late"; "*.created" matches
//     "invoice.created". The other segments are non-empty and hold the
//     characters of an exact type (so no "."), and the whole, with each
//     "*" read as a letter, is a valid exact type.
//
// A "*" inside a segment ("geo*") is refused: matching parts of segments
// is what a prefix filter on the body is for, and keeping wildcards whole
// keeps MatchTypes a split and a compare. The error wraps
// ErrInvalidTypePattern and does not repeat p; the caller names the key
// and the value.
func ValidTypePattern(p string) error {
	if p == "*" {
		return nil
	}
	if p == "" {
		return fmt.Errorf("%w: empty", ErrInvalidTypePattern)
	}
	if len(p) > MaxTypeLen {
		return fmt.Errorf("%w: longer than %d bytes", ErrInvalidTypePattern, MaxTypeLen)
	}
	if !strings.Contains(p, "*") {
		return validType(p)
	}
	for seg := range strings.SplitSeq(p, ".") {
		switch {
		case seg == "":
			return fmt.Errorf(`%w: empty segment (in a pattern "*" stands for one whole non-empty segment)`, ErrInvalidTypePattern)
		case seg == "*":
		case strings.Contains(seg, "*"):
			return fmt.Errorf(`%w: %q: "*" must be a whole segment, as in "geofence.*", not part of one`, ErrInvalidTypePattern, seg)
		}
	}
	// Each "*" read as a letter: the rest must be an exact type's.
	return validType(strings.ReplaceAll(p, "*", "x"))
}

// validType checks an exact event type, with the rule config has always
// applied.
func validType(t string) error {
	for i, r := range t {
		switch {
		case r < 0x80 && isAlnum(byte(r)):
		case i == 0:
			return fmt.Errorf("%w: must start with a letter or a digit, not %q", ErrInvalidTypePattern, r)
		case r != '.' && r != '_' && r != ':' && r != '-':
			return fmt.Errorf(`%w: invalid character %q (want letters, digits and "._:-")`, ErrInvalidTypePattern, r)
		}
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// IsTypePattern reports whether p holds a wildcard segment and is not "*"
// alone: an entry of types that MatchTypes cannot look up as it is. It
// does not validate p.
func IsTypePattern(p string) bool {
	if p == "*" {
		return false
	}
	for seg := range strings.SplitSeq(p, ".") {
		if seg == "*" {
			return true
		}
	}
	return false
}

// MatchTypes compiles a subscription's types, as ValidTypePattern accepts
// them, into a matcher of event types; nil when they hold "*" (every
// type), so that callers can skip the call. An empty list matches no type.
//
// Exact types are looked up in a set and patterns compared segment by
// segment, split once here. The matcher does not allocate, keeps no
// reference to types, and is safe for concurrent use.
func MatchTypes(types []string) func(typ []byte) bool {
	exact := make(map[string]struct{}, len(types))
	var patterns []typePattern
	for _, t := range types {
		if t == "*" {
			return nil
		}
		if IsTypePattern(t) {
			patterns = append(patterns, typePattern{segs: strings.Split(t, "."), dots: strings.Count(t, ".")})
			continue
		}
		exact[t] = struct{}{}
	}
	if len(patterns) == 0 {
		return func(typ []byte) bool {
			_, ok := exact[string(typ)]
			return ok
		}
	}
	return func(typ []byte) bool {
		if _, ok := exact[string(typ)]; ok {
			return true
		}
		dots := bytes.Count(typ, dot)
		for i := range patterns {
			if patterns[i].dots == dots && patterns[i].match(typ) {
				return true
			}
		}
		return false
	}
}

var dot = []byte{'.'}

// typePattern is a pattern of MatchTypes, split at its dots.
type typePattern struct {
	segs []string // "*" for a wildcard segment
	dots int      // len(segs)-1: a type with another count cannot match
}

// match reports whether typ, with as many dots as p, matches p.
func (p *typePattern) match(typ []byte) bool {
	for _, seg := range p.segs {
		part := typ
		if i := bytes.IndexByte(typ, '.'); i >= 0 {
			part, typ = typ[:i], typ[i+1:]
		}
		if seg == "*" {
			if len(part) == 0 {
				return false
			}
		} else if string(part) != seg {
			return false
		}
	}
	return true
}
