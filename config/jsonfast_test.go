package config

import (
	"reflect"
	"testing"
)

// FuzzJSONFast: wherever fastJSONConfig answers, encoding/json's token
// reader parses the document to an equal value.
func FuzzJSONFast(f *testing.F) {
	for _, doc := range []string{
		`{}`, ` {"a": 1, "b": [true, false, null, -0, 1.5e3, 12345678901234567890, "x\u00e9\n", "é"], "c": {"d": {}}} `,
		`{"a": 1, "a": 2}`, `{"a": "\ud800"}`, "{\"a\": \"\xff\"}", `{"a": 01}`, `{"a": 1.}`, `{"a": -}`, `{"a": 1e400}`,
		`{"a": [1, 2,]}`, `{"a" 1}`, `[1]`, `{"a": 1} x`, `{"a": "\x"}`, "{\"a\": \"\t\"}", `{"subscriptions": [{"id": "s0", "concurrency": {"max": 64}}]}`,
	} {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		fast, ok := fastJSONConfig([]byte(doc))
		if !ok {
			return
		}
		slow, err := parseJSONTokens([]byte(doc))
		if err != nil {
			t.Fatalf("%q: the fast path takes it, the token reader refuses it: %v", doc, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q:\nfast %#v\nslow %#v", doc, fast, slow)
		}
	})
}

// TestJSONFastTakesBenchConfig: the fast path takes the shape of a
// generated config (lanes-50k's), so start-up does not silently fall
// back to the token reader.
func TestJSONFastTakesBenchConfig(t *testing.T) {
	doc := `{"admin":{"listen":"127.0.0.1:1"},"allow_private_targets":true,"subscriptions":[{"id":"s0","url":"http://127.0.0.1:2/s0","secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw","types":["bench.event"],"concurrency":{"max":64}}]}` + "\n"
	if _, ok := fastJSONConfig([]byte(doc)); !ok {
		t.Fatal("fastJSONConfig gives up on a generated config")
	}
}
