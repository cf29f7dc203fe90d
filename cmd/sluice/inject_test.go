package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	out, err := inject([]byte(src), defaultInjectOptions())
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != src {
		t.Errorf("Service changed:\n%s", out)
	}
	for _, empty := range []string{"", "# only a comment\n"} {
		out, err := inject([]byte(empty), defaultInjectOptions())
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

func defaultInjectOptions() injectOptions {
	return injectOptions{Image: injectDefaultImage, ConfigMap: injectDefaultConfig, Grace: 10e9,
		IngestPort: injectDefaultIngest, AdminPort: injectDefaultAdmin}
}
