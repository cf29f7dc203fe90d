package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzLoadConfig: any YAML file either loads into a valid config or fails
// with an error; nothing panics, and no error echoes a secret.
func FuzzLoadConfig(f *testing.F) {
	for _, name := range []string{"testdata/minimal.good.yaml", "testdata/full.good.yaml", "testdata/unknown_sub_key.bad.yaml", "testdata/secret_no_prefix.bad.yaml"} {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(string(b))
		}
	}
	f.Add("subscriptions: [{id: a, url: 'http://x', secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, rate: {per_second: 1e308}}]")
	f.Add("retry_budget: {ratio: .nan}\n")
	f.Fuzz(func(t *testing.T, yaml string) {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(path, nil, nil)
		if err != nil {
			// The text is a secret only where it is written as one
			// (whsec_..., or the value of secret:); used as a key or an
			// id, the error rightly names it (found by this fuzzer:
			// "{MfKQ...}" as a key).
			const secret = "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
			onlyAsSecret := strings.Count(yaml, secret) == strings.Count(yaml, "whsec_"+secret)+strings.Count(yaml, "secret: "+secret)
			if onlyAsSecret && strings.Contains(err.Error(), secret) {
				t.Fatalf("error echoes a secret: %v", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("loaded config fails validation: %v", err)
		}
	})
}
