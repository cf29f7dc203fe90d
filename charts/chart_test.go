// Package charts holds the repository's Helm charts: sluice/, the sluice
// injector's. Its tests use Helm's own Go SDK: they lint the chart
// strictly, render it with the values files in testdata/ as `helm install
// --dry-run` does, decode every object strictly into its Kubernetes API
// type, check that the objects agree with each other and with the values,
// and that the default render agrees with the plain manifests of
// examples/kubernetes/injector/, so that the two cannot drift apart.
package charts

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluicehq/sluice/internal/kubetest"
)

const (
	// chartDir is the chart under test.
	chartDir = "sluice"
	// kubeVersion is the oldest Kubernetes Chart.yaml's kubeVersion allows:
	// the chart is rendered and linted for it (Helm's SDK assumes v1.20 in
	// tests, which the chart refuses).
	kubeVersion = "v1.29.0"
)

// chartCase is one way of installing the chart.
type chartCase struct {
	name      string
	release   string
	namespace string
	values    string // a file in testdata/, or "" for the chart's defaults
	fullname  string // the name every object gets
}

// chartCases are the installs every test renders: the defaults, each
// values file of testdata/, and release names that exercise the naming.
var chartCases = []chartCase{
	{"defaults", "sluice", "sluice-system", "", "sluice-injector"},
	{"cert-manager", "sluice", "sluice-system", "cert-manager.yaml", "sluice-injector"},
	{"scan disabled", "sluice", "sluice-system", "scan-disabled.yaml", "sluice-injector"},
	{"failurePolicy Fail", "sluice", "webhooks", "fail-policy.yaml", "sluice-injector"},
	{"sidecar defaults", "sluice", "sluice-system", "sidecar.yaml", "sluice-injector"},
	{"overrides", "sluice", "sluice-system", "overrides.yaml", "hooks"},
	{"no PDB, no NetworkPolicy", "sluice", "sluice-system", "no-pdb-no-netpol.yaml", "sluice-injector"},
	{"nameOverride", "sluice", "sluice-system", "name-override.yaml", "sluice-relay-injector"},
	{"custom release name", "edge", "edge-system", "", "edge-sluice-injector"},
	{"release named after the chart", "sluice-prod", "prod", "", "sluice-prod-injector"},
	{"revision canary", "sluice-canary", "sluice-system", "revision.yaml", "sluice-canary-injector"},
}

func caseNamed(t *testing.T, name string) chartCase {
	t.Helper()
	i := slices.IndexFunc(chartCases, func(c chartCase) bool { return c.name == name })
	if i < 0 {
		t.Fatalf("no chart case %q", name)
	}
	return chartCases[i]
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func parseKubeVersion(t *testing.T) *common.KubeVersion {
	t.Helper()
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// userValues reads a values file of testdata/ ("" for none).
func userValues(t *testing.T, file string) map[string]any {
	t.Helper()
	if file == "" {
		return map[string]any{}
	}
	v, err := common.ReadValuesFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// install renders the chart as `helm install --dry-run` does (client only:
// lookup finds nothing), schema validation included.
func install(t *testing.T, name, namespace string, vals map[string]any) (*release.Release, error) {
	t.Helper()
	in := action.NewInstall(action.NewConfiguration())
	in.DryRunStrategy = action.DryRunClient
	in.ReleaseName = name
	in.Namespace = namespace
	in.KubeVersion = parseKubeVersion(t)
	r, err := in.Run(loadChart(t), vals)
	if err != nil {
		return nil, err
	}
	rel, ok := r.(*release.Release)
	if !ok {
		t.Fatalf("install returned a %T", r)
	}
	return rel, nil
}

// rendered is one install's objects, decoded strictly, by kind.
type rendered struct {
	chartCase
	chart    *chart.Chart
	values   common.Values // the chart's defaults with the case's values over them
	manifest string
	notes    string
	objects  []metav1.Object

	account     *corev1.ServiceAccount
	service     *corev1.Service
	deployment  *appsv1.Deployment
	webhooks    *admissionregistrationv1.MutatingWebhookConfiguration
	secret      *corev1.Secret
	pdb         *policyv1.PodDisruptionBudget
	netpol      *networkingv1.NetworkPolicy
	clusterRole *rbacv1.ClusterRole
	binding     *rbacv1.ClusterRoleBinding
	issuers     map[string]*kubetest.Issuer
	certs       map[string]*kubetest.Certificate
}

// render installs c and decodes what it renders. Every document must
// decode strictly into its API type; a kind with no type in kubetest, or
// one the chart has no business making, fails the test.
func render(t *testing.T, c chartCase) *rendered {
	t.Helper()
	vals := userValues(t, c.values)
	rel, err := install(t, c.release, c.namespace, vals)
	if err != nil {
		t.Fatalf("%s: install: %v", c.name, err)
	}
	ch := loadChart(t)
	merged, err := chartutil.CoalesceValues(ch, userValues(t, c.values))
	if err != nil {
		t.Fatal(err)
	}
	r := &rendered{chartCase: c, chart: ch, values: merged, manifest: rel.Manifest, notes: rel.Info.Notes,
		issuers: map[string]*kubetest.Issuer{}, certs: map[string]*kubetest.Certificate{}}
	if len(rel.Hooks) > 0 {
		t.Errorf("%s: %d hooks: the chart has none", c.name, len(rel.Hooks))
	}
	objs, skipped, err := kubetest.Decode([]byte(rel.Manifest), c.name)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	if skipped > 0 {
		t.Fatalf("%s: %d rendered documents without apiVersion and kind", c.name, skipped)
	}
	set := func(o kubetest.Object, have bool) {
		if have {
			t.Fatalf("%s: a second %s", c.name, o.Kind)
		}
	}
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *corev1.ServiceAccount:
			set(o, r.account != nil)
			r.account = v
		case *corev1.Service:
			set(o, r.service != nil)
			r.service = v
		case *appsv1.Deployment:
			set(o, r.deployment != nil)
			r.deployment = v
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			set(o, r.webhooks != nil)
			r.webhooks = v
		case *corev1.Secret:
			set(o, r.secret != nil)
			r.secret = v
		case *policyv1.PodDisruptionBudget:
			set(o, r.pdb != nil)
			r.pdb = v
		case *networkingv1.NetworkPolicy:
			set(o, r.netpol != nil)
			r.netpol = v
		case *rbacv1.ClusterRole:
			set(o, r.clusterRole != nil)
			r.clusterRole = v
		case *rbacv1.ClusterRoleBinding:
			set(o, r.binding != nil)
			r.binding = v
		case *kubetest.Issuer:
			set(o, r.issuers[v.Name] != nil)
			r.issuers[v.Name] = v
		case *kubetest.Certificate:
			set(o, r.certs[v.Name] != nil)
			r.certs[v.Name] = v
		default:
			t.Fatalf("%s: document %d is a %s: the chart makes no such object", c.name, o.Doc, o.Kind)
		}
		r.objects = append(r.objects, o.Obj.(metav1.Object))
	}
	for kind, missing := range map[string]bool{
		"ServiceAccount": r.account == nil, "Service": r.service == nil, "Deployment": r.deployment == nil,
		"MutatingWebhookConfiguration": r.webhooks == nil,
	} {
		if missing {
			t.Fatalf("%s: no %s", c.name, kind)
		}
	}
	return r
}

// value returns the value at a dotted path of the merged values, and
// whether it is set (a null value is not).
func (r *rendered) value(path string) (any, bool) {
	v, err := r.values.PathValue(path)
	return v, err == nil && v != nil
}

// table returns the table at a dotted path of the merged values.
func (r *rendered) table(t *testing.T, path string) map[string]any {
	t.Helper()
	v, err := r.values.Table(path)
	if err != nil {
		t.Fatalf("%s: values %s: %v", r.name, path, err)
	}
	return v
}

func (r *rendered) str(t *testing.T, path string) string {
	t.Helper()
	v, ok := r.value(path)
	s, isStr := v.(string)
	if !ok || !isStr {
		t.Fatalf("%s: values %s = %#v, want a string", r.name, path, v)
	}
	return s
}

func (r *rendered) boolean(t *testing.T, path string) bool {
	t.Helper()
	v, _ := r.value(path)
	b, ok := v.(bool)
	if !ok {
		t.Fatalf("%s: values %s = %#v, want a boolean", r.name, path, v)
	}
	return b
}

// convert turns a part of the values into the API type it stands for.
func convert(t *testing.T, v any, out any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s into %T: %v", b, out, err)
	}
}

// quantity formats a value the way the chart passes it on: numbers as
// they are written, strings as they are.
func quantity(v any) string {
	switch n := v.(type) {
	case float64:
		return strconv.FormatFloat(n, 'f', -1, 64)
	case int64:
		return strconv.FormatInt(n, 10)
	case int:
		return strconv.Itoa(n)
	}
	return fmt.Sprint(v)
}

// container returns the Deployment's one container.
func (r *rendered) container(t *testing.T) corev1.Container {
	t.Helper()
	spec := r.deployment.Spec.Template.Spec
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 0 || spec.Containers[0].Name != "injector" {
		t.Fatalf("%s: want one container, injector; got %d (and %d init containers)", r.name, len(spec.Containers), len(spec.InitContainers))
	}
	return spec.Containers[0]
}

// flags returns the injector's --flag=value arguments, after the injector
// subcommand.
func (r *rendered) flags(t *testing.T) map[string]string {
	t.Helper()
	args := r.container(t).Args
	if len(args) == 0 || args[0] != "injector" {
		t.Fatalf("%s: args %q: want the injector subcommand first", r.name, args)
	}
	flags := map[string]string{}
	for _, a := range args[1:] {
		k, v, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(k, "--") {
			t.Fatalf("%s: arg %q: want --flag=value", r.name, a)
		}
		if _, dup := flags[k]; dup {
			t.Errorf("%s: %s given twice", r.name, k)
		}
		flags[k] = v
	}
	return flags
}

// appName is the app.kubernetes.io/name label: sluice-injector, or
// nameOverride's.
func (r *rendered) appName() string {
	if v, _ := r.value("nameOverride"); v != nil && v != "" {
		return fmt.Sprint(v) + "-injector"
	}
	return "sluice-injector"
}

// selectorLabels are the labels every selector of the chart uses.
func (r *rendered) selectorLabels() map[string]string {
	return map[string]string{"app.kubernetes.io/name": r.appName(), "app.kubernetes.io/instance": r.release}
}

// TestChartLint: `helm lint --strict` finds nothing to say of the chart,
// with its defaults and with each values file.
func TestChartLint(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !slices.ContainsFunc(chartCases, func(c chartCase) bool { return c.values == filepath.Base(f) }) {
			t.Errorf("%s: no chart case installs it", f)
		}
	}
	for _, c := range chartCases {
		t.Run(c.name, func(t *testing.T) {
			l := action.NewLint()
			l.Strict = true
			l.Namespace = c.namespace
			l.KubeVersion = parseKubeVersion(t)
			res := l.Run([]string{chartDir}, userValues(t, c.values))
			if res.TotalChartsLinted != 1 {
				t.Errorf("linted %d charts, want 1", res.TotalChartsLinted)
			}
			for _, m := range res.Messages {
				t.Log(m)
			}
			if action.HasWarningsOrErrors(res) || len(res.Errors) > 0 {
				t.Errorf("lint: warnings or errors: %v", res.Errors)
			}
		})
	}
}
