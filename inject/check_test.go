package inject

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"
)

// shippedWebhooks are the webhooks of the shipped webhook.yaml, so Check is
// tested against the selectors users install.
func shippedWebhooks(t *testing.T) []admissionregistrationv1.MutatingWebhook {
	t.Helper()
	y, err := os.ReadFile("../examples/kubernetes/injector/webhook.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j, err := sigsyaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if strict, err := kjson.UnmarshalStrict(j, &mwc); err != nil || len(strict) > 0 {
		t.Fatal(err, strict)
	}
	return mwc.Webhooks
}

// check is Check of k8s.io/api objects, passed as the API server's JSON
// of them, which is what Check's own types read.
func check(t *testing.T, pod *corev1.Pod, ns *corev1.Namespace, webhooks []admissionregistrationv1.MutatingWebhook) Verdict {
	t.Helper()
	var p Pod
	var n Namespace
	var ws []MutatingWebhook
	for _, c := range []struct{ from, to any }{{pod, &p}, {ns, &n}, {webhooks, &ws}} {
		b, err := json.Marshal(c.from)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, c.to); err != nil {
			t.Fatal(err)
		}
	}
	return Check(&p, &n, ws, Defaults())
}

func namespace(name string, kv ...string) *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/metadata.name": name}}}
	for i := 0; i+1 < len(kv); i += 2 {
		ns.Labels[kv[i]] = kv[i+1]
	}
	return ns
}

// storedPod is deploymentPod as the API server stores it: named, and in ns.
func storedPod(ns string, edits ...func(p *corev1.Pod)) *corev1.Pod {
	p := deploymentPod()
	p.Name, p.Namespace = p.GenerateName+"x7k2q", ns
	return with(p, edits...)
}

func sidecar(p *corev1.Pod) {
	p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: ContainerName, Image: DefaultImage})
}

func TestCheck(t *testing.T) {
	webhooks := shippedWebhooks(t)
	enabled := namespace("billing", "sluice.io/inject", "enabled")
	plain := namespace("shop")
	for _, c := range []struct {
		name    string
		pod     *corev1.Pod
		ns      *corev1.Namespace
		webhook string // "" for none
		want    bool
		cause   Cause
		why     string
	}{
		{"opted-in namespace, no sidecar", storedPod("billing"), enabled, "namespace.inject.sluice.io", true, NotInjected, "namespace is opted in"},
		{"opted-in namespace, injected", storedPod("billing", sidecar), enabled, "namespace.inject.sluice.io", true, "", "namespace is opted in"},
		{"opted-in namespace, pod labelled out", storedPod("billing", label(AnnotationInject, "false")), enabled, "", false, "", "objectSelector"},
		{"opted-in namespace, pod annotated out", storedPod("billing", annotate(AnnotationInject, "false")), enabled, "namespace.inject.sluice.io", false, "", `annotated sluice.io/inject: "false"`},
		{"pod labelled in", storedPod("shop", label(AnnotationInject, "true")), plain, "pod.inject.sluice.io", true, NotInjected, `labelled sluice.io/inject: "true"`},
		{"pod annotated in only: no webhook sees it", storedPod("shop", annotate(AnnotationInject, "true")), plain, "", false, "", "objectSelector"},
		{"pod not asking", storedPod("shop"), plain, "", false, "", "no webhook selects it"},
		{"injected by sluice inject, not asked", storedPod("shop", sidecar), plain, "", false, "", "no webhook selects it"},
		{"a revision's namespace", storedPod("billing"), namespace("billing", "sluice.io/inject", "enabled", "sluice.io/rev", "canary"), "", false, "", "sluice.io/rev"},
		{"kube-system opted in", storedPod("kube-system"), namespace("kube-system", "sluice.io/inject", "enabled"), "", false, "", "kube-system"},
		{"the injector's namespace", storedPod("sluice-system", label(AnnotationInject, "true")), namespace("sluice-system"), "", false, "", "sluice-system"},
		{"hostNetwork: the review warns", storedPod("billing", func(p *corev1.Pod) { p.Spec.HostNetwork = true }), enabled, "namespace.inject.sluice.io", false, BadInput, "hostNetwork"},
		{"port taken: the review warns", storedPod("billing", addPort(0, DefaultIngestPort)), enabled, "namespace.inject.sluice.io", false, BadInput, "8700"},
		{"bad annotation: the review warns", storedPod("billing", annotate(AnnotationPrefix+"grace", "soon")), enabled, "namespace.inject.sluice.io", false, BadInput, "grace"},
		{"finished", storedPod("billing", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), enabled, "", false, "", "finished"},
		{"being deleted", storedPod("billing", func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }), enabled, "", false, "", "deleted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := check(t, c.pod, c.ns, webhooks)
			if v.Webhook != c.webhook || v.Want != c.want || v.Cause != c.cause || !strings.Contains(v.Why, c.why) {
				t.Errorf("got webhook %q want %v cause %q why %q;\nwant webhook %q want %v cause %q, why saying %q",
					v.Webhook, v.Want, v.Cause, v.Why, c.webhook, c.want, c.cause, c.why)
			}
			if v.Missing() != (c.cause != "") {
				t.Errorf("Missing() = %v with cause %q", v.Missing(), v.Cause)
			}
			if v.Owner != "ReplicaSet/billing-7d9f4c5b8" {
				t.Errorf("owner %q", v.Owner)
			}
			// What Check says a review does is what Review does with the
			// pod as it was created (no name yet, no status).
			if v.Webhook == "" || v.Has || c.pod.Status.Phase != "" || c.pod.DeletionTimestamp != nil {
				return
			}
			created := c.pod.DeepCopy()
			created.Name = ""
			_, result := Review(request(t, created, nil), Defaults(), v.Webhook == "namespace.inject.sluice.io")
			want := map[Cause]Result{NotInjected: Injected, BadInput: Warned, "": Skipped}[v.Cause]
			if result != want {
				t.Errorf("Review says %s, Check's cause %q says %s", result, v.Cause, want)
			}
		})
	}
}

// TestCheckWebhooks covers configurations other than the shipped one: an
// operator's edits count as the API server counts them.
func TestCheckWebhooks(t *testing.T) {
	pod := storedPod("shop", label(AnnotationInject, "true"))
	ns := namespace("shop")
	shipped := shippedWebhooks(t)
	byURL := shipped[1].DeepCopy()
	url := "https://127.0.0.1:8443" + PodPath
	byURL.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url}
	otherPath := shipped[1].DeepCopy()
	other := "/validate"
	otherPath.ClientConfig.Service.Path = &other
	noPods := shipped[1].DeepCopy()
	noPods.Rules[0].Resources = []string{"deployments"}
	nilSelectors := shipped[1].DeepCopy()
	nilSelectors.NamespaceSelector, nilSelectors.ObjectSelector = nil, nil
	for _, c := range []struct {
		name     string
		webhooks []admissionregistrationv1.MutatingWebhook
		want     bool
		why      string
	}{
		{"none", nil, false, "no webhooks"},
		{"by URL", []admissionregistrationv1.MutatingWebhook{*byURL}, true, "selects it"},
		{"another path", []admissionregistrationv1.MutatingWebhook{*otherPath}, false, `calls path "/validate"`},
		{"not pods", []admissionregistrationv1.MutatingWebhook{*noPods}, false, "rules do not send pod creations"},
		{"no selectors: everything", []admissionregistrationv1.MutatingWebhook{*nilSelectors}, true, "selects it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := check(t, pod, ns, c.webhooks)
			if v.Want != c.want || !strings.Contains(v.Why, c.why) {
				t.Errorf("want %v why %q; want %v, why saying %q", v.Want, v.Why, c.want, c.why)
			}
		})
	}
}

func TestNarrows(t *testing.T) {
	webhooks := shippedWebhooks(t)
	for i, want := range []bool{true, false} { // the namespace opt-in names a value; the pod opt-in does not
		sel, err := selector(webhooks[i].NamespaceSelector)
		if err != nil {
			t.Fatal(err)
		}
		if narrows(sel) != want {
			t.Errorf("%s: narrows(%s) = %v", webhooks[i].Name, sel, !want)
		}
	}
	if narrows(labels.Everything()) {
		t.Error("narrows(everything)")
	}
}
