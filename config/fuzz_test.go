package config

import (
	"os"
	"path/filepath"
	"regexp"
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
	f.Add("log: {backend: jetstream}\njetstream: {urls: [nats://a:4222, 'wss://b/x'], replicas: 1, lease_ttl: 2s, tls: {}}\nnode_id: pod-a\n")
	f.Add("jetstream: {stream: S}\nlog: ~\n")
	f.Fuzz(func(t *testing.T, yaml string) { loadFuzzedConfig(t, "c.yaml", yaml) })
}

// FuzzLoadConfigJSON: the same for a .json file, read by parseJSONConfig.
func FuzzLoadConfigJSON(f *testing.F) {
	f.Add(`{"subscriptions": [{"id": "a", "url": "https://a.example/in", "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "types": ["t"], "rate": {"per_second": 1e308}}]}`)
	f.Add(`{"listen": "127.0.0.1:1", "listen": "x"}`)
	f.Add(`{"max_body_bytes": 12345678901234567890123, "retry_budget": {"ratio": -0}}`)
	f.Add(`{"subscriptions": [[], {}, null, 1.5e-400]}`)
	f.Add("{\n\"a\": [1, 2,]\n}")
	f.Fuzz(func(t *testing.T, doc string) { loadFuzzedConfig(t, "c.json", doc) })
}

// idValue finds the fuzzed secret, whsec_ and all, written in the value
// of an id ("0whsec_…" too), in YAML or JSON: an id, which errors name.
var idValue = regexp.MustCompile(`(?:"id"\s*:\s*"[^"\\]*|\bid:\s*['"]?[^\s'"]*)whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`)

// loadFuzzedConfig writes doc to a file called name and loads it: the
// result is a valid config or an error that echoes no secret.
func loadFuzzedConfig(t *testing.T, name, doc string) {
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path, nil, nil)
	if err != nil {
		// The text is a secret only where it is written as one
		// (whsec_..., or the value of secret:); used as a key or an
		// id, the error rightly names it (found by this fuzzer:
		// "{MfKQ...}" as a key, and "whsec_MfKQ..." as an id).
		const secret = "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		asSecret := strings.Count(doc, "whsec_"+secret) + strings.Count(doc, "secret: "+secret) + strings.Count(doc, `"secret": "`+secret) -
			len(idValue.FindAllStringIndex(doc, -1))
		if strings.Count(doc, secret) == asSecret && strings.Contains(err.Error(), secret) {
			t.Fatalf("error echoes a secret: %v", err)
		}
		return
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("loaded config fails validation: %v", err)
	}
}
