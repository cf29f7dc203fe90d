package inject

import (
	"encoding/json"
	"testing"

	"github.com/sluicehq/sluice/internal/kubetest"
	corev1 "k8s.io/api/core/v1"
)

// restrictedPod is an app pod that Pod Security "restricted" admits: non-root,
// no privilege escalation, no capabilities, the runtime's seccomp profile.
func restrictedPod() *corev1.Pod {
	p := barePod()
	yes, no := true, false
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: &yes,
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: &no,
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	return p
}

// TestInjectedPodPassesRestricted: a pod that Pod Security "restricted"
// admits is still admitted once the sidecar is added, by the webhook and by
// sluice inject, with each way of holding the data dir and in fleet mode.
// (The sidecar once set neither capabilities.drop nor a seccomp profile,
// and a namespace enforcing the profile refused every injected pod.)
func TestInjectedPodPassesRestricted(t *testing.T) {
	if msg := kubetest.Restricted(t, restrictedPod()); msg != "" {
		t.Fatalf("the app pod itself is refused: %s", msg)
	}
	for name, edit := range map[string]func(*corev1.Pod){
		"emptyDir": func(*corev1.Pod) {},
		"pvc":      annotate(AnnotationPrefix+"pvc", "sluice-queue"),
		"secret":   annotate(AnnotationPrefix+"secret", "sluice-secrets"),
		"fleet":    annotate(AnnotationPrefix+"jetstream-urls", "nats://nats.nats.svc:4222"),
	} {
		t.Run(name, func(t *testing.T) {
			pod := with(restrictedPod(), edit)
			answer, result := Review(request(t, pod, nil), Defaults(), false)
			if result != Injected {
				t.Fatalf("result %s: %s", result, answer)
			}
			podJSON, _ := json.Marshal(pod)
			patched := strictPod(t, applyPatch(t, decodeAnswer(t, answer).Response.Patch, podJSON))
			if msg := kubetest.Restricted(t, patched); msg != "" {
				t.Errorf("the webhook's pod is refused by restricted: %s", msg)
			}
			o, err := annotationOptions(pod.Annotations, Defaults())
			if err != nil {
				t.Fatal(err)
			}
			if msg := kubetest.Restricted(t, injectYAML(t, pod, o)); msg != "" {
				t.Errorf("sluice inject's pod is refused by restricted: %s", msg)
			}
		})
	}
}
