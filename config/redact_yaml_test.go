package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestYAMLErrorRedactsSecretsNotGrammar: a YAML parse error drops what it
// quotes of the file, which may be a secret, but keeps the grammar token
// it says it expected, without which "did not find expected […]
// indicator" tells nobody what to add.
func TestYAMLErrorRedactsSecretsNotGrammar(t *testing.T) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	for name, c := range map[string]struct {
		doc        string
		want, hide string
	}{
		"sequence item missing its dash": {doc: "subscriptions:\n  - id: a\n  url: http://x\n", want: "did not find expected '-' indicator"},
		"flow sequence not closed":       {doc: "listen: [a, b\n", want: "did not find expected ',' or ']'"},
		"secret as an unknown anchor":    {doc: "listen: *" + secret + "\n", want: "unknown anchor […] referenced", hide: secret},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(path, []byte(c.doc), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(path, nil, nil)
			if err == nil {
				t.Fatal("loaded a malformed file")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q lacks %q", err, c.want)
			}
			if c.hide != "" && strings.Contains(err.Error(), c.hide) {
				t.Errorf("error %q echoes the secret", err)
			}
		})
	}
}
