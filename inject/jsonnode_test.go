package inject

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzJSONNode holds jsonNode and nodeJSON to what they stand in for:
// jsonNode takes exactly the valid JSON and nodeJSON gives it back as it
// was; on what yaml.v3 parses, nodeJSON writes the data Node.Decode and
// json.Marshal write.
func FuzzJSONNode(f *testing.F) {
	for _, s := range []string{
		`{"containers":[{"name":"app","image":"x","ports":[{"containerPort":8080}]}],"terminationGracePeriodSeconds":30}`,
		`[1, -0, 1.5e3, 18446744073709551615, true, false, null, "a\u00e9\"\\/<>&"]`,
		`{"a":{"b":[[],{}]},"":""}`, `"x"`, `1`, `{"a":1}{}`, `{"a":}`, `0x1f`, `{a: 1}`, "k: [1, 2]\n", "? [a]\n: b\n",
		"x: 0o17\ny: .inf\nz: ~\n", `{"a":1,"a":2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		n, err := jsonNode(raw)
		if (err == nil) != json.Valid(raw) {
			t.Fatalf("jsonNode(%q): %v, json.Valid %v", raw, err, json.Valid(raw))
		}
		if err == nil {
			out, err := nodeJSON(n)
			if err != nil {
				t.Fatalf("nodeJSON(jsonNode(%q)): %v", raw, err)
			}
			if !sameJSON(t, raw, out, true) {
				t.Fatalf("round trip of %q gave %q", raw, out)
			}
		}
		var doc yaml.Node
		// Anchors and aliases are left out: an alias bomb would only time
		// the fuzzer out, and a review never parses YAML.
		if bytes.ContainsAny(raw, "&*") || yaml.Unmarshal(raw, &doc) != nil || len(doc.Content) != 1 {
			return
		}
		slow, err := slowNodeJSON(nil, doc.Content[0])
		if err != nil {
			return
		}
		fast, err := nodeJSON(doc.Content[0])
		if err != nil {
			t.Fatalf("nodeJSON of %q: %v, where Decode and Marshal give %q", raw, err, slow)
		}
		if !sameJSON(t, slow, fast, false) {
			t.Fatalf("nodeJSON of %q is %q, Decode and Marshal give %q", raw, fast, slow)
		}
	})
}

// sameJSON reports whether a and b hold the same data; exact compares
// numbers by their literal, else by value.
func sameJSON(t *testing.T, a, b []byte, exact bool) bool {
	t.Helper()
	decode := func(s []byte) any {
		d := json.NewDecoder(bytes.NewReader(s))
		if exact {
			d.UseNumber()
		}
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		return v
	}
	return reflect.DeepEqual(decode(a), decode(b))
}
