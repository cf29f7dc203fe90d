package inject

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Cause is why a pod that asked for the sidecar runs without it: the cause
// label of sluice_injector_pods_without_sidecar.
type Cause string

const (
	// NotInjected: the pod passes the webhooks' selectors and would get
	// the sidecar, and has none. The injector did not answer when it was
	// created (down, or shedding, with failurePolicy Ignore), or the pod
	// predates the webhook or its namespace's label. Recreating it fixes
	// it.
	NotInjected Cause = "not_injected"
	// BadInput: the review would warn and admit it without the sidecar
	// (a port taken, a bad annotation...). Recreating it changes nothing;
	// its spec or annotations must change.
	BadInput Cause = "bad_input"
)

// Causes lists every Cause.
var Causes = []Cause{NotInjected, BadInput}

// Verdict is what Check finds for one pod.
type Verdict struct {
	Namespace, Pod string
	// Webhook is the webhook of the configuration that selects the pod,
	// "" if none does.
	Webhook string
	// Has says the pod has the sidecar (a container named ContainerName).
	Has bool
	// Want says the injector, asked about this pod now, would add it.
	Want bool
	// Cause is set when the pod asked for the sidecar and has none.
	Cause Cause
	// Why says what decided Want, in words.
	Why string
	// Owner is the pod's controller ("ReplicaSet/billing-7d9f8"), the
	// object to restart, or "".
	Owner string
}

// Missing reports that the pod asked for the sidecar and runs without it.
func (v Verdict) Missing() bool { return v.Cause != "" }

// Check says whether pod, in namespace ns, should have the sidecar and
// whether it has it. webhooks are those of the injector's
// MutatingWebhookConfiguration, read from the cluster, so that selectors an
// operator changed count as the API server counts them; defaults are the
// injector's flags. The decision after the selectors is the review's own
// (optedIn, takes), so what Check says a review would do is what it does.
func Check(pod *corev1.Pod, ns *corev1.Namespace, webhooks []admissionregistrationv1.MutatingWebhook, defaults Options) Verdict {
	meta, spec := podParts(pod)
	v := Verdict{Namespace: pod.Namespace, Pod: pod.Name, Has: hasSidecar(&spec)}
	if c := metav1.GetControllerOf(pod); c != nil {
		v.Owner = c.Kind + "/" + c.Name
	}
	switch {
	case pod.DeletionTimestamp != nil:
		v.Why = "it is being deleted"
		return v
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		v.Why = fmt.Sprintf("it has finished (phase %s)", pod.Status.Phase)
		return v
	}
	w, byDefault, why := selecting(webhooks, ns, pod)
	if w == "" {
		v.Why = why
		return v
	}
	v.Webhook = w
	if v.Why, v.Want = optedIn(&meta, byDefault); !v.Want {
		return v
	}
	v.Why = "webhook " + w + " selects it and " + v.Why
	if v.Has {
		return v
	}
	v.Cause = NotInjected
	if _, err := takes(&meta, &spec, defaults); err != nil {
		v.Want, v.Cause = false, BadInput
		v.Why += ", but the injector admits it without the sidecar: " + err.Error()
	}
	return v
}

// podParts is the part of a stored pod that a review reads from a new one.
func podParts(pod *corev1.Pod) (podMeta, podSpec) {
	meta := podMeta{Name: pod.Name, GenerateName: pod.GenerateName, Labels: pod.Labels, Annotations: pod.Annotations}
	spec := podSpec{HostNetwork: pod.Spec.HostNetwork}
	containers := func(list []corev1.Container) []podContainer {
		out := make([]podContainer, len(list))
		for i, c := range list {
			out[i].Name = c.Name
			for _, p := range c.Ports {
				out[i].Ports = append(out[i].Ports, struct {
					ContainerPort int32 `json:"containerPort"`
				}{p.ContainerPort})
			}
		}
		return out
	}
	spec.InitContainers = containers(pod.Spec.InitContainers)
	spec.Containers = containers(pod.Spec.Containers)
	for _, vol := range pod.Spec.Volumes {
		spec.Volumes = append(spec.Volumes, struct {
			Name string `json:"name"`
		}{vol.Name})
	}
	return meta, spec
}

// selecting is the first of webhooks that the API server calls for the
// creation of pod in ns, and whether it is the namespace opt-in's path
// (byDefault); or "" and why none is. The shipped webhooks' selectors are
// disjoint, so at most one matches.
func selecting(webhooks []admissionregistrationv1.MutatingWebhook, ns *corev1.Namespace, pod *corev1.Pod) (name string, byDefault bool, why string) {
	if len(webhooks) == 0 {
		return "", false, "the webhook configuration has no webhooks"
	}
	var whys []string
	for _, w := range webhooks {
		path := webhookPath(w.ClientConfig)
		if path != PodPath && path != NamespacePath {
			whys = append(whys, fmt.Sprintf("%s calls path %q, not the injector's", w.Name, path))
			continue
		}
		if !createsPods(w.Rules) {
			whys = append(whys, w.Name+"'s rules do not send pod creations")
			continue
		}
		nsSel, err := selector(w.NamespaceSelector)
		if err != nil {
			whys = append(whys, fmt.Sprintf("%s's namespaceSelector: %v", w.Name, err))
			continue
		}
		if !nsSel.Matches(labels.Set(ns.Labels)) {
			whys = append(whys, fmt.Sprintf("%s's namespaceSelector (%s) does not match namespace %s", w.Name, nsSel, ns.Name))
			continue
		}
		objSel, err := selector(w.ObjectSelector)
		if err != nil {
			whys = append(whys, fmt.Sprintf("%s's objectSelector: %v", w.Name, err))
			continue
		}
		if !objSel.Matches(labels.Set(pod.Labels)) {
			whys = append(whys, fmt.Sprintf("%s's objectSelector (%s) does not match the pod's labels", w.Name, objSel))
			continue
		}
		return w.Name, path == NamespacePath, ""
	}
	return "", false, "no webhook selects it: " + strings.Join(whys, "; ")
}

// selector is s as the API server reads a webhook's selector: absent
// matches everything.
func selector(s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(s)
}

// webhookPath is the path the API server calls for c.
func webhookPath(c admissionregistrationv1.WebhookClientConfig) string {
	switch {
	case c.Service != nil && c.Service.Path != nil:
		return *c.Service.Path
	case c.URL != nil:
		if u, err := url.Parse(*c.URL); err == nil {
			return u.Path
		}
	}
	return ""
}

// createsPods reports whether rules send the creation of a v1 pod.
func createsPods(rules []admissionregistrationv1.RuleWithOperations) bool {
	has := func(list []string, want string) bool {
		return slices.Contains(list, want) || slices.Contains(list, "*")
	}
	for _, r := range rules {
		ops := make([]string, len(r.Operations))
		for i, op := range r.Operations {
			ops[i] = string(op)
		}
		if has(ops, string(admissionregistrationv1.Create)) && has(r.APIGroups, "") && has(r.APIVersions, "v1") && has(r.Resources, "pods") {
			return true
		}
	}
	return false
}
