package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/sluicehq/sluice/config"
)

// healthcheck exits 0 when the local sidecar answers /readyz, for images
// without curl (Docker HEALTHCHECK, Kubernetes exec probes). It reads the
// same config as serve (file, SLUICE_ environment) to find the admin
// listener and its token.
func healthcheck(args []string, stdout io.Writer) error {
	fs := newFlagSet("healthcheck", `Exits 0 and prints "ok" when the local sidecar's admin address answers
--path with 200, else exits 1 naming what answered: a probe for images
without curl (a Docker HEALTHCHECK, a Kubernetes exec probe). /readyz is
200 once the sidecar serves and until it drains; /healthz while the process
is alive. It finds the admin address and token as serve does: --config
FILE, else $SLUICE_CONFIG, and the SLUICE_* environment; --admin URL
overrides the address.`, stdout)
	configPath := fs.String("config", os.Getenv(config.EnvFile), "the sidecar's config file, for admin.listen and the admin token (default: $SLUICE_CONFIG)")
	admin := fs.String("admin", "", "admin API base URL (default: from the config)")
	path := fs.String("path", "/readyz", "path to probe (/readyz or /healthz)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("healthcheck", pos); err != nil {
		return err
	}
	base, client, token, err := adminClient(*configPath, *admin)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	client.Timeout = 2 * time.Second
	req, err := http.NewRequest(http.MethodGet, base+*path, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s answered %s", *path, resp.Status)
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}
