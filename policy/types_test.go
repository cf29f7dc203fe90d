package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

func TestValidTypePattern(t *testing.T) {
	long := strings.Repeat("a", policy.MaxTypeLen)
	tests := []struct {
		p       string
		pattern bool   // IsTypePattern
		want    string // the error after ErrInvalidTypePattern's text, "" when valid
	}{
		// Exact types: config's rule, ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$.
		{"invoice.created", false, ""},
		{"a", false, ""},
		{"9", false, ""},
		{"Order:v2_created-late", false, ""},
		{"geofence.", false, ""},
		{"a..b", false, ""},
		{long, false, ""},
		{long + "a", false, ": longer than 128 bytes"},
		{"", false, ": empty"},
		{".a", false, `: must start with a letter or a digit, not '.'`},
		{"_a", false, `: must start with a letter or a digit, not '_'`},
		{"a b", false, `: invalid character ' ' (want letters, digits and "._:-")`},
		{"a/b", false, `: invalid character '/' (want letters, digits and "._:-")`},
		{"é", false, `: must start with a letter or a digit, not 'é'`},
		{"aé", false, `: invalid character 'é' (want letters, digits and "._:-")`},
		{"a\xff", false, `: invalid character '�' (want letters, digits and "._:-")`},

		// "*" alone and whole-segment wildcards.
		{"*", false, ""},
		{"geofence.*", true, ""},
		{"*.created", true, ""},
		{"*.*", true, ""},
		{"a.*.c", true, ""},
		{"a:b.*", true, ""},
		{"*." + long[:126], true, ""},
		{"*." + long[:127], true, ": longer than 128 bytes"},
		{"geo*", false, `: "geo*": "*" must be a whole segment, as in "geofence.*", not part of one`},
		{"geofence.en*", false, `: "en*": "*" must be a whole segment, as in "geofence.*", not part of one`},
		{"*a.b", false, `: "*a": "*" must be a whole segment, as in "geofence.*", not part of one`},
		{"**", false, `: "**": "*" must be a whole segment, as in "geofence.*", not part of one`},
		{"a.**.b", false, `: "**": "*" must be a whole segment, as in "geofence.*", not part of one`},
		{"geofence.*.", true, `: empty segment (in a pattern "*" stands for one whole non-empty segment)`},
		{".*", true, `: empty segment (in a pattern "*" stands for one whole non-empty segment)`},
		{"a..*", true, `: empty segment (in a pattern "*" stands for one whole non-empty segment)`},
		{"a b.*", true, `: invalid character ' ' (want letters, digits and "._:-")`},
		{"_a.*", true, `: must start with a letter or a digit, not '_'`},
	}
	for _, tt := range tests {
		err := policy.ValidTypePattern(tt.p)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("ValidTypePattern(%q) = %v, want nil", tt.p, err)
		case tt.want != "" && err == nil:
			t.Errorf("ValidTypePattern(%q) = nil, want an error", tt.p)
		case tt.want != "":
			if want := policy.ErrInvalidTypePattern.Error() + tt.want; err.Error() != want {
				t.Errorf("ValidTypePattern(%q):\n got %v\nwant %s", tt.p, err, want)
			}
			if !errors.Is(err, policy.ErrInvalidTypePattern) {
				t.Errorf("ValidTypePattern(%q) does not wrap ErrInvalidTypePattern", tt.p)
			}
		}
		if got := policy.IsTypePattern(tt.p); got != tt.pattern {
			t.Errorf("IsTypePattern(%q) = %v, want %v", tt.p, got, tt.pattern)
		}
	}
}

func TestMatchTypes(t *testing.T) {
	tests := []struct {
		name  string
		types []string
		match []string
		not   []string
	}{
		{"exact", []string{"invoice.created", "invoice.paid"},
			[]string{"invoice.created", "invoice.paid"},
			[]string{"invoice", "invoice.created.late", "Invoice.created", "invoice.create", ""}},
		{"trailing wildcard", []string{"geofence.*"},
			[]string{"geofence.enter", "geofence.exit", "geofence.x"},
			[]string{"geofence", "geofence.", "geofence.enter.late", "geofences.enter", "geo.enter", "x.geofence.enter", ""}},
		{"leading wildcard", []string{"*.created"},
			[]string{"invoice.created", "a.created"},
			[]string{"created", ".created", "invoice.created.x", "a.b.created", "invoice.createdx"}},
		{"middle wildcard", []string{"a.*.c"},
			[]string{"a.b.c", "a.bbb.c"},
			[]string{"a.c", "a..c", "a.b.c.c", "a.b.d", "x.b.c"}},
		{"two wildcards", []string{"*.*"},
			[]string{"a.b", "invoice.created"},
			[]string{"a", "a.b.c", ".b", "a.", "."}},
		{"exact beside patterns", []string{"geofence", "geofence.*", "*.created"},
			[]string{"geofence", "geofence.enter", "order.created"},
			[]string{"geofence.enter.late", "order.paid"}},
		{"empty list", []string{},
			nil,
			[]string{"a", "*", ""}},
		{"partial wildcard is literal", []string{"geo*"},
			[]string{"geo*"},
			[]string{"geofence", "geo"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := policy.MatchTypes(tt.types)
			if m == nil {
				t.Fatal("MatchTypes returned nil")
			}
			for _, typ := range tt.match {
				if !m([]byte(typ)) {
					t.Errorf("%q does not match %q", tt.types, typ)
				}
			}
			for _, typ := range tt.not {
				if m([]byte(typ)) {
					t.Errorf("%q matches %q", tt.types, typ)
				}
			}
		})
	}
	for _, types := range [][]string{{"*"}, {"a", "*"}, {"geofence.*", "*"}} {
		if policy.MatchTypes(types) != nil {
			t.Errorf("MatchTypes(%q) is not nil", types)
		}
	}
}

// The list is compiled: changing it afterwards changes nothing.
func TestMatchTypesCopies(t *testing.T) {
	types := []string{"a.*", "b"}
	m := policy.MatchTypes(types)
	types[0], types[1] = "x.*", "y"
	if !m([]byte("a.z")) || !m([]byte("b")) || m([]byte("x.z")) || m([]byte("y")) {
		t.Error("the matcher follows changes to the list it was built from")
	}
}

func TestMatchTypesAllocs(t *testing.T) {
	m := policy.MatchTypes([]string{"invoice.created", "geofence.*", "*.deleted"})
	for _, typ := range []string{"invoice.created", "geofence.enter", "user.deleted", "user.created"} {
		b := []byte(typ)
		if n := testing.AllocsPerRun(100, func() { m(b) }); n != 0 {
			t.Errorf("matching %q allocates %v times", typ, n)
		}
	}
}

func BenchmarkMatchTypes(b *testing.B) {
	exact := []string{"invoice.created", "invoice.paid", "invoice.voided", "order.created", "order.shipped"}
	patterns := append(exact[:len(exact):len(exact)], "geofence.*", "*.deleted", "fleet.*.alarm")
	for _, bm := range []struct {
		name  string
		types []string
		typ   string
	}{
		{"exact/hit", exact, "order.created"},
		{"exact/miss", exact, "user.created"},
		{"patterns/exact-hit", patterns, "order.created"},
		{"patterns/pattern-hit", patterns, "fleet.north.alarm"},
		{"patterns/miss", patterns, "user.created"},
	} {
		m := policy.MatchTypes(bm.types)
		typ := []byte(bm.typ)
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m(typ)
			}
		})
	}
}
