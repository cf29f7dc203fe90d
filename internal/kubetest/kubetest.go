// Package kubetest decodes Kubernetes manifests the way the API server's
// strict field validation does, each into the Go type of its apiVersion and
// kind: an unknown field, a duplicate key, a key in the wrong case or a kind
// with no type here is an error. The example manifests' tests and the Helm
// chart's tests share it, so both hold their objects to the same types. For
// tests only.
package kubetest

import (
	"fmt"
	"regexp"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Types maps "apiVersion/kind" to the Go type a manifest of that kind must
// decode into. cert-manager's and kustomize's kinds have no type in
// k8s.io/api: the structs below hold the fields the repository's manifests
// use, so that a field they do not know is refused like any other.
var Types = map[string]func() any{
	"v1/Namespace":      func() any { return new(corev1.Namespace) },
	"v1/ConfigMap":      func() any { return new(corev1.ConfigMap) },
	"v1/Secret":         func() any { return new(corev1.Secret) },
	"v1/Service":        func() any { return new(corev1.Service) },
	"v1/ServiceAccount": func() any { return new(corev1.ServiceAccount) },
	"v1/Pod":            func() any { return new(corev1.Pod) },

	"apps/v1/Deployment":  func() any { return new(appsv1.Deployment) },
	"apps/v1/StatefulSet": func() any { return new(appsv1.StatefulSet) },
	"apps/v1/DaemonSet":   func() any { return new(appsv1.DaemonSet) },
	"batch/v1/Job":        func() any { return new(batchv1.Job) },
	"batch/v1/CronJob":    func() any { return new(batchv1.CronJob) },

	"policy/v1/PodDisruptionBudget": func() any { return new(policyv1.PodDisruptionBudget) },

	"networking.k8s.io/v1/NetworkPolicy": func() any { return new(networkingv1.NetworkPolicy) },

	"admissionregistration.k8s.io/v1/MutatingWebhookConfiguration":   func() any { return new(admissionregistrationv1.MutatingWebhookConfiguration) },
	"admissionregistration.k8s.io/v1/ValidatingWebhookConfiguration": func() any { return new(admissionregistrationv1.ValidatingWebhookConfiguration) },

	"rbac.authorization.k8s.io/v1/Role":               func() any { return new(rbacv1.Role) },
	"rbac.authorization.k8s.io/v1/RoleBinding":        func() any { return new(rbacv1.RoleBinding) },
	"rbac.authorization.k8s.io/v1/ClusterRole":        func() any { return new(rbacv1.ClusterRole) },
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": func() any { return new(rbacv1.ClusterRoleBinding) },

	"cert-manager.io/v1/Issuer":      func() any { return new(Issuer) },
	"cert-manager.io/v1/Certificate": func() any { return new(Certificate) },

	"kustomize.config.k8s.io/v1beta1/Kustomization": func() any { return new(Kustomization) },
}

// Issuer is the part of cert-manager.io/v1 Issuer the manifests use.
type Issuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SelfSigned *struct{} `json:"selfSigned,omitempty"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca,omitempty"`
	} `json:"spec"`
}

// Certificate is the part of cert-manager.io/v1 Certificate the manifests
// use.
type Certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		IsCA        bool     `json:"isCA,omitempty"`
		CommonName  string   `json:"commonName,omitempty"`
		SecretName  string   `json:"secretName"`
		DNSNames    []string `json:"dnsNames,omitempty"`
		Duration    string   `json:"duration,omitempty"`
		RenewBefore string   `json:"renewBefore,omitempty"`
		Usages      []string `json:"usages,omitempty"`
		PrivateKey  *struct {
			Algorithm      string `json:"algorithm,omitempty"`
			Size           int    `json:"size,omitempty"`
			RotationPolicy string `json:"rotationPolicy,omitempty"`
		} `json:"privateKey,omitempty"`
		IssuerRef struct {
			Group string `json:"group,omitempty"`
			Kind  string `json:"kind,omitempty"`
			Name  string `json:"name"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// Kustomization is the part of kustomize.config.k8s.io/v1beta1
// Kustomization the manifests use.
type Kustomization struct {
	metav1.TypeMeta `json:",inline"`
	Resources       []string `json:"resources"`
}

// Object is one decoded YAML document.
type Object struct {
	Doc  int    // 1-based document number in its file
	Kind string // apiVersion/kind
	Obj  any    // a pointer to the Types value
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// DecodeStrict decodes one YAML document into obj the way the API server's
// strict field validation does: an unknown field, a duplicate key or a key
// in the wrong case is an error. sigs.k8s.io/yaml's UnmarshalStrict catches
// the first two (its JSON step is encoding/json, which matches keys
// case-insensitively), sigs.k8s.io/json's UnmarshalStrict (the API
// server's decoder) the third.
func DecodeStrict(doc []byte, obj any) error {
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return err
	}
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, obj)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		return fmt.Errorf("strict decoding: %v", strict)
	}
	return nil
}

// Decode decodes every document of src, a multi-document YAML file that
// errors call name. Empty documents (comments only) are left out. A
// document with neither apiVersion nor kind is not a Kubernetes object (a
// Helm values file): it is counted in skipped. One with an apiVersion and
// kind not in Types, or with only one of the two, is an error.
func Decode(src []byte, name string) (objs []Object, skipped int, err error) {
	for i, doc := range docSeparator.Split(string(src), -1) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return nil, 0, fmt.Errorf("%s#%d: %w", name, i+1, err)
		}
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		if head.APIVersion == "" && head.Kind == "" {
			skipped++
			continue
		}
		if head.APIVersion == "" || head.Kind == "" {
			return nil, 0, fmt.Errorf("%s#%d: apiVersion %q, kind %q: want both", name, i+1, head.APIVersion, head.Kind)
		}
		kind := head.APIVersion + "/" + head.Kind
		newObj, ok := Types[kind]
		if !ok {
			return nil, 0, fmt.Errorf("%s#%d: unknown apiVersion/kind %q", name, i+1, kind)
		}
		obj := newObj()
		if err := DecodeStrict([]byte(doc), obj); err != nil {
			return nil, 0, fmt.Errorf("%s#%d (%s): %w", name, i+1, kind, err)
		}
		objs = append(objs, Object{Doc: i + 1, Kind: kind, Obj: obj})
	}
	return objs, skipped, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.Lines(doc) {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}
