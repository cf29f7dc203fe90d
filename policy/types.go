package policy

// STUB (issue 12): the signatures the proxy and config build on.

// ValidTypePattern checks one entry of a subscription's types: an exact
// event type, "*" alone, or a pattern whose dot-separated segments may be
// "*" (one whole segment: "geofence.*", "*.created").
func ValidTypePattern(p string) error { return nil }

// IsTypePattern reports whether p holds a wildcard segment (and is not
// "*" alone).
func IsTypePattern(p string) bool { return false }

// MatchTypes compiles a subscription's types into a matcher; nil when
// they hold "*" (every type).
func MatchTypes(types []string) func(typ []byte) bool {
	set := map[string]struct{}{}
	for _, t := range types {
		if t == "*" {
			return nil
		}
		set[t] = struct{}{}
	}
	return func(typ []byte) bool { _, ok := set[string(typ)]; return ok }
}
