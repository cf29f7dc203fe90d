package policy_test

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

// fuzzDocs are the documents every filter the fuzzer finds is matched on,
// beside the fuzz input itself read as a body.
var fuzzDocs = []string{
	`{}`,
	`null`,
	`[1, {"a": 2}]`,
	`{"a": 1, "b": "x", "c": [true, null, {"d": 1.5}], "data": {"depot": "A", "speed": 81, "kind": "alarm"}}`,
	`{"a": {"b": {"c": "2026-03-01T00:00:00Z"}}, "0": 9007199254740993, "items": [{"sku": "X1"}]}`,
}

// FuzzParseFilter checks that ParseFilter never panics on any JSON
// object, and for those it accepts: Match never panics, F and {"$not": F}
// never both match, String reads back into a filter that matches the
// same, and DecodeDocument accepts exactly what json.Valid does.
func FuzzParseFilter(f *testing.F) {
	if testing.Short() {
		f.Skip("fuzz targets are skipped with -short")
	}
	for _, seed := range []string{
		issueFilter,
		`{}`,
		`{"a": 1}`,
		`{"a": {"$gt": 1, "$lt": "z"}, "b.0.c": {"$in": [1, "x", null, [true]]}}`,
		`{"$or": [{"a": {"$exists": false}}, {"$not": {"b": {"$nin": [1e400]}}}]}`,
		`{"$and": [{"a": {"$neq": {"b": 1}}}, {"c": {"$startsWith": ""}}]}`,
		`{"a": {"$eq": {"$x": [1, 2]}}, "b": {"c": {"$in": [1]}}}`,
		`{"a": {"$regex": "x"}}`,
		`{"a..b": 1, "": 2}`,
		`{"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"a": 1}}}}}}}}}}}}}}}}`,
		`{"a": 9223372036854775808, "b": -9223372036854775809, "c": 0.1, "d": 1E-400}`,
	} {
		f.Add([]byte(seed))
	}
	docs := make([]any, len(fuzzDocs))
	for i, body := range fuzzDocs {
		docs[i] = mustDoc(f, body)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, ok := policy.DecodeDocument(data)
		if ok != json.Valid(data) || (doc == nil) == ok {
			t.Fatalf("DecodeDocument(%q) = %v, %v; json.Valid says %v", data, doc, ok, json.Valid(data))
		}
		docs := append(docs[:len(docs):len(docs)], doc)

		// As the API decodes (json.Number) and as plain encoding/json does.
		var plain map[string]any
		if json.Unmarshal(data, &plain) == nil {
			if fl, err := policy.ParseFilter(plain); err == nil {
				for _, d := range docs {
					fl.Match(d)
				}
			} else if _, isFilterError := err.(*policy.FilterError); !isFilterError {
				t.Fatalf("ParseFilter error %T: %v", err, err)
			}
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var spec map[string]any
		if dec.Decode(&spec) != nil {
			return
		}
		fl, err := policy.ParseFilter(spec)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "filter: ") {
				t.Fatalf("ParseFilter error %q", err)
			}
			return
		}
		canon := fl.String()
		again, err := policy.ParseFilter(decodeSpec(t, canon))
		if err != nil {
			t.Fatalf("String %s does not parse: %v", canon, err)
		}
		if again.String() != canon {
			t.Fatalf("String is not stable: %s, then %s", canon, again)
		}
		notF, notErr := policy.ParseFilter(map[string]any{"$not": spec}) // fails one level past the depth bound
		for _, d := range docs {
			m := fl.Match(d)
			if again.Match(d) != m {
				t.Fatalf("%s and its String %s differ on %v", data, canon, d)
			}
			if notErr == nil && notF.Match(d) && m {
				t.Fatalf("%s and its $not both match %v", data, d)
			}
			if notErr == nil && d != nil && notF.Match(d) == m {
				t.Fatalf("neither %s nor its $not matches %v", data, d)
			}
		}
	})
}

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
