package policy_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

// FuzzMatchTypes checks ValidTypePattern and IsTypePattern never panic,
// and that MatchTypes agrees with a regular expression built from each
// valid pattern.
func FuzzMatchTypes(f *testing.F) {
	if testing.Short() {
		f.Skip("fuzz targets are skipped with -short")
	}
	for _, seed := range [][2]string{
		{"geofence.*", "geofence.enter"},
		{"geofence.*", "geofence.enter.late"},
		{"*.created", "invoice.created"},
		{"*.*", "a."},
		{"a.*.c", "a..c"},
		{"geo*", "geofence"},
		{"*", "anything"},
		{"invoice.created", "invoice.created"},
		{".*", ".x"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, pattern, typ string) {
		isPattern := policy.IsTypePattern(pattern)
		if policy.ValidTypePattern(pattern) != nil {
			return
		}
		m := policy.MatchTypes([]string{pattern})
		if pattern == "*" {
			if m != nil {
				t.Fatal(`MatchTypes(["*"]) is not nil`)
			}
			return
		}
		want := typ == pattern
		if isPattern {
			segs := strings.Split(pattern, ".")
			for i, s := range segs {
				if s == "*" {
					segs[i] = `[^.]+`
				} else {
					segs[i] = regexp.QuoteMeta(s)
				}
			}
			want = regexp.MustCompile(`^` + strings.Join(segs, `\.`) + `$`).MatchString(typ)
		}
		if got := m([]byte(typ)); got != want {
			t.Fatalf("MatchTypes([%q])(%q) = %v, want %v", pattern, typ, got, want)
		}
	})
}
