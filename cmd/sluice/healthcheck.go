package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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
FILE, else $SLUICE_CONFIG, and the SLUICE_* environment. Without --config,
when the container's PID 1 is sluice serve, its --config and --admin-listen
are used, so an image's HEALTHCHECK follows the command the container runs.
--admin URL overrides the address.`, stdout)
	configPath := fs.String("config", os.Getenv(config.EnvFile), "the sidecar's config file, for admin.listen and the admin token (default: the --config of a sluice serve that is the container's PID 1, else $SLUICE_CONFIG)")
	admin := fs.String("admin", "", "admin API base URL (default: from the config)")
	path := fs.String("path", "/readyz", "path to probe (/readyz or /healthz)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("healthcheck", pos); err != nil {
		return err
	}
	var overrides map[string]any
	if !flagSet(fs, "config") && *admin == "" {
		// An image's HEALTHCHECK cannot see the command the container was
		// started with: `docker run IMAGE serve --config F` would leave it
		// probing the defaults, without F's admin address and token, and
		// the container unhealthy. In a container, that command is PID 1.
		if sf, ok := containerServe(); ok {
			*configPath, overrides = *sf.config, sf.overrides()
		}
	}
	base, client, token, err := adminClient(*configPath, overrides, *admin)
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
	if resp.StatusCode == http.StatusUnauthorized && token == "" {
		found := "healthcheck read no config file"
		if *configPath != "" {
			found = fmt.Sprintf("the config file %q names none", *configPath)
		}
		return fmt.Errorf("healthcheck: %s answered %s: the admin API wants a token and %s; "+
			"set SLUICE_CONFIG to the file serve reads (or give --config), or set SLUICE_ADMIN__TOKEN_FILE", *path, resp.Status, found)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s answered %s", *path, resp.Status)
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}

// pid1Cmdline holds the arguments of the container's main process; tests
// point it elsewhere.
var pid1Cmdline = "/proc/1/cmdline"

// containerServe returns the flags of `sluice serve` when that is PID 1 (the
// image's ENTRYPOINT and CMD, or the command given to docker run). Anything
// else as PID 1 (an init, a pod's pause process, a host's systemd) or
// arguments serve would refuse return false.
func containerServe() (serveFlags, bool) {
	b, err := os.ReadFile(pid1Cmdline)
	if err != nil {
		return serveFlags{}, false
	}
	argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	if len(argv) < 2 || filepath.Base(argv[0]) != "sluice" || argv[1] != "serve" {
		return serveFlags{}, false
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	sf := newServeFlags(fs)
	if fs.Parse(argv[2:]) != nil {
		return serveFlags{}, false
	}
	return sf, true
}
