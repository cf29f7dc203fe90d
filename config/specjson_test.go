package config

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/knadh/koanf/parsers/yaml"
)

// TestSpecJSON: specJSON gives json.Marshal's bytes for the redacted
// documents of every subscription in testdata and for values it leaves
// to encoding/json.
func TestSpecJSON(t *testing.T) {
	docs := []map[string]any{
		{}, {"a": nil, "b": true, "c": -12, "d": 1.5, "e": math.MaxInt64, "f": []any{}, "g": map[string]any{}},
		{"s": "<&> \"q\" \\ \n\t é \u2028 \xff", "k<": 1, "l": []any{"x", 2, 2.5e-7, 1e21, []string{"a"}, int64(3), map[string]any{"z": "y", "a": "b"}}},
	}
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := yaml.Parser().Unmarshal(b)
		if err != nil {
			continue
		}
		subs, _ := m["subscriptions"].([]any)
		for _, s := range subs {
			if sm, ok := jsonable(s).(map[string]any); ok {
				docs = append(docs, redactDoc(sm))
			}
		}
	}
	for _, doc := range docs {
		checkSpecJSON(t, doc)
	}
}

// FuzzSpecJSON: for any JSON object, specJSON of what parseJSONConfig
// makes of it is json.Marshal's bytes.
func FuzzSpecJSON(f *testing.F) {
	f.Add(`{"id": "a", "url": "https://x/?a=1&b=<2>", "types": ["*"], "rate": {"per_second": 0.5, "burst": 1}, "headers": {"X": "é"}}`)
	f.Add(`{"a": [1, -0, 1e300, null, true, "\u0000"], "b": {"": {}}}`)
	f.Fuzz(func(t *testing.T, doc string) {
		m, err := parseJSONConfig([]byte(doc))
		if err != nil {
			return
		}
		checkSpecJSON(t, m)
	})
}

func checkSpecJSON(t *testing.T, doc map[string]any) {
	t.Helper()
	want, werr := json.Marshal(doc)
	got, gerr := specJSON(doc)
	if (werr != nil) != (gerr != nil) || !bytes.Equal(got, want) {
		t.Fatalf("specJSON(%#v)\n got %s, %v\nwant %s, %v", doc, got, gerr, want, werr)
	}
}
