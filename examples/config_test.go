package examples_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/config"
)

// TestConfigsLoad: every sample config under config/ loads and validates
// as sluice serve would load it, with the secrets and token files it
// names provided.
func TestConfigsLoad(t *testing.T) {
	samples, err := filepath.Glob("config/*.yaml")
	if err != nil || len(samples) == 0 {
		t.Fatalf("no sample configs: %v", err)
	}
	for _, path := range samples {
		t.Run(filepath.Base(path), func(t *testing.T) {
			abs, _ := filepath.Abs(path)
			t.Chdir(t.TempDir()) // the samples' relative paths
			os.Mkdir("secrets", 0o700)
			for _, f := range []string{"admin-token", "acme-token"} {
				os.WriteFile(filepath.Join("secrets", f), []byte(f+"-0123456789abcdef"), 0o600)
			}
			env := []string{}
			for _, v := range []string{"OPS_WEBHOOK_SECRET", "DISPATCH_WEBHOOK_SECRET", "BILLING_WEBHOOK_SECRET", "ACME_WEBHOOK_SECRETS", "GEOFENCE_WEBHOOK_SECRET"} {
				env = append(env, v+"="+secretText)
			}
			if _, err := config.Load(abs, env, nil); err != nil {
				t.Fatal(err)
			}
		})
	}
}
