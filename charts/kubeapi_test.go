package charts

import (
	"encoding/base64"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/sluicehq/sluice/internal/kubeapi"
)

// clusterSecrets answers the chart's lookups from a real API server.
type clusterSecrets struct{ dyn dynamic.Interface }

func (p clusterSecrets) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	if apiVersion != "v1" || kind != "Secret" {
		return nil, false, fmt.Errorf("the chart looks up %s %s: only v1 Secret is expected", apiVersion, kind)
	}
	return p.dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}), true, nil
}

// TestChartOnKubeAPI: a real kube-apiserver accepts every object of every
// install of chartCases (but cert-manager's: its kinds are not installed
// there), and an upgrade rendered against it, the chart's lookup reading
// the Secret the install stored, keeps the CA and serving pair. It runs
// only with SLUICE_KUBEAPI=1 (docs/kubernetes.md).
func TestChartOnKubeAPI(t *testing.T) {
	c := kubeapi.Start(t, false)
	for _, cc := range chartCases {
		if cc.values == "cert-manager.yaml" {
			continue
		}
		t.Run(cc.name, func(t *testing.T) {
			r := render(t, cc)
			c.Apply(t, "", []byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: "+cc.namespace+"\n"))
			if objs, err := c.TryApply(cc.namespace, []byte(r.manifest)); err != nil {
				t.Fatalf("the API server refuses the chart's output (%d objects applied first): %v", len(objs), err)
			}
		})
	}

	t.Run("upgrade keeps the certificate", func(t *testing.T) {
		installed := render(t, caseNamed(t, "defaults"))
		u, err := c.Get(t, "v1/Secret", installed.namespace, installed.secret.Name)
		if err != nil {
			t.Fatal(err)
		}
		stored := map[string]string{}
		for k, v := range u.Object["data"].(map[string]any) {
			stored[k] = v.(string)
		}
		dyn, err := dynamic.NewForConfig(c.Admin)
		if err != nil {
			t.Fatal(err)
		}
		upgraded, ca := renderAgainst(t, clusterSecrets{dyn})
		for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, "ca.crt"} {
			if want := stored[k]; want == "" || encode(upgraded.Data[k]) != want {
				t.Errorf("%s: the upgrade renders another value than the cluster holds", k)
			}
		}
		if encode(ca) != stored["ca.crt"] {
			t.Error("the upgrade's caBundle is not the stored CA")
		}
	})
}

// encode is b as a Secret's data holds it.
func encode(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
