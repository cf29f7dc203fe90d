package policy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// decodeSpec decodes a filter spec the way the API does: JSON with
// json.Number, so that large integers stay exact.
func decodeSpec(tb testing.TB, spec string) map[string]any {
	tb.Helper()
	dec := json.NewDecoder(strings.NewReader(spec))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		tb.Fatalf("decode spec %s: %v", spec, err)
	}
	return m
}

func mustFilter(tb testing.TB, spec string) *policy.Filter {
	tb.Helper()
	f, err := policy.ParseFilter(decodeSpec(tb, spec))
	if err != nil {
		tb.Fatalf("ParseFilter(%s): %v", spec, err)
	}
	return f
}

// negate returns {"$not": spec}.
func negate(tb testing.TB, spec string) *policy.Filter {
	tb.Helper()
	return mustFilter(tb, `{"$not": `+spec+`}`)
}

func mustDoc(tb testing.TB, body string) any {
	tb.Helper()
	doc, ok := policy.DecodeDocument([]byte(body))
	if !ok {
		tb.Fatalf("DecodeDocument(%s): not JSON", body)
	}
	return doc
}

// The documented example: depot A or B, and a speed over 80 or an alarm.
const issueFilter = `{"data.depot": {"$in": ["A", "B"]}, "$or": [{"data.speed": {"$gt": 80}}, {"data.kind": {"$startsWith": "alarm"}}]}`

func TestFilterMatch(t *testing.T) {
	tests := []struct {
		name   string
		filter string
		doc    string
		want   bool
	}{
		// Shorthand equality.
		{"shorthand string", `{"a": "x"}`, `{"a": "x"}`, true},
		{"shorthand string differs", `{"a": "x"}`, `{"a": "y"}`, false},
		{"shorthand number", `{"a": 80}`, `{"a": 80}`, true},
		{"shorthand number vs 80.0", `{"a": 80}`, `{"a": 80.0}`, true},
		{"shorthand number vs 8e1", `{"a": 80}`, `{"a": 8e1}`, true},
		{"shorthand number vs string", `{"a": 80}`, `{"a": "80"}`, false},
		{"shorthand string vs number", `{"a": "80"}`, `{"a": 80}`, false},
		{"shorthand bool", `{"a": true}`, `{"a": true}`, true},
		{"shorthand bool differs", `{"a": true}`, `{"a": false}`, false},
		{"shorthand bool vs 1", `{"a": true}`, `{"a": 1}`, false},
		{"shorthand null", `{"a": null}`, `{"a": null}`, true},
		{"shorthand null vs missing", `{"a": null}`, `{}`, false},
		{"shorthand null vs false", `{"a": null}`, `{"a": false}`, false},
		{"shorthand list", `{"a": [1, "x"]}`, `{"a": [1.0, "x"]}`, true},
		{"shorthand list order", `{"a": [1, "x"]}`, `{"a": ["x", 1]}`, false},
		{"shorthand list length", `{"a": [1]}`, `{"a": [1, 1]}`, false},
		{"shorthand list is not membership", `{"a": "x"}`, `{"a": ["x"]}`, false},
		{"shorthand object", `{"a": {"b": 1, "c": [true]}}`, `{"a": {"c": [true], "b": 1}}`, true},
		{"shorthand object extra key", `{"a": {"b": 1}}`, `{"a": {"b": 1, "c": 2}}`, false},
		{"shorthand object missing key", `{"a": {"b": 1, "c": 2}}`, `{"a": {"b": 1, "d": 2}}`, false},

		// $eq, $neq.
		{"$eq", `{"a": {"$eq": "x"}}`, `{"a": "x"}`, true},
		{"$eq empty object", `{"a": {"$eq": {}}}`, `{"a": {}}`, true},
		{"$eq empty object vs list", `{"a": {"$eq": {}}}`, `{"a": []}`, false},
		{"$eq object with $ key", `{"a": {"$eq": {"$x": 1}}}`, `{"a": {"$x": 1}}`, true},
		{"$eq missing", `{"a": {"$eq": "x"}}`, `{}`, false},
		{"$neq differs", `{"a": {"$neq": "x"}}`, `{"a": "y"}`, true},
		{"$neq equal", `{"a": {"$neq": "x"}}`, `{"a": "x"}`, false},
		{"$neq other type", `{"a": {"$neq": 1}}`, `{"a": "1"}`, true},
		{"$neq missing matches", `{"a": {"$neq": "x"}}`, `{}`, true},
		{"$neq null present", `{"a": {"$neq": null}}`, `{"a": null}`, false},
		{"$neq null missing", `{"a": {"$neq": null}}`, `{}`, true},

		// Order of numbers.
		{"$gt above", `{"a": {"$gt": 80}}`, `{"a": 81}`, true},
		{"$gt equal", `{"a": {"$gt": 80}}`, `{"a": 80}`, false},
		{"$gt fraction", `{"a": {"$gt": 80}}`, `{"a": 80.5}`, true},
		{"$gte equal", `{"a": {"$gte": 80}}`, `{"a": 80.0}`, true},
		{"$gte below", `{"a": {"$gte": 80}}`, `{"a": 79.999}`, false},
		{"$lt below", `{"a": {"$lt": 0}}`, `{"a": -1}`, true},
		{"$lt equal", `{"a": {"$lt": 0}}`, `{"a": -0}`, false},
		{"$lte equal", `{"a": {"$lte": 1.5}}`, `{"a": 1.5}`, true},
		{"$lte above", `{"a": {"$lte": 1.5}}`, `{"a": 2}`, false},
		{"$gt negative fraction", `{"a": {"$gt": -2.5}}`, `{"a": -2}`, true},
		{"$lt negative fraction", `{"a": {"$lt": -2.5}}`, `{"a": -3}`, true},
		{"$gt fraction operand vs int", `{"a": {"$gt": 2.5}}`, `{"a": 3}`, true},
		{"$gt fraction operand vs smaller int", `{"a": {"$gt": 2.5}}`, `{"a": 2}`, false},
		{"$gt exponent", `{"a": {"$gt": 1e3}}`, `{"a": 1001}`, true},
		{"$gt number vs string", `{"a": {"$gt": 80}}`, `{"a": "90"}`, false},
		{"$gt number vs bool", `{"a": {"$gt": 0}}`, `{"a": true}`, false},
		{"$gt missing", `{"a": {"$gt": 80}}`, `{}`, false},
		{"$lt missing", `{"a": {"$lt": 80}}`, `{}`, false},
		{"range inside", `{"a": {"$gt": 1, "$lt": 5}}`, `{"a": 3}`, true},
		{"range outside", `{"a": {"$gt": 1, "$lt": 5}}`, `{"a": 5}`, false},

		// Exact integers past 2^53, where float64 rounds.
		{"2^53+1 > 2^53", `{"a": {"$gt": 9007199254740992}}`, `{"a": 9007199254740993}`, true},
		{"2^53+1 != 2^53", `{"a": 9007199254740992}`, `{"a": 9007199254740993}`, false},
		{"max int64", `{"a": 9223372036854775807}`, `{"a": 9223372036854775807}`, true},
		{"max int64 - 1 < max", `{"a": {"$lt": 9223372036854775807}}`, `{"a": 9223372036854775806}`, true},
		{"min int64", `{"a": {"$lte": -9223372036854775808}}`, `{"a": -9223372036854775808}`, true},
		{"beyond int64 above max", `{"a": {"$gt": 9223372036854775807}}`, `{"a": 1e19}`, true},
		{"beyond int64 below min", `{"a": {"$lt": -9223372036854775808}}`, `{"a": -1e19}`, true},
		{"huge doc number", `{"a": {"$gt": 0}}`, `{"a": 1e400}`, true},
		{"float operand equals int doc", `{"a": 3.0}`, `{"a": 3}`, true},

		// Order of strings.
		{"$gt string", `{"a": {"$gt": "b"}}`, `{"a": "c"}`, true},
		{"$gt string equal", `{"a": {"$gt": "b"}}`, `{"a": "b"}`, false},
		{"$gt string prefix", `{"a": {"$gt": "b"}}`, `{"a": "ba"}`, true},
		{"$lt string case", `{"a": {"$lt": "a"}}`, `{"a": "B"}`, true},
		{"$gte timestamp", `{"at": {"$gte": "2026-03-01T00:00:00Z"}}`, `{"at": "2026-03-01T12:30:00Z"}`, true},
		{"$lt timestamp", `{"at": {"$lt": "2026-03-01T00:00:00Z"}}`, `{"at": "2026-02-28T23:59:59Z"}`, true},
		{"$lt timestamp later", `{"at": {"$lt": "2026-03-01T00:00:00Z"}}`, `{"at": "2026-03-01T00:00:01Z"}`, false},
		{"$gt string vs number", `{"a": {"$gt": "1"}}`, `{"a": 2}`, false},

		// $in, $nin.
		{"$in string", `{"a": {"$in": ["A", "B"]}}`, `{"a": "B"}`, true},
		{"$in string absent", `{"a": {"$in": ["A", "B"]}}`, `{"a": "C"}`, false},
		{"$in number", `{"a": {"$in": [1, 2, 3]}}`, `{"a": 2.0}`, true},
		{"$in number absent", `{"a": {"$in": [1, 2, 3]}}`, `{"a": 2.5}`, false},
		{"$in mixed", `{"a": {"$in": ["1", 2, true, null]}}`, `{"a": null}`, true},
		{"$in mixed bool", `{"a": {"$in": ["1", 2, true, null]}}`, `{"a": true}`, true},
		{"$in mixed no coercion", `{"a": {"$in": ["1", 2, true, null]}}`, `{"a": 1}`, false},
		{"$in list item", `{"a": {"$in": [[1, 2], "x"]}}`, `{"a": [1, 2]}`, true},
		{"$in on a list value", `{"a": {"$in": ["x"]}}`, `{"a": ["x"]}`, false},
		{"$in missing", `{"a": {"$in": ["A"]}}`, `{}`, false},
		{"$nin absent", `{"a": {"$nin": ["A", "B"]}}`, `{"a": "C"}`, true},
		{"$nin present", `{"a": {"$nin": ["A", "B"]}}`, `{"a": "A"}`, false},
		{"$nin number", `{"a": {"$nin": [1]}}`, `{"a": 1.0}`, false},
		{"$nin missing matches", `{"a": {"$nin": ["A"]}}`, `{}`, true},

		// $exists.
		{"$exists true present", `{"a": {"$exists": true}}`, `{"a": 0}`, true},
		{"$exists true null", `{"a": {"$exists": true}}`, `{"a": null}`, true},
		{"$exists true missing", `{"a": {"$exists": true}}`, `{"b": 0}`, false},
		{"$exists false missing", `{"a": {"$exists": false}}`, `{"b": 0}`, true},
		{"$exists false present", `{"a": {"$exists": false}}`, `{"a": false}`, false},
		{"$exists with a value", `{"a": {"$exists": true, "$neq": 0}}`, `{"a": 1}`, true},

		// $startsWith.
		{"$startsWith", `{"k": {"$startsWith": "alarm"}}`, `{"k": "alarm.fire"}`, true},
		{"$startsWith whole", `{"k": {"$startsWith": "alarm"}}`, `{"k": "alarm"}`, true},
		{"$startsWith other", `{"k": {"$startsWith": "alarm"}}`, `{"k": "alar"}`, false},
		{"$startsWith case", `{"k": {"$startsWith": "alarm"}}`, `{"k": "Alarm"}`, false},
		{"$startsWith number", `{"k": {"$startsWith": "1"}}`, `{"k": 12}`, false},
		{"$startsWith empty", `{"k": {"$startsWith": ""}}`, `{"k": ""}`, true},
		{"$startsWith empty vs null", `{"k": {"$startsWith": ""}}`, `{"k": null}`, false},
		{"$startsWith missing", `{"k": {"$startsWith": ""}}`, `{}`, false},

		// Paths.
		{"nested", `{"data.depot": "A"}`, `{"data": {"depot": "A"}}`, true},
		{"nested missing", `{"data.depot": "A"}`, `{"data": {}}`, false},
		{"below a scalar", `{"data.depot": {"$exists": false}}`, `{"data": "A"}`, true},
		{"below null", `{"data.depot": {"$exists": false}}`, `{"data": null}`, true},
		{"dotted key is not a path", `{"data.depot": "A"}`, `{"data.depot": "A"}`, false},
		{"index", `{"items.0.sku": "X1"}`, `{"items": [{"sku": "X1"}, {"sku": "X2"}]}`, true},
		{"index 1", `{"items.1.sku": "X2"}`, `{"items": [{"sku": "X1"}, {"sku": "X2"}]}`, true},
		{"index past end", `{"items.2": {"$exists": true}}`, `{"items": [1, 2]}`, false},
		{"index past end $exists false", `{"items.2": {"$exists": false}}`, `{"items": [1, 2]}`, true},
		{"index on an object", `{"m.0": "x"}`, `{"m": {"0": "x"}}`, true},
		{"leading zero is a name", `{"items.01": {"$exists": true}}`, `{"items": [1, 2]}`, false},
		{"leading zero on an object", `{"m.01": "x"}`, `{"m": {"01": "x"}}`, true},
		{"name on a list", `{"items.sku": {"$exists": true}}`, `{"items": [{"sku": 1}]}`, false},
		{"top-level list", `{"0.a": 1}`, `[{"a": 1}]`, true},
		{"top-level scalar", `{"a": {"$exists": false}}`, `"a"`, true},
		{"top-level null", `{"a": {"$exists": false}}`, `null`, true},
		{"top-level null $eq", `{"a": null}`, `null`, false},
		{"$ inside a path", `{"a.$b": 1}`, `{"a": {"$b": 1}}`, true},
		{"unicode key", `{"données.dépôt": "A"}`, `{"données": {"dépôt": "A"}}`, true},

		// Logical operators and implicit and.
		{"empty filter", `{}`, `{"a": 1}`, true},
		{"empty filter top-level null", `{}`, `null`, true},
		{"implicit and both", `{"a": 1, "b": 2}`, `{"a": 1, "b": 2}`, true},
		{"implicit and one", `{"a": 1, "b": 2}`, `{"a": 1, "b": 3}`, false},
		{"$and", `{"$and": [{"a": 1}, {"b": 2}]}`, `{"a": 1, "b": 2}`, true},
		{"$and one fails", `{"$and": [{"a": 1}, {"b": 2}]}`, `{"a": 1}`, false},
		{"$and empty object", `{"$and": [{}]}`, `{}`, true},
		{"$or first", `{"$or": [{"a": 1}, {"b": 2}]}`, `{"a": 1}`, true},
		{"$or second", `{"$or": [{"a": 1}, {"b": 2}]}`, `{"b": 2}`, true},
		{"$or none", `{"$or": [{"a": 1}, {"b": 2}]}`, `{"a": 2}`, false},
		{"$not", `{"$not": {"a": 1}}`, `{"a": 2}`, true},
		{"$not missing", `{"$not": {"a": 1}}`, `{}`, true},
		{"$not match", `{"$not": {"a": 1}}`, `{"a": 1}`, false},
		{"$not $not", `{"$not": {"$not": {"a": 1}}}`, `{"a": 1}`, true},
		{"$not $exists", `{"$not": {"a": {"$exists": true}}}`, `{}`, true},
		{"nested", `{"$or": [{"$and": [{"a": 1}, {"$not": {"b": 2}}]}, {"c": {"$in": [3]}}]}`, `{"a": 1, "b": 3}`, true},
		{"nested fails", `{"$or": [{"$and": [{"a": 1}, {"$not": {"b": 2}}]}, {"c": {"$in": [3]}}]}`, `{"a": 1, "b": 2}`, false},
		{"nested other arm", `{"$or": [{"$and": [{"a": 1}, {"$not": {"b": 2}}]}, {"c": {"$in": [3]}}]}`, `{"a": 1, "b": 2, "c": 3}`, true},
		{"path beside $or", `{"a": 1, "$or": [{"b": 1}, {"c": 1}]}`, `{"a": 1, "c": 1}`, true},
		{"path beside $or fails", `{"a": 1, "$or": [{"b": 1}, {"c": 1}]}`, `{"a": 2, "c": 1}`, false},

		// The documented example (issueFilter).
		{"issue: speed", issueFilter, `{"data": {"depot": "A", "speed": 81, "kind": "move"}}`, true},
		{"issue: kind", issueFilter, `{"data": {"depot": "B", "speed": 10, "kind": "alarm.smoke"}}`, true},
		{"issue: neither", issueFilter, `{"data": {"depot": "B", "speed": 80, "kind": "move"}}`, false},
		{"issue: depot", issueFilter, `{"data": {"depot": "C", "speed": 99, "kind": "alarm"}}`, false},
		{"issue: no depot", issueFilter, `{"data": {"speed": 99}}`, false},
		{"issue: speed as string", issueFilter, `{"data": {"depot": "A", "speed": "99"}}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := mustDoc(t, tt.doc)
			if got := mustFilter(t, tt.filter).Match(doc); got != tt.want {
				t.Errorf("%s.Match(%s) = %v, want %v", tt.filter, tt.doc, got, tt.want)
			}
			// Exactly one of F and {"$not": F} matches a JSON document.
			if got := negate(t, tt.filter).Match(doc); got == tt.want {
				t.Errorf(`{"$not": %s}.Match(%s) = %v, want %v`, tt.filter, tt.doc, got, !tt.want)
			}
		})
	}
}

func TestFilterNotJSON(t *testing.T) {
	filters := []string{`{}`, `{"a": {"$exists": false}}`, `{"a": {"$neq": 1}}`, `{"a": {"$nin": [1]}}`, issueFilter}
	for _, body := range []string{"", " ", "not json", `{"a": 1`, `{"a": 1} {}`, `{"a": 1}x`, "\xff"} {
		doc, ok := policy.DecodeDocument([]byte(body))
		if ok || doc != nil {
			t.Fatalf("DecodeDocument(%q) = %v, %v; want nil, false", body, doc, ok)
		}
		for _, spec := range filters {
			if mustFilter(t, spec).Match(doc) {
				t.Errorf("%s matches the non-JSON body %q", spec, body)
			}
			if negate(t, spec).Match(doc) {
				t.Errorf(`{"$not": %s} matches the non-JSON body %q`, spec, body)
			}
		}
	}
	// No filter is not a filter: it passes every body.
	var none *policy.Filter
	if !none.Match(nil) || !none.Match(mustDoc(t, `{}`)) {
		t.Error("a nil *Filter does not match every body")
	}
}

func TestDecodeDocument(t *testing.T) {
	tests := []struct {
		body string
		ok   bool
	}{
		{`{"a": 1}`, true},
		{" \n{\"a\": 1}\r\n\t ", true},
		{`[1, 2]`, true},
		{`"s"`, true},
		{`12`, true},
		{`true`, true},
		{`null`, true},
		{"\"\xff\"", true}, // invalid UTF-8 inside a string reads as U+FFFD
		{``, false},
		{` `, false},
		{`{`, false},
		{`{"a": 1}}`, false},
		{`{} {}`, false},
		{`1 2`, false},
		{`nul`, false},
		{`{"a": 01}`, false},
		{`{'a': 1}`, false},
		{`NaN`, false},
	}
	for _, tt := range tests {
		doc, ok := policy.DecodeDocument([]byte(tt.body))
		if ok != tt.ok {
			t.Errorf("DecodeDocument(%q) ok = %v, want %v", tt.body, ok, tt.ok)
		}
		// nil is reserved for "not JSON", which no filter matches; a null
		// body is a document.
		if (doc != nil) != tt.ok {
			t.Errorf("DecodeDocument(%q) doc = %#v with ok = %v", tt.body, doc, ok)
		}
	}
	// The document is a copy: reusing the body's buffer does not change it.
	body := []byte(`{"a": "xyz"}`)
	doc, _ := policy.DecodeDocument(body)
	copy(body, `{"a": "abc"}`)
	if !mustFilter(t, `{"a": "xyz"}`).Match(doc) {
		t.Error("the document changed with the body's buffer")
	}
}

func TestParseFilterErrors(t *testing.T) {
	tests := []struct {
		name     string
		spec     string
		path, op string // the FilterError's fields
		want     string // the whole message
	}{
		{"$gt bool", `{"data.speed": {"$gt": true}}`, "data.speed", "$gt",
			`filter: data.speed: $gt: want a number or a string, got true`},
		{"$gte null", `{"a": {"$gte": null}}`, "a", "$gte", `filter: a: $gte: want a number or a string, got null`},
		{"$lt list", `{"a": {"$lt": [1]}}`, "a", "$lt", `filter: a: $lt: want a number or a string, got a list`},
		{"$lte object", `{"a": {"$lte": {"b": 1}}}`, "a", "$lte", `filter: a: $lte: want a number or a string, got an object`},
		{"$or empty", `{"$or": []}`, "", "$or", `filter: $or: want a non-empty list of filters`},
		{"$and empty", `{"$and": []}`, "", "$and", `filter: $and: want a non-empty list of filters`},
		{"$or null", `{"$or": null}`, "", "$or", `filter: $or: want a non-empty list of filters`},
		{"$or object", `{"$or": {"a": 1}}`, "", "$or", `filter: $or: want a non-empty list of filters, got an object`},
		{"$or item", `{"$or": [{"a": 1}, "b"]}`, "", "", `filter: $or[1]: want a filter object, got "b"`},
		{"$not list", `{"$not": [{"a": 1}]}`, "", "$not", `filter: $not: want a filter object, got a list`},
		{"$not string", `{"$not": "a"}`, "", "$not", `filter: $not: want a filter object, got "a"`},
		{"unknown at a path", `{"data.x": {"$regex": "a.*"}}`, "data.x", "", `filter: data.x: unknown operator "$regex"`},
		{"unknown at the top", `{"$where": "1"}`, "", "", `filter: unknown operator "$where"`},
		{"unknown nested", `{"$and": [{"a": 1}, {"$or": [{"b": {"$size": 1}}]}]}`, "b", "",
			`filter: $and[1].$or[0]: b: unknown operator "$size"`},
		{"nested operand", `{"$or": [{"x": 1}, {"$not": {"data.speed": {"$gt": false}}}]}`, "data.speed", "$gt",
			`filter: $or[1].$not: data.speed: $gt: want a number or a string, got false`},
		{"comparison at the top", `{"$eq": 1}`, "", "$eq", `filter: $eq: a comparison needs a path, as in {"data.x": {"$eq": …}}`},
		{"logical at a path", `{"a": {"$or": [{"b": 1}]}}`, "a", "$or",
			`filter: a: $or: use it at the level of a filter object, as in {"$or": …} around {"a": …}`},
		{"$in not a list", `{"a": {"$in": "A"}}`, "a", "$in", `filter: a: $in: want a non-empty list, got "A"`},
		{"$in empty", `{"a": {"$in": []}}`, "a", "$in", `filter: a: $in: want a non-empty list, got a list`},
		{"$nin empty", `{"a": {"$nin": []}}`, "a", "$nin", `filter: a: $nin: want a non-empty list, got a list`},
		{"$exists string", `{"a": {"$exists": "yes"}}`, "a", "$exists", `filter: a: $exists: want true or false, got "yes"`},
		{"$exists number", `{"a": {"$exists": 1}}`, "a", "$exists", `filter: a: $exists: want true or false, got 1`},
		{"$startsWith number", `{"a": {"$startsWith": 1}}`, "a", "$startsWith", `filter: a: $startsWith: want a string, got 1`},
		{"$startsWith null", `{"a": {"$startsWith": null}}`, "a", "$startsWith", `filter: a: $startsWith: want a string, got null`},
		{"mixed object", `{"a": {"$gt": 1, "b": 2}}`, "a", "", `filter: a: mixes operators ($gt) with fields (b): use $eq to compare with an object`},
		{"empty object", `{"a": {}}`, "a", "", `filter: a: empty object: give operators, or {"$eq": {}} to match an empty object`},
		{"nested filter in shorthand", `{"data": {"depot": {"$in": ["A"]}}}`, "data", "$eq",
			`filter: data: $eq: operator "$in" inside a plain object: write the path dotted, as in {"data.depot": {"$in": …}}, or use "$eq" to compare with the object as it is`},
		{"nested filter in shorthand list", `{"a": [{"$gt": 1}]}`, "a", "$eq",
			`filter: a: $eq: operator "$gt" inside a plain object: write the path dotted, as in {"a.0": {"$gt": …}}, or use "$eq" to compare with the object as it is`},
		{"empty path", `{"": 1}`, "", "", `filter: empty path ""`},
		{"empty segment", `{"a..b": 1}`, "a..b", "", `filter: a..b: empty segment in path`},
		{"leading dot", `{".a": 1}`, ".a", "", `filter: .a: empty segment in path`},
		{"trailing dot", `{"a.": 1}`, "a.", "", `filter: a.: empty segment in path`},
		{"first operator in order", `{"a": {"$startsWith": 1, "$gt": true}}`, "a", "$gt", `filter: a: $gt: want a number or a string, got true`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := policy.ParseFilter(decodeSpec(t, tt.spec))
			if err == nil {
				t.Fatalf("ParseFilter(%s) = %v, want an error", tt.spec, f)
			}
			if err.Error() != tt.want {
				t.Errorf("ParseFilter(%s):\n got %s\nwant %s", tt.spec, err, tt.want)
			}
			var fe *policy.FilterError
			if !errors.As(err, &fe) {
				t.Fatalf("error %T is not a *FilterError", err)
			}
			if fe.Path != tt.path || fe.Op != tt.op {
				t.Errorf("FilterError Path, Op = %q, %q; want %q, %q", fe.Path, fe.Op, tt.path, tt.op)
			}
			if !errors.Is(err, policy.ErrInvalidFilter) {
				t.Error("error does not wrap ErrInvalidFilter")
			}
		})
	}
}

// nestNot wraps inner in n $not.
func nestNot(n int, inner string) string {
	return strings.Repeat(`{"$not": `, n) + inner + strings.Repeat(`}`, n)
}

// list returns a JSON list of n distinct strings.
func list(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`"v%d"`, i)
	}
	return "[" + strings.Join(items, ",") + "]"
}

// conditions returns a filter object of n comparisons.
func conditions(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`"p%d": %d`, i, i)
	}
	return "{" + strings.Join(items, ",") + "}"
}

func TestParseFilterLimits(t *testing.T) {
	depth := policy.MaxFilterDepth
	tests := []struct {
		name string
		spec string
		want string // "" when the filter is within the bounds
	}{
		{"depth at the bound", nestNot(depth-1, `{"a": 1}`), ""},
		{"depth past the bound", nestNot(depth, `{"a": 1}`),
			"filter: " + strings.Repeat("$not.", depth-1) + "$not: nested deeper than 16 levels"},
		{"depth through $or", strings.Repeat(`{"$or": [`, depth) + `{}` + strings.Repeat(`]}`, depth),
			"filter: $or[0]" + strings.Repeat(".$or[0]", depth-1) + ": nested deeper than 16 levels"},
		{"operand depth at the bound", `{"a": ` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `}`, ""},
		{"operand depth past the bound", `{"a": ` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`,
			"filter: a: $eq: nested deeper than 16 levels"},
		{"$in depth past the bound", nestNot(depth-1, `{"a": {"$in": [1]}}`),
			"filter: " + strings.Repeat("$not.", depth-2) + "$not: a: $in: nested deeper than 16 levels"},
		// One node is the filter object, the others are comparisons.
		{"nodes at the bound", conditions(policy.MaxFilterNodes - 1), ""},
		{"nodes past the bound", conditions(policy.MaxFilterNodes),
			"filter: more than 256 nodes (filter objects, logical operators and comparisons)"},
		{"many keys", conditions(10 * policy.MaxFilterNodes),
			"filter: more than 256 nodes (filter objects, logical operators and comparisons)"},
		{"nodes in $or", `{"$or": [` + strings.Repeat(`{"a": 1},`, 127) + `{}]}`,
			"filter: $or[127]: more than 256 nodes (filter objects, logical operators and comparisons)"},
		{"$in at the bound", `{"a": {"$in": ` + list(policy.MaxFilterList) + `}}`, ""},
		{"$in past the bound", `{"a": {"$in": ` + list(policy.MaxFilterList+1) + `}}`, "filter: a: $in: more than 1024 items"},
		{"$nin past the bound", `{"a": {"$nin": ` + list(policy.MaxFilterList+1) + `}}`, "filter: a: $nin: more than 1024 items"},
		{"$in values past the bound", `{"a": {"$in": [` + list(policy.MaxFilterList) + `]}}`, "filter: a: $in: more than 1024 values"},
		{"$eq values at the bound", `{"a": {"$eq": ` + list(policy.MaxFilterList-1) + `}}`, ""},
		{"$eq values past the bound", `{"a": {"$eq": ` + list(policy.MaxFilterList) + `}}`, "filter: a: $eq: more than 1024 values"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := policy.ParseFilter(decodeSpec(t, tt.spec))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("ParseFilter: %v", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Errorf("ParseFilter:\n got %v\nwant %s", err, tt.want)
			}
		})
	}
}

// A recursive spec (possible only from Go) is refused by the depth bound
// rather than overflowing the stack.
func TestParseFilterCycle(t *testing.T) {
	spec := map[string]any{}
	spec["$not"] = spec
	if _, err := policy.ParseFilter(spec); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Errorf("ParseFilter(cycle) = %v, want the depth bound", err)
	}
	operand := []any{nil}
	operand[0] = operand
	if _, err := policy.ParseFilter(map[string]any{"a": operand}); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Errorf("ParseFilter(cyclic operand) = %v, want the depth bound", err)
	}
}

// Configuration decodes YAML: its integers are int or uint64, its
// timestamps time.Time, and a mapping may come as map[any]any.
func TestParseFilterGoValues(t *testing.T) {
	at := time.Date(2026, time.March, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		spec map[string]any
		doc  string
		want bool
	}{
		{"int", map[string]any{"a": map[string]any{"$gt": 80}}, `{"a": 81}`, true},
		{"int8", map[string]any{"a": int8(-3)}, `{"a": -3}`, true},
		{"uint64 large", map[string]any{"a": uint64(1<<63 + 1)}, `{"a": 9223372036854775809}`, true},
		{"uint64 vs max int64", map[string]any{"a": map[string]any{"$gt": uint64(1 << 63)}}, `{"a": 9223372036854775807}`, false},
		{"float64 integral", map[string]any{"a": 2.0}, `{"a": 2}`, true},
		{"float32", map[string]any{"a": float32(0.5)}, `{"a": 0.5}`, true},
		{"json.Number", map[string]any{"a": json.Number("1e2")}, `{"a": 100}`, true},
		{"time.Time", map[string]any{"at": map[string]any{"$gte": at}}, `{"at": "2026-03-01T00:00:00Z"}`, true},
		{"time.Time before", map[string]any{"at": map[string]any{"$gte": at}}, `{"at": "2026-02-28T23:59:59Z"}`, false},
		{"[]string", map[string]any{"a": map[string]any{"$in": []string{"x", "y"}}}, `{"a": "y"}`, true},
		{"[]int", map[string]any{"a": map[string]any{"$in": []int{1, 2}}}, `{"a": 2}`, true},
		{"map[any]any filter", map[string]any{"$or": []any{map[any]any{"a": 1}}}, `{"a": 1}`, true},
		{"map[any]any operators", map[string]any{"a": map[any]any{"$lt": 1}}, `{"a": 0}`, true},
		{"map[string]string operand", map[string]any{"a": map[string]any{"$eq": map[string]string{"b": "c"}}}, `{"a": {"b": "c"}}`, true},
		{"nil spec", nil, `{"a": 1}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := policy.ParseFilter(tt.spec)
			if err != nil {
				t.Fatalf("ParseFilter: %v", err)
			}
			if got := f.Match(mustDoc(t, tt.doc)); got != tt.want {
				t.Errorf("%v.Match(%s) = %v, want %v", f, tt.doc, got, tt.want)
			}
		})
	}

	bad := []struct {
		name string
		spec map[string]any
		want string
	}{
		{"NaN", map[string]any{"a": map[string]any{"$gt": nan()}}, `filter: a: $gt: want a finite number, got NaN`},
		{"Inf", map[string]any{"a": inf()}, `filter: a: $eq: want a finite number, got +Inf`},
		{"struct", map[string]any{"a": struct{}{}}, `filter: a: $eq: unsupported value of type struct {}`},
		{"int keys", map[string]any{"$not": map[any]any{1: "a"}}, `filter: $not: want a filter object, got a map[interface {}]interface {}`},
		{"bad json.Number", map[string]any{"a": json.Number("x")}, `filter: a: $eq: want a finite number, got x`},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := policy.ParseFilter(tt.spec)
			if err == nil || err.Error() != tt.want {
				t.Errorf("ParseFilter:\n got %v\nwant %s", err, tt.want)
			}
		})
	}
}

func nan() float64 { z := 0.0; return z / z }
func inf() float64 { z := 0.0; return 1 / z }

// Match accepts what plain encoding/json decodes too (float64 numbers).
func TestFilterMatchPlainJSON(t *testing.T) {
	var doc any
	if err := json.Unmarshal([]byte(`{"data": {"depot": "A", "speed": 81.5}}`), &doc); err != nil {
		t.Fatal(err)
	}
	if !mustFilter(t, issueFilter).Match(doc) {
		t.Error("the example filter does not match a document of float64 numbers")
	}
}

func TestFilterString(t *testing.T) {
	tests := []struct {
		spec, want string
	}{
		{`{}`, `{}`},
		{`{"b": 1, "a": "x"}`, `{"a":{"$eq":"x"},"b":{"$eq":1}}`},
		{`{"a": {"$lt": 5, "$gt": 1.50}}`, `{"a":{"$gt":1.5,"$lt":5}}`},
		{`{"a": 1e3}`, `{"a":{"$eq":1000}}`},
		{`{"a": 1.0}`, `{"a":{"$eq":1}}`},
		{`{"a": 9007199254740993}`, `{"a":{"$eq":9007199254740993}}`},
		{`{"a": 1e300}`, `{"a":{"$eq":1e+300}}`},
		{`{"a": {"b": [null, true]}}`, `{"a":{"$eq":{"b":[null,true]}}}`},
		{`{"a": "<&>"}`, `{"a":{"$eq":"<&>"}}`},
		{issueFilter, `{"$or":[{"data.speed":{"$gt":80}},{"data.kind":{"$startsWith":"alarm"}}],"data.depot":{"$in":["A","B"]}}`},
		{`{"$not": {"$and": [{"a": {"$exists": false}}, {"b": {"$nin": [2, 1]}}]}}`, `{"$not":{"$and":[{"a":{"$exists":false}},{"b":{"$nin":[2,1]}}]}}`},
	}
	for _, tt := range tests {
		f := mustFilter(t, tt.spec)
		got := f.String()
		if got != tt.want {
			t.Errorf("String(%s):\n got %s\nwant %s", tt.spec, got, tt.want)
		}
		if again := mustFilter(t, got).String(); again != got {
			t.Errorf("String does not read back: %s became %s", got, again)
		}
	}
	if got := (*policy.Filter)(nil).String(); got != "<nil>" {
		t.Errorf("nil String() = %q", got)
	}
}

// A Filter is shared by a subscription's lanes; -race checks that Match
// only reads.
func TestFilterConcurrent(t *testing.T) {
	f := mustFilter(t, issueFilter)
	docs := []any{
		mustDoc(t, `{"data": {"depot": "A", "speed": 81}}`),
		mustDoc(t, `{"data": {"depot": "C", "speed": 81}}`),
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 1000 {
				if got, want := f.Match(docs[(g+i)%2]), (g+i)%2 == 0; got != want {
					t.Errorf("Match = %v, want %v", got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestFilterMatchAllocs(t *testing.T) {
	for _, bf := range benchFilters {
		f := mustFilter(t, bf.spec)
		doc := mustDoc(t, benchBody)
		if n := testing.AllocsPerRun(100, func() { f.Match(doc) }); n != 0 {
			t.Errorf("%s: Match allocates %v times", bf.name, n)
		}
	}
}

// benchBody is a 512-byte event body of the kind the example filter reads.
var benchBody = func() string {
	s := `{"type":"vehicle.position","id":"evt_01HZY3C2B7Q8KJ0M3T4V5W6X7Y","data":{"depot":"B","speed":83.5,` +
		`"kind":"position","vehicle":{"id":"veh_4821","plate":"AB-123-CD","fleet":"north"},` +
		`"position":{"lat":48.85661,"lon":2.35222,"heading":271,"accuracy":4.2},` +
		`"at":"2026-03-01T12:30:05.123Z","odometer":183422,"tags":["urban","night"],` +
		`"driver":{"id":"drv_77","shift":"B"},"items":[{"sku":"X1","qty":2},{"sku":"X2","qty":1}]},"pad":"`
	s += strings.Repeat("x", 512-len(s)-2) + `"}`
	return s
}()

var benchFilters = []struct{ name, spec string }{
	{"issue", issueFilter},
	{"eq", `{"data.vehicle.fleet": "north"}`},
	{"range", `{"data.speed": {"$gte": 50, "$lt": 120}, "data.at": {"$gte": "2026-03-01T00:00:00Z"}}`},
	{"in1024", `{"data.vehicle.id": {"$in": ` + list(1023) + `}}`},
	{"nested", `{"$and": [{"data.items.1.sku": "X2"}, {"$not": {"data.driver.shift": {"$in": ["A", "C"]}}}, {"$or": [{"data.tags.0": "rural"}, {"data.odometer": {"$gt": 100000}}]}]}`},
}

func BenchmarkFilterMatch(b *testing.B) {
	doc := mustDoc(b, benchBody)
	for _, bf := range benchFilters {
		f := mustFilter(b, bf.spec)
		b.Run(bf.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				f.Match(doc)
			}
		})
	}
}

func BenchmarkDecodeDocument(b *testing.B) {
	body := []byte(benchBody)
	if len(body) != 512 {
		b.Fatalf("body is %d bytes", len(body))
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := policy.DecodeDocument(body); !ok {
			b.Fatal("not JSON")
		}
	}
}

func BenchmarkParseFilter(b *testing.B) {
	spec := decodeSpec(b, issueFilter)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := policy.ParseFilter(spec); err != nil {
			b.Fatal(err)
		}
	}
}

// The benchmark body must be valid JSON and exactly 512 bytes.
func TestBenchBody(t *testing.T) {
	if len(benchBody) != 512 || !json.Valid([]byte(benchBody)) {
		t.Fatalf("benchBody: %d bytes, valid %v", len(benchBody), json.Valid([]byte(benchBody)))
	}
	if !mustFilter(t, issueFilter).Match(mustDoc(t, benchBody)) {
		t.Error("the example filter does not match the benchmark body")
	}
}

// gen draws random filters and documents over a small vocabulary, so that
// paths often exist and operands often equal what is there.
type gen struct{ r *rand.Rand }

var (
	genKeys    = []string{"a", "b", "c", "0", "1"}
	genPaths   = []string{"a", "b", "a.b", "a.0", "a.1", "b.c", "c.0.a", "0", "a.b.c"}
	genStrings = []string{"", "a", "ab", "b", "alarm", "2026-03-01T00:00:00Z"}
	genNumbers = []json.Number{"0", "-0", "1", "1.0", "1.5", "-2", "1e2", "100", "9007199254740992", "9007199254740993", "-9223372036854775808", "1e19"}
	genOps     = []string{"$eq", "$neq", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$startsWith"}
)

func (g gen) pick(n int) int { return g.r.IntN(n) }

func (g gen) scalar() any {
	switch g.pick(5) {
	case 0:
		return nil
	case 1:
		return g.pick(2) == 0
	case 2:
		return genStrings[g.pick(len(genStrings))]
	}
	return genNumbers[g.pick(len(genNumbers))]
}

// value returns a JSON value, lists and objects at most depth deep.
func (g gen) value(depth int) any {
	if depth <= 0 || g.pick(3) > 0 {
		return g.scalar()
	}
	n := g.pick(3)
	if g.pick(2) == 0 {
		l := make([]any, n)
		for i := range l {
			l[i] = g.value(depth - 1)
		}
		return l
	}
	m := make(map[string]any, n)
	for range n {
		m[genKeys[g.pick(len(genKeys))]] = g.value(depth - 1)
	}
	return m
}

// doc returns a document body: mostly an object, sometimes any JSON value.
func (g gen) doc() []byte {
	var v any
	if g.pick(10) == 0 {
		v = g.value(2)
	} else {
		m := map[string]any{}
		for range g.pick(4) {
			m[genKeys[g.pick(len(genKeys))]] = g.value(3)
		}
		v = m
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// operand returns a valid operand for op.
func (g gen) operand(op string) any {
	switch op {
	case "$gt", "$gte", "$lt", "$lte":
		if g.pick(2) == 0 {
			return genStrings[g.pick(len(genStrings))]
		}
		return genNumbers[g.pick(len(genNumbers))]
	case "$in", "$nin":
		l := make([]any, 1+g.pick(3))
		for i := range l {
			l[i] = g.value(1)
		}
		return l
	case "$exists":
		return g.pick(2) == 0
	case "$startsWith":
		return genStrings[g.pick(len(genStrings))]
	}
	return g.value(1)
}

// comparison returns {op: operand}.
func (g gen) comparison() map[string]any {
	op := genOps[g.pick(len(genOps))]
	return map[string]any{op: g.operand(op)}
}

// filter returns a valid filter spec, logical operators at most depth deep.
func (g gen) filter(depth int) map[string]any {
	m := map[string]any{}
	for range g.pick(4) {
		switch k := g.pick(8); {
		case depth > 0 && k == 0:
			m["$not"] = g.filter(depth - 1)
		case depth > 0 && k <= 2:
			l := make([]any, 1+g.pick(3))
			for i := range l {
				l[i] = g.filter(depth - 1)
			}
			m[[]string{"$and", "$or"}[k-1]] = l
		default:
			p := genPaths[g.pick(len(genPaths))]
			if g.pick(4) == 0 {
				m[p] = g.scalar() // shorthand
				continue
			}
			c := g.comparison()
			if g.pick(3) == 0 {
				maps.Copy(c, g.comparison())
			}
			m[p] = c
		}
	}
	return m
}

func mustParse(tb testing.TB, spec map[string]any) *policy.Filter {
	tb.Helper()
	f, err := policy.ParseFilter(spec)
	if err != nil {
		tb.Fatalf("ParseFilter(%v): %v", spec, err)
	}
	return f
}

// For every filter F and document D exactly one of F and {"$not": F}
// matches, and for a body that is not JSON neither does. The other
// identities check operators against each other: $nin is $not $in, $neq
// is $not $eq, $exists false is $not $exists true, $gte is $gt or $eq;
// $or and $and obey De Morgan; and String reads back to the same filter.
func TestFilterProperties(t *testing.T) {
	g := gen{rand.New(rand.NewPCG(12, 1))}
	notJSON, _ := policy.DecodeDocument([]byte("{not json"))
	iterations := 5000
	if testing.Short() {
		iterations = 500
	}
	for i := range iterations {
		fs, gs := g.filter(3), g.filter(3)
		f, gf := mustParse(t, fs), mustParse(t, gs)
		notF := mustParse(t, map[string]any{"$not": fs})
		or := mustParse(t, map[string]any{"$or": []any{fs, gs}})
		deMorgan := mustParse(t, map[string]any{"$not": map[string]any{"$and": []any{
			map[string]any{"$not": fs}, map[string]any{"$not": gs}}}})
		and := mustParse(t, map[string]any{"$and": []any{fs, gs}})
		again := mustFilter(t, f.String())

		// One comparison against its complement on a random path.
		p := genPaths[g.pick(len(genPaths))]
		op := genOps[g.pick(len(genOps))]
		arg := g.operand(op)
		cmp := mustParse(t, map[string]any{p: map[string]any{op: arg}})
		var complement *policy.Filter
		switch op {
		case "$in":
			complement = mustParse(t, map[string]any{p: map[string]any{"$nin": arg}})
		case "$eq":
			complement = mustParse(t, map[string]any{p: map[string]any{"$neq": arg}})
		case "$exists":
			complement = mustParse(t, map[string]any{p: map[string]any{"$exists": !arg.(bool)}})
		default:
			complement = mustParse(t, map[string]any{"$not": map[string]any{p: map[string]any{op: arg}}})
		}
		var orEqual *policy.Filter
		if op == "$gte" || op == "$lte" {
			orEqual = mustParse(t, map[string]any{"$or": []any{
				map[string]any{p: map[string]any{op[:3]: arg}}, map[string]any{p: map[string]any{"$eq": arg}}}})
		}

		if f.Match(notJSON) || notF.Match(notJSON) {
			t.Fatalf("%v or its negation matches a body that is not JSON", f)
		}
		for range 4 {
			body := g.doc()
			doc := mustDoc(t, string(body))
			m := f.Match(doc)
			if notF.Match(doc) == m {
				t.Fatalf("iteration %d: %v and its $not both = %v on %s", i, f, m, body)
			}
			if got, want := or.Match(doc), m || gf.Match(doc); got != want {
				t.Fatalf("iteration %d: $or of %v, %v = %v on %s, want %v", i, f, gf, got, body, want)
			}
			if or.Match(doc) != deMorgan.Match(doc) {
				t.Fatalf("iteration %d: De Morgan fails for %v, %v on %s", i, f, gf, body)
			}
			if got, want := and.Match(doc), m && gf.Match(doc); got != want {
				t.Fatalf("iteration %d: $and of %v, %v = %v on %s, want %v", i, f, gf, got, body, want)
			}
			if again.Match(doc) != m {
				t.Fatalf("iteration %d: %v read back from String differs on %s", i, f, body)
			}
			if cmp.Match(doc) == complement.Match(doc) {
				t.Fatalf("iteration %d: %v and %v agree on %s", i, cmp, complement, body)
			}
			if orEqual != nil && orEqual.Match(doc) != cmp.Match(doc) {
				t.Fatalf("iteration %d: %v differs from %v on %s", i, cmp, orEqual, body)
			}
		}
	}
}
