package main

// `sluice injector` is the mutating admission webhook that adds the
// sidecar to pods as they are created; the review itself, and the rewrite
// it shares with `sluice inject`, are package inject's.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sluicehq/sluice/inject"
)

// injectorShutdownGrace bounds the wait for reviews in flight once the
// injector stops listening: the API server gives a review 5 s (the
// manifests' timeoutSeconds), so one still running after 10 s has been
// given up on.
const injectorShutdownGrace = 10 * time.Second

// errInjectorAborted is the injector's error when a second signal stops it
// at once: the process exits 1.
var errInjectorAborted = errors.New("injector: second signal: stopped without waiting for reviews in flight")

const injectorAbout = `Serves the mutating admission webhook (POST /mutate, and
/mutate/namespace-enabled for namespaces that opt in) over TLS: pods created
with sluice.io/inject: "true", or in an opted-in namespace, get the sidecar
'sluice inject' adds, the pod's sluice.io/ annotations overriding the flags
below. The certificate pair is re-read when its files change (cert-manager's
rotation). Metrics, /healthz and /readyz are on --admin-listen. SIGTERM or
SIGINT stops it after --shutdown-delay; a second one stops it at once.
Manifests: examples/kubernetes/injector/.`

// minScanInterval bounds --scan-interval from below: a scan is a few list
// calls per opted-in namespace, and a pod missing its sidecar is no
// emergency measured in seconds.
const minScanInterval = 10 * time.Second

// scanCluster is the API server the scan reads: kubeconfig's, or the pod's
// own service account's.
func scanCluster(kubeconfig string) (*inject.Cluster, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else if cfg, err = rest.InClusterConfig(); errors.Is(err, rest.ErrNotInCluster) {
		err = errors.New("not in a Kubernetes pod and no --kubeconfig: the scan cannot reach the API server")
	}
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = "sluice-injector/" + version
	return inject.NewCluster(cfg)
}

// injectorCmd runs the webhook until SIGTERM or SIGINT (a second one stops
// it without waiting).
func injectorCmd(args []string, stdout, stderr io.Writer) error {
	life := notifySignals()
	defer life.stop()
	return runInjector(life.drain, life.abort, args, stdout, stderr, nil)
}

// runInjector serves the webhook until drain is done, then stops: /readyz
// answers 503 at once, reviews are still answered for --shutdown-delay (the
// API server and kube-proxy learn of a terminating endpoint a moment after
// it terminates; with failurePolicy Ignore, a review refused in that moment
// is a pod created without its sidecar), then the listeners close and
// reviews in flight get injectorShutdownGrace. abort cuts both waits
// short. ready, if not nil, is called with the two listeners' addresses
// once both serve.
func runInjector(drain, abort context.Context, args []string, stdout, stderr io.Writer, ready func(webhook, admin string)) error {
	fs := newFlagSet("injector", injectorAbout, stdout)
	listen := fs.String("listen", "127.0.0.1:8443", "webhook address (TLS); in a cluster 0.0.0.0:8443, behind the Service")
	certFile := fs.String("tls-cert-file", "", "serving certificate, PEM (cert-manager's tls.crt); required")
	keyFile := fs.String("tls-key-file", "", "its private key, PEM (tls.key); required")
	adminListen := fs.String("admin-listen", "127.0.0.1:8702", "admin address (plain HTTP): /metrics, /healthz, /readyz")
	delay := fs.Duration("shutdown-delay", 5*time.Second, "after SIGTERM, keep answering reviews this long (with /readyz at 503) before closing, so the API server stops calling first")
	limits := inject.DefaultLimits()
	fs.IntVar(&limits.MaxInFlight, "max-in-flight", limits.MaxInFlight, fmt.Sprintf("reviews read and answered at once (1 to %d); a review can take 7 times its body, up to 24 MiB, so keep this times 24 MiB well under the container's memory limit", inject.MaxMaxInFlight))
	fs.DurationVar(&limits.QueueWait, "queue-wait", limits.QueueWait, fmt.Sprintf("how long a review past --max-in-flight waits for a slot (0 to %s), never past the API server's timeout less 1s; then it is answered 503 and the webhook's failurePolicy applies", inject.MaxQueueWait))
	scanInterval := fs.Duration("scan-interval", time.Minute, "how often to look for pods that asked for the sidecar and run without it (sluice_injector_pods_without_sidecar; needs list on pods and namespaces, get on the webhook configuration); 0 turns the scan off")
	webhookConfig := fs.String("webhook-configuration", inject.DefaultWebhookConfiguration, "the MutatingWebhookConfiguration whose selectors the scan evaluates")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig for the scan (default: the pod's service account, in a cluster)")
	options := injectFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("injector", pos); err != nil {
		return err
	}
	o, err := options()
	if err != nil {
		return fmt.Errorf("injector: %w", err)
	}
	switch {
	case *certFile == "":
		return errors.New("injector: --tls-cert-file is required (the webhook serves TLS only; cert-manager's Certificate writes tls.crt and tls.key)")
	case *keyFile == "":
		return errors.New("injector: --tls-key-file is required (the key of --tls-cert-file)")
	case *delay < 0:
		return fmt.Errorf("injector: --shutdown-delay %s is negative", *delay)
	case *scanInterval < 0:
		return fmt.Errorf("injector: --scan-interval %s is negative (0 turns the scan off)", *scanInterval)
	case *scanInterval > 0 && *scanInterval < minScanInterval:
		return fmt.Errorf("injector: --scan-interval %s is under %s: each scan lists the opted-in pods from the API server", *scanInterval, minScanInterval)
	}
	if err := limits.Validate(); err != nil {
		return fmt.Errorf("injector: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	certs, err := inject.NewCertReloader(*certFile, *keyFile, log)
	if err != nil {
		return fmt.Errorf("injector: --tls-cert-file, --tls-key-file: %w", err)
	}
	var cluster *inject.Cluster
	if *scanInterval > 0 {
		if cluster, err = scanCluster(*kubeconfig); err != nil {
			return fmt.Errorf("injector: --scan-interval: %w (or set --scan-interval=0 to run without the scan)", err)
		}
	}
	// As `sluice serve` does: the heap may grow to twice the live set
	// before a collection, past the container's limit under a burst of
	// large reviews; the soft limit makes the collector work harder before
	// then.
	if soft := setMemoryLimit(cgroupMemoryFiles); soft > 0 {
		log.Info("Go memory limit set from the container's", "gomemlimit_bytes", soft)
	}
	reg := newRegistry()
	mux := http.NewServeMux()
	wh := inject.NewWebhook(o, reg, log)
	wh.Limits = limits
	mux.Handle(inject.PodPath, wh)
	mux.Handle(inject.NamespacePath, wh)
	scanCtx, stopScan := context.WithCancel(context.Background())
	scanDone := make(chan struct{})
	defer func() { stopScan(); <-scanDone }() // a list in flight ends with its context
	if cluster != nil {
		scanner := inject.NewScanner(cluster, *webhookConfig, o, *scanInterval, reg, log)
		go func() { defer close(scanDone); scanner.Run(scanCtx) }()
	} else {
		close(scanDone)
	}
	var serving atomic.Bool
	admin := http.NewServeMux()
	admin.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	admin.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	admin.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !serving.Load() {
			http.Error(w, "not serving", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("injector: --listen: %w", err)
	}
	aln, err := net.Listen("tcp", *adminListen)
	if err != nil {
		ln.Close()
		return fmt.Errorf("injector: --admin-listen: %w", err)
	}
	errorLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn) // TLS handshake errors and the like
	srv := &http.Server{
		Handler:   mux,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate},
		// The API server sends a review at once and waits at most 30 s
		// (the largest timeoutSeconds) for the answer; it keeps its
		// connections alive between reviews.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          errorLog,
	}
	adminSrv := &http.Server{Handler: admin, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: errorLog}
	stopped := make(chan error, 2)
	go func() { stopped <- srv.ServeTLS(ln, "", "") }()
	go func() { stopped <- adminSrv.Serve(aln) }()
	serving.Store(true)
	leaf := certs.Certificate().Leaf
	log.Info("sluice injector serving", "version", version, "listen", ln.Addr().String(), "admin", aln.Addr().String(),
		"tls_cert_file", *certFile, "tls_key_file", *keyFile, "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter,
		"image", o.Image, "config_map", o.ConfigMap, "max_in_flight", limits.MaxInFlight, "queue_wait", limits.QueueWait,
		"scan_interval", *scanInterval)
	if ready != nil {
		ready(ln.Addr().String(), aln.Addr().String())
	}

	var served error
	select {
	case <-drain.Done():
		serving.Store(false)
		stopScan()
		log.Info("stopping: /readyz answers 503; still answering reviews for --shutdown-delay", "signal", signalName(drain), "shutdown_delay", *delay)
		t := time.NewTimer(*delay)
		select {
		case <-t.C:
		case <-abort.Done():
			t.Stop()
		}
	case served = <-stopped: // a listener failed on its own
		serving.Store(false)
		log.Error("a listener stopped; stopping", "err", served)
	}
	ctx, cancel := context.WithTimeout(abort, injectorShutdownGrace)
	defer cancel()
	if abort.Err() == nil {
		err = errors.Join(srv.Shutdown(ctx), adminSrv.Shutdown(ctx))
	}
	if abort.Err() != nil || err != nil {
		// The grace is over or a second signal came: stop now, closing the
		// connections of the reviews in flight (the API server retries
		// none; failurePolicy decides for their pods).
		srv.Close()
		adminSrv.Close()
	}
	switch {
	case served != nil:
		return fmt.Errorf("injector: %w", served)
	case abort.Err() != nil:
		log.Warn("second signal: stopped without waiting for reviews in flight", "signal", signalName(abort))
		return errInjectorAborted
	case err != nil:
		return fmt.Errorf("injector: reviews still in flight after %s: %w", injectorShutdownGrace, err)
	}
	log.Info("stopped")
	return nil
}
