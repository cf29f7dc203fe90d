package config

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// TestLoadManySubscriptions: a list long enough for the paths that work
// on every core (the chunked decoding, the checks of each subscription)
// loads to the same subscriptions as on one core, and each bad file gives
// the same error as on one core, naming the first bad subscription in list
// order.
func TestLoadManySubscriptions(t *testing.T) {
	const n = 4200 // past the 4096 where the work is shared
	item := func(i int) map[string]any {
		return map[string]any{"id": fmt.Sprintf("s%d", i), "url": fmt.Sprintf("https://h%d.example/s%d", i, i), "secret": secretA,
			"types": []any{"t.a"}, "concurrency": map[string]any{"max": 8}, "timeout": "5s"}
	}
	for _, c := range []struct {
		name string
		edit func(subs []map[string]any)
		want string // in the error; "" for none
	}{
		{"valid", func([]map[string]any) {}, ""},
		{"two bad values", func(s []map[string]any) { s[4000]["url"] = "x"; s[100]["url"] = "ftp://x" }, "subscriptions[100].url"},
		{"two values that do not decode", func(s []map[string]any) { s[4000]["timeout"] = "soon"; s[100]["timeout"] = "later" }, "subscriptions[100].timeout"},
		{"bad value for the slow path", func(s []map[string]any) { s[3000]["timeout"] = 5; s[4000]["id"] = "Bad" }, "subscriptions[3000].timeout"},
		{"unknown key late, bad value early", func(s []map[string]any) { s[4199]["colour"] = "red"; s[1]["url"] = "ftp://x" }, "subscriptions[4199].colour"},
		{"duplicate id across chunks", func(s []map[string]any) { s[4150]["id"] = "s10" }, "subscriptions[10] and subscriptions[4150]"},
		{"duplicate before a bad value", func(s []map[string]any) { s[4150]["id"] = "s10"; s[4151]["url"] = "x" }, "subscriptions[10] and subscriptions[4150]"},
		{"private target", func(s []map[string]any) { s[3999]["url"] = "http://10.0.0.1/"; s[4100]["url"] = "http://[::1]/" }, "subscriptions[3999].url"},
	} {
		for _, format := range []string{"yaml", "json"} {
			t.Run(c.name+"/"+format, func(t *testing.T) {
				subs := make([]map[string]any, n)
				for i := range subs {
					subs[i] = item(i)
				}
				c.edit(subs)
				path := filepath.Join(t.TempDir(), "c."+format)
				if err := os.WriteFile(path, manyDoc(t, format, c.name != "private target", subs), 0o600); err != nil {
					t.Fatal(err)
				}
				one, oneErr := loadOn(1, path)
				many, manyErr := loadOn(4, path)
				if c.want == "" {
					if oneErr != nil || manyErr != nil {
						t.Fatalf("one core: %v; four: %v", oneErr, manyErr)
					}
					if len(many.Subscriptions) != n {
						t.Fatalf("%d subscriptions", len(many.Subscriptions))
					}
					for i := range one.Subscriptions {
						// A parsed secret is a pointer to its own state: compare its encoding.
						x, y := one.Subscriptions[i], many.Subscriptions[i]
						if len(x.Resolved) != 1 || len(y.Resolved) != 1 || x.Resolved[0].Encode() != y.Resolved[0].Encode() {
							t.Fatalf("subscriptions[%d]: the secrets differ", i)
						}
						x.Resolved, y.Resolved = nil, nil
						a, b := reflect.ValueOf(x), reflect.ValueOf(y)
						if !reflect.DeepEqual(a.Interface(), b.Interface()) {
							t.Fatalf("subscriptions[%d]: four cores load another %s than one", i, diffField(a, b))
						}
					}
					return
				}
				if oneErr == nil || manyErr == nil || oneErr.Error() != manyErr.Error() {
					t.Fatalf("errors differ:\none core:   %v\nfour cores: %v", oneErr, manyErr)
				}
				if !strings.Contains(manyErr.Error(), c.want) {
					t.Fatalf("error %q does not name %q", manyErr, c.want)
				}
			})
		}
	}
}

// manyDoc writes subs as a config file: YAML with one flow mapping a
// line, as generated fleets are written, or JSON.
func manyDoc(t *testing.T, format string, allowPrivate bool, subs []map[string]any) []byte {
	t.Helper()
	if format == "json" {
		b, err := json.Marshal(map[string]any{"allow_private_targets": allowPrivate, "subscriptions": subs})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var b strings.Builder
	fmt.Fprintf(&b, "allow_private_targets: %v\nsubscriptions:\n", allowPrivate)
	for _, s := range subs {
		line, err := json.Marshal(s) // JSON is YAML's flow style
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "  - %s\n", line)
	}
	b.WriteString("log_level: warn\n")
	return []byte(b.String())
}

func loadOn(procs int, path string) (*Config, error) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	return Load(path, nil, nil)
}
