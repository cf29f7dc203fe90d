package kubetest

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

// Restricted returns what Pod Security "restricted:latest" says of pod, the
// admission plugin's own checks: "" when it admits it.
func Restricted(t testing.TB, pod *corev1.Pod) string {
	t.Helper()
	e, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res := policy.AggregateCheckResults(e.EvaluatePod(api.LevelVersion{Level: api.LevelRestricted, Version: api.LatestVersion()}, &pod.ObjectMeta, &pod.Spec))
	if res.Allowed {
		return ""
	}
	return res.ForbiddenReason() + ": " + res.ForbiddenDetail()
}

// CheckInjectorPorts checks that svc sends port 443 to the injector
// container c's webhook port (its --listen) and that c's probes ask
// /readyz and /healthz on its admin port (--admin-listen).
func CheckInjectorPorts(t testing.TB, svc *corev1.Service, c *corev1.Container, webhookPort, adminPort int32) {
	t.Helper()
	for _, sp := range svc.Spec.Ports {
		target := sp.TargetPort.IntVal
		if sp.TargetPort.StrVal != "" {
			i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == sp.TargetPort.StrVal })
			if i < 0 {
				t.Fatalf("Service targetPort %q names no container port", sp.TargetPort.StrVal)
			}
			target = c.Ports[i].ContainerPort
		}
		if sp.Port != 443 || target != webhookPort {
			t.Errorf("Service port %d → %d, want 443 → %d (--listen)", sp.Port, target, webhookPort)
		}
	}
	for path, p := range map[string]*corev1.Probe{"/readyz": c.ReadinessProbe, "/healthz": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port.IntValue() != int(adminPort) {
			t.Errorf("want an httpGet probe of %s on port %d (--admin-listen), got %+v", path, adminPort, p)
		}
	}
}
