package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/inject"
	"github.com/sluicehq/sluice/internal/injecttest"
	"github.com/sluicehq/sluice/internal/kubeapi"
)

// injectorAccount is the user the injector's service account token stands
// for: the shipped ClusterRoleBinding's subject.
const injectorAccount = "system:serviceaccount:sluice-system:sluice-injector"

// TestKubeAPI runs the shipped manifests, the injector, its scan and
// check-inject against a real kube-apiserver and controller manager (no
// kubelet: pods are stored, not run). It runs only with SLUICE_KUBEAPI=1
// (docs/kubernetes.md says how to build the binaries).
func TestKubeAPI(t *testing.T) {
	c := kubeapi.Start(t, true, injectorAccount)

	// The shipped manifests, as `kubectl apply -k` would send them, less
	// cert-manager's (its kinds are not installed here) and the webhook
	// configuration, applied below with the injector's loopback address.
	for _, f := range []string{"namespace.yaml", "rbac.yaml", "service.yaml", "deployment.yaml", "pdb.yaml", "networkpolicy.yaml"} {
		y, err := os.ReadFile("../../examples/kubernetes/injector/" + f)
		if err != nil {
			t.Fatal(err)
		}
		c.Apply(t, "", y)
	}
	ca, vol := injecttest.Serving(t, 1)
	webhookAddr := freePort(t)
	c.Apply(t, "", webhookConfig(t, "https://"+webhookAddr, ca.PEM()))

	// The injector as the injector's service account: the scan's reads
	// are what the shipped ClusterRole grants, no more.
	injectorArgs := []string{"--listen", webhookAddr, "--tls-cert-file", vol.CertFile(), "--tls-key-file", vol.KeyFile(),
		"--shutdown-delay=0s", "--scan-interval=10s", "--kubeconfig", c.Kubeconfig(t, injectorAccount)}
	inj := startInjector(t, injectorArgs...)

	c.Apply(t, "", []byte(`
apiVersion: v1
kind: Namespace
metadata:
  name: team-a
  labels:
    sluice.io/inject: enabled
    pod-security.kubernetes.io/enforce: restricted
---
apiVersion: v1
kind: Namespace
metadata:
  name: shop
`))
	for _, ns := range []string{"team-a", "shop"} {
		awaitDefaultAccount(t, c, ns) // the controller manager makes it; a pod needs it
	}

	t.Run("restricted namespace takes the injected pod", func(t *testing.T) {
		pod := c.Apply(t, "team-a", []byte(restrictedPod("billing")))[0]
		if !hasSidecar(t, pod) {
			t.Fatal("the stored pod has no sidecar")
		}
		// Reviewed once: the ServiceAccount plugin, re-run after the
		// patch, finds the sidecar's own mount at the token's path.
		if n := reviewsOf(t, c, "team-a", "billing"); n != 1 {
			t.Errorf("the injector was called %d times for one pod, want 1", n)
		}
	})

	t.Run("pod opted in by label", func(t *testing.T) {
		pod := c.Apply(t, "shop", []byte(strings.Replace(restrictedPod("cart"), "labels: {app: x}", `labels: {app: x, sluice.io/inject: "true"}`, 1)))[0]
		if !hasSidecar(t, pod) {
			t.Fatal("the stored pod has no sidecar")
		}
	})

	t.Run("deployment through the controller manager", func(t *testing.T) {
		c.Apply(t, "team-a", []byte(`
apiVersion: apps/v1
kind: Deployment
metadata: {name: orders}
spec:
  replicas: 2
  selector: {matchLabels: {app: orders}}
  template:
    metadata: {labels: {app: orders}}
    spec:
`+indent(restrictedSpec, "      ")))
		awaitPods(t, c, "team-a", "app=orders", 2, func(pods []unstructured.Unstructured) error {
			for _, p := range pods {
				if !hasSidecar(t, &p) {
					return fmt.Errorf("pod %s has no sidecar", p.GetName())
				}
			}
			return nil
		})
	})

	t.Run("statefulset replica mounts its own claim", func(t *testing.T) {
		c.Apply(t, "team-a", []byte(`
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: ledger}
spec:
  replicas: 1
  serviceName: ledger
  selector: {matchLabels: {app: ledger}}
  template:
    metadata:
      labels: {app: ledger}
      annotations: {sluice.io/pvc: sluice-queue}
    spec:
`+indent(restrictedSpec, "      ")+`
  volumeClaimTemplates:
    - metadata: {name: sluice-queue}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
`))
		awaitPods(t, c, "team-a", "app=ledger", 1, func(pods []unstructured.Unstructured) error {
			var pod corev1.Pod
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(pods[0].Object, &pod); err != nil {
				return err
			}
			for _, v := range pod.Spec.Volumes {
				if v.Name == inject.DataVolume {
					if v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "sluice-queue-ledger-0" {
						return fmt.Errorf("volume %s is %+v, want the replica's claim sluice-queue-ledger-0", v.Name, v.VolumeSource)
					}
					return nil
				}
			}
			for _, v := range pod.Spec.Volumes {
				if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == "sluice-queue-ledger-0" && hasSidecar(t, &pods[0]) {
					return nil // the claim template's own volume, mounted by the sidecar
				}
			}
			return fmt.Errorf("no volume holds claim sluice-queue-ledger-0 for the sidecar: %+v", pod.Spec.Volumes)
		})
	})

	// The injector down: with failurePolicy Ignore the pod is created
	// without its sidecar. The scan and check-inject must say so.
	inj.stop(t)
	missed := c.Apply(t, "team-a", []byte(restrictedPod("missed")))[0]
	if hasSidecar(t, missed) {
		t.Fatal("a pod created while no injector answers has the sidecar")
	}
	inj = startInjector(t, injectorArgs...)

	t.Run("scan counts the pod without its sidecar", func(t *testing.T) {
		series := `sluice_injector_pods_without_sidecar{cause="not_injected",namespace="team-a"} 1`
		deadline := time.Now().Add(time.Minute) // the first scan runs at start; 10 s is the interval
		for {
			_, text := inj.adminGet(t, "/metrics")
			if strings.Contains(text, series) {
				if n := metricValue(text, "sluice_injector_scan_errors_total"); n != 0 {
					t.Errorf("scan errors %v", n)
				}
				if strings.Count(text, "sluice_injector_pods_without_sidecar{") != 1 {
					t.Errorf("want one series of pods without the sidecar:\n%s", grepLines(text, "sluice_injector_pods_without_sidecar"))
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s after a minute:\n%s\nlog:\n%s", series, grepLines(text, "sluice_injector_"), inj.log)
			}
			time.Sleep(200 * time.Millisecond) // the metric has no notification
		}
	})

	t.Run("check-inject explains", func(t *testing.T) {
		kc := c.Kubeconfig(t, "")
		var out, errb bytes.Buffer
		code := run([]string{"check-inject", "--kubeconfig", kc, "-n", "team-a"}, &out, &errb)
		if code != 1 {
			t.Errorf("check-inject -n team-a: exit %d, want 1 (a pod misses its sidecar); stderr %s", code, errb.String())
		}
		if !regexp.MustCompile(`(?m)^missed\s+MISSING\s`).MatchString(out.String()) || !regexp.MustCompile(`(?m)^billing\s+injected\s`).MatchString(out.String()) {
			t.Errorf("check-inject -n team-a:\n%s", out.String())
		}
		out.Reset()
		errb.Reset()
		if code := run([]string{"check-inject", "--kubeconfig", kc, "-n", "team-a", "billing"}, &out, &errb); code != 0 ||
			!strings.Contains(out.String(), "namespace.inject.sluice.io selects it") {
			t.Errorf("check-inject billing: exit %d:\n%s%s", code, out.String(), errb.String())
		}
		out.Reset()
		errb.Reset()
		if code := run([]string{"check-inject", "--kubeconfig", kc, "-A"}, &out, &errb); code != 1 ||
			!regexp.MustCompile(`(?m)^team-a\s+missed\s+MISSING`).MatchString(out.String()) || !strings.Contains(out.String(), "cart") {
			t.Errorf("check-inject -A: exit %d:\n%s%s", code, out.String(), errb.String())
		}
	})

	t.Run("the scan clears once the pod is recreated", func(t *testing.T) {
		c.Delete(t, "v1/Pod", "team-a", "missed")
		if !hasSidecar(t, c.Apply(t, "team-a", []byte(restrictedPod("missed")))[0]) {
			t.Fatal("recreated, the pod still has no sidecar")
		}
		deadline := time.Now().Add(time.Minute)
		for {
			_, text := inj.adminGet(t, "/metrics")
			if !strings.Contains(text, "sluice_injector_pods_without_sidecar{") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pods without the sidecar still counted after a minute:\n%s", grepLines(text, "sluice_injector_pods_without_sidecar"))
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
}

// restrictedSpec is a pod spec that Pod Security "restricted" admits.
const restrictedSpec = `securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  seccompProfile: {type: RuntimeDefault}
containers:
  - name: app
    image: registry.local/app:1
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
`

func restrictedPod(name string) string {
	return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name + "\n  labels: {app: x}\nspec:\n" + indent(restrictedSpec, "  ")
}

func indent(s, by string) string {
	return by + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+by) + "\n"
}

// webhookConfig is the shipped webhook.yaml with each webhook's Service
// swapped for a URL at base (the injector on loopback) and caBundle set.
func webhookConfig(t *testing.T, base string, caPEM []byte) []byte {
	t.Helper()
	y, err := os.ReadFile("../../examples/kubernetes/injector/webhook.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := sigsyaml.Unmarshal(y, &obj); err != nil {
		t.Fatal(err)
	}
	for _, w := range obj["webhooks"].([]any) {
		cc := w.(map[string]any)["clientConfig"].(map[string]any)
		path := cc["service"].(map[string]any)["path"].(string)
		delete(cc, "service")
		cc["url"] = base + path
		cc["caBundle"] = caPEM
	}
	j, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func hasSidecar(t *testing.T, pod *unstructured.Unstructured) bool {
	t.Helper()
	var p corev1.Pod
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(pod.Object, &p); err != nil {
		t.Fatal(err)
	}
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		if c.Name == inject.ContainerName {
			return true
		}
	}
	return false
}

// reviewsOf counts the injector's calls for the creation of pod ns/name in
// the API server's audit log (its mutation annotations, one per call).
func reviewsOf(t *testing.T, c *kubeapi.Cluster, ns, name string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The event is written once the response is sent.
		if n, ok := auditedReviews(c.AuditLog(t), ns, name); ok {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("no audit event of the creation of pod %s/%s", ns, name)
		}
		time.Sleep(100 * time.Millisecond) // the audit log has no notification
	}
}

func auditedReviews(log []byte, ns, name string) (n int, found bool) {
	for _, line := range bytes.Split(log, []byte("\n")) {
		var ev struct {
			Stage       string                           `json:"stage"`
			ObjectRef   struct{ Namespace, Name string } `json:"objectRef"`
			Annotations map[string]string                `json:"annotations"`
		}
		if json.Unmarshal(line, &ev) != nil || ev.Stage != "ResponseComplete" || ev.ObjectRef.Namespace != ns || ev.ObjectRef.Name != name {
			continue
		}
		found = true
		for k, v := range ev.Annotations {
			if strings.HasPrefix(k, "mutation.webhook.admission.k8s.io/round_") && strings.Contains(v, "inject.sluice.io") {
				n++
			}
		}
	}
	return n, found
}

func awaitDefaultAccount(t *testing.T, c *kubeapi.Cluster, ns string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := c.Get(t, "v1/ServiceAccount", ns, "default"); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("no ServiceAccount %s/default after a minute: %v", ns, err)
		}
		time.Sleep(100 * time.Millisecond) // the controller manager's work has no notification here
	}
}

// awaitPods waits for want pods matching sel in ns and for ok to accept them.
func awaitPods(t *testing.T, c *kubeapi.Cluster, ns, sel string, want int, ok func([]unstructured.Unstructured) error) {
	t.Helper()
	k, v, _ := strings.Cut(sel, "=")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var pods []unstructured.Unstructured
		for _, p := range c.List(t, "v1/Pod", ns) {
			if p.GetLabels()[k] == v {
				pods = append(pods, p)
			}
		}
		var err error
		if len(pods) != want {
			err = fmt.Errorf("%d pods, want %d", len(pods), want)
		} else if err = ok(pods); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods %s in %s: %v", sel, ns, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func metricValue(text, name string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}
