package charts

import (
	"fmt"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/engine"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/sluicehq/sluice/internal/kubetest"
)

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
func renderAgainst(t *testing.T, p engine.ClientProvider) (*corev1.Secret, []byte) {
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
