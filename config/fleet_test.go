package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/sluicehq/sluice/queue/jetstream"
)

// fleetFiles are a NATS credentials file and TLS files written for a test:
// nothing with a private key or a seed is committed.
type fleetFiles struct {
	dir                      string
	creds, seed              string // a good .creds file and the user seed in it
	jwtOnly, badSeed, notPEM string // a JWT without a seed, an account seed, plain text
	ca, cert, key            string // a CA, a client certificate it signed, that certificate's key
	otherKey                 string // a key that is not the certificate's
}

// fakeJWT stands in for the user JWT: config checks that a creds file
// holds one, the NATS server is what verifies it.
const fakeJWT = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJzdWIiOiJVVEVTVCJ9.c2lnbmF0dXJl"

func writeFleetFiles(t *testing.T) *fleetFiles {
	t.Helper()
	f := &fleetFiles{dir: t.TempDir()}
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	f.seed = string(seed)
	creds := func(jwt, seed string) string {
		return "-----BEGIN NATS USER JWT-----\n" + jwt + "\n------END NATS USER JWT------\n\n" +
			"************************* IMPORTANT *************************\n\n" +
			"-----BEGIN USER NKEY SEED-----\n" + seed + "\n------END USER NKEY SEED------\n"
	}
	f.creds = f.write(t, "sluice.creds", creds(fakeJWT, f.seed))
	f.jwtOnly = f.write(t, "jwt-only.creds", "-----BEGIN NATS USER JWT-----\n"+fakeJWT+"\n------END NATS USER JWT------\n")
	// An account seed where the user's belongs: a credential, but not a
	// user's.
	acct, _ := nkeys.CreateAccount()
	aseed, _ := acct.Seed()
	f.badSeed = f.write(t, "account-seed.creds", creds(fakeJWT, string(aseed)))
	f.notPEM = f.write(t, "not.pem", "just some text\n")

	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "sluice"},
		NotBefore: caTpl.NotBefore, NotAfter: caTpl.NotAfter, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := func(k *ecdsa.PrivateKey) string {
		der, _ := x509.MarshalECPrivateKey(k)
		return string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
	}
	f.ca = f.write(t, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})))
	f.cert = f.write(t, "client.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER})))
	f.key = f.write(t, "client-key.pem", pemKey(leafKey))
	f.otherKey = f.write(t, "other-key.pem", pemKey(caKey))
	return f
}

func (f *fleetFiles) write(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(f.dir, name)
	writeFile(t, path, content)
	return path
}

// withHostname makes Load see h (and err) as the host name.
func withHostname(t *testing.T, h string, err error) {
	t.Helper()
	old := hostname
	hostname = func() (string, error) { return h, err }
	t.Cleanup(func() { hostname = old })
}

// TestLoadConfigFleet loads every fleet key from a file and checks the
// values, the printed form (which loads back) and that nothing printed
// shows the credentials file's seed.
func TestLoadConfigFleet(t *testing.T) {
	f := writeFleetFiles(t)
	path := f.write(t, "fleet.yaml", fmt.Sprintf(`
log:
  backend: jetstream
jetstream:
  urls: ["nats://nats-0.nats:4222", "tls://nats-1.nats:4222", "nats://10.0.0.3"]
  stream: BILLING_EVENTS
  replicas: 5
  lease_ttl: 3s
  credentials_file: %s
  tls: {ca_file: %s, cert_file: %s, key_file: %s}
node_id: billing-7d9f-x2x
max_disk_bytes: 1073741824
`, f.creds, f.ca, f.cert, f.key))
	cfg, err := Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := JetStreamConfig{
		URLs:   []string{"nats://nats-0.nats:4222", "tls://nats-1.nats:4222", "nats://10.0.0.3"},
		Stream: "BILLING_EVENTS", Replicas: 5, LeaseTTL: 3 * time.Second, CredentialsFile: f.creds,
		TLS: JetStreamTLSConfig{CAFile: f.ca, CertFile: f.cert, KeyFile: f.key},
	}
	if cfg.Log.Backend != BackendJetStream || !equalJetStream(cfg.JetStream, want) || cfg.NodeID != "billing-7d9f-x2x" {
		t.Fatalf("got log %+v, jetstream %+v, node_id %q", cfg.Log, cfg.JetStream, cfg.NodeID)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a loaded fleet config fails Validate again: %v", err)
	}

	// Printed every way, the seed never shows; the paths do.
	b, _ := json.Marshal(cfg)
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "cfg", cfg)
	for _, out := range []string{cfg.String(), fmt.Sprintf("%v %+v %#v", cfg, *cfg, cfg), string(b), logged.String()} {
		if strings.Contains(out, f.seed) || strings.Contains(out, fakeJWT) {
			t.Errorf("output reveals the credentials:\n%s", out)
		}
	}
	s := cfg.String()
	for _, w := range []string{"backend: jetstream", "credentials_file: " + f.creds, "ca_file: " + f.ca, "lease_ttl: 3s", "node_id: billing-7d9f-x2x", "- nats://nats-0.nats:4222"} {
		if !strings.Contains(s, w) {
			t.Errorf("String() lacks %q:\n%s", w, s)
		}
	}
	// ... and loads back to the same.
	again, err := Load(f.write(t, "printed.yaml", s), nil, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	if !equalJetStream(again.JetStream, cfg.JetStream) || again.NodeID != cfg.NodeID || again.Log != cfg.Log {
		t.Errorf("printed and loaded again: %+v %q, want %+v %q", again.JetStream, again.NodeID, cfg.JetStream, cfg.NodeID)
	}

	// A badger config prints no fleet keys, so its String loads back too.
	if s := Default().String(); strings.Contains(s, "jetstream:") || !strings.Contains(s, "backend: badger") {
		t.Errorf("Default().String() =\n%s", s)
	}
}

func equalJetStream(a, b JetStreamConfig) bool {
	return slices.Equal(a.URLs, b.URLs) && a.Stream == b.Stream && a.Replicas == b.Replicas && a.LeaseTTL == b.LeaseTTL &&
		a.CredentialsFile == b.CredentialsFile && a.TLS == b.TLS
}

// TestLoadConfigFleetDefaults: what fleet mode takes when only the backend
// and the servers are given, and where node_id's default comes from.
func TestLoadConfigFleetDefaults(t *testing.T) {
	// Fleet mode's defaults: the badger backend, stream SLUICE_EVENTS, R3,
	// a 10 s lease, no servers and no node id until one is given.
	d := Default()
	if d.Log.Backend != "badger" || d.JetStream.Stream != "SLUICE_EVENTS" || d.JetStream.Replicas != 3 ||
		d.JetStream.LeaseTTL != 10*time.Second || d.JetStream.URLs != nil || d.NodeID != "" {
		t.Fatalf("Default() fleet keys = %+v %+v %q", d.Log, d.JetStream, d.NodeID)
	}
	if d.JetStream.Stream != jetstream.DefaultStream || d.JetStream.Replicas != jetstream.DefaultReplicas || d.JetStream.LeaseTTL != jetstream.DefaultLeaseTTL {
		t.Fatalf("Default() does not take jetstream's defaults: %+v", d.JetStream)
	}

	const minimal = "log: {backend: jetstream}\njetstream: {urls: [nats://127.0.0.1:4222]}\n"
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	writeFile(t, path, minimal)
	for _, tt := range []struct{ host, want string }{
		{"billing-7d9f4c-x2xkq", "billing-7d9f4c-x2xkq"},     // a pod name
		{"web-1.prod.example.com", "web-1_prod_example_com"}, // dots become "_", which no host name has
		{"Build_Box", "Build_Box"},
	} {
		withHostname(t, tt.host, nil)
		cfg, err := Load(path, nil, nil)
		if err != nil {
			t.Fatalf("host %q: %v", tt.host, err)
		}
		if cfg.NodeID != tt.want {
			t.Errorf("host %q: node_id = %q, want %q", tt.host, cfg.NodeID, tt.want)
		}
		if want := (JetStreamConfig{URLs: []string{"nats://127.0.0.1:4222"}, Stream: "SLUICE_EVENTS", Replicas: 3, LeaseTTL: 10 * time.Second}); !equalJetStream(cfg.JetStream, want) {
			t.Errorf("jetstream = %+v, want %+v", cfg.JetStream, want)
		}
	}

	// node_id set anywhere wins over the host name, which is then not asked.
	withHostname(t, "", errors.New("must not be called"))
	cfg, err := Load(path, []string{"SLUICE_NODE_ID=pod-b"}, nil)
	if err != nil || cfg.NodeID != "pod-b" {
		t.Fatalf("SLUICE_NODE_ID: %v, node_id %q", err, cfg.NodeID)
	}
	// With badger the host name is not needed and not read.
	if _, err := Load("", nil, nil); err != nil {
		t.Fatalf("badger with no host name: %v", err)
	}

	for _, tt := range []struct {
		host    string
		err     error
		want    string
		errorIs error
	}{
		{"", errors.New("uname failed"), `config: node_id: required with log.backend: jetstream, and the default, the host name, is unknown (uname failed); set node_id (SLUICE_NODE_ID)`, ErrMissingValue},
		{"host with spaces", nil, `config: node_id: required with log.backend: jetstream, and the default, the host name "host with spaces", is not a valid node id`, ErrInvalidValue},
		{strings.Repeat("h", 65), nil, `is not a valid node id (1 to 64 letters, digits, "_" or "-"); set node_id`, ErrInvalidValue},
	} {
		withHostname(t, tt.host, tt.err)
		_, err := Load(path, nil, nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, tt.errorIs) {
			t.Errorf("host %q, %v: err = %v, want %q", tt.host, tt.err, err, tt.want)
		}
	}

	// A Config built by hand must name its node.
	c := Default()
	c.Log.Backend = BackendJetStream
	c.JetStream.URLs = []string{"nats://127.0.0.1:4222"}
	if err := c.Validate(); err == nil || err.Error() != `config: node_id: required with log.backend: jetstream (Load defaults it to the host name)` {
		t.Errorf("Validate without node_id: %v", err)
	}
	c.NodeID = "a"
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

// TestLoadConfigFleetEnv sets fleet mode from the environment alone, as
// `sluice inject --jetstream-url` does: the list is comma-separated.
func TestLoadConfigFleetEnv(t *testing.T) {
	f := writeFleetFiles(t)
	environ := []string{
		"SLUICE_LOG__BACKEND=jetstream",
		"SLUICE_JETSTREAM__URLS=nats://nats-0.nats:4222, nats://nats-1.nats:4222 ,nats://nats-2.nats:4222",
		"SLUICE_JETSTREAM__STREAM=FLEET",
		"SLUICE_JETSTREAM__REPLICAS=1",
		"SLUICE_JETSTREAM__LEASE_TTL=2s",
		"SLUICE_JETSTREAM__CREDENTIALS_FILE=" + f.creds,
		"SLUICE_JETSTREAM__TLS__CA_FILE=" + f.ca,
		"SLUICE_NODE_ID=billing-0",
	}
	cfg, err := Load("testdata/minimal.good.yaml", environ, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := JetStreamConfig{URLs: []string{"nats://nats-0.nats:4222", "nats://nats-1.nats:4222", "nats://nats-2.nats:4222"},
		Stream: "FLEET", Replicas: 1, LeaseTTL: 2 * time.Second, CredentialsFile: f.creds, TLS: JetStreamTLSConfig{CAFile: f.ca}}
	if cfg.Log.Backend != BackendJetStream || !equalJetStream(cfg.JetStream, want) || cfg.NodeID != "billing-0" || len(cfg.IgnoredEnv) != 0 {
		t.Fatalf("got %+v %+v %q (ignored %v)", cfg.Log, cfg.JetStream, cfg.NodeID, cfg.IgnoredEnv)
	}

	// The variable's list replaces the file's, it does not add to it.
	path := f.write(t, "fleet.yaml", "log: {backend: jetstream}\njetstream: {urls: [nats://a:4222, nats://b:4222], replicas: 1}\nnode_id: n\n")
	cfg, err = Load(path, []string{"SLUICE_JETSTREAM__URLS=nats://c:4222"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.JetStream.URLs, []string{"nats://c:4222"}) || cfg.JetStream.Replicas != 1 {
		t.Errorf("env over file: %+v", cfg.JetStream)
	}
}

// TestLoadConfigFleetBad: each bad fleet value is refused naming the key
// and where it came from; none echoes a credential.
func TestLoadConfigFleetBad(t *testing.T) {
	f := writeFleetFiles(t)
	const fleet = "log: {backend: jetstream}\nnode_id: pod-a\n"
	const urls = "jetstream:\n  urls: [nats://nats:4222]\n"
	tests := []struct {
		name, yaml string
		env        []string
		want       string
		is         error
	}{
		// The backend, and fleet keys without fleet mode.
		{"unknown backend", "log: {backend: nats}\n", nil, `config: log.backend: "nats": must be "badger" (the default: the log in data_dir) or "jetstream" (fleet mode) (in file `, ErrInvalidValue},
		{"unknown log key", "log: {level: debug}\n", nil, `config: unknown key "log.level" (in file `, ErrUnknownKey},
		{"jetstream with badger", urls, nil, `config: jetstream.urls: is set but log.backend is "badger": the jetstream keys configure fleet mode; set log.backend: jetstream (SLUICE_LOG__BACKEND=jetstream), or remove them (in file `, ErrConflict},
		{"explicit badger", "log: {backend: badger}\njetstream: {lease_ttl: 5s}\n", nil, `config: jetstream.lease_ttl: is set but log.backend is "badger"`, ErrConflict},
		{"a default value still counts", "jetstream: {replicas: 3}\n", nil, `config: jetstream.replicas: is set but log.backend is "badger"`, ErrConflict},
		{"empty section", "jetstream: {}\n", nil, `config: jetstream: is set but log.backend is "badger"`, ErrConflict},
		{"from the environment", "", []string{"SLUICE_JETSTREAM__URLS=nats://a:4222"}, `config: jetstream.urls: is set but log.backend is "badger": the jetstream keys configure fleet mode; set log.backend: jetstream (SLUICE_LOG__BACKEND=jetstream), or remove them (from environment variable SLUICE_JETSTREAM__URLS)`, ErrConflict},
		{"node_id checked with badger too", "node_id: pod.a\n", nil, `config: node_id: "pod.a": must be 1 to 64 letters, digits, "_" or "-" (no ".", "*", ">" or spaces: it names this node in NATS subjects and keys) (in file `, ErrInvalidValue},

		// Servers.
		{"no urls", fleet, nil, `config: jetstream.urls: required with log.backend: jetstream: list the NATS servers, like ["nats://nats:4222"]`, ErrMissingValue},
		{"empty urls", fleet + "jetstream: {urls: []}\n", nil, `config: jetstream.urls: required with log.backend: jetstream`, ErrMissingValue},
		{"empty urls from the environment", fleet, []string{"SLUICE_JETSTREAM__URLS="}, `config: jetstream.urls: required with log.backend: jetstream`, ErrMissingValue},
		{"urls not a list", fleet + "jetstream: {urls: {a: b}}\n", nil, `jetstream.urls: expected a list`, ErrInvalidValue},
		{"http", fleet + "jetstream: {urls: [\"http://nats:4222\"]}\n", nil, `config: jetstream.urls[0]: "http://nats:4222": must be nats://, tls://, ws:// or wss://, not http:// (in file `, ErrInvalidValue},
		{"no scheme", fleet + "jetstream: {urls: [\"nats:4222\"]}\n", nil, `jetstream.urls[0]: "nats:4222": must start with nats://, tls://, ws:// or wss://, like "nats://nats:4222"`, ErrInvalidValue},
		{"host and port only", fleet + "jetstream: {urls: [\"127.0.0.1:4222\"]}\n", nil, `jetstream.urls[0]: "127.0.0.1:4222": not a valid URL; write it like "nats://nats:4222"`, ErrInvalidValue},
		{"credentials in the url", fleet + "jetstream: {urls: [\"nats://sluice:hunter2@nats:4222\"]}\n", nil, `jetstream.urls[0]: "nats://[redacted]@nats:4222": must not contain credentials (user:password@): they would show in logs; use jetstream.credentials_file`, ErrInvalidValue},
		{"no host", fleet + "jetstream: {urls: [\"nats://:4222\"]}\n", nil, `jetstream.urls[0]: "nats://:4222": must have a host`, ErrInvalidValue},
		{"port out of range", fleet + "jetstream: {urls: [\"nats://nats:99999\"]}\n", nil, `jetstream.urls[0]: "nats://nats:99999": port must be a number from 1 to 65535`, ErrInvalidValue},
		{"path", fleet + "jetstream: {urls: [\"nats://nats:4222/events\"]}\n", nil, `must not have a path (only websocket URLs have one)`, ErrInvalidValue},
		{"query", fleet + "jetstream: {urls: [\"nats://nats:4222?x=1\"]}\n", nil, `must not have a query or a fragment`, ErrInvalidValue},
		{"space", fleet + "jetstream: {urls: [\"nats://a:4222 nats://b:4222\"]}\n", nil, `must not contain spaces; list several servers as separate entries`, ErrInvalidValue},
		{"duplicate", fleet + "jetstream: {urls: [\"nats://a:4222\", \"nats://b:4222\", \"nats://a:4222\"]}\n", nil, `config: jetstream.urls[2]: "nats://a:4222": listed twice: jetstream.urls[0] is the same`, ErrDuplicate},
		{"websocket mixed in", fleet + "jetstream: {urls: [\"nats://a:4222\", \"wss://b:443/nats\"]}\n", nil, `config: jetstream.urls[1]: "wss://b:443/nats": mixes websocket (ws://, wss://) and other URLs; the NATS client dials one kind`, ErrConflict},
		{"empty entry from the environment", fleet, []string{"SLUICE_JETSTREAM__URLS=nats://a:4222,,nats://b:4222"}, `config: jetstream.urls[1]: must not be empty (from environment variable SLUICE_JETSTREAM__URLS)`, ErrMissingValue},

		// Stream, replicas, lease.
		{"stream with a dot", fleet + urls + "  stream: SLUICE.EVENTS\n", nil, `config: jetstream.stream: "SLUICE.EVENTS": must be 1 to 64 letters, digits, "_" or "-" (it names the stream and prefixes the KV buckets)`, ErrInvalidValue},
		{"empty stream", fleet + urls + "  stream: \"\"\n", nil, `config: jetstream.stream: "": must be 1 to 64`, ErrInvalidValue},
		{"zero replicas", fleet + urls + "  replicas: 0\n", nil, `config: jetstream.replicas: 0: must be between 1 (development) and 5; 3 keeps a quorum through the loss of one server (in file `, ErrInvalidValue},
		{"too many replicas", fleet + urls + "  replicas: 7\n", nil, `config: jetstream.replicas: 7: must be between 1 (development) and 5`, ErrInvalidValue},
		{"replicas in words", fleet + urls, []string{"SLUICE_JETSTREAM__REPLICAS=three"}, `config: jetstream.replicas: "three": must be an integer (from environment variable SLUICE_JETSTREAM__REPLICAS)`, ErrInvalidValue},
		{"short lease", fleet + urls + "  lease_ttl: 500ms\n", nil, `config: jetstream.lease_ttl: 500ms: must be between 1s and 5m0s`, ErrInvalidValue},
		{"long lease", fleet + urls, []string{"SLUICE_JETSTREAM__LEASE_TTL=10m"}, `config: jetstream.lease_ttl: 10m0s: must be between 1s and 5m0s (from environment variable SLUICE_JETSTREAM__LEASE_TTL)`, ErrInvalidValue},
		{"bare lease", fleet + urls + "  lease_ttl: 10\n", nil, `jetstream.lease_ttl: 10: bare number is not a duration`, ErrInvalidValue},
		{"unknown jetstream key", fleet + urls + "  url: nats://nats:4222\n", nil, `config: unknown key "jetstream.url"`, ErrUnknownKey},
		{"unknown tls key", fleet + urls + "  tls: {ca: x}\n", nil, `config: unknown key "jetstream.tls.ca"`, ErrUnknownKey},

		// Files.
		{"missing credentials", fleet + urls + "  credentials_file: " + filepath.Join(f.dir, "nope.creds") + "\n", nil, `config: jetstream.credentials_file: "` + filepath.Join(f.dir, "nope.creds") + `": open `, fs.ErrNotExist},
		{"credentials a directory", fleet + urls + "  credentials_file: " + f.dir + "\n", nil, `is a directory`, ErrInvalidValue},
		{"credentials not creds", fleet + urls + "  credentials_file: " + f.notPEM + "\n", nil, `config: jetstream.credentials_file: "` + f.notPEM + `": not a NATS credentials file: no user JWT (-----BEGIN NATS USER JWT-----)`, ErrInvalidValue},
		{"credentials without a seed", fleet + urls + "  credentials_file: " + f.jwtOnly + "\n", nil, `jetstream.credentials_file: "` + f.jwtOnly + `": not a NATS credentials file: no valid user seed`, nkeys.ErrNoSeedFound},
		{"credentials with an account seed", fleet + urls + "  credentials_file: " + f.badSeed + "\n", nil, `not a NATS credentials file: no valid user seed`, nkeys.ErrInvalidUserSeed},
		{"credentials from the environment", fleet + urls, []string{"SLUICE_JETSTREAM__CREDENTIALS_FILE=" + f.notPEM}, `(from environment variable SLUICE_JETSTREAM__CREDENTIALS_FILE)`, ErrInvalidValue},
		{"missing ca", fleet + urls + "  tls: {ca_file: " + filepath.Join(f.dir, "nope.pem") + "}\n", nil, `config: jetstream.tls.ca_file: "` + filepath.Join(f.dir, "nope.pem") + `"`, fs.ErrNotExist},
		{"ca not PEM", fleet + urls + "  tls: {ca_file: " + f.notPEM + "}\n", nil, `config: jetstream.tls.ca_file: "` + f.notPEM + `": holds no PEM certificate`, ErrInvalidValue},
		{"cert without key", fleet + urls + "  tls: {cert_file: " + f.cert + "}\n", nil, `config: jetstream.tls.key_file: required with jetstream.tls.cert_file: the client certificate's private key`, ErrMissingValue},
		{"key without cert", fleet + urls + "  tls: {key_file: " + f.key + "}\n", nil, `config: jetstream.tls.cert_file: required with jetstream.tls.key_file`, ErrMissingValue},
		{"missing key", fleet + urls + "  tls: {cert_file: " + f.cert + ", key_file: " + filepath.Join(f.dir, "nope-key.pem") + "}\n", nil, `config: jetstream.tls.key_file: "` + filepath.Join(f.dir, "nope-key.pem") + `"`, fs.ErrNotExist},
		{"key of another cert", fleet + urls + "  tls: {cert_file: " + f.cert + ", key_file: " + f.otherKey + "}\n", nil, `config: jetstream.tls.cert_file: "` + f.cert + `": with key_file "` + f.otherKey + `": private key does not match public key`, ErrInvalidValue},
		{"cert not PEM", fleet + urls + "  tls: {cert_file: " + f.notPEM + ", key_file: " + f.key + "}\n", nil, `config: jetstream.tls.cert_file: "` + f.notPEM + `": with key_file`, ErrInvalidValue},

		// The node.
		{"node_id with a dot", "log: {backend: jetstream}\n" + urls + "node_id: billing.v2-abc\n", nil, `config: node_id: "billing.v2-abc": must be 1 to 64 letters`, ErrInvalidValue},
		{"node_id wildcard from the environment", "log: {backend: jetstream}\n" + urls, []string{"SLUICE_NODE_ID=pod>"}, `config: node_id: "pod>": must be 1 to 64 letters, digits, "_" or "-" (no ".", "*", ">" or spaces: it names this node in NATS subjects and keys) (from environment variable SLUICE_NODE_ID)`, ErrInvalidValue},
		{"node_id too long", "log: {backend: jetstream}\n" + urls + "node_id: " + strings.Repeat("n", 65) + "\n", nil, `config: node_id: "nnnn`, ErrInvalidValue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := f.write(t, strings.ReplaceAll(tt.name, " ", "_")+".yaml", tt.yaml)
			_, err := Load(path, tt.env, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v\nwant %q", err, tt.want)
			}
			if !errors.Is(err, tt.is) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.is)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Errorf("error %T is not a *ValidationError", err)
			}
			for _, s := range []string{f.seed, fakeJWT, "hunter2"} {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error reveals %q: %v", s, err)
				}
			}
		})
	}

	// A Config built by hand is judged by its values: any fleet key that
	// differs from its default is refused with badger.
	c := Default()
	c.JetStream.TLS.CAFile = f.ca
	if err := c.Validate(); err == nil || err.Error() != `config: jetstream.tls.ca_file: is set but log.backend is "badger": the jetstream keys configure fleet mode; set log.backend: jetstream (SLUICE_LOG__BACKEND=jetstream), or remove them` {
		t.Errorf("Validate: %v", err)
	}
}

// TestValidateJetStreamURL: the URL rules `sluice inject --jetstream-url`
// shares.
func TestValidateJetStreamURL(t *testing.T) {
	for _, ok := range []string{"nats://nats:4222", "nats://127.0.0.1", "tls://nats.example.com:4443", "ws://nats:8080", "wss://nats.example.com/ws", "nats://[::1]:4222", "nats://nats:4222/"} {
		if err := ValidateJetStreamURL(ok); err != nil {
			t.Errorf("ValidateJetStreamURL(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "nats", "http://nats:4222", "nats://u:p@nats:4222", "nats://token@nats:4222", "nats://nats:0", "nats://nats:x", "nats://nats:4222#a", "nats://nats:4222?", " nats://nats:4222"} {
		err := ValidateJetStreamURL(bad)
		if err == nil || !(errors.Is(err, ErrInvalidValue) || errors.Is(err, ErrMissingValue)) {
			t.Errorf("ValidateJetStreamURL(%q) = %v, want an invalid or missing value", bad, err)
		}
		if strings.Contains(fmt.Sprint(err), "token") && !strings.Contains(fmt.Sprint(err), "credentials") {
			t.Errorf("ValidateJetStreamURL(%q) = %v echoes the URL's credentials", bad, err)
		}
	}
}

// TestRestartRequired: a reload that changes where the log is, or which
// node this is, changes nothing; other keys do not count here.
func TestRestartRequired(t *testing.T) {
	f := writeFleetFiles(t)
	base := "log: {backend: jetstream}\njetstream: {urls: [nats://a:4222], replicas: 1}\nnode_id: pod-a\n"
	load := func(t *testing.T, yaml string, env ...string) *Config {
		t.Helper()
		cfg, err := Load(f.write(t, "c.yaml", yaml), env, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	running := load(t, base)
	for _, tt := range []struct {
		name string
		next *Config
		want []string
	}{
		{"same", load(t, base), nil},
		{"other keys", load(t, base+"log_level: debug\nmax_in_flight: 7\nsubscriptions:\n  - {id: a, url: 'https://a.example', secret: "+secretA+"}\n"), nil},
		{"back to badger", load(t, "log_level: warn\n"), []string{"jetstream.replicas", "jetstream.urls", "log.backend", "node_id"}},
		{"another server", load(t, strings.Replace(base, "nats://a:4222", "nats://a:4222, nats://b:4222", 1)), []string{"jetstream.urls"}},
		{"lease and tls", load(t, strings.Replace(base, "replicas: 1", "replicas: 1, lease_ttl: 4s, tls: {ca_file: "+f.ca+"}", 1)), []string{"jetstream.lease_ttl", "jetstream.tls.ca_file"}},
		{"node from the environment", load(t, base, "SLUICE_NODE_ID=pod-b"), []string{"node_id"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := RestartRequired(running, tt.next); !slices.Equal(got, tt.want) {
				t.Errorf("RestartRequired = %q, want %q", got, tt.want)
			}
		})
	}
	if got := RestartRequired(Default(), Default()); got != nil {
		t.Errorf("RestartRequired(badger, badger) = %q", got)
	}
}
