package charts

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluicehq/sluice/internal/kubetest"
)

// example is the plain manifests of examples/kubernetes/injector/, the
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
				t.Errorf("webhook %d:\nchart   %s\nexample %s", i, show(w), show(e))
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
				t.Errorf("%s: the example's %s, the chart's %s", what, show(pair[0]), show(pair[1]))
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
				t.Errorf("container %s: the example's %s, the chart's %s", what, show(pair[0]), show(pair[1]))
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
				t.Errorf("%s: the example's %s, the chart's %s", what, show(pair[0]), show(pair[1]))
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

// show formats a value of an API type for a failure message, as JSON.
func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
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
