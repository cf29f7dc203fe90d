// Command sluice is the webhook delivery sidecar: `sluice serve` runs it,
// the other subcommands are tools around it. This package wires; the logic
// lives in proxy, queue, policy and signing.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/signing"
)

// Set with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "none"
)

const usage = `sluice — a webhook delivery sidecar

Usage:
  sluice serve [--config FILE] [--listen ADDR] [--admin-listen ADDR] [--data-dir DIR]
  sluice demo
  sluice testbed --listen ADDR --mode ok|fail|slow|blackhole|ratelimit|flaky [--secret whsec_...]
  sluice healthcheck [--config FILE] [--admin URL]
  sluice status [--json]
  sluice dlq list [--subscription S] [--reason R] [--limit N] [--cursor C] [--all] [--json]
  sluice dlq show SUBSCRIPTION SEQ [--json]
  sluice dlq replay (SUBSCRIPTION SEQ | [--subscription S] [--reason R] --all) [--force] [--json]
  sluice events show ID [--json]
  sluice pause ID [--reason TEXT]
  sluice resume ID
  sluice inject [FILE|-] [--image IMG] [--config-map NAME] [--pvc NAME] [--secret NAME] [--grace 10s] [--ingest-port 8700] [--admin-port 8701]
  sluice verify --secret whsec_... [--id ID --timestamp TS --signature SIG | --headers FILE] [--tolerance 5m] < BODY
  sluice version

status, dlq, events, pause and resume call the admin API found like
healthcheck finds it (--config FILE, else $SLUICE_CONFIG; --admin URL), and
retry for a few seconds while the sidecar restarts.

Run 'sluice COMMAND -h' for the flags of a command.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "serve":
		err = serve(rest, stderr)
	case "demo":
		err = demo(rest, stdout)
	case "testbed":
		err = testbedCmd(rest, stdout, stderr)
	case "healthcheck":
		err = healthcheck(rest, stdout)
	case "status":
		err = statusCmd(rest, stdout, stderr)
	case "dlq":
		err = dlqCmd(rest, stdout, stderr)
	case "events":
		err = eventsCmd(rest, stdout, stderr)
	case "pause", "resume":
		err = pauseCmd(rest, stdout, stderr, cmd == "pause")
	case "verify":
		err = verifyCmd(rest, stdout, stderr)
	case "inject":
		err = injectCmd(rest, os.Stdin, stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "sluice %s (commit %s)\n", version, commit)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "sluice:", err)
		return 1
	}
	return 0
}

// serve runs the sidecar until SIGTERM or SIGINT; SIGHUP reloads the
// subscriptions from the config file.
func serve(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", os.Getenv(envConfigFile), "config file, YAML or (name ending in .json) JSON (default: $SLUICE_CONFIG, else built-in defaults)")
	listen := fs.String("listen", "", "ingest address, overrides the config's listen")
	adminListen := fs.String("admin-listen", "", "admin address, overrides admin.listen")
	dataDir := fs.String("data-dir", "", "data directory, overrides data_dir")
	if err := fs.Parse(args); err != nil {
		return err
	}
	overrides := map[string]any{}
	for k, v := range map[string]string{"listen": *listen, "admin.listen": *adminListen, "data_dir": *dataDir} {
		if v != "" {
			overrides[k] = v
		}
	}
	load := func() (*Config, error) { return LoadConfig(*configPath, os.Environ(), overrides) }
	cfg, err := load()
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	if len(cfg.IgnoredEnv) > 0 {
		log.Warn("ignoring SLUICE_ environment variables that are no config key", "variables", strings.Join(cfg.IgnoredEnv, ","))
	}
	subs, err := subscriptions(cfg)
	if err != nil {
		return err
	}
	for _, l := range []struct{ key, addr string }{{"listen", cfg.Listen}, {"admin.listen", cfg.Admin.Listen}} {
		if !loopback(l.addr) && cfg.Admin.ResolvedToken == "" {
			log.Warn("listening beyond loopback without an admin token: anyone who reaches it can post events or use the admin API; set admin.token_file",
				"key", l.key, "address", l.addr)
		}
	}
	if soft := setMemoryLimit(cgroupMemoryFiles); soft > 0 {
		log.Info("Go memory limit set from the container's", "gomemlimit_bytes", soft)
	}
	// Signals are caught before the server opens: a SIGTERM during start-up
	// (Kubernetes deleting a pod that is still starting) must drain, not kill.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	srv := proxy.New(serverOptions(cfg, subs, log))
	nsubs := len(subs)
	cfg.Subscriptions, subs = nil, nil // the server owns its copies; reload re-reads the file
	if err := srv.Open(); err != nil {
		return err
	}
	// Parsing a large config leaves much garbage behind; hand it back now
	// rather than carry it as resident memory.
	debug.FreeOSMemory()
	log.Info("sluice serving", "version", version, "ingest", srv.URL(), "admin", srv.AdminURL(),
		"data_dir", cfg.DataDir, "durability", cfg.Durability, "subscriptions", nsubs)
	if nsubs == 0 {
		log.Warn("no subscriptions configured: events are accepted and kept, but go nowhere. " +
			"Add one under 'subscriptions:' in a config file (id, url, secret: whsec_..., types) " +
			"and start with --config FILE, or send SIGHUP after editing it")
	}

	for sig := range sigs {
		if sig == syscall.SIGHUP {
			reload(srv, load, log)
			continue
		}
		log.Info("draining", "signal", sig.String(), "grace", cfg.ShutdownGrace)
		ctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
		// A second signal exits at once: whatever was not finished is in
		// the log and runs again after restart.
		go func() {
			for s := range sigs {
				if s != syscall.SIGHUP {
					log.Warn("second signal: exiting now", "signal", s.String())
					os.Exit(1)
				}
			}
		}()
		err := srv.Close(ctx)
		cancel()
		log.Info("stopped")
		return err
	}
	return nil
}

// reload applies the config file's subscriptions; a bad file changes nothing.
func reload(srv *proxy.Server, load func() (*Config, error), log *slog.Logger) {
	cfg, err := load()
	if err == nil {
		var subs []*proxy.Subscription
		if subs, err = subscriptions(cfg); err == nil {
			err = srv.Reload(subs)
			if err == nil {
				log.Info("config reloaded", "subscriptions", len(subs))
				return
			}
		}
	}
	log.Error("config reload failed; keeping the running config", "err", err)
}

func newLogger(cfg *Config, w io.Writer) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(cfg.LogLevel)) // validated by Config.Validate
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serverOptions copies the config onto the proxy's plain options.
func serverOptions(cfg *Config, subs []*proxy.Subscription, log *slog.Logger) proxy.Options {
	return proxy.Options{
		Listen:       cfg.Listen,
		SocketMode:   socketMode(cfg.SocketMode),
		AdminListen:  cfg.Admin.Listen,
		AdminToken:   cfg.Admin.ResolvedToken,
		DataDir:      cfg.DataDir,
		Sync:         cfg.Durability == DurabilityFsync,
		DedupWindow:  cfg.DedupWindow,
		MaxBodyBytes: cfg.MaxBodyBytes,
		Ingest: proxy.IngestLimits{
			HeaderTimeout: cfg.Ingest.HeaderTimeout, BodyTimeout: cfg.Ingest.BodyTimeout, IdleTimeout: cfg.Ingest.IdleTimeout,
			MaxHeaderBytes: cfg.Ingest.MaxHeaderBytes, MaxConnections: cfg.Ingest.MaxConnections,
		},
		MaxInFlight:     cfg.MaxInFlight,
		MaxConnsPerHost: cfg.MaxConnsPerHost,
		MaxDiskBytes:    cfg.MaxDiskBytes,
		// The config says 0 to disable the floor; the queue reads 0 as its
		// default and a negative value as none.
		MinFreeDiskBytes:    cmp.Or(cfg.MinFreeDiskBytes, -1),
		AllowPrivateTargets: cfg.AllowPrivateTargets,
		Registry:            newRegistry(),
		RetryBudget:         policy.BudgetConfig{Ratio: cfg.RetryBudget.Ratio, MinPerSecond: cfg.RetryBudget.MinPerSecond, Window: cfg.RetryBudget.Window},
		Subscriptions:       subs,
		Logger:              log,
	}
}

// newRegistry holds sluice's metrics plus the Go runtime and process
// collectors, served at the admin /metrics.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// subscriptions converts validated config into the proxy's subscriptions.
// Identical secrets and type lists are shared between subscriptions (one
// HMAC state, one slice), which keeps a lane small when thousands of
// subscriptions repeat them.
func subscriptions(cfg *Config) ([]*proxy.Subscription, error) {
	out := make([]*proxy.Subscription, 0, len(cfg.Subscriptions))
	secrets := map[string]signing.Secret{}
	typeLists := map[string][]string{}
	for i, sc := range cfg.Subscriptions {
		for j, k := range sc.Resolved {
			enc := k.Encode()
			if prev, ok := secrets[enc]; ok {
				sc.Resolved[j] = prev
			} else {
				secrets[enc] = k
			}
		}
		tk := strings.Join(sc.Types, "\x00")
		if prev, ok := typeLists[tk]; ok {
			sc.Types = prev
		} else {
			typeLists[tk] = sc.Types
		}
		classify, err := policy.ParseClassify(sc.Classify)
		if err != nil {
			return nil, fmt.Errorf("config: subscriptions[%d].classify: %w", i, err)
		}
		out = append(out, &proxy.Subscription{
			ID:             sc.ID,
			URL:            sc.URL,
			Secrets:        sc.Resolved,
			Types:          sc.Types,
			Timeout:        sc.Timeout,
			MaxConcurrency: sc.Concurrency.Max,
			Retry: policy.RetryPolicy{
				MaxAttempts: sc.Retry.MaxAttempts,
				MaxAge:      sc.Retry.MaxAge,
				Backoff:     policy.Backoff{Base: sc.Retry.Base, Cap: sc.Retry.Cap},
			},
			Headers:  sc.Headers,
			Classify: classify,
			Paused:   sc.Paused,
			Rate:     proxy.RateLimit{PerSecond: sc.Rate.PerSecond, Burst: sc.Rate.Burst},
			Auto:     autoCap(sc.Concurrency),
			Backlog:  proxy.BacklogQuota{MaxEvents: sc.Backlog.MaxEvents, MaxAge: sc.Backlog.MaxAge},
			Breaker: policy.BreakerConfig{
				Window: sc.Breaker.Window, MinRequests: sc.Breaker.MinRequests, FailureRatio: sc.Breaker.FailureRatio,
				ConsecutiveTimeouts: sc.Breaker.ConsecutiveTimeouts, CoolDown: sc.Breaker.CoolDown, MaxCoolDown: sc.Breaker.MaxCoolDown,
			},
		})
	}
	return out, nil
}

// loopback reports whether a listen address is reachable only from this
// host (or a unix socket, whose file mode guards it).
func loopback(addr string) bool {
	if strings.HasPrefix(addr, "unix://") {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// socketMode parses the validated octal socket_mode.
func socketMode(s string) os.FileMode {
	m, _ := strconv.ParseUint(s, 8, 32)
	return os.FileMode(m)
}

// autoCap returns the lane's Little's-law cap settings, or nil for a static cap.
func autoCap(c ConcurrencyConfig) *policy.AutoCapConfig {
	if !c.Auto {
		return nil
	}
	return &policy.AutoCapConfig{Min: c.Min, Max: c.Max, Headroom: c.Headroom}
}

// healthcheck exits 0 when the local sidecar answers /readyz, for images
// without curl (Docker HEALTHCHECK, Kubernetes exec probes). It reads the
// same config as serve (file, SLUICE_ environment) to find the admin
// listener and its token.
func healthcheck(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	configPath := fs.String("config", os.Getenv(envConfigFile), "the sidecar's config file, for admin.listen and the admin token (default: $SLUICE_CONFIG)")
	admin := fs.String("admin", "", "admin API base URL (default: from the config)")
	path := fs.String("path", "/readyz", "path to probe (/readyz or /healthz)")
	if err := fs.Parse(args); err != nil {
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
