package inject

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

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

// Pod, Namespace and MutatingWebhook are the parts of a stored pod, a namespace
// and a MutatingWebhookConfiguration's webhook that Check reads, decoded
// from the API server's JSON. They are not k8s.io/api's types: those
// would link k8s.io/api/core/v1 into every sluice binary, 6 MB of the
// release build (29 → 35 MB measured) and its start-up registrations, for
// the few fields read here.
type (
	Pod struct {
		Metadata struct {
			podMeta
			Namespace         string                  `json:"namespace"`
			DeletionTimestamp *metav1.Time            `json:"deletionTimestamp"`
			OwnerReferences   []metav1.OwnerReference `json:"ownerReferences"`
		} `json:"metadata"`
		Spec   podSpec `json:"spec"`
		Status struct {
			Phase string `json:"phase"`
		} `json:"status"`
	}
	Namespace struct {
		Metadata struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	MutatingWebhook struct {
		Name         string `json:"name"`
		ClientConfig struct {
			URL     *string `json:"url"`
			Service *struct {
				Path *string `json:"path"`
			} `json:"service"`
		} `json:"clientConfig"`
		Rules []struct {
			Operations  []string `json:"operations"`
			APIGroups   []string `json:"apiGroups"`
			APIVersions []string `json:"apiVersions"`
			Resources   []string `json:"resources"`
		} `json:"rules"`
		NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector"`
		ObjectSelector    *metav1.LabelSelector `json:"objectSelector"`
	}
)

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
func Check(pod *Pod, ns *Namespace, webhooks []MutatingWebhook, defaults Options) Verdict {
	meta, spec := &pod.Metadata.podMeta, &pod.Spec
	v := Verdict{Namespace: pod.Metadata.Namespace, Pod: meta.Name, Has: hasSidecar(spec)}
	for _, o := range pod.Metadata.OwnerReferences {
		if o.Controller != nil && *o.Controller {
			v.Owner = o.Kind + "/" + o.Name
		}
	}
	switch phase := pod.Status.Phase; {
	case pod.Metadata.DeletionTimestamp != nil:
		v.Why = "it is being deleted"
		return v
	case phase == "Succeeded" || phase == "Failed":
		v.Why = fmt.Sprintf("it has finished (phase %s)", phase)
		return v
	}
	w, byDefault, why := selecting(webhooks, ns, pod)
	if w == "" {
		v.Why = why
		return v
	}
	v.Webhook = w
	if v.Why, v.Want = optedIn(meta, byDefault); !v.Want {
		return v
	}
	v.Why = "webhook " + w + " selects it and " + v.Why
	if v.Has {
		return v
	}
	v.Cause = NotInjected
	if _, err := takes(meta, spec, defaults); err != nil {
		v.Want, v.Cause = false, BadInput
		v.Why += ", but the injector admits it without the sidecar: " + err.Error()
	}
	return v
}

// selecting is the first of webhooks that the API server calls for the
// creation of pod in ns, and whether it is the namespace opt-in's path
// (byDefault); or "" and why none is. The shipped webhooks' selectors are
// disjoint, so at most one matches.
func selecting(webhooks []MutatingWebhook, ns *Namespace, pod *Pod) (name string, byDefault bool, why string) {
	if len(webhooks) == 0 {
		return "", false, "the webhook configuration has no webhooks"
	}
	var whys []string
	for _, w := range webhooks {
		path := webhookPath(&w)
		if path != PodPath && path != NamespacePath {
			whys = append(whys, fmt.Sprintf("%s calls path %q, not the injector's", w.Name, path))
			continue
		}
		if !createsPods(&w) {
			whys = append(whys, w.Name+"'s rules do not send pod creations")
			continue
		}
		nsSel, err := selector(w.NamespaceSelector)
		if err != nil {
			whys = append(whys, fmt.Sprintf("%s's namespaceSelector: %v", w.Name, err))
			continue
		}
		if !nsSel.Matches(labels.Set(ns.Metadata.Labels)) {
			whys = append(whys, fmt.Sprintf("%s's namespaceSelector (%s) does not match namespace %s", w.Name, nsSel, ns.Metadata.Name))
			continue
		}
		objSel, err := selector(w.ObjectSelector)
		if err != nil {
			whys = append(whys, fmt.Sprintf("%s's objectSelector: %v", w.Name, err))
			continue
		}
		if !objSel.Matches(labels.Set(pod.Metadata.Labels)) {
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

// webhookPath is the path the API server calls for w.
func webhookPath(w *MutatingWebhook) string {
	switch c := w.ClientConfig; {
	case c.Service != nil && c.Service.Path != nil:
		return *c.Service.Path
	case c.URL != nil:
		if u, err := url.Parse(*c.URL); err == nil {
			return u.Path
		}
	}
	return ""
}

// createsPods reports whether w's rules send the creation of a v1 pod.
func createsPods(w *MutatingWebhook) bool {
	has := func(list []string, want string) bool {
		return slices.Contains(list, want) || slices.Contains(list, "*")
	}
	for _, r := range w.Rules {
		if has(r.Operations, "CREATE") && has(r.APIGroups, "") && has(r.APIVersions, "v1") && has(r.Resources, "pods") {
			return true
		}
	}
	return false
}
