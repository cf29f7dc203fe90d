// Package charts holds the repository's Helm charts: sluice/, the sluice
// injector's. Its tests use Helm's own Go SDK: they lint the chart
// strictly, render it with the values files in testdata/ as `helm install
// --dry-run` does, decode every object strictly into its Kubernetes API
// type, check that the objects agree with each other and with the values,
// and that the default render agrees with the plain manifests of
// examples/kubernetes/injector/, so that the two cannot drift apart.
package charts

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	release "helm.sh/helm/v4/pkg/release/v1"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"

	"github.com/sluicehq/sluice/inject"
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
	{"custom release name", "edge", "edge-system", "", "edge-sluice-injector"},
	{"release named after the chart", "sluice-prod", "prod", "", "sluice-prod-injector"},
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
func install(t *testing.T, release_, namespace string, vals map[string]any) (*release.Release, error) {
	t.Helper()
	in := action.NewInstall(action.NewConfiguration())
	in.DryRunStrategy = action.DryRunClient
	in.ReleaseName = release_
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

// selectorLabels are the labels every selector of the chart uses.
func (r *rendered) selectorLabels() map[string]string {
	return map[string]string{"app.kubernetes.io/name": "sluice-injector", "app.kubernetes.io/instance": r.release}
}

// TestChartLint: `helm lint --strict` finds nothing to say of the chart,
// with its defaults and with each values file.
func TestChartLint(t *testing.T) {
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

// TestChartRenders: every install of chartCases renders objects that
// decode strictly and agree with each other and with the values.
func TestChartRenders(t *testing.T) {
	for _, c := range chartCases {
		t.Run(c.name, func(t *testing.T) {
			r := render(t, c)
			t.Run("objects", func(t *testing.T) { checkObjects(t, r) })
			t.Run("webhooks", func(t *testing.T) { checkWebhooks(t, r) })
			t.Run("deployment", func(t *testing.T) { checkDeployment(t, r) })
			t.Run("tls", func(t *testing.T) { checkTLS(t, r) })
			t.Run("scan", func(t *testing.T) { checkScan(t, r) })
			t.Run("sidecar flags", func(t *testing.T) { checkSidecarFlags(t, r) })
			t.Run("pdb", func(t *testing.T) { checkPDB(t, r) })
			t.Run("networkpolicy", func(t *testing.T) { checkNetworkPolicy(t, r) })
			t.Run("order", func(t *testing.T) { checkOrder(t, r) })
			t.Run("notes", func(t *testing.T) { checkNotes(t, r) })
		})
	}
}

// checkObjects: the objects the values ask for and no others, named after
// the release, in its namespace (but the cluster-scoped ones), with the
// standard labels.
func checkObjects(t *testing.T, r *rendered) {
	certManager, scan := r.boolean(t, "certManager.enabled"), r.boolean(t, "scan.enabled")
	for what, ok := range map[string]bool{
		"a Secret iff certManager.enabled is false":           (r.secret != nil) != certManager,
		"Issuers and Certificates iff certManager.enabled":    (len(r.issuers) == 2 && len(r.certs) == 2) == certManager && (len(r.issuers) == 0) != certManager,
		"a ClusterRole and its binding iff scan.enabled":      (r.clusterRole != nil) == scan && (r.binding != nil) == scan,
		"a PodDisruptionBudget iff pdb.enabled":               (r.pdb != nil) == r.boolean(t, "pdb.enabled"),
		"a NetworkPolicy iff networkPolicy.enabled":           (r.netpol != nil) == r.boolean(t, "networkPolicy.enabled"),
		"no Namespace (helm install --create-namespace does)": true, // render refuses any kind not listed there
	} {
		if !ok {
			t.Errorf("want %s", what)
		}
	}
	chartLabel := r.chart.Name() + "-" + r.chart.Metadata.Version
	for _, o := range r.objects {
		id := fmt.Sprintf("%T %s", o, o.GetName())
		clusterScoped := false
		switch o.(type) {
		case *admissionregistrationv1.MutatingWebhookConfiguration, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
			clusterScoped = true
		}
		if clusterScoped && o.GetNamespace() != "" || !clusterScoped && o.GetNamespace() != r.namespace {
			t.Errorf("%s: namespace %q, want %q", id, o.GetNamespace(), map[bool]string{true: "", false: r.namespace}[clusterScoped])
		}
		if n := o.GetName(); n != r.fullname && !strings.HasPrefix(n, r.fullname+"-") {
			t.Errorf("%s: want it named %s or %s-...", id, r.fullname, r.fullname)
		}
		want := map[string]string{
			"app.kubernetes.io/name": "sluice-injector", "app.kubernetes.io/instance": r.release,
			"app.kubernetes.io/version": r.chart.AppVersion(), "app.kubernetes.io/managed-by": "Helm",
			"helm.sh/chart": chartLabel,
		}
		if !maps.Equal(o.GetLabels(), want) {
			t.Errorf("%s: labels %v, want %v", id, o.GetLabels(), want)
		}
	}
	for what, names := range map[string][2]string{
		"Service":                      {r.service.Name, r.fullname},
		"Deployment":                   {r.deployment.Name, r.fullname},
		"ServiceAccount":               {r.account.Name, r.fullname},
		"MutatingWebhookConfiguration": {r.webhooks.Name, r.fullname},
	} {
		if names[0] != names[1] {
			t.Errorf("%s %q, want %q", what, names[0], names[1])
		}
	}
	if !maps.Equal(r.service.Spec.Selector, r.selectorLabels()) {
		t.Errorf("Service selector %v, want %v", r.service.Spec.Selector, r.selectorLabels())
	}
}

// checkWebhooks: both webhooks call the Service on the injector's paths,
// with the values' policy and timeout, and never review a pod of
// kube-system, of the release's namespace or of an excluded namespace.
func checkWebhooks(t *testing.T, r *rendered) {
	svc := r.service
	var excluded []string
	convert(t, r.table(t, "webhook")["excludeNamespaces"], &excluded)
	excluded = append([]string{"kube-system", r.namespace}, excluded...)
	slices.Sort(excluded)
	excluded = slices.Compact(excluded)

	paths := map[string]string{}
	type sel struct{ ns, obj labels.Selector }
	sels := map[string]sel{}
	for _, w := range r.webhooks.Webhooks {
		s := w.ClientConfig.Service
		if s == nil || w.ClientConfig.URL != nil {
			t.Fatalf("%s: want clientConfig.service, got %+v", w.Name, w.ClientConfig)
		}
		if s.Name != svc.Name || s.Namespace != svc.Namespace {
			t.Errorf("%s: calls Service %s/%s, the chart's is %s/%s", w.Name, s.Namespace, s.Name, svc.Namespace, svc.Name)
		}
		if s.Port == nil || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == *s.Port }) {
			t.Errorf("%s: port %v is not a port of the Service", w.Name, s.Port)
		}
		if s.Path != nil {
			paths[w.Name] = *s.Path
		}
		if w.FailurePolicy == nil || string(*w.FailurePolicy) != r.str(t, "webhook.failurePolicy") {
			t.Errorf("%s: failurePolicy %v, want %s", w.Name, w.FailurePolicy, r.str(t, "webhook.failurePolicy"))
		}
		timeout, _ := r.value("webhook.timeoutSeconds")
		if w.TimeoutSeconds == nil || quantity(timeout) != strconv.Itoa(int(*w.TimeoutSeconds)) {
			t.Errorf("%s: timeoutSeconds %v, want %v", w.Name, w.TimeoutSeconds, timeout)
		}
		if w.ReinvocationPolicy == nil || *w.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy ||
			w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNone {
			t.Errorf("%s: reinvocationPolicy %v, sideEffects %v: want IfNeeded, None", w.Name, w.ReinvocationPolicy, w.SideEffects)
		}
		// The exclusion is by name, an expression of its own.
		var got []string
		for _, e := range w.NamespaceSelector.MatchExpressions {
			if e.Key == "kubernetes.io/metadata.name" && e.Operator == metav1.LabelSelectorOpNotIn {
				got = slices.Sorted(slices.Values(e.Values))
			}
		}
		if !slices.Equal(got, excluded) {
			t.Errorf("%s: excludes namespaces %q, want %q", w.Name, got, excluded)
		}
		n, err := metav1.LabelSelectorAsSelector(w.NamespaceSelector)
		if err != nil {
			t.Fatal(err)
		}
		o, err := metav1.LabelSelectorAsSelector(w.ObjectSelector)
		if err != nil || w.ObjectSelector == nil {
			t.Fatalf("%s: objectSelector %v: %v", w.Name, w.ObjectSelector, err)
		}
		sels[w.Name] = sel{n, o}
	}
	if want := map[string]string{
		"namespace.inject.sluice.io": inject.NamespacePath,
		"pod.inject.sluice.io":       inject.PodPath,
	}; !maps.Equal(paths, want) {
		t.Errorf("webhooks and paths %v, want %v", paths, want)
	}
	// Which webhook reviews a pod, as the API server decides it.
	reviewer := func(ns labels.Set, pod labels.Set) []string {
		var got []string
		for name, s := range sels {
			if s.ns.Matches(ns) && s.obj.Matches(pod) {
				got = append(got, name)
			}
		}
		return got
	}
	podIn := labels.Set{"sluice.io/inject": "true"}
	for _, ns := range excluded {
		for _, nsLabels := range []labels.Set{{}, {"sluice.io/inject": "enabled"}} {
			l := labels.Merge(nsLabels, labels.Set{"kubernetes.io/metadata.name": ns})
			if got := reviewer(l, podIn); len(got) > 0 {
				t.Errorf("an opted-in pod of namespace %s (labels %v) is reviewed by %q", ns, l, got)
			}
		}
	}
	if got := reviewer(labels.Set{"kubernetes.io/metadata.name": "team-a", "sluice.io/inject": "enabled"}, labels.Set{}); !slices.Equal(got, []string{"namespace.inject.sluice.io"}) {
		t.Errorf("a pod of an opted-in namespace is reviewed by %q", got)
	}
	if got := reviewer(labels.Set{"kubernetes.io/metadata.name": "team-b"}, podIn); !slices.Equal(got, []string{"pod.inject.sluice.io"}) {
		t.Errorf("an opted-in pod of another namespace is reviewed by %q", got)
	}
	// The injector's own pods, wherever they run.
	if got := reviewer(labels.Set{"kubernetes.io/metadata.name": r.namespace, "sluice.io/inject": "enabled"},
		labels.Set(r.deployment.Spec.Template.Labels)); len(got) > 0 {
		t.Errorf("the injector's own pods are reviewed by %q", got)
	}
}

// checkDeployment: the Deployment runs the values' image and replicas,
// the Service reaches its webhook port, the probes its admin port, its
// selectors select its pods and its pod passes Pod Security "restricted".
func checkDeployment(t *testing.T, r *rendered) {
	dep, c, flags := r.deployment, r.container(t), r.flags(t)
	spec := dep.Spec.Template.Spec

	if !maps.Equal(dep.Spec.Selector.MatchLabels, r.selectorLabels()) || len(dep.Spec.Selector.MatchExpressions) > 0 {
		t.Errorf("selector %v, want %v", dep.Spec.Selector, r.selectorLabels())
	}
	podLabels := labels.Set(dep.Spec.Template.Labels)
	if !labels.SelectorFromSet(r.selectorLabels()).Matches(podLabels) || podLabels["sluice.io/inject"] != "false" {
		t.Errorf("pod labels %v: want the selector's and sluice.io/inject=false", podLabels)
	}
	replicas, _ := r.value("injector.replicas")
	if dep.Spec.Replicas == nil || strconv.Itoa(int(*dep.Spec.Replicas)) != quantity(replicas) {
		t.Errorf("replicas %v, want %v", dep.Spec.Replicas, replicas)
	}
	tag := r.str(t, "image.tag")
	if tag == "" {
		tag = r.chart.AppVersion()
	}
	if want := r.str(t, "image.repository") + ":" + tag; c.Image != want || string(c.ImagePullPolicy) != r.str(t, "image.pullPolicy") {
		t.Errorf("image %s (%s), want %s (%s)", c.Image, c.ImagePullPolicy, want, r.str(t, "image.pullPolicy"))
	}
	maxInFlight, _ := r.value("injector.maxInFlight")
	if flags["--max-in-flight"] != quantity(maxInFlight) {
		t.Errorf("--max-in-flight=%s, want %v", flags["--max-in-flight"], maxInFlight)
	}

	// The Service's target port is --listen's, and the probes ask --admin-listen.
	port := func(flag string) int32 {
		_, p, err := net.SplitHostPort(flags[flag])
		n, err2 := strconv.Atoi(p)
		if err != nil || err2 != nil {
			t.Fatalf("%s=%q: want host:port", flag, flags[flag])
		}
		return int32(n)
	}
	webhookPort, adminPort := port("--listen"), port("--admin-listen")
	for _, sp := range r.service.Spec.Ports {
		target := sp.TargetPort.IntVal
		if sp.TargetPort.Type == intstr.String {
			i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == sp.TargetPort.StrVal })
			if i < 0 {
				t.Fatalf("Service targetPort %q names no container port", sp.TargetPort.StrVal)
			}
			target = c.Ports[i].ContainerPort
		}
		if sp.Port != 443 || target != webhookPort {
			t.Errorf("Service port %d → %d, want 443 → %d (--listen)", sp.Port, target, webhookPort)
		}
	}
	for path, p := range map[string]*corev1.Probe{"/readyz": c.ReadinessProbe, "/healthz": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port.IntValue() != int(adminPort) {
			t.Errorf("want an httpGet probe of %s on port %d (--admin-listen), got %+v", path, adminPort, p)
		}
	}

	// The scheduling values, as given.
	var resources corev1.ResourceRequirements
	convert(t, r.table(t, "injector")["resources"], &resources)
	if !apiequality.Semantic.DeepEqual(c.Resources, resources) {
		t.Errorf("resources %+v, want injector.resources %+v", c.Resources, resources)
	}
	var nodeSelector, annotations map[string]string
	var tolerations []corev1.Toleration
	convert(t, r.table(t, "injector")["nodeSelector"], &nodeSelector)
	convert(t, r.table(t, "injector")["podAnnotations"], &annotations)
	convert(t, r.table(t, "injector")["tolerations"], &tolerations)
	if !maps.Equal(spec.NodeSelector, nodeSelector) || !maps.Equal(dep.Spec.Template.Annotations, annotations) ||
		!apiequality.Semantic.DeepEqual(spec.Tolerations, tolerations) && len(spec.Tolerations)+len(tolerations) > 0 {
		t.Errorf("nodeSelector %v, annotations %v, tolerations %v: want %v, %v, %v", spec.NodeSelector, dep.Spec.Template.Annotations, spec.Tolerations,
			nodeSelector, annotations, tolerations)
	}
	if spec.PriorityClassName != r.str(t, "injector.priorityClassName") {
		t.Errorf("priorityClassName %q, want %q", spec.PriorityClassName, r.str(t, "injector.priorityClassName"))
	}
	if a := r.table(t, "injector.affinity"); len(a) > 0 {
		var want corev1.Affinity
		convert(t, a, &want)
		if !apiequality.Semantic.DeepEqual(spec.Affinity, &want) {
			t.Errorf("affinity %+v, want injector.affinity %+v", spec.Affinity, want)
		}
	} else if a := spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("want one preferred pod anti-affinity term across nodes, got %+v", spec.Affinity)
	} else if s := a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector; s == nil || !maps.Equal(s.MatchLabels, r.selectorLabels()) {
		t.Errorf("the anti-affinity term selects %v, want %v", s, r.selectorLabels())
	}

	if spec.ServiceAccountName != r.account.Name {
		t.Errorf("serviceAccountName %q, the chart's is %q", spec.ServiceAccountName, r.account.Name)
	}
	pod := &corev1.Pod{ObjectMeta: dep.Spec.Template.ObjectMeta, Spec: spec}
	if msg := restricted(t, pod); msg != "" {
		t.Errorf("Pod Security restricted refuses the injector's pod: %s", msg)
	}
}

// restricted returns what Pod Security "restricted:latest" says of pod, the
// admission plugin's own checks: "" when it admits it.
func restricted(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	e, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res := policy.AggregateCheckResults(e.EvaluatePod(psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}, &pod.ObjectMeta, &pod.Spec))
	if res.Allowed {
		return ""
	}
	return res.ForbiddenReason() + ": " + res.ForbiddenDetail()
}

// checkTLS: the Deployment mounts the Secret that holds the serving
// certificate, read-only, where the TLS flags look. Without cert-manager
// the chart writes it: the caBundle of both webhooks is the CA that signs
// its tls.crt, a certificate for the Service's DNS names whose key is
// tls.key. With cert-manager, its Certificate writes that Secret for the
// same names, and the cainjector annotation names it.
func checkTLS(t *testing.T, r *rendered) {
	c, flags, spec := r.container(t), r.flags(t), r.deployment.Spec.Template.Spec
	secretName := ""
	for flag, file := range map[string]string{"--tls-cert-file": "tls.crt", "--tls-key-file": "tls.key"} {
		dir, base := filepath.Split(flags[flag])
		if base != file {
			t.Errorf("%s=%s: the Secret's key is %s", flag, flags[flag], file)
		}
		i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return filepath.Clean(m.MountPath) == filepath.Clean(dir) })
		if i < 0 {
			t.Fatalf("%s=%s: no volume mounted at %s", flag, flags[flag], dir)
		}
		vm := c.VolumeMounts[i]
		v := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		if v < 0 || spec.Volumes[v].Secret == nil {
			t.Fatalf("%s: volume %q is not a Secret", flag, vm.Name)
		}
		if !vm.ReadOnly {
			t.Errorf("%s: mount it read-only", flag)
		}
		secretName = spec.Volumes[v].Secret.SecretName
	}
	svc := r.service.Name + "." + r.service.Namespace + ".svc"
	dnsNames := []string{svc, svc + ".cluster.local"}

	if r.boolean(t, "certManager.enabled") {
		cert := r.certs[secretName]
		if cert == nil || cert.Spec.SecretName != secretName {
			t.Fatalf("the Deployment mounts Secret %q, which no Certificate writes", secretName)
		}
		if !slices.Equal(cert.Spec.DNSNames, dnsNames) || cert.Spec.IsCA || !slices.Contains(cert.Spec.Usages, "server auth") {
			t.Errorf("Certificate %s: dnsNames %q, isCA %v, usages %q: want a server certificate for %q", cert.Name, cert.Spec.DNSNames, cert.Spec.IsCA, cert.Spec.Usages, dnsNames)
		}
		if got, want := r.webhooks.Annotations["cert-manager.io/inject-ca-from"], r.namespace+"/"+cert.Name; got != want {
			t.Errorf("cert-manager.io/inject-ca-from %q, want %q", got, want)
		}
		for _, w := range r.webhooks.Webhooks {
			if len(w.ClientConfig.CABundle) > 0 {
				t.Errorf("%s: a caBundle of the chart's own: cainjector writes it", w.Name)
			}
		}
		// The chain: serving cert ← CA Issuer ← CA Certificate ← selfSigned Issuer.
		caIssuer := r.issuers[cert.Spec.IssuerRef.Name]
		if cert.Spec.IssuerRef.Kind != "Issuer" || caIssuer == nil || caIssuer.Spec.CA == nil {
			t.Fatalf("serving certificate's issuer %+v: want a CA Issuer of the chart", cert.Spec.IssuerRef)
		}
		ca := r.certs[caIssuer.Spec.CA.SecretName]
		if ca == nil || !ca.Spec.IsCA || ca.Spec.SecretName != caIssuer.Spec.CA.SecretName {
			t.Fatalf("CA Issuer's Secret %q is written by no isCA Certificate", caIssuer.Spec.CA.SecretName)
		}
		if root := r.issuers[ca.Spec.IssuerRef.Name]; ca.Spec.IssuerRef.Kind != "Issuer" || root == nil || root.Spec.SelfSigned == nil {
			t.Errorf("CA Certificate's issuer %+v: want the selfSigned Issuer", ca.Spec.IssuerRef)
		}
		return
	}

	s := r.secret
	if s == nil || s.Name != secretName {
		t.Fatalf("the Deployment mounts Secret %q, the chart writes none by that name", secretName)
	}
	if s.Type != corev1.SecretTypeTLS {
		t.Errorf("Secret type %q, want %q", s.Type, corev1.SecretTypeTLS)
	}
	if _, ok := r.webhooks.Annotations["cert-manager.io/inject-ca-from"]; ok {
		t.Error("a cert-manager annotation without cert-manager")
	}
	for _, w := range r.webhooks.Webhooks {
		if string(w.ClientConfig.CABundle) != string(s.Data["ca.crt"]) {
			t.Errorf("%s: caBundle is not the Secret's ca.crt", w.Name)
		}
	}
	verifyServingPair(t, s.Data, r.webhooks.Webhooks[0].ClientConfig.CABundle, dnsNames)
}

// verifyServingPair checks that data's tls.crt is a serving certificate for
// dnsNames that the CA in caBundle signs, and that tls.key is its key.
func verifyServingPair(t *testing.T, data map[string][]byte, caBundle []byte, dnsNames []string) {
	t.Helper()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caBundle) {
		t.Fatalf("caBundle holds no PEM certificate: %q", caBundle)
	}
	pair, err := tls.X509KeyPair(data["tls.crt"], data["tls.key"])
	if err != nil {
		t.Fatalf("tls.crt and tls.key: %v", err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		block, _ := pem.Decode(data["tls.crt"])
		if leaf, err = x509.ParseCertificate(block.Bytes); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(leaf.DNSNames)), slices.Sorted(slices.Values(dnsNames))) || leaf.IsCA {
		t.Errorf("serving certificate: SANs %q, isCA %v: want %q", leaf.DNSNames, leaf.IsCA, dnsNames)
	}
	for _, name := range dnsNames {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("the API server would refuse the serving certificate for %s: %v", name, err)
		}
	}
}

// checkScan: with scan.enabled the injector scans every scan.interval,
// reads the chart's webhook configuration and holds a token whose
// ClusterRole grants exactly what the scan needs; without it, it holds no
// token and nothing is granted.
func checkScan(t *testing.T, r *rendered) {
	flags := r.flags(t)
	pod := r.deployment.Spec.Template.Spec
	if b := r.account.AutomountServiceAccountToken; b == nil || *b {
		t.Error("ServiceAccount: automountServiceAccountToken must be false (the pod asks for the token where it needs it)")
	}
	if !r.boolean(t, "scan.enabled") {
		if flags["--scan-interval"] != "0" {
			t.Errorf("--scan-interval=%q, want 0", flags["--scan-interval"])
		}
		if v, ok := flags["--webhook-configuration"]; ok {
			t.Errorf("--webhook-configuration=%s without a scan", v)
		}
		if b := pod.AutomountServiceAccountToken; b == nil || *b {
			t.Error("pod: automountServiceAccountToken must be false without a scan")
		}
		if r.clusterRole != nil || r.binding != nil {
			t.Error("a ClusterRole or ClusterRoleBinding without a scan")
		}
		return
	}
	if flags["--scan-interval"] != r.str(t, "scan.interval") || flags["--webhook-configuration"] != r.webhooks.Name {
		t.Errorf("--scan-interval=%s --webhook-configuration=%s, want %s and %s", flags["--scan-interval"], flags["--webhook-configuration"],
			r.str(t, "scan.interval"), r.webhooks.Name)
	}
	if b := pod.AutomountServiceAccountToken; b == nil || !*b {
		t.Error("pod: automountServiceAccountToken must be true: the scan calls the API")
	}
	if r.clusterRole == nil || r.binding == nil {
		t.Fatal("scan.enabled: no ClusterRole or ClusterRoleBinding")
	}
	if want := scanRules(r.webhooks.Name); !apiequality.Semantic.DeepEqual(r.clusterRole.Rules, want) {
		t.Errorf("ClusterRole rules %+v, want exactly %+v", r.clusterRole.Rules, want)
	}
	b := r.binding
	if b.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r.clusterRole.Name}) {
		t.Errorf("ClusterRoleBinding roleRef %+v, want the ClusterRole %s", b.RoleRef, r.clusterRole.Name)
	}
	if want := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: r.account.Name, Namespace: r.namespace}}; !slices.Equal(b.Subjects, want) {
		t.Errorf("ClusterRoleBinding subjects %+v, want %+v", b.Subjects, want)
	}
}

// scanRules is what the scan may do: list pods and namespaces, and read
// the one webhook configuration.
func scanRules(webhookConfiguration string) []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"list"}},
		{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"},
			ResourceNames: []string{webhookConfiguration}, Verbs: []string{"get"}},
	}
}

// sidecarFlags maps each sidecar value to the injector flag it sets.
var sidecarFlags = []struct{ value, flag string }{
	{"sidecar.image", "--image"},
	{"sidecar.resources.requests.cpu", "--cpu-request"},
	{"sidecar.resources.requests.memory", "--memory-request"},
	{"sidecar.resources.limits.cpu", "--cpu-limit"},
	{"sidecar.resources.limits.memory", "--memory-limit"},
	{"sidecar.grace", "--grace"},
	{"sidecar.ingestPort", "--ingest-port"},
	{"sidecar.adminPort", "--admin-port"},
	{"sidecar.configMap", "--config-map"},
	{"sidecar.secret", "--secret"},
	{"sidecar.pvc", "--pvc"},
	{"sidecar.jetstreamURL", "--jetstream-url"},
}

// injectorFlags are the flags the chart sets that are not the sidecar's.
var injectorFlags = []string{"--listen", "--admin-listen", "--tls-cert-file", "--tls-key-file", "--max-in-flight", "--scan-interval", "--webhook-configuration"}

// checkSidecarFlags: each sidecar value that is set is passed as its flag,
// with its value; one that is not set is not passed, but --image, which
// defaults to the injector's image. No other flag is passed.
func checkSidecarFlags(t *testing.T, r *rendered) {
	flags := r.flags(t)
	want := map[string]string{}
	for _, s := range sidecarFlags {
		if v, ok := r.value(s.value); ok && (v != "" || strings.HasPrefix(s.value, "sidecar.resources.")) {
			want[s.flag] = quantity(v)
		}
	}
	if _, ok := want["--image"]; !ok {
		want["--image"] = r.container(t).Image
	}
	got := map[string]string{}
	for k, v := range flags {
		if !slices.Contains(injectorFlags, k) {
			got[k] = v
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("sidecar flags %v, want %v (from the values)", got, want)
	}
}

func checkPDB(t *testing.T, r *rendered) {
	if r.pdb == nil {
		return
	}
	var want intstr.IntOrString
	v, _ := r.value("pdb.minAvailable")
	convert(t, v, &want)
	if r.pdb.Spec.MinAvailable == nil || *r.pdb.Spec.MinAvailable != want || r.pdb.Spec.MaxUnavailable != nil {
		t.Errorf("minAvailable %v, want %v", r.pdb.Spec.MinAvailable, want.String())
	}
	if s := r.pdb.Spec.Selector; s == nil || !maps.Equal(s.MatchLabels, r.selectorLabels()) || len(s.MatchExpressions) > 0 {
		t.Errorf("PDB selector %v, want %v", s, r.selectorLabels())
	}
}

// checkNetworkPolicy: the webhook port open to all, the admin port to the
// release's namespace and the metrics namespaces, nothing else.
func checkNetworkPolicy(t *testing.T, r *rendered) {
	if r.netpol == nil {
		return
	}
	np := r.netpol.Spec
	if !maps.Equal(np.PodSelector.MatchLabels, r.selectorLabels()) || len(np.PodSelector.MatchExpressions) > 0 {
		t.Errorf("podSelector %v, want %v", np.PodSelector, r.selectorLabels())
	}
	if !slices.Equal(np.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policyTypes %q, want [Ingress]", np.PolicyTypes)
	}
	tcp := corev1.ProtocolTCP
	named := func(name string) []networkingv1.NetworkPolicyPort {
		p := intstr.FromString(name)
		return []networkingv1.NetworkPolicyPort{{Port: &p, Protocol: &tcp}}
	}
	var metrics []string
	convert(t, r.table(t, "networkPolicy")["metricsNamespaces"], &metrics)
	admin := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}
	for _, ns := range metrics {
		admin = append(admin, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}})
	}
	want := []networkingv1.NetworkPolicyIngressRule{{Ports: named("webhook")}, {From: admin, Ports: named("admin")}}
	if !apiequality.Semantic.DeepEqual(np.Ingress, want) {
		t.Errorf("ingress %+v, want %+v", np.Ingress, want)
	}
	c := r.container(t)
	for _, name := range []string{"webhook", "admin"} {
		if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == name }) {
			t.Errorf("the rules name port %q, which the container does not have", name)
		}
	}
}

// checkOrder: helm install creates the MutatingWebhookConfiguration after
// the Deployment, Service and Secret it relies on, and helm uninstall
// deletes it first, so that no pod creation waits on an injector that is
// going away.
func checkOrder(t *testing.T, r *rendered) {
	kinds := func(order releaseutil.KindSortOrder) []string {
		_, ms, err := releaseutil.SortManifests(releaseutil.SplitManifests(r.manifest), nil, order)
		if err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, m := range ms {
			ks = append(ks, m.Head.Kind)
		}
		return ks
	}
	in := kinds(releaseutil.InstallOrder)
	mwc := slices.Index(in, "MutatingWebhookConfiguration")
	for _, before := range []string{"Deployment", "Service", "ServiceAccount", "Secret"} {
		if before == "Secret" && r.secret == nil {
			continue
		}
		if i := slices.Index(in, before); i < 0 || i > mwc {
			t.Errorf("install order %q: the webhook configuration before the %s", in, before)
		}
	}
	if out := kinds(releaseutil.UninstallOrder); len(out) == 0 || out[0] != "MutatingWebhookConfiguration" {
		t.Errorf("uninstall order %q: want the webhook configuration first", out)
	}
}

func checkNotes(t *testing.T, r *rendered) {
	for _, want := range []string{r.fullname, r.namespace, "pod-security.kubernetes.io/enforce=restricted", "failurePolicy is " + r.str(t, "webhook.failurePolicy")} {
		if !strings.Contains(r.notes, want) {
			t.Errorf("NOTES.txt does not say %q:\n%s", want, r.notes)
		}
	}
}

// examples is the plain manifests of examples/kubernetes/injector/, the
// resources its kustomization.yaml lists, by kind.
type example struct {
	service     *corev1.Service
	account     *corev1.ServiceAccount
	deployment  *appsv1.Deployment
	webhooks    *admissionregistrationv1.MutatingWebhookConfiguration
	pdb         *policyv1.PodDisruptionBudget
	netpol      *networkingv1.NetworkPolicy
	clusterRole *rbacv1.ClusterRole
	issuers     map[string]*kubetest.Issuer
	certs       map[string]*kubetest.Certificate
	objects     []metav1.Object
}

const exampleDir = "../examples/kubernetes/injector"

func loadExample(t *testing.T) *example {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(exampleDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kubetest.Kustomization
	if err := kubetest.DecodeStrict(src, &k); err != nil {
		t.Fatal(err)
	}
	ex := &example{issuers: map[string]*kubetest.Issuer{}, certs: map[string]*kubetest.Certificate{}}
	for _, file := range k.Resources {
		src, err := os.ReadFile(filepath.Join(exampleDir, file))
		if err != nil {
			t.Fatal(err)
		}
		objs, _, err := kubetest.Decode(src, file)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			switch v := o.Obj.(type) {
			case *corev1.Namespace: // the chart's is helm install --create-namespace's
				continue
			case *corev1.Service:
				ex.service = v
			case *corev1.ServiceAccount:
				ex.account = v
			case *appsv1.Deployment:
				ex.deployment = v
			case *admissionregistrationv1.MutatingWebhookConfiguration:
				ex.webhooks = v
			case *policyv1.PodDisruptionBudget:
				ex.pdb = v
			case *networkingv1.NetworkPolicy:
				ex.netpol = v
			case *rbacv1.ClusterRole:
				ex.clusterRole = v
			case *rbacv1.ClusterRoleBinding:
			case *kubetest.Issuer:
				ex.issuers[v.Name] = v
			case *kubetest.Certificate:
				ex.certs[v.Name] = v
			default:
				t.Fatalf("%s#%d: a %s: teach TestChartMatchesExample to compare it with the chart's", file, o.Doc, o.Kind)
			}
			ex.objects = append(ex.objects, o.Obj.(metav1.Object))
		}
	}
	if ex.service == nil || ex.account == nil || ex.deployment == nil || ex.webhooks == nil || ex.pdb == nil || ex.netpol == nil {
		t.Fatalf("%s: want a Service, ServiceAccount, Deployment, MutatingWebhookConfiguration, PodDisruptionBudget and NetworkPolicy", exampleDir)
	}
	return ex
}

// subset reports whether every label of sub is in super.
func subset(sub, super map[string]string) bool {
	for k, v := range sub {
		if w, ok := super[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestChartMatchesExample: the chart with its defaults, installed as
// release sluice in sluice-system, makes the objects of
// examples/kubernetes/injector/: the same names, labels (the chart adds
// its own), selectors (the chart's select on the release too), webhooks,
// security contexts, probes, ports, resources, PodDisruptionBudget and
// NetworkPolicy; with certManager.enabled, the same Issuers and
// Certificates. A change to one that is not made to the other fails here.
func TestChartMatchesExample(t *testing.T) {
	ex := loadExample(t)
	def := render(t, caseNamed(t, "defaults"))
	cm := render(t, caseNamed(t, "cert-manager"))
	// The example holds a ClusterRole once the injector scans: it is
	// compared with the chart's defaults (scan on); without one, with the
	// chart's scan off.
	scanCase := def
	if ex.clusterRole == nil {
		scanCase = render(t, caseNamed(t, "scan disabled"))
	}

	t.Run("names and labels", func(t *testing.T) {
		chartObjects := map[string]metav1.Object{}
		for _, o := range append(slices.Clone(scanCase.objects), cm.objects...) {
			chartObjects[fmt.Sprintf("%T %s/%s", o, o.GetNamespace(), o.GetName())] = o
		}
		for _, o := range ex.objects {
			id := fmt.Sprintf("%T %s/%s", o, o.GetNamespace(), o.GetName())
			c, ok := chartObjects[id]
			if !ok {
				t.Errorf("%s: the chart makes none by that name", id)
				continue
			}
			if !subset(o.GetLabels(), c.GetLabels()) {
				t.Errorf("%s: labels %v, the chart's %v", id, o.GetLabels(), c.GetLabels())
			}
			if !maps.Equal(o.GetAnnotations(), c.GetAnnotations()) {
				t.Errorf("%s: annotations %v, the chart's %v", id, o.GetAnnotations(), c.GetAnnotations())
			}
		}
		if got, want := cm.webhooks.Annotations, ex.webhooks.Annotations; !maps.Equal(got, want) {
			t.Errorf("webhook configuration's annotations with cert-manager %v, the example's %v", got, want)
		}
	})

	t.Run("webhooks", func(t *testing.T) {
		if len(def.webhooks.Webhooks) != len(ex.webhooks.Webhooks) {
			t.Fatalf("%d webhooks, the example has %d", len(def.webhooks.Webhooks), len(ex.webhooks.Webhooks))
		}
		for i, w := range def.webhooks.Webhooks {
			w.ClientConfig.CABundle = nil // the chart's own CA; the example's cainjector writes it
			if e := ex.webhooks.Webhooks[i]; !apiequality.Semantic.DeepEqual(w, e) {
				t.Errorf("webhook %d:\nchart   %+v\nexample %+v", i, w, e)
			}
		}
	})

	t.Run("selectors", func(t *testing.T) {
		for what, s := range map[string][2]map[string]string{
			"Deployment selector":  {ex.deployment.Spec.Selector.MatchLabels, def.deployment.Spec.Selector.MatchLabels},
			"Service selector":     {ex.service.Spec.Selector, def.service.Spec.Selector},
			"PDB selector":         {ex.pdb.Spec.Selector.MatchLabels, def.pdb.Spec.Selector.MatchLabels},
			"NetworkPolicy pods":   {ex.netpol.Spec.PodSelector.MatchLabels, def.netpol.Spec.PodSelector.MatchLabels},
			"pod labels":           {ex.deployment.Spec.Template.Labels, def.deployment.Spec.Template.Labels},
			"anti-affinity labels": {antiAffinityLabels(ex.deployment), antiAffinityLabels(def.deployment)},
		} {
			if len(s[0]) == 0 || !subset(s[0], s[1]) {
				t.Errorf("%s: the example's %v, the chart's %v", what, s[0], s[1])
			}
		}
	})

	t.Run("deployment", func(t *testing.T) {
		e, c := ex.deployment, scanCase.deployment
		es, cs := e.Spec.Template.Spec, c.Spec.Template.Spec
		for what, pair := range map[string][2]any{
			"replicas":                     {e.Spec.Replicas, c.Spec.Replicas},
			"strategy":                     {e.Spec.Strategy, c.Spec.Strategy},
			"pod securityContext":          {es.SecurityContext, cs.SecurityContext},
			"serviceAccountName":           {es.ServiceAccountName, cs.ServiceAccountName},
			"automountServiceAccountToken": {es.AutomountServiceAccountToken, cs.AutomountServiceAccountToken},
			"priorityClassName":            {es.PriorityClassName, cs.PriorityClassName},
			"volumes":                      {es.Volumes, cs.Volumes},
			"container count":              {len(es.Containers), len(cs.Containers)},
			"ServiceAccount automount":     {ex.account.AutomountServiceAccountToken, scanCase.account.AutomountServiceAccountToken},
		} {
			if !apiequality.Semantic.DeepEqual(pair[0], pair[1]) {
				t.Errorf("%s: the example's %+v, the chart's %+v", what, pair[0], pair[1])
			}
		}
		ea, ca := es.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution, cs.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution
		if len(ea) != 1 || len(ca) != 1 || ea[0].Weight != ca[0].Weight || ea[0].PodAffinityTerm.TopologyKey != ca[0].PodAffinityTerm.TopologyKey {
			t.Errorf("anti-affinity: the example's %+v, the chart's %+v", ea, ca)
		}
		if len(es.Containers) != 1 || len(cs.Containers) != 1 {
			return
		}
		ec, cc := es.Containers[0], cs.Containers[0]
		for what, pair := range map[string][2]any{
			"name":            {ec.Name, cc.Name},
			"ports":           {ec.Ports, cc.Ports},
			"readinessProbe":  {ec.ReadinessProbe, cc.ReadinessProbe},
			"livenessProbe":   {ec.LivenessProbe, cc.LivenessProbe},
			"resources":       {ec.Resources, cc.Resources},
			"securityContext": {ec.SecurityContext, cc.SecurityContext},
			"volumeMounts":    {ec.VolumeMounts, cc.VolumeMounts},
			"env":             {ec.Env, cc.Env},
		} {
			if !apiequality.Semantic.DeepEqual(pair[0], pair[1]) {
				t.Errorf("container %s: the example's %+v, the chart's %+v", what, pair[0], pair[1])
			}
		}
		// The example's args, but --image (the chart pins the sidecar to its
		// own image), are the chart's too.
		for _, a := range ec.Args {
			if !strings.HasPrefix(a, "--image=") && !slices.Contains(cc.Args, a) {
				t.Errorf("the example's arg %q is not among the chart's %q", a, cc.Args)
			}
		}
	})

	t.Run("service, pdb, networkpolicy, rbac", func(t *testing.T) {
		for what, pair := range map[string][2]any{
			"Service ports":               {ex.service.Spec.Ports, def.service.Spec.Ports},
			"PDB minAvailable":            {ex.pdb.Spec.MinAvailable, def.pdb.Spec.MinAvailable},
			"PDB maxUnavailable":          {ex.pdb.Spec.MaxUnavailable, def.pdb.Spec.MaxUnavailable},
			"NetworkPolicy policyTypes":   {ex.netpol.Spec.PolicyTypes, def.netpol.Spec.PolicyTypes},
			"NetworkPolicy ingress rules": {ex.netpol.Spec.Ingress, def.netpol.Spec.Ingress},
			"NetworkPolicy egress rules":  {ex.netpol.Spec.Egress, def.netpol.Spec.Egress},
		} {
			if !apiequality.Semantic.DeepEqual(pair[0], pair[1]) {
				t.Errorf("%s: the example's %+v, the chart's %+v", what, pair[0], pair[1])
			}
		}
		if ex.clusterRole != nil && !apiequality.Semantic.DeepEqual(ex.clusterRole.Rules, def.clusterRole.Rules) {
			t.Errorf("ClusterRole rules: the example's %+v, the chart's %+v", ex.clusterRole.Rules, def.clusterRole.Rules)
		}
	})

	t.Run("cert-manager", func(t *testing.T) {
		if !maps.Equal(mapKeys(ex.issuers), mapKeys(cm.issuers)) || !maps.Equal(mapKeys(ex.certs), mapKeys(cm.certs)) {
			t.Fatalf("Issuers %v and Certificates %v, the chart's %v and %v", mapKeys(ex.issuers), mapKeys(ex.certs), mapKeys(cm.issuers), mapKeys(cm.certs))
		}
		for name, e := range ex.issuers {
			if !apiequality.Semantic.DeepEqual(e.Spec, cm.issuers[name].Spec) {
				t.Errorf("Issuer %s: the example's %+v, the chart's %+v", name, e.Spec, cm.issuers[name].Spec)
			}
		}
		for name, e := range ex.certs {
			if !apiequality.Semantic.DeepEqual(e.Spec, cm.certs[name].Spec) {
				t.Errorf("Certificate %s: the example's %+v, the chart's %+v", name, e.Spec, cm.certs[name].Spec)
			}
		}
	})
}

func antiAffinityLabels(d *appsv1.Deployment) map[string]string {
	a := d.Spec.Template.Spec.Affinity
	if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 ||
		a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector == nil {
		return nil
	}
	return a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector.MatchLabels
}

// mapKeys returns m's keys as a set.
func mapKeys[V any](m map[string]V) map[string]bool {
	s := map[string]bool{}
	for k := range m {
		s[k] = true
	}
	return s
}

// TestChartRefusesBadValues: a value of the wrong kind, out of range, or
// under a key the chart does not know fails helm install and helm lint,
// with an error that names it.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		want         []string // in the error, each
	}{
		{"failurePolicy not an enum value", "webhook: {failurePolicy: Sometimes}", []string{"/webhook/failurePolicy", "Ignore", "Fail"}},
		{"unknown top-level key", "webhooks: {failurePolicy: Fail}", []string{"webhooks"}},
		{"unknown nested key", "webhook: {failurPolicy: Fail}", []string{"/webhook", "failurPolicy"}},
		{"key in the wrong case", "sidecar: {jetstreamUrl: nats://nats:4222}", []string{"/sidecar", "jetstreamUrl"}},
		{"timeout out of range", "webhook: {timeoutSeconds: 60}", []string{"/webhook/timeoutSeconds", "30"}},
		{"excluded namespace not a name", "webhook: {excludeNamespaces: [Team_A]}", []string{"/webhook/excludeNamespaces/0"}},
		{"grace not a duration", "sidecar: {grace: thirty}", []string{"/sidecar/grace"}},
		{"memory limit not a quantity", "sidecar: {resources: {limits: {memory: 1GB}}}", []string{"/sidecar/resources/limits/memory"}},
		{"port out of range", "sidecar: {ingestPort: 70000}", []string{"/sidecar/ingestPort"}},
		{"maxInFlight out of range", "injector: {maxInFlight: 0}", []string{"/injector/maxInFlight"}},
		{"replicas not a number", "injector: {replicas: two}", []string{"/injector/replicas"}},
		{"pullPolicy not an enum value", "image: {pullPolicy: Sometimes}", []string{"/image/pullPolicy"}},
		{"certManager.enabled not a boolean", "certManager: {enabled: yes please}", []string{"/certManager/enabled"}},
		{"minAvailable neither a number nor a percentage", "pdb: {minAvailable: half}", []string{"/pdb/minAvailable"}},
		{"metrics namespace not a name", "networkPolicy: {metricsNamespaces: [Monitoring]}", []string{"/networkPolicy/metricsNamespaces/0"}},
		{"scan interval not a duration", "scan: {interval: often}", []string{"/scan/interval"}},
		{"scan interval zero while enabled", "scan: {interval: 0m0s}", []string{"/scan/interval"}},
		{"unknown key in a toleration", "injector: {tolerations: [{key: a, operater: Exists}]}", []string{"/injector/tolerations/0", "operater"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals, err := common.ReadValues([]byte(tc.values))
			if err != nil {
				t.Fatal(err)
			}
			check := func(what string, err error) {
				if err == nil {
					t.Fatalf("%s: %s passed, want an error", what, tc.values)
				}
				t.Logf("%s: %v", what, err)
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: %v\nwant it to name %q", what, err, w)
					}
				}
			}
			_, err = install(t, "sluice", "sluice-system", vals)
			check("helm install", err)
			l := action.NewLint()
			l.Strict = true
			l.Namespace = "sluice-system"
			l.KubeVersion = parseKubeVersion(t)
			check("helm lint", errors.Join(l.Run([]string{chartDir}, vals).Errors...))
		})
	}
}

// secretsProvider answers the chart's lookups as a cluster holding secrets
// would; a lookup of anything but a Secret fails the render.
type secretsProvider struct{ secrets []runtime.Object }

func (p secretsProvider) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	if apiVersion != "v1" || kind != "Secret" {
		return nil, false, fmt.Errorf("the chart looks up %s %s: only v1 Secret is expected", apiVersion, kind)
	}
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	return dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), p.secrets...).Resource(gvr), true, nil
}

// renderAgainst renders the chart's webhook.yaml as helm upgrade does, with
// lookup answered by p, and returns its Secret and the caBundle of its
// webhooks (the same for both, or the test fails).
func renderAgainst(t *testing.T, p secretsProvider) (*corev1.Secret, []byte) {
	t.Helper()
	ch := loadChart(t)
	caps := common.DefaultCapabilities.Copy()
	caps.KubeVersion = *parseKubeVersion(t)
	vals, err := chartutil.ToRenderValuesWithSchemaValidation(ch, map[string]any{},
		common.ReleaseOptions{Name: "sluice", Namespace: "sluice-system", Revision: 2, IsUpgrade: true}, caps, false)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.RenderWithClientProvider(ch, vals, p)
	if err != nil {
		t.Fatal(err)
	}
	objs, _, err := kubetest.Decode([]byte(out["sluice/templates/webhook.yaml"]), "webhook.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var secret *corev1.Secret
	var caBundle []byte
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *corev1.Secret:
			secret = v
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			caBundle = v.Webhooks[0].ClientConfig.CABundle
			for _, w := range v.Webhooks {
				if string(w.ClientConfig.CABundle) != string(caBundle) {
					t.Fatalf("the webhooks' caBundles differ")
				}
			}
		}
	}
	if secret == nil || caBundle == nil {
		t.Fatalf("webhook.yaml: want a Secret and a webhook configuration")
	}
	return secret, caBundle
}

// inCluster turns a rendered Secret into the object a cluster would hold.
func inCluster(t *testing.T, s *corev1.Secret) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(s)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// TestChartKeepsItsCertificate: without cert-manager, helm upgrade keeps the
// CA and serving certificate the install made (lookup finds the Secret), so
// the caBundle never changes under the running injectors; where lookup
// finds nothing, as under helm template, or a Secret without all three
// keys, a new pair is made, which still agrees with its caBundle.
func TestChartKeepsItsCertificate(t *testing.T) {
	dnsNames := []string{"sluice-injector.sluice-system.svc", "sluice-injector.sluice-system.svc.cluster.local"}
	first, firstCA := renderAgainst(t, secretsProvider{})
	verifyServingPair(t, first.Data, firstCA, dnsNames)

	t.Run("nothing found: a new pair", func(t *testing.T) {
		again, againCA := renderAgainst(t, secretsProvider{})
		if string(againCA) == string(firstCA) || string(again.Data["tls.crt"]) == string(first.Data["tls.crt"]) {
			t.Error("two renders without a Secret in the cluster made the same CA or certificate")
		}
		verifyServingPair(t, again.Data, againCA, dnsNames)
	})

	t.Run("upgrade: the pair is kept", func(t *testing.T) {
		kept, keptCA := renderAgainst(t, secretsProvider{secrets: []runtime.Object{inCluster(t, first)}})
		for _, k := range []string{"tls.crt", "tls.key", "ca.crt"} {
			if string(kept.Data[k]) != string(first.Data[k]) {
				t.Errorf("%s changed on upgrade", k)
			}
		}
		if string(keptCA) != string(firstCA) {
			t.Error("the caBundle changed on upgrade")
		}
	})

	t.Run("a Secret without ca.crt: a new pair", func(t *testing.T) {
		partial := first.DeepCopy()
		delete(partial.Data, "ca.crt")
		made, madeCA := renderAgainst(t, secretsProvider{secrets: []runtime.Object{inCluster(t, partial)}})
		if string(made.Data["tls.crt"]) == string(first.Data["tls.crt"]) {
			t.Error("kept a serving certificate whose CA is unknown")
		}
		verifyServingPair(t, made.Data, madeCA, dnsNames)
	})

	t.Run("another release's Secret is not read", func(t *testing.T) {
		other := first.DeepCopy()
		other.Namespace = "elsewhere"
		made, _ := renderAgainst(t, secretsProvider{secrets: []runtime.Object{inCluster(t, other)}})
		if string(made.Data["tls.crt"]) == string(first.Data["tls.crt"]) {
			t.Error("read the Secret of another namespace")
		}
	})
}

// pendingFlags are flags the chart passes that `sluice injector` does not
// define yet: the periodic scan's. TestChartArgsParse runs the injector
// without them until it defines them, and then fails until they are taken
// off this list, so that from then on the injector checks their values.
var pendingFlags = map[string]bool{
	"scan-interval":         true,
	"webhook-configuration": true,
}

var helpFlag = regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`)

// TestChartArgsParse: the injector's arguments, as the chart renders them
// for each case, are flags `sluice injector` defines, and it accepts
// their values: it gets as far as reading the certificate files (which
// do not exist here), past parsing its flags and validating the sidecar's
// defaults (a quantity, a duration, a port, a NATS URL).
func TestChartArgsParse(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	help, _ := exec.Command(bin, "injector", "--help").CombinedOutput()
	defined := map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(string(help), -1) {
		defined[m[1]] = true
	}
	if !defined["tls-cert-file"] || !defined["image"] {
		t.Fatalf("sluice injector --help lists no --tls-cert-file or --image flag:\n%s", help)
	}
	for f := range pendingFlags {
		if defined[f] {
			t.Errorf("sluice injector now defines --%s: take it off pendingFlags", f)
		}
	}
	for _, c := range chartCases {
		t.Run(c.name, func(t *testing.T) {
			r := render(t, c)
			var args []string
			for _, a := range r.container(t).Args[1:] {
				name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if !defined[name] && pendingFlags[name] {
					continue
				}
				if !defined[name] {
					t.Errorf("%s: sluice injector has no such flag", a)
				}
				args = append(args, a)
			}
			// Loopback listeners, should the certificate files exist here.
			args = append(args, "--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0")
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, append([]string{"injector"}, args...)...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), "--tls-cert-file, --tls-key-file: read certificate") {
				t.Errorf("sluice injector %q: %v\n%s\nwant it to refuse only the missing certificate files", args, err, out)
			}
		})
	}
}
