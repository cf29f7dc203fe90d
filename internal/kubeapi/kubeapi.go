// Package kubeapi runs a real Kubernetes API server for tests: etcd and
// kube-apiserver (and, when asked, kube-controller-manager) as processes
// on loopback ports, stopped by PID when the test ends. Pods are stored,
// not run: there is no kubelet. The binaries come from
// .ci/kubeapi-build.sh (docs/kubernetes.md, "Testing against a real API
// server"); a test that needs them calls Start, which skips the test
// unless SLUICE_KUBEAPI=1, so the default `go test ./...` stays fast and
// needs nothing but Go. For tests only.
package kubeapi

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/sluicehq/sluice/internal/testwait"
)

// Users the API server knows by static token. Admin is in system:masters;
// each Cluster.User is whoever a test says, with no group but
// system:authenticated, so RBAC alone decides what it may do.
const adminToken = "sluice-test-admin"

// startTimeout bounds the wait for the API server to be ready: under load
// on two cores it took up to 40 s.
const startTimeout = 3 * time.Minute

// Cluster is a running API server.
type Cluster struct {
	Dir    string       // its state: etcd's data, certificates, logs
	Admin  *rest.Config // a system:masters user
	Server string       // https://127.0.0.1:PORT
	caFile string       // the serving certificate's CA (the API server's self-signed one)
	users  map[string]string
	mapper meta.RESTMapper
	dyn    *dynamic.DynamicClient
}

// Bin is where the binaries are: $SLUICE_KUBEAPI_BIN, else the build
// script's default, $XDG_CACHE_HOME/kubeapi/bin or ~/.cache/kubeapi/bin.
func Bin() string {
	if b := os.Getenv("SLUICE_KUBEAPI_BIN"); b != "" {
		return b
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "kubeapi", "bin")
}

// Start runs etcd and kube-apiserver, and kube-controller-manager if
// controllers is true, for the test, or skips the test unless
// SLUICE_KUBEAPI=1. users are the names of users to create, each with a
// static token (User gives their config). It fails the test if a binary is
// missing: the variable says the run wants this test.
func Start(t *testing.T, controllers bool, users ...string) *Cluster {
	t.Helper()
	if os.Getenv("SLUICE_KUBEAPI") != "1" {
		t.Skip("set SLUICE_KUBEAPI=1 to run against a real API server (docs/kubernetes.md)")
	}
	bin := Bin()
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Fatalf("SLUICE_KUBEAPI=1 but %v: build the binaries first (docs/kubernetes.md)", err)
		}
	}
	dir := t.TempDir()
	c := &Cluster{Dir: dir, users: map[string]string{}}

	etcdClient, etcdPeer := testwait.FreePort(t), testwait.FreePort(t)
	c.run(t, "etcd", filepath.Join(bin, "etcd"),
		"--name=test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls=http://"+etcdClient, "--advertise-client-urls=http://"+etcdClient,
		"--listen-peer-urls=http://"+etcdPeer, "--initial-advertise-peer-urls=http://"+etcdPeer,
		"--initial-cluster=test=http://"+etcdPeer, "--unsafe-no-fsync", "--log-level=warn")

	saKey := filepath.Join(dir, "sa.key")
	writeKey(t, saKey)
	var tokens strings.Builder
	fmt.Fprintf(&tokens, "%s,admin,admin,\"system:masters\"\n", adminToken)
	for i, u := range users {
		tok := fmt.Sprintf("sluice-test-user-%d", i)
		c.users[u] = tok
		fmt.Fprintf(&tokens, "%s,%s,user-%d\n", tok, u, i)
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(tokens.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	apiAddr := testwait.FreePort(t)
	_, port, _ := net.SplitHostPort(apiAddr)
	certDir := filepath.Join(dir, "certs")
	apiDone := c.run(t, "kube-apiserver", filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers=http://"+etcdClient,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+port,
		"--cert-dir="+certDir, "--token-auth-file="+tokenFile, "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file="+saKey,
		"--service-account-signing-key-file="+saKey, "--service-cluster-ip-range=10.96.0.0/16",
		// The endpoint reconciler refuses a loopback address for the
		// kubernetes Service; nothing here runs behind it.
		"--endpoint-reconciler-type=none",
		"--audit-log-path="+filepath.Join(dir, "audit.log"), "--audit-policy-file="+auditPolicy(t, dir))
	c.Server = "https://" + apiAddr
	c.caFile = filepath.Join(certDir, "apiserver.crt")
	c.awaitReady(t, apiDone)
	c.Admin = c.config(adminToken)
	var err error
	if c.dyn, err = dynamic.NewForConfig(c.Admin); err != nil {
		t.Fatal(err)
	}
	if controllers {
		kc := c.Kubeconfig(t, "")
		c.run(t, "kube-controller-manager", filepath.Join(bin, "kube-controller-manager"),
			"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
			"--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false",
			"--service-account-private-key-file="+saKey, "--use-service-account-credentials=false",
			"--controllers=*")
	}
	return c
}

// config is a REST config for the user with token.
func (c *Cluster) config(token string) *rest.Config {
	return &rest.Config{Host: c.Server, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: c.caFile},
		QPS: 100, Burst: 200}
}

// User is the REST config of a user Start was given.
func (c *Cluster) User(t *testing.T, name string) *rest.Config {
	tok, ok := c.users[name]
	if !ok {
		t.Fatalf("kubeapi: no user %q (Start's users)", name)
	}
	return c.config(tok)
}

// Kubeconfig writes a kubeconfig for user ("" for the admin) and returns
// its path.
func (c *Cluster) Kubeconfig(t *testing.T, user string) string {
	t.Helper()
	tok := adminToken
	if user != "" {
		var ok bool
		if tok, ok = c.users[user]; !ok {
			t.Fatalf("kubeapi: no user %q (Start's users)", user)
		}
	}
	f, err := os.CreateTemp(c.Dir, "kubeconfig-*")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, `apiVersion: v1
kind: Config
clusters:
  - name: test
    cluster: {server: %q, certificate-authority: %q}
users:
  - name: user
    user: {token: %q}
contexts:
  - name: test
    context: {cluster: test, user: user, namespace: default}
current-context: test
`, c.Server, c.caFile, tok)
	return f.Name()
}

// Apply creates or updates every document of the YAML stream y (server-
// side apply, as `kubectl apply --server-side` does), in namespace ns for
// namespaced kinds that name none.
func (c *Cluster) Apply(t *testing.T, ns string, y []byte) []*unstructured.Unstructured {
	t.Helper()
	objs, err := c.apply(ns, y)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TryApply is Apply that returns the API server's refusal.
func (c *Cluster) TryApply(ns string, y []byte) ([]*unstructured.Unstructured, error) {
	return c.apply(ns, y)
}

func (c *Cluster) apply(ns string, y []byte) ([]*unstructured.Unstructured, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(y), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return out, err
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		m, err := c.restMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return out, fmt.Errorf("%s: %w", gvk, err)
		}
		r := c.dyn.Resource(m.Resource)
		var got *unstructured.Unstructured
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			if obj.GetNamespace() == "" {
				obj.SetNamespace(ns)
			}
			got, err = r.Namespace(obj.GetNamespace()).Apply(ctx, obj.GetName(), &obj, metav1.ApplyOptions{FieldManager: "sluice-test", Force: true})
		} else {
			got, err = r.Apply(ctx, obj.GetName(), &obj, metav1.ApplyOptions{FieldManager: "sluice-test", Force: true})
		}
		if err != nil {
			return out, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		out = append(out, got)
	}
}

// resource is the client of kind (as "v1/Pod" or "apps/v1/Deployment") in
// ns, which a cluster-scoped kind ignores.
func (c *Cluster) resource(t *testing.T, apiVersionKind, ns string) dynamic.ResourceInterface {
	t.Helper()
	i := strings.LastIndex(apiVersionKind, "/")
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion(apiVersionKind[:i])
	obj.SetKind(apiVersionKind[i+1:])
	gvk := obj.GroupVersionKind()
	m, err := c.restMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatal(err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource).Namespace(ns)
	}
	return c.dyn.Resource(m.Resource)
}

// Get reads the object of kind ns/name.
func (c *Cluster) Get(t *testing.T, apiVersionKind, ns, name string) (*unstructured.Unstructured, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.resource(t, apiVersionKind, ns).Get(ctx, name, metav1.GetOptions{})
}

// List lists the objects of kind in ns ("" for all).
func (c *Cluster) List(t *testing.T, apiVersionKind, ns string) []unstructured.Unstructured {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := c.resource(t, apiVersionKind, ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// Delete deletes the object of kind ns/name.
func (c *Cluster) Delete(t *testing.T, apiVersionKind, ns, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.resource(t, apiVersionKind, ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// AuditLog is the API server's audit log so far: one JSON event a line,
// metadata level, for the pods' creations (auditPolicy).
func (c *Cluster) AuditLog(t *testing.T) []byte {
	b, err := os.ReadFile(filepath.Join(c.Dir, "audit.log"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var mapperMu sync.Mutex

// restMapper finds kinds' resources from the API server's discovery,
// re-read when a kind is new (a CRD applied since).
func (c *Cluster) restMapper() meta.RESTMapper {
	mapperMu.Lock()
	defer mapperMu.Unlock()
	if c.mapper == nil {
		dc := discovery.NewDiscoveryClientForConfigOrDie(c.Admin)
		c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	}
	return c.mapper
}

// awaitReady polls /readyz until the API server answers 200.
func (c *Cluster) awaitReady(t *testing.T, exited <-chan struct{}) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // only to poll readiness: its CA is written at start
	deadline := time.Now().Add(startTimeout)
	for {
		req, _ := http.NewRequest(http.MethodGet, c.Server+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-exited:
			t.Fatalf("kube-apiserver exited; log: %s", filepath.Join(c.Dir, "kube-apiserver.log"))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready after %s (last: %v); log: %s", startTimeout, err, filepath.Join(c.Dir, "kube-apiserver.log"))
		}
		time.Sleep(200 * time.Millisecond) // a process's readiness has no notification
	}
}

// run starts a binary with its output to DIR/name.log and stops it when the
// test ends: SIGTERM, then SIGKILL after 10 s. The channel is closed when
// it exits.
func (c *Cluster) run(t *testing.T, name, bin string, args ...string) <-chan struct{} {
	t.Helper()
	logf, err := os.Create(filepath.Join(c.Dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil && len(b) > 0 {
				t.Logf("%s log (last 3 KiB):\n%s", name, tail(b, 3<<10))
			}
		}
	})
	return done
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// auditPolicy writes a policy that logs the metadata of pod creations (and
// server-side applies, which create), which says how often each webhook
// was called (annotations mutation.webhook.*).
func auditPolicy(t *testing.T, dir string) string {
	p := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(p, []byte(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, patch]
    resources: [{group: "", resources: [pods]}]
  - level: None
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeKey writes an ECDSA key, PEM, for the service accounts' tokens.
func writeKey(t *testing.T, path string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
