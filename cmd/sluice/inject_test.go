package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/inject"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files in testdata/inject")

const injectDir = "testdata/inject"

// injectCases are the golden-file cases: NAME.in.yaml injected with args
// must equal NAME.golden.yaml.
var injectCases = []struct {
	name, in string
	args     []string
}{
	{"deployment", "deployment", nil},
	{"statefulset-pvc-template", "statefulset", []string{"--pvc", "queue"}},
	{"statefulset-pvc-claim", "statefulset", []string{"--pvc", "sluice-queue", "--grace", "20s"}},
	{"daemonset", "daemonset", nil},
	{"job-grace", "job", []string{"--grace", "30s"}},
	{"pod-flags", "pod", []string{"--image", "registry.local/sluice:v0.3.0", "--config-map", "debug-sluice",
		"--secret", "sluice-secrets", "--ingest-port", "9700", "--admin-port", "9701"}},
	{"multidoc", "multidoc", nil},
	{"multidoc-pvc", "multidoc-pvc", []string{"--pvc", "sluice-queue"}},
	// Re-injecting an injected file with other flags updates the sidecar
	// in place rather than adding a second one.
	{"update", "deployment.golden", []string{"--image", "ghcr.io/sluicehq/sluice:v0.2.0", "--pvc", "billing-queue", "--secret", "billing-secrets"}},
	// Fleet mode: a comma list and a repeated flag; the data volume stays
	// an emptyDir.
	{"deployment-fleet", "deployment", []string{"--jetstream-url", "nats://nats-0.nats-headless.nats.svc:4222, nats://nats-1.nats-headless.nats.svc:4222",
		"--jetstream-url", "nats://nats-2.nats-headless.nats.svc:4222", "--secret", "sluice-secrets"}},
	{"statefulset-fleet", "statefulset", []string{"--jetstream-url", "tls://nats.nats.svc:4222"}},
	// Resources: a CPU limit added, the memory request dropped, the
	// memory limit raised.
	{"deployment-resources", "deployment", []string{"--cpu-request", "100m", "--cpu-limit", "1", "--memory-request", "", "--memory-limit", "2Gi"}},
	// Re-injecting without --jetstream-url turns fleet mode off again.
	{"update-fleet-off", "deployment-fleet.golden", []string{"--secret", "sluice-secrets"}},
}

func runInject(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(append([]string{"inject"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestInjectGolden(t *testing.T) {
	for _, c := range injectCases {
		t.Run(c.name, func(t *testing.T) {
			in := filepath.Join(injectDir, c.in+".yaml")
			if !strings.HasSuffix(c.in, ".golden") {
				in = filepath.Join(injectDir, c.in+".in.yaml")
			}
			golden := filepath.Join(injectDir, c.name+".golden.yaml")
			// Flags go after the file, as in the usage line.
			code, out, errOut := runInject(t, append([]string{in}, c.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if *updateGolden {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if out != string(want) {
				t.Errorf("output differs from %s (run with -update to accept):\n%s", golden, out)
			}

			// Idempotent: inject(inject(x)) == inject(x), read from stdin.
			var again bytes.Buffer
			if err := injectCmd(append([]string{"-"}, c.args...), strings.NewReader(out), &again, &bytes.Buffer{}); err != nil {
				t.Fatalf("second inject: %v", err)
			}
			if again.String() != out {
				t.Errorf("second inject changed the output:\n%s", again.String())
			}
			if n := strings.Count(out, "- name: sluice\n"); n != strings.Count(out, "restartPolicy: Always") {
				t.Errorf("%d sluice containers for %d native sidecars", n, strings.Count(out, "restartPolicy: Always"))
			}
		})
	}
}

// TestInjectPassThrough checks that documents inject does not own keep
// their meaning: a Service, a ConfigMap and a PVC come out as they went in,
// up to formatting, and comments survive.
func TestInjectPassThrough(t *testing.T) {
	src := "# head\napiVersion: v1\nkind: Service\nmetadata:\n  name: s # line\nspec:\n  ports:\n    - port: 80\n"
	out, err := inject.YAML([]byte(src), defaultInjectOptions())
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != src {
		t.Errorf("Service changed:\n%s", out)
	}
	for _, empty := range []string{"", "# only a comment\n"} {
		out, err := inject.YAML([]byte(empty), defaultInjectOptions())
		if err != nil || string(out) != empty {
			t.Errorf("inject(%q) = %q, %v", empty, out, err)
		}
	}
}

func TestInjectErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"bad yaml", []string{filepath.Join(injectDir, "bad-yaml.in.yaml")}, "document 2: not valid YAML"},
		{"no pod spec", []string{filepath.Join(injectDir, "no-pod-spec.in.yaml")}, `document 2: Deployment "hollow" has no spec.template.spec`},
		{"no containers", []string{filepath.Join(injectDir, "no-containers.in.yaml")}, `document 1: Pod "empty": spec: containers is missing or not a list`},
		{"initContainers not a list", []string{filepath.Join(injectDir, "init-not-list.in.yaml")}, `document 1: Job "odd": spec.template.spec: initContainers is not a list`},
		{"grace not an int", []string{filepath.Join(injectDir, "grace-not-int.in.yaml")}, `terminationGracePeriodSeconds "soon" is not an integer`},
		{"missing file", []string{filepath.Join(injectDir, "nope.yaml")}, "no such file"},
		{"two files", []string{"a.yaml", "b.yaml"}, "at most one FILE"},
		{"bad grace", []string{"--grace", "soon"}, "--grace"},
		{"bad pvc", []string{"--pvc", "Not_A_Name"}, `--pvc "Not_A_Name"`},
		{"same ports", []string{"--ingest-port", "9000", "--admin-port", "9000"}, "both 9000"},
		{"port range", []string{"--admin-port", "70000"}, "--admin-port 70000"},
		{"jetstream http", []string{"--jetstream-url", "http://nats:4222"}, `--jetstream-url "http://nats:4222": must be nats://, tls://, ws:// or wss://, not http://`},
		{"jetstream no scheme", []string{"--jetstream-url", "nats.nats.svc:4222"}, `--jetstream-url "nats.nats.svc:4222": must start with nats://`},
		{"jetstream credentials", []string{"--jetstream-url", "nats://sluice:hunter2@nats:4222"}, `--jetstream-url "[redacted]": must not contain credentials (user:password@): they would show in logs; use jetstream.credentials_file`},
		{"jetstream empty", []string{"--jetstream-url", "nats://a:4222,"}, `--jetstream-url "": must not be empty`},
		{"jetstream twice", []string{"--jetstream-url", "nats://a:4222", "--jetstream-url", "nats://a:4222"}, `--jetstream-url "nats://a:4222": given twice`},
		{"bad cpu request", []string{"--cpu-request", "lots"}, `--cpu-request "lots" is not a Kubernetes quantity`},
		{"negative memory limit", []string{"--memory-limit", "-1Gi"}, `--memory-limit "-1Gi" is negative`},
		{"request above limit", []string{"--memory-request", "2Gi"}, "--memory-request 2Gi is above --memory-limit 1Gi"},
		{"jetstream dotted name", []string{filepath.Join(injectDir, "dotted-name.in.yaml"), "--jetstream-url", "nats://a:4222"},
			`document 1: Deployment "billing.v2": with --jetstream-url each pod's name is its node_id, which cannot contain "."; rename the Deployment`},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := runInject(t, c.args...)
			if code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			if out != "" {
				t.Errorf("wrote output on error:\n%s", out)
			}
			if !strings.Contains(errOut, c.want) {
				t.Errorf("stderr %q does not contain %q", errOut, c.want)
			}
			if strings.Contains(errOut, "hunter2") {
				t.Errorf("stderr echoes a password: %s", errOut)
			}
		})
	}
}

// TestInjectExample keeps examples/kubernetes/deployment.yaml what inject
// makes of examples/kubernetes/app.yaml.
func TestInjectExample(t *testing.T) {
	dir := filepath.Join("..", "..", "examples", "kubernetes")
	code, out, errOut := runInject(t, filepath.Join(dir, "app.yaml"), "--secret", "sluice-secrets")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want, err := os.ReadFile(filepath.Join(dir, "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Errorf("examples/kubernetes/deployment.yaml is stale; regenerate it:\n  go run ./cmd/sluice inject examples/kubernetes/app.yaml --secret sluice-secrets > examples/kubernetes/deployment.yaml")
	}
}

// TestInjectFleetExample keeps examples/kubernetes/fleet/deployment.yaml
// what inject makes of examples/kubernetes/app.yaml in fleet mode.
func TestInjectFleetExample(t *testing.T) {
	dir := filepath.Join("..", "..", "examples", "kubernetes")
	code, out, errOut := runInject(t, filepath.Join(dir, "app.yaml"), "--secret", "sluice-secrets", "--jetstream-url", "nats://nats.nats.svc:4222")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want, err := os.ReadFile(filepath.Join(dir, "fleet", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Errorf("examples/kubernetes/fleet/deployment.yaml is stale; regenerate it:\n  go run ./cmd/sluice inject examples/kubernetes/app.yaml --secret sluice-secrets --jetstream-url nats://nats.nats.svc:4222 > examples/kubernetes/fleet/deployment.yaml")
	}
}

// TestInjectFleetEnvLoads: the environment inject gives the sidecar, with
// the pod name the downward API puts in SLUICE_NODE_ID, loads as a fleet
// config with the servers given and that name as the node id.
func TestInjectFleetEnvLoads(t *testing.T) {
	code, out, errOut := runInject(t, filepath.Join(injectDir, "deployment.in.yaml"),
		"--jetstream-url", "nats://nats-0.nats-headless.nats.svc:4222,tls://nats-1.nats-headless.nats.svc:4222")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					InitContainers []struct {
						Env []struct {
							Name      string `yaml:"name"`
							Value     string `yaml:"value"`
							ValueFrom *struct {
								FieldRef struct {
									FieldPath string `yaml:"fieldPath"`
								} `yaml:"fieldRef"`
							} `yaml:"valueFrom"`
						} `yaml:"env"`
					} `yaml:"initContainers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal([]byte(out), &d); err != nil {
		t.Fatal(err)
	}
	const podName = "billing-7d9f4c5b8-x2xkq"
	var environ []string
	for _, e := range d.Spec.Template.Spec.InitContainers[0].Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Fatalf("%s comes from %s", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			v = podName
		}
		environ = append(environ, e.Name+"="+v)
	}
	cfg, err := config.Load("", environ, nil)
	if err != nil {
		t.Fatalf("the injected environment does not load: %v\n%s", err, strings.Join(environ, "\n"))
	}
	want := []string{"nats://nats-0.nats-headless.nats.svc:4222", "tls://nats-1.nats-headless.nats.svc:4222"}
	if cfg.Log.Backend != config.BackendJetStream || !slices.Equal(cfg.JetStream.URLs, want) || cfg.NodeID != podName ||
		cfg.DataDir != inject.DataDir || len(cfg.IgnoredEnv) != 0 {
		t.Errorf("loaded: backend %q, urls %q, node_id %q, data_dir %q, ignored %v", cfg.Log.Backend, cfg.JetStream.URLs, cfg.NodeID, cfg.DataDir, cfg.IgnoredEnv)
	}
}

func defaultInjectOptions() inject.Options { return inject.Defaults() }
