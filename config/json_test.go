package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/knadh/koanf/parsers/yaml"
)

// TestLoadConfigJSONMatchesYAML: the full example written as JSON loads
// into exactly the config the YAML gives.
func TestLoadConfigJSONMatchesYAML(t *testing.T) {
	b, err := os.ReadFile("testdata/full.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := yaml.Parser().Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	j, err := json.MarshalIndent(stringKeys(m), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "full.json")
	writeFile(t, path, string(j))

	fromYAML, err := Load("testdata/full.good.yaml", goodEnviron, nil)
	if err != nil {
		t.Fatal(err)
	}
	fromJSON, err := Load(path, goodEnviron, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, j)
	}
	// Resolved secrets hold their pooled HMAC state: compared as text.
	for i := range min(len(fromJSON.Subscriptions), len(fromYAML.Subscriptions)) {
		a, b := &fromJSON.Subscriptions[i], &fromYAML.Subscriptions[i]
		if !slices.Equal(encodeAll(a.Resolved), encodeAll(b.Resolved)) {
			t.Errorf("subscriptions[%d]: resolved secrets differ", i)
		}
		a.Resolved, b.Resolved = nil, nil
	}
	if a, b := &fromJSON.Admin.OperationalWebhook, &fromYAML.Admin.OperationalWebhook; !slices.Equal(encodeAll(a.Resolved), encodeAll(b.Resolved)) {
		t.Error("admin.operational_webhook: resolved secrets differ")
	} else {
		a.Resolved, b.Resolved = nil, nil
	}
	fromYAML.lookupEnv, fromJSON.lookupEnv = nil, nil
	if !reflect.DeepEqual(fromJSON, fromYAML) {
		t.Fatalf("from JSON:\n%s\nfrom YAML:\n%s", fromJSON, fromYAML)
	}
	if len(fromJSON.Subscriptions) == 0 {
		t.Fatal("no subscriptions: the comparison proves nothing")
	}
}

func TestLoadConfigJSONBad(t *testing.T) {
	const sub = `{"id": "a", "url": "https://a.example/in", "secret": "` + secretA + `"`
	tests := []struct {
		name, doc string
		want      []string // substrings, or regexps after "re:"
		is        error
	}{
		{"duplicate key", "{\n\"listen\": \"127.0.0.1:1\",\n\"listen\": \"127.0.0.1:2\"\n}", []string{`line 3: key "listen" appears twice`}, nil},
		{"duplicate nested key", "{\"subscriptions\": [\n" + sub + ",\n\"id\": \"b\"}]}", []string{`line 3: key "id" appears twice`}, nil},
		{"syntax", "{\n\"listen\": \"127.0.0.1:1\",\n\"durability\" \"fsync\"\n}", []string{"line 3: invalid character", "after object key"}, nil},
		// encoding/json's wording and the offset it blames differ between
		// Go releases (1.27 reads v1 through json/v2): ours is the line.
		{"trailing comma", "{\n\"listen\": \"127.0.0.1:1\",\n}", []string{`re:line [23]: invalid character`}, nil},
		{"unterminated", "{\n\"listen\": \"127.0.0.1:1\",\n", []string{`line 3: unexpected end of`}, nil},
		{"empty", "", []string{"line 1: unexpected end of file"}, nil},
		{"top level array", `[{"listen": "127.0.0.1:1"}]`, []string{"the top level must be an object"}, nil},
		{"trailing data", "{}\n{}", []string{"line 2: unexpected data after the top-level object"}, nil},
		{"unknown key", `{"subscriptions": [` + sub + `, "colour": "red"}]}`, []string{`unknown key "subscriptions[0].colour"`}, ErrUnknownKey},
		{"fractional int", `{"max_body_bytes": 1.5}`, []string{"max_body_bytes", "must be a whole number"}, ErrInvalidValue},
		{"bare duration", `{"dedup_window": 3600}`, []string{"dedup_window", "bare number is not a duration"}, ErrInvalidValue},
		{"number too big", `{"max_body_bytes": 1e999}`, []string{"line 1: number 1e999 is out of range"}, nil},
		{"bad secret", `{"subscriptions": [{"id": "a", "url": "https://a.example/in", "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2L"}]}`, []string{"subscriptions[0].secret: [redacted]: invalid secret"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sluice.json")
			writeFile(t, path, tt.doc)
			cfg, err := Load(path, nil, nil)
			if err == nil {
				t.Fatalf("loaded %+v, want an error", cfg)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
			for _, w := range tt.want {
				if re, ok := strings.CutPrefix(w, "re:"); ok && !regexp.MustCompile(re).MatchString(err.Error()) ||
					!ok && !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "MfKQ9r8GKYqrTwjUPD8ILPZIo2L") {
				t.Errorf("error %q echoes a secret", err)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %q is not %v", err, tt.is)
			}
		})
	}
}

// TestLoadConfigJSONTypes: JSON values reach the config as the YAML
// parser's would: whole numbers as ints (also where a float is wanted),
// fractions as floats, null as absent.
func TestLoadConfigJSONTypes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "SLUICE.JSON") // the extension in any case
	writeFile(t, path, `{"max_body_bytes": 2048, "log_level": null, "retry_budget": {"ratio": 0.25, "min_per_second": 3},
		"subscriptions": [{"id": "a", "url": "https://a.example/in", "secret": "`+secretA+`", "rate": {"per_second": 2}}]}`)
	cfg, err := Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxBodyBytes != 2048 || cfg.RetryBudget.Ratio != 0.25 || cfg.RetryBudget.MinPerSecond != 3 ||
		cfg.Subscriptions[0].Rate.PerSecond != 2 || cfg.LogLevel != Default().LogLevel {
		t.Fatalf("loaded %+v", cfg)
	}
}

// stringKeys turns YAML's map[any]any (classify: {404: ack}) into the
// map[string]any a JSON object is.
func stringKeys(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = stringKeys(e)
		}
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[fmt.Sprint(k)] = stringKeys(e)
		}
		return m
	case []any:
		for i, e := range v {
			v[i] = stringKeys(e)
		}
	}
	return v
}
