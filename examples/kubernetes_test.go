package examples_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sluicehq/sluice/inject"
	"github.com/sluicehq/sluice/internal/kubetest"
)

// The cert-manager and kustomize kinds the examples use, by short names.
type (
	cmIssuer      = kubetest.Issuer
	cmCertificate = kubetest.Certificate
	kustomization = kubetest.Kustomization
)

// manifest is one decoded YAML document.
type manifest struct {
	file string // relative to examples/
	doc  int    // 1-based document number in file
	kind string // apiVersion/kind
	obj  any    // a pointer to the kubetest.Types value
}

func (m manifest) String() string { return fmt.Sprintf("%s#%d (%s)", m.file, m.doc, m.kind) }

// decodeManifests decodes every document of a YAML file with
// kubetest.Decode: strictly, each into its API type.
func decodeManifests(path, name string) (ms []manifest, skipped int, err error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	objs, skipped, err := kubetest.Decode(src, name)
	for _, o := range objs {
		ms = append(ms, manifest{file: name, doc: o.Doc, kind: o.Kind, obj: o.Obj})
	}
	return ms, skipped, err
}

// loadKubernetes decodes every YAML file under examples/kubernetes.
func loadKubernetes(t *testing.T) []manifest {
	t.Helper()
	var all []manifest
	var notObjects []string
	err := filepath.WalkDir("kubernetes", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml") {
			return err
		}
		ms, skipped, err := decodeManifests(path, filepath.ToSlash(path))
		if err != nil {
			return err
		}
		if skipped > 0 {
			notObjects = append(notObjects, filepath.ToSlash(path))
		}
		all = append(all, ms...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Only Helm values files hold no Kubernetes object: a manifest that lost
	// its apiVersion or kind must not pass as one.
	if want := []string{"kubernetes/fleet/nats-values.yaml"}; !slices.Equal(notObjects, want) {
		t.Errorf("documents without apiVersion and kind in %q, want only in %q", notObjects, want)
	}
	return all
}

// TestKubernetesManifestsStrict: every Kubernetes object under
// examples/kubernetes decodes strictly into its API type, and the strict
// decoding does catch what it should.
func TestKubernetesManifestsStrict(t *testing.T) {
	all := loadKubernetes(t)
	files := map[string]bool{}
	for _, m := range all {
		files[m.file] = true
	}
	for _, f := range []string{
		"kubernetes/app.yaml", "kubernetes/configmap.yaml", "kubernetes/deployment.yaml", "kubernetes/secret.yaml",
		"kubernetes/fleet/deployment.yaml", "kubernetes/injector/webhook.yaml", "kubernetes/injector/deployment.yaml",
		"kubernetes/injector/networkpolicy.yaml",
	} {
		if !files[f] {
			t.Errorf("%s: no object decoded", f)
		}
	}
	t.Logf("%d objects in %d files decode strictly", len(all), len(files))

	// A manifest that strict decoding must refuse, in a temp copy.
	t.Run("refused", func(t *testing.T) {
		src, err := os.ReadFile("kubernetes/injector/webhook.yaml")
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ name, old, new, want string }{
			{"unknown field", "    reinvocationPolicy: IfNeeded\n", "    reinvocationPolicy: IfNeeded\n    reinvokePolicy: Never\n", `unknown field "reinvokePolicy"`},
			{"key in the wrong case", "    sideEffects: None\n", "    sideeffects: None\n", `unknown field "webhooks[0].sideeffects"`},
			{"duplicate key", "    timeoutSeconds: 5\n", "    timeoutSeconds: 5\n    timeoutSeconds: 30\n", `"timeoutSeconds" already set`},
			{"unknown kind", "kind: MutatingWebhookConfiguration\n", "kind: MutatingWebhookConfig\n", "unknown apiVersion/kind"},
			{"wrong type", "port: 443\n", "port: https\n", "port"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if !bytes.Contains(src, []byte(tc.old)) {
					t.Fatalf("webhook.yaml has no %q to change", tc.old)
				}
				bad := filepath.Join(t.TempDir(), "webhook.yaml")
				if err := os.WriteFile(bad, bytes.Replace(src, []byte(tc.old), []byte(tc.new), 1), 0o600); err != nil {
					t.Fatal(err)
				}
				_, _, err := decodeManifests(bad, "webhook.yaml")
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("decode: %v, want an error with %q", err, tc.want)
				}
			})
		}
	})
}

// injector holds the objects of examples/kubernetes/injector, by kind.
type injector struct {
	namespace  *corev1.Namespace
	account    *corev1.ServiceAccount
	role       *rbacv1.ClusterRole
	binding    *rbacv1.ClusterRoleBinding
	service    *corev1.Service
	deployment *appsv1.Deployment
	pdb        *policyv1.PodDisruptionBudget
	netpol     *networkingv1.NetworkPolicy
	webhooks   *admissionregistrationv1.MutatingWebhookConfiguration
	issuers    map[string]*cmIssuer
	certs      map[string]*cmCertificate
	kustomize  *kustomization
	files      []string // the files other than kustomization.yaml
	namespaced []metav1.Object
}

func loadInjector(t *testing.T) *injector {
	t.Helper()
	in := &injector{issuers: map[string]*cmIssuer{}, certs: map[string]*cmCertificate{}}
	once := func(m manifest, set bool) {
		if set {
			t.Fatalf("%v: a second one", m)
		}
	}
	for _, m := range loadKubernetes(t) {
		file, ok := strings.CutPrefix(m.file, "kubernetes/injector/")
		if !ok {
			continue
		}
		if file != "kustomization.yaml" && !slices.Contains(in.files, file) {
			in.files = append(in.files, file)
		}
		switch o := m.obj.(type) {
		case *corev1.Namespace:
			once(m, in.namespace != nil)
			in.namespace = o
		case *corev1.ServiceAccount:
			once(m, in.account != nil)
			in.account = o
		case *rbacv1.ClusterRole:
			once(m, in.role != nil)
			in.role = o
		case *rbacv1.ClusterRoleBinding:
			once(m, in.binding != nil)
			in.binding = o
		case *corev1.Service:
			once(m, in.service != nil)
			in.service = o
		case *appsv1.Deployment:
			once(m, in.deployment != nil)
			in.deployment = o
		case *policyv1.PodDisruptionBudget:
			once(m, in.pdb != nil)
			in.pdb = o
		case *networkingv1.NetworkPolicy:
			once(m, in.netpol != nil)
			in.netpol = o
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			once(m, in.webhooks != nil)
			in.webhooks = o
		case *cmIssuer:
			once(m, in.issuers[o.Name] != nil)
			in.issuers[o.Name] = o
		case *cmCertificate:
			once(m, in.certs[o.Name] != nil)
			in.certs[o.Name] = o
		case *kustomization:
			once(m, in.kustomize != nil)
			in.kustomize = o
			continue
		default:
			t.Fatalf("%v: not expected in injector/", m)
		}
		if o, ok := m.obj.(metav1.Object); ok && m.kind != "v1/Namespace" && m.kind != "admissionregistration.k8s.io/v1/MutatingWebhookConfiguration" &&
			!strings.HasPrefix(m.kind, "rbac.authorization.k8s.io/v1/Cluster") {
			in.namespaced = append(in.namespaced, o)
		}
	}
	for name, missing := range map[string]bool{
		"Namespace": in.namespace == nil, "ServiceAccount": in.account == nil, "Service": in.service == nil,
		"ClusterRole": in.role == nil, "ClusterRoleBinding": in.binding == nil,
		"Deployment": in.deployment == nil, "PodDisruptionBudget": in.pdb == nil, "NetworkPolicy": in.netpol == nil,
		"MutatingWebhookConfiguration": in.webhooks == nil, "Kustomization": in.kustomize == nil,
	} {
		if missing {
			t.Fatalf("injector/: no %s", name)
		}
	}
	return in
}

// TestKubernetesInjector: the injector's manifests agree with each other and
// with what the API server and the injector expect of them.
func TestKubernetesInjector(t *testing.T) {
	in := loadInjector(t)
	const ns = "sluice-system"

	t.Run("namespace", func(t *testing.T) {
		if in.namespace.Name != ns {
			t.Errorf("Namespace %q, want %q", in.namespace.Name, ns)
		}
		for _, o := range in.namespaced {
			if o.GetNamespace() != ns {
				t.Errorf("%T %s in namespace %q, want %q", o, o.GetName(), o.GetNamespace(), ns)
			}
		}
	})

	t.Run("kustomization", func(t *testing.T) {
		got := slices.Sorted(slices.Values(in.kustomize.Resources))
		if want := slices.Sorted(slices.Values(in.files)); !slices.Equal(got, want) {
			t.Errorf("kustomization resources %q, want the directory's manifests %q", got, want)
		}
	})

	svc := in.service
	dep := in.deployment
	pod := dep.Spec.Template
	t.Run("webhooks", func(t *testing.T) {
		wc := in.webhooks
		if got, want := wc.Annotations["cert-manager.io/inject-ca-from"], ns+"/sluice-injector-tls"; got != want {
			t.Errorf("inject-ca-from %q, want %q", got, want)
		}
		if c := in.certs["sluice-injector-tls"]; c == nil || c.Namespace+"/"+c.Name != wc.Annotations["cert-manager.io/inject-ca-from"] {
			t.Errorf("inject-ca-from names no Certificate in certificate.yaml")
		}
		paths := map[string]string{}
		for _, w := range wc.Webhooks {
			// What the API server's validation requires of a webhook.
			if len(strings.Split(w.Name, ".")) < 3 || len(validation.IsDNS1123Subdomain(w.Name)) > 0 {
				t.Errorf("%s: a webhook's name must be a domain name with at least three segments", w.Name)
			}
			if !slices.Equal(w.AdmissionReviewVersions, []string{"v1"}) {
				t.Errorf("%s: admissionReviewVersions %q, want [v1]", w.Name, w.AdmissionReviewVersions)
			}
			if w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNone {
				t.Errorf("%s: sideEffects %v, want None", w.Name, w.SideEffects)
			}
			if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Ignore {
				t.Errorf("%s: failurePolicy %v, want Ignore", w.Name, w.FailurePolicy)
			}
			if w.ReinvocationPolicy == nil || *w.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy {
				t.Errorf("%s: reinvocationPolicy %v, want IfNeeded", w.Name, w.ReinvocationPolicy)
			}
			if w.TimeoutSeconds == nil || *w.TimeoutSeconds != 5 {
				t.Errorf("%s: timeoutSeconds %v, want 5", w.Name, w.TimeoutSeconds)
			}
			if len(w.Rules) != 1 {
				t.Fatalf("%s: %d rules, want 1", w.Name, len(w.Rules))
			}
			r := w.Rules[0]
			if !slices.Equal(r.Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) ||
				!slices.Equal(r.APIGroups, []string{""}) || !slices.Equal(r.APIVersions, []string{"v1"}) ||
				!slices.Equal(r.Resources, []string{"pods"}) {
				t.Errorf("%s: rule %+v, want CREATE of v1 pods in the core group", w.Name, r)
			}
			s := w.ClientConfig.Service
			if s == nil || w.ClientConfig.URL != nil {
				t.Fatalf("%s: clientConfig must name the Service", w.Name)
			}
			if s.Name != svc.Name || s.Namespace != svc.Namespace {
				t.Errorf("%s: calls Service %s/%s, service.yaml is %s/%s", w.Name, s.Namespace, s.Name, svc.Namespace, svc.Name)
			}
			if s.Port == nil || *s.Port != 443 || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == *s.Port }) {
				t.Errorf("%s: port %v, want 443, a port of the Service", w.Name, s.Port)
			}
			if s.Path == nil {
				t.Fatalf("%s: no path", w.Name)
			}
			// The API server refuses a path whose segments are not DNS-1123
			// subdomains (ValidateWebhookService): no query string.
			for i, seg := range strings.Split(strings.Trim(*s.Path, "/"), "/") {
				if errs := validation.IsDNS1123Subdomain(seg); len(errs) > 0 || !strings.HasPrefix(*s.Path, "/") {
					t.Errorf("%s: path %q segment[%d] is refused by the API server: %v", w.Name, *s.Path, i, errs)
				}
			}
			paths[w.Name] = *s.Path
		}
		if want := map[string]string{
			"namespace.inject.sluice.io": inject.NamespacePath,
			"pod.inject.sluice.io":       inject.PodPath,
		}; !maps.Equal(paths, want) {
			t.Errorf("webhooks and paths %v, want %v", paths, want)
		}
	})

	t.Run("selectors", func(t *testing.T) {
		type sel struct{ ns, obj labels.Selector }
		sels := map[string]sel{}
		for _, w := range in.webhooks.Webhooks {
			n, err := metav1.LabelSelectorAsSelector(w.NamespaceSelector)
			if err != nil || w.NamespaceSelector == nil {
				t.Fatalf("%s: namespaceSelector %v: %v", w.Name, w.NamespaceSelector, err)
			}
			o, err := metav1.LabelSelectorAsSelector(w.ObjectSelector)
			if err != nil || w.ObjectSelector == nil {
				t.Fatalf("%s: objectSelector %v: %v", w.Name, w.ObjectSelector, err)
			}
			sels[w.Name] = sel{n, o}
		}
		// namespace returns a namespace's labels as the API server sets them.
		namespace := func(name string, kv ...string) labels.Set {
			l := labels.Set{"kubernetes.io/metadata.name": name}
			for i := 0; i+1 < len(kv); i += 2 {
				l[kv[i]] = kv[i+1]
			}
			return l
		}
		enabled := []string{"sluice.io/inject", "enabled"}
		podIn, podOut := labels.Set{"app": "billing", "sluice.io/inject": "true"}, labels.Set{"app": "billing", "sluice.io/inject": "false"}
		plain := labels.Set{"app": "billing"}
		for _, tc := range []struct {
			name string
			ns   labels.Set
			pod  labels.Set
			want string // the webhook that reviews the pod, or ""
		}{
			{"opted-in namespace, plain pod", namespace("team-a", enabled...), plain, "namespace.inject.sluice.io"},
			{"opted-in namespace, pod opts in too", namespace("team-a", enabled...), podIn, "namespace.inject.sluice.io"},
			{"opted-in namespace, pod opts out", namespace("team-a", enabled...), podOut, ""},
			{"plain namespace, plain pod", namespace("team-b"), plain, ""},
			{"plain namespace, pod opts in", namespace("team-b"), podIn, "pod.inject.sluice.io"},
			{"plain namespace, pod opts out", namespace("team-b"), podOut, ""},
			{"namespace label other than enabled, pod opts in", namespace("team-c", "sluice.io/inject", "disabled"), podIn, "pod.inject.sluice.io"},
			{"kube-system, even opted in", namespace("kube-system", enabled...), podIn, ""},
			{"sluice-system, even opted in", namespace(ns, enabled...), podIn, ""},
			{"kube-system, pod opts in", namespace("kube-system"), podIn, ""},
			{"sluice-system, pod opts in", namespace(ns), podIn, ""},
			{"the injector's own pods", labels.Merge(in.namespace.Labels, namespace(in.namespace.Name)), labels.Set(pod.Labels), ""},
			// A revision installed beside this one takes these (the chart's
			// revision): a namespace labelled sluice.io/rev, whatever else
			// it says, and a pod so labelled in a plain namespace.
			{"namespace of a revision", namespace("team-d", "sluice.io/rev", "canary"), plain, ""},
			{"namespace of a revision, opted in too", namespace("team-d", "sluice.io/rev", "canary", "sluice.io/inject", "enabled"), podIn, ""},
			{"plain namespace, pod of a revision", namespace("team-b"), labels.Set{"sluice.io/inject": "true", "sluice.io/rev": "canary"}, ""},
			{"opted-in namespace, pod of a revision: the namespace decides", namespace("team-a", enabled...), labels.Set{"sluice.io/rev": "canary"}, "namespace.inject.sluice.io"},
		} {
			var got []string
			for name, s := range sels {
				if s.ns.Matches(tc.ns) && s.obj.Matches(tc.pod) {
					got = append(got, name)
				}
			}
			if len(got) > 1 || tc.want == "" && len(got) > 0 || tc.want != "" && !slices.Equal(got, []string{tc.want}) {
				t.Errorf("%s: reviewed by %q, want %q", tc.name, got, tc.want)
			}
		}
	})

	t.Run("service", func(t *testing.T) {
		if svc.Name != "sluice-injector" {
			t.Errorf("Service %q, want sluice-injector", svc.Name)
		}
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) || len(svc.Spec.Selector) == 0 {
			t.Errorf("Service selector %v does not match the Deployment's pods %v", svc.Spec.Selector, pod.Labels)
		}
	})

	t.Run("rbac", func(t *testing.T) {
		// Read-only, and no more than the scan reads: list pods and
		// namespaces, get the one webhook configuration.
		want := []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"list"}},
			{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"},
				ResourceNames: []string{in.webhooks.Name}, Verbs: []string{"get"}},
		}
		if !equality.Semantic.DeepEqual(in.role.Rules, want) {
			t.Errorf("ClusterRole rules %+v, want %+v", in.role.Rules, want)
		}
		b := in.binding
		if b.RoleRef != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: in.role.Name}) {
			t.Errorf("ClusterRoleBinding roleRef %+v, want the ClusterRole %s", b.RoleRef, in.role.Name)
		}
		if want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: in.account.Name, Namespace: in.account.Namespace}}; !slices.Equal(b.Subjects, want) {
			t.Errorf("ClusterRoleBinding subjects %+v, want the injector's ServiceAccount", b.Subjects)
		}
	})

	t.Run("deployment", func(t *testing.T) {
		spec := pod.Spec
		if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
			t.Errorf("replicas %v, want 2", dep.Spec.Replicas)
		}
		sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
			t.Errorf("selector %v does not match the pod labels %v: %v", dep.Spec.Selector, pod.Labels, err)
		}
		if a := spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
			a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
			t.Errorf("want one preferred pod anti-affinity term across nodes, got %+v", spec.Affinity)
		} else if s, err := metav1.LabelSelectorAsSelector(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector); err != nil || !s.Matches(labels.Set(pod.Labels)) {
			t.Errorf("the anti-affinity term does not select the injector's pods: %v", err)
		}
		if spec.ServiceAccountName != in.account.Name {
			t.Errorf("serviceAccountName %q, rbac.yaml has %q", spec.ServiceAccountName, in.account.Name)
		}
		// The token is the scan's (rbac.yaml): mounted in the injector's
		// pod only, not for every pod of the ServiceAccount.
		if b := in.account.AutomountServiceAccountToken; b == nil || *b {
			t.Error("ServiceAccount: automountServiceAccountToken must be false")
		}
		if b := spec.AutomountServiceAccountToken; b == nil || !*b {
			t.Error("pod: automountServiceAccountToken must be true, for the scan")
		}
		if spec.PriorityClassName != "" {
			t.Errorf("priorityClassName %q: see the comment in deployment.yaml", spec.PriorityClassName)
		}
		if ps := spec.SecurityContext; ps == nil || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
			ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot {
			t.Errorf("pod securityContext %+v: want runAsNonRoot and seccomp RuntimeDefault", ps)
		}
		if len(spec.Containers) != 1 || len(spec.InitContainers) != 0 {
			t.Fatalf("want one container, got %d (and %d init containers)", len(spec.Containers), len(spec.InitContainers))
		}
		c := spec.Containers[0]
		if c.Image != "ghcr.io/sluicehq/sluice:latest" {
			t.Errorf("image %q", c.Image)
		}
		flags := map[string]string{}
		if len(c.Args) == 0 || c.Args[0] != "injector" {
			t.Fatalf("args %q: want the injector subcommand first", c.Args)
		}
		for _, a := range c.Args[1:] {
			k, v, ok := strings.Cut(a, "=")
			if !ok || !strings.HasPrefix(k, "--") {
				t.Fatalf("arg %q: want --flag=value", a)
			}
			flags[k] = v
		}
		port := func(flag string) int32 {
			_, p, err := net.SplitHostPort(flags[flag])
			n, err2 := strconv.Atoi(p)
			if err != nil || err2 != nil {
				t.Fatalf("%s=%q: want host:port", flag, flags[flag])
			}
			return int32(n)
		}
		if flags["--scan-interval"] != "1m" {
			t.Errorf("--scan-interval=%q, want 1m", flags["--scan-interval"])
		}
		if flags["--listen"] != "0.0.0.0:8443" || flags["--admin-listen"] != "0.0.0.0:8702" {
			t.Errorf("--listen=%s --admin-listen=%s, want 0.0.0.0:8443 and 0.0.0.0:8702", flags["--listen"], flags["--admin-listen"])
		}
		// The Service's target port is the webhook listener.
		webhookPort, adminPort := port("--listen"), port("--admin-listen")
		kubetest.CheckInjectorPorts(t, svc, &c, webhookPort, adminPort)
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("resources %+v: want CPU and memory requests and a memory limit", c.Resources)
		}
		sc := c.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 ||
			sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("container securityContext %+v: want it locked down", sc)
		}

		// The TLS flags name files in the mounted Secret that cert-manager
		// writes from the serving Certificate.
		cert := in.certs["sluice-injector-tls"]
		if cert == nil {
			t.Fatal("no Certificate sluice-injector-tls")
		}
		for flag, file := range map[string]string{"--tls-cert-file": "tls.crt", "--tls-key-file": "tls.key"} {
			dir, base := filepath.Split(flags[flag])
			if base != file {
				t.Errorf("%s=%s: cert-manager names the file %s", flag, flags[flag], file)
			}
			i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return filepath.Clean(m.MountPath) == filepath.Clean(dir) })
			if i < 0 {
				t.Errorf("%s=%s: no volume mounted at %s", flag, flags[flag], dir)
				continue
			}
			vm := c.VolumeMounts[i]
			v := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
			if v < 0 || spec.Volumes[v].Secret == nil {
				t.Errorf("%s: volume %q is not a Secret", flag, vm.Name)
				continue
			}
			if got := spec.Volumes[v].Secret.SecretName; got != cert.Spec.SecretName || got != "sluice-injector-tls" {
				t.Errorf("%s: Secret %q, the Certificate writes %q", flag, got, cert.Spec.SecretName)
			}
			if !vm.ReadOnly {
				t.Errorf("%s: mount it read-only", flag)
			}
		}
	})

	t.Run("pdb", func(t *testing.T) {
		if in.pdb.Spec.MinAvailable == nil || in.pdb.Spec.MinAvailable.IntValue() != 1 || in.pdb.Spec.MaxUnavailable != nil {
			t.Errorf("minAvailable %v, want 1", in.pdb.Spec.MinAvailable)
		}
		s, err := metav1.LabelSelectorAsSelector(in.pdb.Spec.Selector)
		if err != nil || s.Empty() || !s.Matches(labels.Set(pod.Labels)) {
			t.Errorf("PDB selector %v does not match the Deployment's pods %v: %v", in.pdb.Spec.Selector, pod.Labels, err)
		}
	})

	t.Run("networkpolicy", func(t *testing.T) {
		np := in.netpol.Spec
		s, err := metav1.LabelSelectorAsSelector(&np.PodSelector)
		if err != nil || s.Empty() || !s.Matches(labels.Set(pod.Labels)) {
			t.Errorf("podSelector %v does not select the Deployment's pods %v: %v", np.PodSelector, pod.Labels, err)
		}
		if !slices.Equal(np.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("policyTypes %q, want [Ingress]", np.PolicyTypes)
		}
		c := pod.Spec.Containers[0]
		// containerPort resolves a rule's port, a number or a name.
		containerPort := func(p networkingv1.NetworkPolicyPort) int32 {
			if p.Port == nil || p.EndPort != nil || p.Protocol == nil || *p.Protocol != corev1.ProtocolTCP {
				t.Fatalf("rule port %+v: want one TCP port", p)
			}
			if p.Port.StrVal == "" {
				return p.Port.IntVal
			}
			i := slices.IndexFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.Port.StrVal })
			if i < 0 {
				t.Fatalf("rule port %q names no container port", p.Port.StrVal)
			}
			return c.Ports[i].ContainerPort
		}
		named := map[string]int32{}
		for _, cp := range c.Ports {
			named[cp.Name] = cp.ContainerPort
		}
		// Which rules open each port; a rule without ports would open all.
		opens := map[int32][]networkingv1.NetworkPolicyIngressRule{}
		for i, r := range np.Ingress {
			if len(r.Ports) == 0 {
				t.Errorf("ingress rule %d has no ports: it opens every port", i)
			}
			for _, p := range r.Ports {
				opens[containerPort(p)] = append(opens[containerPort(p)], r)
			}
		}
		if got, want := slices.Sorted(maps.Keys(opens)), []int32{named["webhook"], named["admin"]}; !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			t.Errorf("ports opened %v, want the webhook and admin ports %v only", got, want)
		}
		// The API server must reach the webhook port: from anywhere (the
		// shipped choice) or from addresses only.
		for _, r := range opens[named["webhook"]] {
			for _, peer := range r.From {
				if peer.IPBlock == nil {
					t.Errorf("the webhook port is open to %+v: the API server is no pod a selector can name", peer)
				}
			}
		}
		// The admin port: this namespace's pods, or named namespaces; never
		// every namespace or every address.
		for _, r := range opens[named["admin"]] {
			if len(r.From) == 0 {
				t.Error("the admin port is open to every source")
			}
			for _, peer := range r.From {
				switch {
				case peer.IPBlock != nil:
					t.Errorf("the admin port is open to addresses %+v", peer.IPBlock)
				case peer.NamespaceSelector != nil:
					if ns, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector); err != nil || ns.Empty() {
						t.Errorf("the admin port is open to namespaces %v: want named ones", peer.NamespaceSelector)
					}
				case peer.PodSelector == nil:
					t.Errorf("admin peer %+v selects nothing", peer)
				}
			}
		}
	})

	t.Run("certificates", func(t *testing.T) {
		cert := in.certs["sluice-injector-tls"]
		if cert == nil {
			t.Fatal("no Certificate sluice-injector-tls")
		}
		for _, w := range in.webhooks.Webhooks {
			s := w.ClientConfig.Service
			// The API server checks the serving certificate against
			// <service>.<namespace>.svc.
			if name := s.Name + "." + s.Namespace + ".svc"; !slices.Contains(cert.Spec.DNSNames, name) || !slices.Contains(cert.Spec.DNSNames, name+".cluster.local") {
				t.Errorf("dnsNames %q: want %s and %s.cluster.local", cert.Spec.DNSNames, name, name)
			}
		}
		if cert.Spec.IsCA || !slices.Contains(cert.Spec.Usages, "server auth") {
			t.Errorf("serving certificate: isCA %v, usages %q: want a server certificate", cert.Spec.IsCA, cert.Spec.Usages)
		}
		// The chain: serving cert ← CA Issuer ← CA Certificate ← selfSigned Issuer.
		caIssuer := in.issuers[cert.Spec.IssuerRef.Name]
		if cert.Spec.IssuerRef.Kind != "Issuer" || caIssuer == nil || caIssuer.Spec.CA == nil {
			t.Fatalf("serving certificate's issuer %+v: want a CA Issuer in certificate.yaml", cert.Spec.IssuerRef)
		}
		var ca *cmCertificate
		for _, c := range in.certs {
			if c.Spec.SecretName == caIssuer.Spec.CA.SecretName {
				ca = c
			}
		}
		if ca == nil || !ca.Spec.IsCA {
			t.Fatalf("CA Issuer's Secret %q is written by no isCA Certificate", caIssuer.Spec.CA.SecretName)
		}
		root := in.issuers[ca.Spec.IssuerRef.Name]
		if ca.Spec.IssuerRef.Kind != "Issuer" || root == nil || root.Spec.SelfSigned == nil {
			t.Errorf("CA Certificate's issuer %+v: want the selfSigned Issuer", ca.Spec.IssuerRef)
		}
	})
}
