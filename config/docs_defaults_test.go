package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDocumentedDefaults: every default the configuration reference
// (docs/configuration.md) writes as one literal, in the top-level table and
// in the subscription table, is the value sluice really uses when the key is
// left out. A default changed in code without the docs, or the other way
// round, fails here, naming the key.
func TestDocumentedDefaults(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	top, subs := section(t, text, "### Top-level keys"), section(t, text, "### Subscription keys")

	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	// b has concurrency.auto, the only case where concurrency.min and
	// headroom apply and get their defaults.
	if err := os.WriteFile(path, []byte("subscriptions:\n"+
		"  - {id: a, url: 'https://a.example/in', secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}\n"+
		"  - {id: b, url: 'https://a.example/in', secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, concurrency: {auto: true}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}

	checked := 0
	for _, tc := range []struct {
		table string
		root  any
	}{{top, Default()}, {subs, &cfg.Subscriptions[0]}} {
		for key, want := range documentedDefaults(tc.table) {
			root := tc.root
			if key == "concurrency.min" || key == "concurrency.headroom" {
				root = &cfg.Subscriptions[1]
			}
			got, ok := koanfField(reflect.ValueOf(root), key)
			if !ok {
				t.Errorf("docs/configuration.md documents key %q, which the config does not have", key)
				continue
			}
			// An ordering left out stays "", which validation and the
			// lanes read as none.
			if key == "ordering" && got.String() == "" {
				got = reflect.ValueOf("none")
			}
			// So does a format, read as standard-webhooks.
			if key == "format" && got.String() == "" {
				got = reflect.ValueOf("standard-webhooks")
			}
			if !sameValue(t, got, want) {
				t.Errorf("docs/configuration.md says %s defaults to %s; sluice uses %v", key, want, got.Interface())
			}
			checked++
		}
	}
	if checked < 40 {
		t.Errorf("only %d documented defaults were checked: has the table's layout changed?", checked)
	}
}

// section is text from heading to the next heading.
func section(t *testing.T, text, heading string) string {
	t.Helper()
	i := strings.Index(text, heading+"\n")
	if i < 0 {
		t.Fatalf("docs/configuration.md has no %q", heading)
	}
	rest := text[i+len(heading):]
	if j := strings.Index(rest, "\n#"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// documentedRow is a table row whose key cell is one key and whose default
// cell is one literal, optionally followed by a parenthesis: "`10s`",
// "`1048576` (1 MiB)". Rows with prose defaults ("none", "`16`, or `64`
// with `auto`") say something no single value can check.
var documentedRow = regexp.MustCompile("(?m)^\\| `([a-z_.]+)` \\| `([^`]+)`(?: \\([^)]*\\))? \\|")

func documentedDefaults(table string) map[string]string {
	out := map[string]string{}
	for _, m := range documentedRow.FindAllStringSubmatch(table, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// koanfField follows a dotted key through the koanf tags of v's struct.
func koanfField(v reflect.Value, key string) (reflect.Value, bool) {
	for _, name := range strings.Split(key, ".") {
		for v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			return reflect.Value{}, false
		}
		found := false
		for i := range v.NumField() {
			if tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("koanf"), ","); tag == name {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return reflect.Value{}, false
		}
	}
	return v, true
}

// sameValue compares a field with the docs' literal, read as the field's
// type reads it.
func sameValue(t *testing.T, got reflect.Value, want string) bool {
	t.Helper()
	if d, ok := got.Interface().(time.Duration); ok {
		w, err := time.ParseDuration(want)
		return err == nil && w == d
	}
	switch got.Kind() {
	case reflect.String:
		return got.String() == strings.Trim(want, `"`)
	case reflect.Bool:
		w, err := strconv.ParseBool(want)
		return err == nil && w == got.Bool()
	case reflect.Int, reflect.Int64, reflect.Int32:
		w, err := strconv.ParseInt(want, 10, 64)
		return err == nil && w == got.Int()
	case reflect.Float64:
		w, err := strconv.ParseFloat(want, 64)
		return err == nil && w == got.Float()
	case reflect.Slice:
		var w []string
		if err := json.Unmarshal([]byte(want), &w); err != nil {
			return false
		}
		g, ok := got.Interface().([]string)
		return ok && reflect.DeepEqual(g, w)
	}
	t.Errorf("no comparison for a %s (documented %s)", got.Type(), want)
	return false
}
