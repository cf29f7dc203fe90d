package config

import (
	"reflect"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"
)

// FuzzFastFlowItems: wherever fastFlowItems reads a piece, yaml.v3 reads
// it to an equal list.
func FuzzFastFlowItems(f *testing.F) {
	for _, s := range []string{
		"  - {id: s0, url: \"http://127.0.0.1:1/s0\", secret: \"whsec_x\", types: [\"idle.type\"], concurrency: {max: 64}}\n",
		"  - {\"id\": \"a\", \"n\": -12, 'q': 'x y', e: {}, l: [], z: 0}\n\n  # c\n  - {a: [b, [c, {d: e}]], t: True, y: yes, o: on, n: No, f: 1.5, x: 007, h: 0x1F}\n",
		"  - {a: null, b: ~, c: -0, d: .inf, e: 12345678901234567890, f: a.b/c-d_e, g: _x, 1: a, true: b}\n",
		"  - {a: b, a: c}\n  - {a: 'it''s', b: \"\\t\", c: [a, ], d: {x: y,}, e: b c, f: b #c}\n",
		"  - {a: 2001-12-14, b: 1_000, c: +1, d: -a, e: \"é\"}\n",
		"  - {\"id\":\"s1\",\"n\":[1,2],'k':{},\"e\":-5}\n  - {\"a\" : b}\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, piece string) {
		got, ok := fastFlowItems([]byte(piece), 2)
		if !ok {
			return
		}
		var want any
		if err := yamlv3.Unmarshal([]byte(piece), &want); err != nil {
			t.Fatalf("%q: fastFlowItems reads it, yaml.v3 refuses it: %v", piece, err)
		}
		if len(got) == 0 && want == nil {
			return // only blank lines and comments
		}
		// DeepEqual alone: fastFlowItems makes no float, so no NaN, and
		// %#v would take an int for yaml.v3's int64 or uint64.
		if !reflect.DeepEqual(any(got), want) {
			t.Fatalf("%q:\nfast    %#v\nyaml.v3 %#v", piece, got, want)
		}
	})
}

// TestFastFlowItemsTakesGenerated: the lines lanes-50k and the
// start-up benchmark write are read by the fast path.
func TestFastFlowItemsTakesGenerated(t *testing.T) {
	piece := "  - {id: s0, url: \"http://127.0.0.1:40000/s0\", secret: \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", types: [\"bench.event\"], concurrency: {max: 64}}\n" +
		"  - {\"id\":\"s1\",\"types\":[\"t.a\"],\"concurrency\":{\"max\":8}}\n"
	if _, ok := fastFlowItems([]byte(piece), 2); !ok {
		t.Fatal("fastFlowItems gives up on generated lines")
	}
}
