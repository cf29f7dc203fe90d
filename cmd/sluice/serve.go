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
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/jetstream"
)

// errAborted is serve's error when a second signal ends the drain: the
// process exits 1 without waiting for it. Nothing accepted is lost by
// that: every accepted event is in the log, and deliveries still in flight
// run again after the restart (at-least-once).
var errAborted = errors.New("second signal: stopped without finishing the drain; deliveries in flight run again after restart")

const serveAbout = `Runs the sidecar: producers POST events to the ingest address, sluice keeps
each in its log before answering 202, and delivers it, signed, to every
subscription that takes its type, retrying failures and dead-lettering
what cannot be delivered; the admin API, /metrics, /healthz and /readyz are
on the admin address.

Configuration, later sources winning: built-in defaults, the --config file
(else $SLUICE_CONFIG), SLUICE_* environment variables, then these flags. A
variable is SLUICE_ and the key's path in capitals, each "." of the path
written "__": SLUICE_LISTEN sets listen, SLUICE_DATA_DIR data_dir,
SLUICE_ADMIN__TOKEN_FILE admin.token_file; a list key takes a
comma-separated value (SLUICE_JETSTREAM__URLS=nats://a:4222,nats://b:4222).
Subscriptions, tenants and admin.tokens are lists of mappings a variable
cannot spell: they come from the file only. A SLUICE_ variable that names
no key is ignored with a warning.

Signals: SIGTERM or SIGINT drains (ingest answers 503, deliveries in
flight get shutdown_grace, cursors are written, the log is closed, exit 0);
a second one stops at once, exit 1, and what was in flight is delivered
again after the restart. SIGHUP re-reads the config file and applies its
subscriptions and admin.tokens, as a change of the file on disk does; every
other key is read at start only, a file that moves the log (log.backend,
jetstream.*, node_id) is refused, and a bad file changes nothing.`

// serve runs the sidecar until SIGTERM or SIGINT; SIGHUP reloads the
// subscriptions from the config file, and so does a change of the file on
// disk (config.Watcher: a Kubernetes ConfigMap update swaps a symlink and
// sends no signal). The first SIGTERM drains (ingest answers 503,
// deliveries in flight get shutdown_grace, cursors are written, the log is
// closed) and serve returns Close's error; a second one makes serve return
// errAborted at once, even if closing is stuck.
func serve(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", serveAbout, stdout)
	f := newServeFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("serve", pos); err != nil {
		return err
	}
	configPath, acceptLoss, overrides := f.config, f.acceptLoss, f.overrides()
	load := func() (*config.Config, error) { return config.Load(*configPath, os.Environ(), overrides) }
	// The watcher's baseline is taken before the file is read, so a change
	// made while sluice starts is reloaded once it is serving.
	var watcher *config.Watcher
	if *configPath != "" {
		watcher = config.NewWatcher(*configPath)
	}
	cfg, err := load()
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	if len(cfg.IgnoredEnv) > 0 {
		log.Warn("ignoring SLUICE_ environment variables that are no config key", "variables", strings.Join(cfg.IgnoredEnv, ","))
	}
	subs := subscriptions(cfg)
	for _, l := range []struct{ key, addr string }{{"listen", cfg.Listen}, {"admin.listen", cfg.Admin.Listen}} {
		if !loopback(l.addr) && cfg.Admin.ResolvedToken == "" {
			log.Warn("listening beyond loopback without an admin token: anyone who reaches it can post events or use the admin API; set admin.token_file",
				"key", l.key, "address", l.addr)
		}
	}
	mem := applyMemoryBudget(cfg.MemoryBytes, cgroupMemoryFiles)
	sh := proxy.SplitMemory(mem.bytes)
	log.Info("memory budget", "memory_bytes", mem.bytes, "from", mem.from, "gomemlimit_bytes", mem.goLimit,
		"memtable_bytes", sh.Log.MemTable, "ring_bytes", sh.Ring, "gate_bytes", sh.Gate)
	// Signals are caught before the server opens: a SIGTERM during start-up
	// (Kubernetes deleting a pod that is still starting) must drain, not kill.
	life := notifySignals()
	defer life.stop()
	opts := serverOptions(cfg, subs, log, life.drain.Done())
	opts.MemoryBytes = mem.bytes
	opts.AcceptDataLoss = *acceptLoss
	tp, err := tracerProvider(cfg.OTel, log) // otel.go; nil when tracing is off
	if err != nil {
		return err
	}
	if tp != nil {
		opts.TracerProvider = tp // the server shuts it down on Close
		log.Info("tracing on: exporting spans over OTLP/HTTP", "url", cfg.OTel.TracesURL, "from", cfg.OTel.TracesURLFrom,
			"service_name", serviceName(cfg.OTel), "sample_ratio", cfg.OTel.SampleRatio)
	}
	srv := proxy.New(opts)
	cfg.Subscriptions, subs = nil, nil // the server owns its copies; reload re-reads the file
	if err := srv.Open(); err != nil {
		if errors.Is(err, queue.ErrClosed) && life.drain.Err() != nil {
			// Told to stop while the shared log was away: nothing was
			// accepted, so there is nothing to drain.
			log.Info("stopped while starting", "signal", signalName(life.drain), "err", err)
			return nil
		}
		return err
	}
	// Parsing a large config leaves much garbage behind; hand it back now
	// rather than carry it as resident memory.
	debug.FreeOSMemory()
	// The API's subscriptions are counted beside the file's: they are read
	// back from the log, and a count of the file's alone would make a
	// restart look as if they were lost.
	fileSubs, apiSubs := countSubscriptions(srv.Lanes())
	nsubs := fileSubs + apiSubs
	if cfg.Log.Backend == config.BackendJetStream {
		log.Info("sluice serving", "version", version, "ingest", srv.URL(), "admin", srv.AdminURL(),
			"log", "jetstream", "jetstream_urls", strings.Join(cfg.JetStream.URLs, ","), "stream", cfg.JetStream.Stream,
			"node_id", cfg.NodeID, "subscriptions", nsubs, "file_subscriptions", fileSubs, "api_subscriptions", apiSubs)
	} else {
		log.Info("sluice serving", "version", version, "ingest", srv.URL(), "admin", srv.AdminURL(),
			"data_dir", cfg.DataDir, "durability", cfg.Durability, "subscriptions", nsubs, "file_subscriptions", fileSubs, "api_subscriptions", apiSubs)
	}
	if nsubs == 0 {
		log.Warn("no subscriptions configured: events are accepted and kept, but go nowhere. " +
			"Add one under 'subscriptions:' in a config file (id, url, secret: whsec_..., types) " +
			"and start with --config FILE (it is re-read on SIGHUP and when it changes), " +
			"or create one through the admin API: POST /v1/subscriptions")
	}

	changed, stopWatching := watch(watcher)
wait:
	for {
		select {
		case <-life.reload:
			reload(srv, cfg, load, log)
		case <-changed:
			log.Info("config file changed; reloading", "file", *configPath)
			reload(srv, cfg, load, log)
		case <-life.drain.Done():
			break wait
		}
	}
	stopWatching()
	log.Info("draining", "signal", signalName(life.drain), "grace", cfg.ShutdownGrace)
	// The second signal cancels the grace early, so Close abandons what is
	// in flight at once, and ends the wait below.
	ctx, cancel := context.WithTimeout(life.abort, cfg.ShutdownGrace)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- srv.Close(ctx) }()
	select {
	case err := <-closed:
		log.Info("stopped")
		return err
	case <-life.abort.Done():
		// Closing may be stuck (a hung disk); the operator asked to stop
		// now, and what was not finished is in the log.
		log.Warn("second signal: exiting now", "signal", signalName(life.abort))
		return errAborted
	}
}

// serveFlags are serve's flags. healthcheck parses them too, from the
// arguments of a serve that is the container's main process.
type serveFlags struct {
	config, listen, adminListen, dataDir *string
	acceptLoss                           *bool
}

func newServeFlags(fs *flag.FlagSet) serveFlags {
	return serveFlags{
		config:      fs.String("config", os.Getenv(config.EnvFile), "config file, YAML or (name ending in .json) JSON (default: $SLUICE_CONFIG, else built-in defaults)"),
		listen:      fs.String("listen", "", "ingest address, overrides the config's listen"),
		adminListen: fs.String("admin-listen", "", "admin address, overrides admin.listen"),
		dataDir:     fs.String("data-dir", "", "data directory, overrides data_dir"),
		// A flag and no config key: accepting a loss is a decision about
		// one damaged dir, and a key left in a config file would accept the
		// next damage too, unseen.
		acceptLoss: fs.Bool("accept-data-loss", false, "open a data dir whose logs are damaged, dropping the records after the damage (sluice refuses it otherwise; see docs/reliability.md)"),
	}
}

// overrides are the config keys the flags set, for config.Load.
func (f serveFlags) overrides() map[string]any {
	overrides := map[string]any{}
	for k, v := range map[string]string{"listen": *f.listen, "admin.listen": *f.adminListen, "data_dir": *f.dataDir} {
		if v != "" {
			overrides[k] = v
		}
	}
	return overrides
}

// countSubscriptions counts the lanes of the file's subscriptions and of
// the API's; the operational webhook's lane is the sidecar's own, no
// subscription anyone configured.
func countSubscriptions(lanes []api.LaneStatus) (file, viaAPI int) {
	for _, l := range lanes {
		switch {
		case l.Subscription == delivery.OperationalID:
		case l.ManagedBy == api.ManagedByAPI:
			viaAPI++
		default:
			file++
		}
	}
	return file, viaAPI
}

// reload applies the config file's subscriptions and tenant tokens
// (admin.tokens); a bad file changes
// nothing. Nor does a file that moves the log (log.backend, jetstream.*,
// node_id): its subscriptions are meant for another log, and in fleet mode
// applying them would register them in a shared registry this sidecar is
// leaving. Other keys are read at start only (docs/operations.md, "Running it").
func reload(srv *proxy.Server, running *config.Config, load func() (*config.Config, error), log *slog.Logger) {
	cfg, err := load()
	if err == nil {
		if keys := config.RestartRequired(running, cfg); len(keys) > 0 {
			err = fmt.Errorf("%s changed: where the log lives and which node this is take effect only on a restart; nothing was reloaded (restart to apply, or undo the change)", strings.Join(keys, ", "))
		}
	}
	if err == nil {
		subs := subscriptions(cfg)
		if err = srv.Reload(subs); err == nil {
			// A tenant token dropped from admin.tokens must stop working
			// now, not at the next restart.
			srv.SetTenantTokens(tenantTokens(cfg))
			log.Info("config reloaded", "subscriptions", len(subs), "tenant_tokens", len(cfg.Admin.ResolvedTenantTokens))
			return
		}
	}
	log.Error("config reload failed; keeping the running config", "err", err)
}

// watch runs w until stop is called, which waits for it; changed receives
// once for any number of changes since it was last read, like
// lifecycle.reload. A nil w watches nothing.
func watch(w *config.Watcher) (changed <-chan struct{}, stop func()) {
	if w == nil {
		return nil, func() {}
	}
	ch := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		w.Run(ctx, func() {
			select {
			case ch <- struct{}{}:
			default: // a reload is pending already
			}
		})
	})
	return ch, func() { cancel(); wg.Wait() }
}

func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(cfg.LogLevel)) // validated by config.Load
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serverOptions copies the config onto the proxy's plain options. Closing
// stop makes a fleet store that is still waiting for its NATS servers give
// up.
func serverOptions(cfg *config.Config, subs []*delivery.Subscription, log *slog.Logger, stop <-chan struct{}) proxy.Options {
	opts := proxy.Options{
		Listen:       cfg.Listen,
		SocketMode:   socketMode(cfg.SocketMode),
		AdminListen:  cfg.Admin.Listen,
		AdminToken:   cfg.Admin.ResolvedToken,
		DataDir:      cfg.DataDir,
		Sync:         cfg.Durability == config.DurabilityFsync,
		DedupWindow:  cfg.DedupWindow,
		MaxBodyBytes: cfg.MaxBodyBytes,
		Ingest: ingest.Limits{
			HeaderTimeout: cfg.Ingest.HeaderTimeout, BodyTimeout: cfg.Ingest.BodyTimeout, IdleTimeout: cfg.Ingest.IdleTimeout,
			MaxHeaderBytes: cfg.Ingest.MaxHeaderBytes, MaxConnections: cfg.Ingest.MaxConnections,
			MaxBatchEvents: cfg.Ingest.MaxBatchEvents, MaxBatchBytes: cfg.Ingest.MaxBatchBytes,
		},
		MaxInFlight:     cfg.MaxInFlight,
		MaxConnsPerHost: cfg.MaxConnsPerHost,
		MaxDiskBytes:    cfg.MaxDiskBytes,
		// The config says 0 to disable the floor; the queue reads 0 as its
		// default and a negative value as none.
		MinFreeDiskBytes:    cmp.Or(cfg.MinFreeDiskBytes, -1),
		AllowPrivateTargets: cfg.AllowPrivateTargets,
		Egress:              cfg.ProxyEgress(),
		Registry:            newRegistry(),
		RetryBudget:         cfg.RetryBudget.Policy(),
		Subscriptions:       subs,
		Logger:              log,
		Specs:               specParser{allowPrivate: cfg.AllowPrivateTargets},
		Tenants:             tenants(cfg),
		TenantDefaults:      tenantDefaults(cfg),
		TenantTokens:        tenantTokens(cfg),
		OperationalWebhook:  operationalWebhook(cfg),
		DropTraceContext:    !cfg.OTel.Propagate,
		CloudEventsSource:   cfg.CloudEvents.Source,
	}
	if cfg.Log.Backend == config.BackendJetStream {
		// Fleet mode: the log, the delivery state and the registry are in
		// JetStream, so data_dir holds nothing (it is still accepted, and
		// an emptyDir is enough for it); durability and
		// min_free_disk_bytes are Badger's and do not apply: a 202 means a
		// JetStream quorum has the event. max_disk_bytes bounds the
		// stream (its max_bytes) instead of the directory.
		js := jetstreamOptions(cfg, log)
		js.Cancel = stop
		opts.OpenStore = openFleetStore(js)
	}
	return opts
}

// jetstreamOptions copies fleet mode's config onto the JetStream backend's
// options; Open adds OnCommit and the registerer.
func jetstreamOptions(cfg *config.Config, log *slog.Logger) jetstream.Options {
	js := cfg.JetStream
	return jetstream.Options{
		URLs:            slices.Clone(js.URLs),
		Stream:          js.Stream,
		Replicas:        js.Replicas,
		LeaseTTL:        js.LeaseTTL,
		NodeID:          cfg.NodeID,
		CredentialsFile: js.CredentialsFile,
		TLS:             jetstream.TLS{CAFile: js.TLS.CAFile, CertFile: js.TLS.CertFile, KeyFile: js.TLS.KeyFile},
		DedupWindow:     cfg.DedupWindow, // the stream's duplicate window
		MaxBytes:        cfg.MaxDiskBytes,
		Logger:          log,
	}
}

// openFleetStore is proxy.Options.OpenStore for fleet mode.
func openFleetStore(opts jetstream.Options) func(func([]*queue.Event), prometheus.Registerer) (queue.Store, error) {
	return func(onCommit func([]*queue.Event), reg prometheus.Registerer) (queue.Store, error) {
		opts.OnCommit, opts.Registerer = onCommit, reg
		s, err := jetstream.Open(opts)
		if err != nil {
			return nil, err // not a nil *Store in a non-nil interface
		}
		return s, nil
	}
}

// newRegistry holds sluice's metrics plus the Go runtime and process
// collectors, served at the admin /metrics.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
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
