package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue/jetstream"
)

// TestFleetServerOptions: with log.backend jetstream, serve opens the log
// through proxy.Options.OpenStore with the config's fleet keys; with
// badger it leaves the Badger log in data_dir as it was.
func TestFleetServerOptions(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg, err := config.Load("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if opts := serverOptions(cfg, nil, quiet, nil); opts.OpenStore != nil || opts.DataDir != "./sluice-data" {
		t.Fatalf("badger: OpenStore set (%v) or data dir %q", opts.OpenStore != nil, opts.DataDir)
	}

	cfg, err = config.Load("", []string{
		"SLUICE_LOG__BACKEND=jetstream",
		"SLUICE_JETSTREAM__URLS=nats://nats-0:4222,nats://nats-1:4222",
		"SLUICE_JETSTREAM__STREAM=BILLING",
		"SLUICE_JETSTREAM__REPLICAS=1",
		"SLUICE_JETSTREAM__LEASE_TTL=4s",
		"SLUICE_NODE_ID=billing-0",
		"SLUICE_DEDUP_WINDOW=2h",
		"SLUICE_MAX_DISK_BYTES=1073741824",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if opts := serverOptions(cfg, nil, quiet, nil); opts.OpenStore == nil {
		t.Fatal("jetstream: OpenStore not set")
	}
	got := jetstreamOptions(cfg, quiet)
	want := jetstream.Options{
		URLs: []string{"nats://nats-0:4222", "nats://nats-1:4222"}, Stream: "BILLING", Replicas: 1, LeaseTTL: 4 * time.Second,
		NodeID: "billing-0", DedupWindow: 2 * time.Hour, MaxBytes: 1 << 30, Logger: quiet,
	}
	if !slices.Equal(got.URLs, want.URLs) || got.Stream != want.Stream || got.Replicas != want.Replicas || got.LeaseTTL != want.LeaseTTL ||
		got.NodeID != want.NodeID || got.DedupWindow != want.DedupWindow || got.MaxBytes != want.MaxBytes || got.Logger != want.Logger ||
		got.CredentialsFile != "" || got.TLS != (jetstream.TLS{}) {
		t.Errorf("jetstreamOptions =\n %+v\nwant\n %+v", got, want)
	}
	got.URLs[0] = "changed"
	if cfg.JetStream.URLs[0] != "nats://nats-0:4222" {
		t.Error("jetstreamOptions shares the config's URL slice")
	}
}

// startNATSWithToken runs a JetStream-enabled nats-server on loopback that
// refuses clients without its token.
func startNATSWithToken(t *testing.T) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Authorization: "nats-token-not-given", JetStream: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// TestServeFleetDialsNATS: a real `sluice serve` in fleet mode, configured
// from the environment as `sluice inject --jetstream-url` configures it,
// dials the NATS servers named by jetstream.urls; a server that refuses
// it stops the start-up at once with an error naming the key, and the data
// dir is never created, fleet mode not needing it.
func TestServeFleetDialsNATS(t *testing.T) {
	ns := startNATSWithToken(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	cfg := filepath.Join(dir, "sluice.yaml")
	writeFile(t, cfg, "data_dir: "+data+"\nlisten: "+freePort(t)+"\nadmin: {listen: "+freePort(t)+"}\n")
	var out syncBuffer
	cmd := sluiceCmd(t, &out, "serve", "--config", cfg)
	cmd.Env = append(cmd.Env, "SLUICE_LOG__BACKEND=jetstream", "SLUICE_JETSTREAM__URLS="+ns.ClientURL(),
		"SLUICE_JETSTREAM__REPLICAS=1", "SLUICE_NODE_ID=pod-a")
	err := cmd.Run()
	if err == nil || cmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1; output:\n%s", err, out.String())
	}
	for _, want := range []string{"jetstream.urls: cannot reach NATS at " + ns.ClientURL(), "Authorization Violation"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("fleet mode created the data dir: %v", err)
	}
}

// TestSIGHUPRefusesFleetChange: a reload that would move the log to
// JetStream is refused whole, naming the keys and saying a restart is
// needed, and the subscription the same file adds does not join.
func TestSIGHUPRefusesFleetChange(t *testing.T) {
	dir := t.TempDir()
	tb := startReceiver(t)
	a := subYAML("a", tb.URL()+"/a", `["*"]`)
	b := subYAML("b", tb.URL()+"/b", `["*"]`)
	sc := newSidecar(t, dir, a)
	conf, err := os.ReadFile(sc.config)
	if err != nil {
		t.Fatal(err)
	}
	admin := regexp.MustCompile(`admin:\n  listen: (\S+)`).FindSubmatch(conf)[1]
	sc.start()

	sc.writeConfig(dir, a+b+"log: {backend: jetstream}\njetstream: {urls: [\"nats://127.0.0.1:4222\"]}\nnode_id: pod-a\n")
	sc.cmd.Process.Signal(syscall.SIGHUP)
	sc.log.await(t, "config reload failed", 1, 20*time.Second)
	want := "jetstream.urls, log.backend, node_id changed: where the log lives and which node this is take effect only on a restart; nothing was reloaded"
	if !strings.Contains(sc.log.String(), want) {
		t.Fatalf("log lacks %q:\n%s", want, sc.log.String())
	}
	if got := laneIDs(t, "http://"+string(admin)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("lanes after the refused reload = %v, want [a]", got)
	}
}

func laneIDs(t *testing.T, admin string) []string {
	t.Helper()
	resp, err := http.Get(admin + "/v1/subscriptions")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list api.SubscriptionList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatalf("GET /v1/subscriptions: %v", err)
	}
	var ids []string
	for _, l := range list.Subscriptions {
		ids = append(ids, l.Subscription)
	}
	slices.Sort(ids)
	return ids
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(fmt.Errorf("write %s: %w", path, err))
	}
}
