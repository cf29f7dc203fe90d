package charts

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sluicehq/sluice/inject"
	"github.com/sluicehq/sluice/internal/kubetest"
)

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
	// render refuses any other kind: a Namespace among them (helm install
	// --create-namespace makes it).
	for what, ok := range map[string]bool{
		"a Secret iff certManager.enabled is false":        (r.secret != nil) != certManager,
		"Issuers and Certificates iff certManager.enabled": (len(r.issuers) == 2 && len(r.certs) == 2) == certManager && (len(r.issuers)+len(r.certs) == 0) != certManager,
		"a ClusterRole and its binding iff scan.enabled":   (r.clusterRole != nil) == scan && (r.binding != nil) == scan,
		"a PodDisruptionBudget iff pdb.enabled":            (r.pdb != nil) == r.boolean(t, "pdb.enabled"),
		"a NetworkPolicy iff networkPolicy.enabled":        (r.netpol != nil) == r.boolean(t, "networkPolicy.enabled"),
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
			"app.kubernetes.io/name": r.appName(), "app.kubernetes.io/instance": r.release,
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
	// A revision's opt-in is its label, on a namespace or on a pod; its
	// pods are reviewed as those of an opted-in namespace.
	revision := r.str(t, "webhook.revision")
	nsIn, podIn, podPath := labels.Set{"sluice.io/inject": "enabled"}, labels.Set{"sluice.io/inject": "true"}, inject.PodPath
	if revision != "" {
		nsIn, podIn, podPath = labels.Set{"sluice.io/rev": revision}, labels.Set{"sluice.io/rev": revision}, inject.NamespacePath
	}
	if want := map[string]string{
		"namespace.inject.sluice.io": inject.NamespacePath,
		"pod.inject.sluice.io":       podPath,
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
	for _, ns := range excluded {
		for _, nsLabels := range []labels.Set{{}, nsIn} {
			l := labels.Merge(nsLabels, labels.Set{"kubernetes.io/metadata.name": ns})
			if got := reviewer(l, podIn); len(got) > 0 {
				t.Errorf("an opted-in pod of namespace %s (labels %v) is reviewed by %q", ns, l, got)
			}
		}
	}
	if got := reviewer(labels.Merge(nsIn, labels.Set{"kubernetes.io/metadata.name": "team-a"}), labels.Set{}); !slices.Equal(got, []string{"namespace.inject.sluice.io"}) {
		t.Errorf("a pod of an opted-in namespace is reviewed by %q", got)
	}
	if got := reviewer(labels.Set{"kubernetes.io/metadata.name": "team-b"}, podIn); !slices.Equal(got, []string{"pod.inject.sluice.io"}) {
		t.Errorf("an opted-in pod of another namespace is reviewed by %q", got)
	}
	// The injector's own pods, wherever they run.
	if got := reviewer(labels.Merge(nsIn, labels.Set{"kubernetes.io/metadata.name": r.namespace}),
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
	kubetest.CheckInjectorPorts(t, r.service, &c, webhookPort, adminPort)

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
	if msg := kubetest.Restricted(t, pod); msg != "" {
		t.Errorf("Pod Security restricted refuses the injector's pod: %s", msg)
	}
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

// TestChartRevisions: the default release and a revision installed beside
// it (testdata/revision.yaml) never both review a pod. A namespace's label
// decides for all its pods; a pod's own label counts only in a namespace
// that has none.
func TestChartRevisions(t *testing.T) {
	type sel struct{ ns, obj labels.Selector }
	sels := map[string]sel{} // "release/webhook"
	for _, c := range []chartCase{caseNamed(t, "defaults"), caseNamed(t, "revision canary")} {
		for _, w := range render(t, c).webhooks.Webhooks {
			n, err := metav1.LabelSelectorAsSelector(w.NamespaceSelector)
			if err != nil {
				t.Fatal(err)
			}
			o, err := metav1.LabelSelectorAsSelector(w.ObjectSelector)
			if err != nil {
				t.Fatal(err)
			}
			sels[c.release+"/"+w.Name] = sel{n, o}
		}
	}
	ns := func(kv ...string) labels.Set {
		l := labels.Set{"kubernetes.io/metadata.name": "team"}
		for i := 0; i+1 < len(kv); i += 2 {
			l[kv[i]] = kv[i+1]
		}
		return l
	}
	for _, tc := range []struct {
		name    string
		ns, pod labels.Set
		want    string // release/webhook, or ""
	}{
		{"default namespace", ns("sluice.io/inject", "enabled"), labels.Set{}, "sluice/namespace.inject.sluice.io"},
		{"canary namespace", ns("sluice.io/rev", "canary"), labels.Set{}, "sluice-canary/namespace.inject.sluice.io"},
		{"canary namespace, still labelled for the default", ns("sluice.io/rev", "canary", "sluice.io/inject", "enabled"), labels.Set{}, "sluice-canary/namespace.inject.sluice.io"},
		{"canary namespace, pod opted out", ns("sluice.io/rev", "canary"), labels.Set{"sluice.io/inject": "false"}, ""},
		{"default namespace, pod of the canary: the namespace decides", ns("sluice.io/inject", "enabled"), labels.Set{"sluice.io/rev": "canary"}, "sluice/namespace.inject.sluice.io"},
		{"plain namespace, default pod", ns(), labels.Set{"sluice.io/inject": "true"}, "sluice/pod.inject.sluice.io"},
		{"plain namespace, canary pod", ns(), labels.Set{"sluice.io/rev": "canary"}, "sluice-canary/pod.inject.sluice.io"},
		{"plain namespace, pod with both labels", ns(), labels.Set{"sluice.io/rev": "canary", "sluice.io/inject": "true"}, "sluice-canary/pod.inject.sluice.io"},
		{"plain namespace, canary pod opted out", ns(), labels.Set{"sluice.io/rev": "canary", "sluice.io/inject": "false"}, ""},
		{"another revision's namespace", ns("sluice.io/rev", "stable"), labels.Set{"sluice.io/inject": "true"}, ""},
		{"plain namespace, plain pod", ns(), labels.Set{}, ""},
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
}
