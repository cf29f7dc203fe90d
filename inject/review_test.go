package inject

import (
	"bytes"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"go.yaml.in/yaml/v3"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsyaml "sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/review")

const reviewDir = "testdata/review"

// deploymentPod is a pod as a Deployment's ReplicaSet asks for it, after
// the API server's defaulting: a generateName and no name, an owner, two
// containers with probes, env and volumes.
func deploymentPod() *corev1.Pod {
	grace := int64(30)
	yes := true
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("http"), Scheme: corev1.URISchemeHTTP}},
			PeriodSeconds: 10, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3}
	}
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "billing-7d9f4c5b8-",
			Namespace:    "billing",
			Labels:       map[string]string{"app": "billing", "pod-template-hash": "7d9f4c5b8"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "billing-7d9f4c5b8",
				UID: "0b6f7c6e-2d0c-4c8e-9d7e-3f1c2a9b8e11", Controller: &yes, BlockOwnerDeletion: &yes}},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{
				{
					Name: "app", Image: "registry.local/billing:1.4.2",
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
					Env: []corev1.EnvVar{
						{Name: "WEBHOOKS_URL", Value: "http://127.0.0.1:8700"},
						{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}},
					},
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
						Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
					},
					VolumeMounts:             []corev1.VolumeMount{{Name: "app-config", MountPath: "/etc/billing", ReadOnly: true}, {Name: "tmp", MountPath: "/tmp"}},
					ReadinessProbe:           probe("/ready"),
					LivenessProbe:            probe("/healthz"),
					TerminationMessagePath:   "/dev/termination-log",
					TerminationMessagePolicy: corev1.TerminationMessageReadFile,
					ImagePullPolicy:          corev1.PullIfNotPresent,
				},
				{
					Name: "log-shipper", Image: "registry.local/vector:0.40", Args: []string{"--config", "/etc/vector/vector.yaml"},
					VolumeMounts:             []corev1.VolumeMount{{Name: "tmp", MountPath: "/var/log/app", ReadOnly: true}},
					TerminationMessagePath:   "/dev/termination-log",
					TerminationMessagePolicy: corev1.TerminationMessageReadFile,
					ImagePullPolicy:          corev1.PullIfNotPresent,
				},
			},
			Volumes: []corev1.Volume{
				{Name: "app-config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "billing-config"}}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
			RestartPolicy:                 corev1.RestartPolicyAlways,
			TerminationGracePeriodSeconds: &grace,
			DNSPolicy:                     corev1.DNSClusterFirst,
			ServiceAccountName:            "billing",
			SchedulerName:                 corev1.DefaultSchedulerName,
			SecurityContext:               &corev1.PodSecurityContext{},
		},
	}
}

// barePod is a pod created by hand: a name, one container, no volumes and
// no grace period.
func barePod() *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "debug", Namespace: "default", Annotations: map[string]string{AnnotationInject: "true"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "shell", Image: "busybox:1.36", Command: []string{"sleep", "3600"}}}},
	}
}

// with returns p changed by edits.
func with(p *corev1.Pod, edits ...func(p *corev1.Pod)) *corev1.Pod {
	for _, e := range edits {
		e(p)
	}
	return p
}

func annotate(kv ...string) func(p *corev1.Pod) {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Annotations[kv[i]] = kv[i+1]
		}
	}
}

func label(k, v string) func(p *corev1.Pod) {
	return func(p *corev1.Pod) {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[k] = v
	}
}

func addPort(container int, port int32) func(p *corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[container].Ports = append(p.Spec.Containers[container].Ports, corev1.ContainerPort{ContainerPort: port, Protocol: corev1.ProtocolTCP})
	}
}

func addVolume(name string) func(p *corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
}

// request is an AdmissionReview of the creation of pod.
func request(t testing.TB, pod *corev1.Pod, edit func(r *admissionv1.AdmissionRequest)) []byte {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	req := &admissionv1.AdmissionRequest{
		UID:       "705ab4f5-6393-11e8-b7cc-42010a800002",
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Namespace: pod.Namespace, Name: pod.Name,
		Operation: admissionv1.Create,
		UserInfo:  authUser,
		Object:    runtime.RawExtension{Raw: raw},
	}
	if edit != nil {
		edit(req)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

var authUser = authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:replicaset-controller",
	Groups: []string{"system:serviceaccounts", "system:authenticated"}}

type reviewCase struct {
	name      string
	pod       *corev1.Pod
	byDefault bool
	defaults  func(o *Options)
	edit      func(r *admissionv1.AdmissionRequest)
	want      Result
	message   string                                                         // in the warning or the denial
	check     func(t *testing.T, sidecar *corev1.Container, pod *corev1.Pod) // an Injected pod
}

func fleetDefaults(o *Options) { o.JetStreamURLs = []string{"nats://nats.nats.svc:4222"} }

var reviewCases = []reviewCase{
	{name: "deployment-pod", pod: deploymentPod(), byDefault: true, want: Injected,
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if *p.Spec.TerminationGracePeriodSeconds != 30 {
				t.Errorf("grace lowered to %d", *p.Spec.TerminationGracePeriodSeconds)
			}
			if len(p.Spec.Volumes) != 5 || p.Spec.Volumes[2].Name != DataVolume || p.Spec.Volumes[3].Name != ConfigVolume || p.Spec.Volumes[4].Name != NoTokenVolume {
				t.Errorf("volumes %v", p.Spec.Volumes)
			}
			// The ServiceAccount plugin mounts the token into every
			// container without a mount at its path: the sidecar has one,
			// so the plugin leaves the pod alone after the injector and the
			// injector is not called again; the app keeps its token.
			if !slices.ContainsFunc(s.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount" && m.Name == NoTokenVolume && m.ReadOnly
			}) {
				t.Errorf("the sidecar has no mount at the service account's token path: %+v", s.VolumeMounts)
			}
			if v := podVolume(p, NoTokenVolume); v == nil || v.EmptyDir == nil {
				t.Errorf("%s is not an empty volume: %+v", NoTokenVolume, v)
			}
		}},
	{name: "bare-pod", pod: barePod(), want: Injected,
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			// No grace written: the API server's default of 30 s covers
			// the drain (10 s + 5), and a lower one would shorten it.
			if g := p.Spec.TerminationGracePeriodSeconds; g != nil {
				t.Errorf("grace %d written, want none (the API server's 30 s)", *g)
			}
		}},
	{name: "existing-init-containers", want: Injected, pod: with(barePod(), func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "registry.local/migrate:1", Args: []string{"up"}}}
	}), check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
		if len(p.Spec.InitContainers) != 2 || p.Spec.InitContainers[0].Name != "migrate" {
			t.Errorf("init containers %v", p.Spec.InitContainers)
		}
	}},
	{name: "label-opt-in", want: Injected, pod: with(deploymentPod(), label(AnnotationInject, "true"))},
	{name: "namespace-opt-in-annotation-true", byDefault: true, want: Injected, pod: with(deploymentPod(), annotate(AnnotationInject, "true"))},

	// One case for each annotation.
	{name: "annotation-image", want: Injected, pod: with(barePod(), annotate("sluice.io/image", "registry.local/sluice:v0.3.0")),
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if s.Image != "registry.local/sluice:v0.3.0" {
				t.Errorf("image %s", s.Image)
			}
		}},
	{name: "annotation-config-map", want: Injected, pod: with(barePod(), annotate("sluice.io/config-map", "debug-sluice")),
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if v := podVolume(p, ConfigVolume); v == nil || v.ConfigMap == nil || v.ConfigMap.Name != "debug-sluice" {
				t.Errorf("config volume %+v", v)
			}
		}},
	{name: "annotation-pvc", want: Injected, pod: with(barePod(), annotate("sluice.io/pvc", "debug-queue")),
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if v := podVolume(p, DataVolume); v == nil || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "debug-queue" {
				t.Errorf("data volume %+v", v)
			}
		}},
	// A StatefulSet's pod: the controller turned the volumeClaimTemplate
	// "sluice-queue" into a volume of that name bound to the replica's
	// claim. The sidecar mounts it; no claim called "sluice-queue", which
	// does not exist, is added.
	{name: "statefulset-pod-claim-template", want: Injected, pod: with(barePod(), annotate("sluice.io/pvc", "sluice-queue"),
		func(p *corev1.Pod) {
			p.Name = "ledger-0"
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "sluice-queue",
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "sluice-queue-ledger-0"}}})
		}),
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if v := podVolume(p, "sluice-queue"); v == nil || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != "sluice-queue-ledger-0" {
				t.Errorf("the replica's claim volume %+v", v)
			}
			if v := podVolume(p, DataVolume); v != nil {
				t.Errorf("a %s volume was added beside the replica's claim: %+v", DataVolume, v)
			}
			if !slices.ContainsFunc(s.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "sluice-queue" && m.MountPath == DataDir }) {
				t.Errorf("the sidecar does not mount the replica's claim at %s: %+v", DataDir, s.VolumeMounts)
			}
		}},
	{name: "annotation-secret", want: Injected, pod: with(barePod(), annotate("sluice.io/secret", "debug-secrets")),
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if v := podVolume(p, SecretsVolume); v == nil || v.Secret == nil || v.Secret.SecretName != "debug-secrets" {
				t.Errorf("secrets volume %+v", v)
			}
			if !slices.ContainsFunc(s.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.Name == SecretsVolume && m.MountPath == SecretsDir && m.ReadOnly
			}) {
				t.Errorf("mounts %v", s.VolumeMounts)
			}
		}},
	{name: "annotation-grace", want: Injected, pod: with(deploymentPod(), annotate("sluice.io/grace", "60s")), byDefault: true,
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if *p.Spec.TerminationGracePeriodSeconds != 65 || env(s, "SLUICE_SHUTDOWN_GRACE") != "1m0s" {
				t.Errorf("grace %d, env %s", *p.Spec.TerminationGracePeriodSeconds, env(s, "SLUICE_SHUTDOWN_GRACE"))
			}
		}},
	{name: "annotation-ingest-port", want: Injected, pod: with(barePod(), annotate("sluice.io/ingest-port", "9700")),
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if env(s, "SLUICE_LISTEN") != "127.0.0.1:9700" {
				t.Errorf("listen %s", env(s, "SLUICE_LISTEN"))
			}
		}},
	{name: "annotation-admin-port", want: Injected, pod: with(barePod(), annotate("sluice.io/admin-port", "9701")),
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if env(s, "SLUICE_ADMIN__LISTEN") != "127.0.0.1:9701" {
				t.Errorf("admin listen %s", env(s, "SLUICE_ADMIN__LISTEN"))
			}
		}},
	{name: "annotation-cpu-request", want: Injected, pod: with(barePod(), annotate("sluice.io/cpu-request", "200m")),
		check: quantityIs("requests", corev1.ResourceCPU, "200m")},
	{name: "annotation-memory-request", want: Injected, pod: with(barePod(), annotate("sluice.io/memory-request", "128Mi")),
		check: quantityIs("requests", corev1.ResourceMemory, "128Mi")},
	{name: "annotation-cpu-limit", want: Injected, pod: with(barePod(), annotate("sluice.io/cpu-limit", "1")),
		check: quantityIs("limits", corev1.ResourceCPU, "1")},
	{name: "annotation-memory-limit", want: Injected, pod: with(barePod(), annotate("sluice.io/memory-limit", "2Gi")),
		check: quantityIs("limits", corev1.ResourceMemory, "2Gi")},
	{name: "annotation-required", want: Injected, pod: with(barePod(), annotate(AnnotationRequired, "true"))},
	{name: "annotation-jetstream-urls", want: Injected, byDefault: true,
		pod: with(deploymentPod(), annotate("sluice.io/jetstream-urls", "nats://nats-0.nats:4222,nats://nats-1.nats:4222")),
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if env(s, "SLUICE_LOG__BACKEND") != "jetstream" || env(s, "SLUICE_JETSTREAM__URLS") != "nats://nats-0.nats:4222,nats://nats-1.nats:4222" {
				t.Errorf("env %v", s.Env)
			}
			i := slices.IndexFunc(s.Env, func(e corev1.EnvVar) bool { return e.Name == "SLUICE_NODE_ID" })
			if i < 0 || s.Env[i].ValueFrom == nil || s.Env[i].ValueFrom.FieldRef == nil || s.Env[i].ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("SLUICE_NODE_ID not from the pod's name: %v", s.Env)
			}
		}},
	{name: "fleet-flags", want: Injected, byDefault: true, defaults: fleetDefaults, pod: deploymentPod(),
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if env(s, "SLUICE_JETSTREAM__URLS") != "nats://nats.nats.svc:4222" {
				t.Errorf("env %v", s.Env)
			}
		}},
	{name: "fleet-off-by-annotation", want: Injected, byDefault: true, defaults: fleetDefaults,
		pod: with(deploymentPod(), annotate("sluice.io/jetstream-urls", "")),
		check: func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
			if env(s, "SLUICE_LOG__BACKEND") != "" {
				t.Errorf("still in fleet mode: %v", s.Env)
			}
		}},

	// Skipped.
	{name: "namespace-opt-in-pod-opt-out", byDefault: true, want: Skipped, pod: with(deploymentPod(), annotate(AnnotationInject, "false"))},
	{name: "namespace-opt-in-pod-label-opt-out", byDefault: true, want: Skipped, pod: with(deploymentPod(), label(AnnotationInject, "false"))},
	{name: "opt-out-beats-bad-annotations", byDefault: true, want: Skipped, pod: with(deploymentPod(), annotate(AnnotationInject, "false", "sluice.io/grace", "soon"))},
	{name: "no-opt-in", want: Skipped, pod: deploymentPod()},
	{name: "has-sidecar-init", want: Skipped, pod: with(barePod(), func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: ContainerName, Image: DefaultImage}}
	})},
	{name: "has-sidecar-container", want: Skipped, pod: with(barePod(), func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: ContainerName, Image: DefaultImage})
	})},
	{name: "update", want: Skipped, pod: barePod(), edit: func(r *admissionv1.AdmissionRequest) { r.Operation = admissionv1.Update }},
	{name: "not-a-pod", want: Skipped, pod: barePod(), edit: func(r *admissionv1.AdmissionRequest) {
		r.Kind = metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
	}},
	{name: "subresource", want: Skipped, pod: barePod(), edit: func(r *admissionv1.AdmissionRequest) { r.SubResource = "binding" }},

	// Bad input: warned, or denied when required.
	{name: "bad-annotation", want: Warned, pod: with(barePod(), annotate("sluice.io/grace", "soon")),
		message: `sluice: annotation sluice.io/grace "soon": not a duration; the pod starts without the sidecar`},
	{name: "bad-annotation-required", want: Denied, pod: with(barePod(), annotate("sluice.io/grace", "soon", AnnotationRequired, "true")),
		message: `sluice: annotation sluice.io/grace "soon": not a duration (the pod says sluice.io/required: "true")`},
	{name: "unknown-annotation", want: Warned, pod: with(barePod(), annotate("sluice.io/pvcs", "q")), message: `unknown annotation "sluice.io/pvcs" (did you mean sluice.io/pvc?)`},
	{name: "bad-inject-value", want: Warned, byDefault: true, pod: with(barePod(), annotate(AnnotationInject, "yes")),
		message: `annotation sluice.io/inject "yes": not "true" or "false"`},
	{name: "no-containers", want: Warned, pod: with(barePod(), func(p *corev1.Pod) { p.Spec.Containers = nil }), message: "the pod has no containers"},
	{name: "no-spec", want: Warned, pod: with(barePod(), func(p *corev1.Pod) { p.Spec = corev1.PodSpec{} }), message: "the pod has no containers"},
	{name: "ingest-port-taken", want: Warned, pod: with(barePod(), addPort(0, DefaultIngestPort)),
		message: `container "shell" already uses port 8700, the sidecar's ingest port (set sluice.io/ingest-port to another)`},
	{name: "admin-port-taken", want: Warned, byDefault: true, pod: with(deploymentPod(), addPort(1, 9701), annotate("sluice.io/admin-port", "9701")),
		message: `container "log-shipper" already uses port 9701, the sidecar's admin port`},
	{name: "init-container-port-taken", want: Warned, pod: with(barePod(), func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "proxy", Image: "envoy", Ports: []corev1.ContainerPort{{ContainerPort: 8700}}}}
	}), message: `container "proxy" already uses port 8700`},
	{name: "volume-data-taken", want: Warned, pod: with(barePod(), addVolume(DataVolume)), message: `the pod already has a volume "sluice-data"`},
	{name: "volume-config-taken", want: Warned, pod: with(barePod(), addVolume(ConfigVolume)), message: `the pod already has a volume "sluice-config"`},
	{name: "volume-secrets-taken", want: Warned, pod: with(barePod(), addVolume(SecretsVolume)), message: `the pod already has a volume "sluice-secrets"`},
	{name: "host-network", want: Warned, pod: with(barePod(), func(p *corev1.Pod) { p.Spec.HostNetwork = true }), message: "the pod uses hostNetwork"},
	{name: "host-network-required", want: Denied, pod: with(barePod(), annotate(AnnotationRequired, "true"), func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
		message: "the pod uses hostNetwork"},
	{name: "fleet-dotted-name", want: Warned, defaults: fleetDefaults, pod: with(barePod(), func(p *corev1.Pod) { p.Name = "debug.v2" }),
		message: `pod name "debug.v2": in fleet mode each pod's name is its node_id, which must be 1 to 64 letters, digits, "_" or "-"`},
	{name: "fleet-long-name", want: Warned, defaults: fleetDefaults, pod: with(barePod(), func(p *corev1.Pod) { p.Name = strings.Repeat("a", 65) }),
		message: `in fleet mode each pod's name is its node_id, which must be 1 to 64 letters`},
	{name: "fleet-dotted-generate-name", want: Denied, byDefault: true,
		pod:     with(deploymentPod(), annotate("sluice.io/jetstream-urls", "nats://nats:4222", AnnotationRequired, "true"), func(p *corev1.Pod) { p.GenerateName = "billing.v2-7d9f4c5b8-" }),
		message: `pod name "billing.v2-7d9f4c5b8-": in fleet mode`},
	{name: "dotted-name-without-fleet", want: Injected, pod: with(barePod(), func(p *corev1.Pod) { p.Name = "debug.v2" })},
}

func podVolume(p *corev1.Pod, name string) *corev1.Volume {
	for i := range p.Spec.Volumes {
		if p.Spec.Volumes[i].Name == name {
			return &p.Spec.Volumes[i]
		}
	}
	return nil
}

func env(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func quantityIs(kind string, r corev1.ResourceName, want string) func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
	return func(t *testing.T, s *corev1.Container, p *corev1.Pod) {
		list := s.Resources.Requests
		if kind == "limits" {
			list = s.Resources.Limits
		}
		if q, ok := list[r]; !ok || q.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("%s %s = %v, want %s", kind, r, list, want)
		}
	}
}

// decodeAnswer decodes an answer strictly, as the API server would.
func decodeAnswer(t testing.TB, answer []byte) *admissionv1.AdmissionReview {
	t.Helper()
	var ar admissionv1.AdmissionReview
	dec := json.NewDecoder(bytes.NewReader(answer))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ar); err != nil {
		t.Fatalf("answer does not decode: %v\n%s", err, answer)
	}
	if ar.APIVersion != "admission.k8s.io/v1" || ar.Kind != "AdmissionReview" || ar.Response == nil || ar.Request != nil {
		t.Fatalf("answer is not an AdmissionReview response: %s", answer)
	}
	return &ar
}

// strictPod decodes a pod's JSON strictly: a field the patch got wrong
// fails here rather than being dropped.
func strictPod(t testing.TB, raw []byte) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("patched pod does not decode strictly: %v\n%s", err, raw)
	}
	return &p
}

func TestReview(t *testing.T) {
	for _, c := range reviewCases {
		t.Run(c.name, func(t *testing.T) {
			defaults := Defaults()
			if c.defaults != nil {
				c.defaults(&defaults)
			}
			body := request(t, c.pod, c.edit)
			answer, result := Review(body, defaults, c.byDefault)
			resp := decodeAnswer(t, answer).Response
			if result != c.want {
				t.Fatalf("result %s, want %s: %s", result, c.want, answer)
			}
			if resp.UID != "705ab4f5-6393-11e8-b7cc-42010a800002" {
				t.Errorf("uid %q not echoed", resp.UID)
			}
			if resp.Allowed != (result != Denied) {
				t.Errorf("allowed %v for %s", resp.Allowed, result)
			}
			if (result == Injected) != (resp.Patch != nil) || (resp.Patch != nil) != (resp.PatchType != nil) {
				t.Errorf("%s with patch %q, patchType %v", result, resp.Patch, resp.PatchType)
			}
			switch result {
			case Warned:
				if len(resp.Warnings) == 1 && len(resp.Warnings[0]) > 256 {
					t.Errorf("a warning of %d characters, which the API server may cut", len(resp.Warnings[0]))
				}
				if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], c.message) || !strings.HasPrefix(resp.Warnings[0], "sluice: ") {
					t.Errorf("warnings %q, want one containing %q", resp.Warnings, c.message)
				}
			case Denied:
				if resp.Result == nil || !strings.Contains(resp.Result.Message, c.message) || resp.Result.Code != 400 || len(resp.Warnings) != 0 {
					t.Errorf("status %+v, want a 400 containing %q", resp.Result, c.message)
				}
			case Skipped, Injected:
				if len(resp.Warnings) != 0 || resp.Result != nil {
					t.Errorf("%s with warnings %q, status %+v", result, resp.Warnings, resp.Result)
				}
			}
			if result != Injected {
				return
			}
			if *resp.PatchType != admissionv1.PatchTypeJSONPatch {
				t.Errorf("patchType %s", *resp.PatchType)
			}
			golden(t, filepath.Join(reviewDir, c.name+".json"), resp.Patch)

			podJSON, _ := json.Marshal(c.pod)
			patched := applyPatch(t, resp.Patch, podJSON)
			pod := strictPod(t, patched)
			if len(pod.Spec.InitContainers) == 0 {
				t.Fatal("no init containers")
			}
			sidecar := &pod.Spec.InitContainers[len(pod.Spec.InitContainers)-1]
			if sidecar.Name != ContainerName || sidecar.RestartPolicy == nil || *sidecar.RestartPolicy != corev1.ContainerRestartPolicyAlways {
				t.Errorf("last init container is not the native sidecar: %+v", sidecar)
			}
			if c.check != nil {
				c.check(t, sidecar, pod)
			}

			// One code path: sluice inject makes the same pod.
			o, err := annotationOptions(c.pod.Annotations, defaults)
			if err != nil {
				t.Fatal(err)
			}
			if viaYAML := injectYAML(t, c.pod, o); !equality.Semantic.DeepEqual(pod, viaYAML) {
				a, _ := sigsyaml.Marshal(pod)
				b, _ := sigsyaml.Marshal(viaYAML)
				t.Errorf("the patched pod differs from sluice inject's:\n--- patched\n%s\n--- inject\n%s", a, b)
			}

			// Reinvocation (reinvocationPolicy: IfNeeded) adds nothing.
			again, result := Review(request(t, pod, c.edit), defaults, c.byDefault)
			if resp := decodeAnswer(t, again).Response; result != Skipped || resp.Patch != nil || !resp.Allowed {
				t.Errorf("reinvoked: %s, %s", result, again)
			}
		})
	}
}

func applyPatch(t testing.TB, patch, doc []byte) []byte {
	t.Helper()
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("patch does not decode: %v\n%s", err, patch)
	}
	out, err := p.Apply(doc)
	if err != nil {
		t.Fatalf("patch does not apply: %v\n%s", err, patch)
	}
	return out
}

// injectYAML is what `sluice inject` makes of pod.
func injectYAML(t *testing.T, pod *corev1.Pod, o Options) *corev1.Pod {
	t.Helper()
	src, err := sigsyaml.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	out, err := YAML(src, o)
	if err != nil {
		t.Fatalf("inject: %v", err)
	}
	var p corev1.Pod
	if err := sigsyaml.UnmarshalStrict(out, &p); err != nil {
		t.Fatalf("inject's pod does not decode strictly: %v\n%s", err, out)
	}
	return &p
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Indent(&buf, got, "", "  "); err != nil {
		t.Fatal(err)
	}
	buf.WriteByte('\n')
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("patch differs from %s (run with -update to accept):\n%s", path, buf.Bytes())
	}
}

func TestReviewMalformed(t *testing.T) {
	const uid = "705ab4f5-6393-11e8-b7cc-42010a800002"
	valid := string(request(t, barePod(), nil))
	for _, c := range []struct {
		name, body, uid, message string
	}{
		{"empty", "", "", "not a JSON AdmissionReview"},
		{"not json", "<html>", "", "not a JSON AdmissionReview"},
		{"null", "null", "", "not an admission.k8s.io/v1 AdmissionReview"},
		{"array", "[]", "", "not a JSON AdmissionReview"},
		{"v1beta1", strings.Replace(valid, "admission.k8s.io/v1", "admission.k8s.io/v1beta1", 1), uid, `(apiVersion "admission.k8s.io/v1beta1", kind "AdmissionReview")`},
		{"no kind", strings.Replace(valid, `"kind":"AdmissionReview",`, "", 1), uid, `kind ""`},
		{"no request", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, "", "no request"},
		{"no uid", strings.Replace(valid, `"uid":"`+uid+`",`, "", 1), "", "no request or no request.uid"},
		{"object not a pod", strings.Replace(valid, `"object":{`, `"object":{"spec":[1]},"x":{`, 1), uid, "request.object.spec is not a pod spec"},
		{"object a string", strings.Replace(valid, `"object":{`, `"object":"pod","x":{`, 1), uid, "request.object is not a pod"},
		{"truncated after uid", valid[:strings.Index(valid, uid)+len(uid)+2], uid, "not a JSON AdmissionReview"},
		{"wrong type", strings.Replace(valid, `"operation":"CREATE"`, `"operation":7`, 1), uid, "not a JSON AdmissionReview"},
	} {
		t.Run(c.name, func(t *testing.T) {
			answer, result := Review([]byte(c.body), Defaults(), true)
			resp := decodeAnswer(t, answer).Response
			if result != Malformed || !resp.Allowed || resp.Patch != nil {
				t.Errorf("%s: %s", result, answer)
			}
			if string(resp.UID) != c.uid {
				t.Errorf("uid %q, want %q", resp.UID, c.uid)
			}
			if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], c.message) {
				t.Errorf("warnings %q, want %q", resp.Warnings, c.message)
			}
		})
	}
}

// TestReviewPatchOps pins the shape of the patch: appends to lists that
// exist, whole lists where there are none, and grace raised in place.
func TestReviewPatchOps(t *testing.T) {
	ops := func(p *corev1.Pod) []string {
		answer, _ := Review(request(t, p, nil), Defaults(), true)
		var parsed []patchOp
		if err := json.Unmarshal(decodeAnswer(t, answer).Response.Patch, &parsed); err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, op := range parsed {
			s = append(s, op.Op+" "+op.Path)
		}
		return s
	}
	short := int64(5)
	for _, c := range []struct {
		pod  *corev1.Pod
		want []string
	}{
		{barePod(), []string{"add /spec/initContainers", "add /spec/volumes"}}, // no grace: the API server's 30 s covers the drain
		{deploymentPod(), []string{"add /spec/volumes/-", "add /spec/volumes/-", "add /spec/volumes/-", "add /spec/initContainers"}},
		{with(barePod(), func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "m"}}
			p.Spec.TerminationGracePeriodSeconds = &short
		}, addVolume("tmp")), []string{"add /spec/volumes/-", "add /spec/volumes/-", "add /spec/volumes/-", "add /spec/initContainers/-", "replace /spec/terminationGracePeriodSeconds"}},
	} {
		if got := ops(c.pod); !slices.Equal(got, c.want) {
			t.Errorf("ops %q, want %q", got, c.want)
		}
	}
}

func TestDiff(t *testing.T) {
	for _, c := range []struct{ old, new, want string }{
		{`{"a":1}`, `{"a":1}`, `null`},
		{`{"a":[1]}`, `{"a":[1,2,3]}`, `[{"op":"add","path":"/s/a/-","value":2},{"op":"add","path":"/s/a/-","value":3}]`},
		{`{"a":[1,2]}`, `{"a":[1,5,3]}`, `[{"op":"replace","path":"/s/a/1","value":5},{"op":"add","path":"/s/a/-","value":3}]`},
		{`{"a":[1,2]}`, `{"a":[1]}`, `[{"op":"replace","path":"/s/a","value":[1]}]`},
		{`{"a":null}`, `{"a":[{"b":"c"}]}`, `[{"op":"replace","path":"/s/a","value":[{"b":"c"}]}]`},
		{`{"a/b~c":1,"d":2}`, `{"a/b~c":"1","e":false}`, `[{"op":"replace","path":"/s/a~1b~0c","value":"1"},{"op":"add","path":"/s/e","value":false},{"op":"remove","path":"/s/d"}]`},
	} {
		parse := func(s string) *yaml.Node {
			var doc yaml.Node
			if err := yaml.Unmarshal([]byte(s), &doc); err != nil {
				t.Fatal(err)
			}
			return doc.Content[0]
		}
		ops, err := diff("/s", parse(c.old), parse(c.new))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(ops)
		if string(got) != c.want {
			t.Errorf("diff(%s, %s) = %s, want %s", c.old, c.new, got, c.want)
		}
		// The ops turn old into new.
		if c.want != "null" {
			out := applyPatch(t, got, []byte(`{"s":`+c.old+`}`))
			if !jsonpatch.Equal(out, []byte(`{"s":`+c.new+`}`)) {
				t.Errorf("applied: %s, want %s", out, c.new)
			}
		}
	}
}

// TestJSONNode: nodeJSON writes back what jsonNode read, keys in their
// order and numbers as written; both take JSON that yaml.v3's parser
// refuses, a raw DEL or C1 control character in a string, which the API
// server's encoder does not escape.
func TestJSONNode(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"b":1,"a":[2,-0,1.5e3,1.0,18446744073709551615]}`, ""},
		{`[true,false,null,{},[],""]`, ""},
		{"{\"env\":\"del\x7f c1\u0080\u0085\"}", ""},
		{` { "a" : [ 1 , "x" ] } `, `{"a":[1,"x"]}`},
		{`"\u00e9\"\\\/<>&\u2028"`, `"é\"\\/\u003c\u003e\u0026\u2028"`},
	} {
		n, err := jsonNode([]byte(c.in))
		if err != nil {
			t.Errorf("jsonNode(%q): %v", c.in, err)
			continue
		}
		got, err := nodeJSON(n)
		if want := cmp.Or(c.want, c.in); err != nil || string(got) != want {
			t.Errorf("nodeJSON(jsonNode(%q)) = %q, %v; want %q", c.in, got, err, want)
		}
	}
	for _, bad := range []string{``, `{"a":}`, `{"a":1}{}`, `[1,]`, `{a:1}`} {
		if n, err := jsonNode([]byte(bad)); err == nil {
			t.Errorf("jsonNode(%q) = %v, want an error", bad, n)
		}
	}
}

// BenchmarkReview is one review of a Deployment's typical pod, the
// injector's own share of the admission latency.
func BenchmarkReview(b *testing.B) {
	body := request(b, deploymentPod(), nil)
	defaults := Defaults()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, r := Review(body, defaults, true); r != Injected {
			b.Fatal(r)
		}
	}
}

// TestReviewRecovers: a panic in the review is answered, allowed, with a
// warning that shows nothing of the pod, and counted as warned once the
// request was read.
func TestReviewRecovers(t *testing.T) {
	defer func(d func([]byte, Options, bool, *outcome) (*admissionv1.AdmissionResponse, Result)) {
		decide = d
	}(decide)
	for _, c := range []struct {
		name  string
		after Result
		want  Result
	}{{"before the request is read", Malformed, Malformed}, {"after", Skipped, Warned}} {
		decide = func(body []byte, _ Options, byDefault bool, o *outcome) (*admissionv1.AdmissionResponse, Result) {
			o.uid, o.result = "u-1", c.after
			panic("secret-in-pod")
		}
		answer, result := Review(request(t, barePod(), nil), Defaults(), true)
		resp := decodeAnswer(t, answer).Response
		if result != c.want || !resp.Allowed || resp.UID != "u-1" || len(resp.Warnings) != 1 || strings.Contains(string(answer), "secret-in-pod") {
			t.Errorf("%s: %s %s", c.name, result, answer)
		}
	}
}

// largePods are pods of about 3 MiB, the most the API server accepts, in
// the shapes that cost a review most: one large value, many small ones in
// one container, and many containers.
func largePods() map[string]*corev1.Pod {
	annotation := deploymentPod()
	annotation.Annotations = map[string]string{"example.com/blob": strings.Repeat("x", 3<<20)}
	env := deploymentPod()
	for i := range 40000 {
		env.Spec.Containers[0].Env = append(env.Spec.Containers[0].Env, corev1.EnvVar{Name: fmt.Sprintf("VAR_%06d", i), Value: strings.Repeat("v", 50)})
	}
	containers := deploymentPod()
	for i := range 2200 {
		c := containers.Spec.Containers[0].DeepCopy()
		c.Name, c.Ports = fmt.Sprintf("c%d", i), nil
		for j := range 20 {
			c.Env = append(c.Env, corev1.EnvVar{Name: fmt.Sprintf("E%d", j), Value: "x"})
		}
		containers.Spec.Containers = append(containers.Spec.Containers, *c)
	}
	return map[string]*corev1.Pod{"annotation": annotation, "env": env, "containers": containers}
}

// maxReviewFactor bounds what one review allocates, as a multiple of its
// body: the injector's --max-in-flight sizing (24 MiB for the 3 MiB the
// API server sends at most) rests on it. The body is held about four
// times (read, the review's raw object, the pod's keys, the spec's items)
// and json.Decoder buffers the largest item.
const maxReviewFactor = 7

// TestReviewMemory: a review of a large pod, whatever its shape, allocates
// at most maxReviewFactor times its body in all. A node tree of the whole
// spec took 29 times (env) and 63 times (containers).
func TestReviewMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 9 MiB of pods")
	}
	for shape, pod := range largePods() {
		body := request(t, pod, nil)
		if len(body) < 2<<20 || len(body) > MaxReviewBytes {
			t.Fatalf("%s: body of %d bytes, want 2 MiB to MaxReviewBytes", shape, len(body))
		}
		var before, after goruntime.MemStats
		goruntime.ReadMemStats(&before)
		_, result := Review(body, Defaults(), true)
		goruntime.ReadMemStats(&after)
		if result != Injected {
			t.Fatalf("%s: %s", shape, result)
		}
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("%-10s body %.2f MiB, allocated %.1f MiB (%.1f times)", shape, float64(len(body))/(1<<20), float64(alloc)/(1<<20), float64(alloc)/float64(len(body)))
		if alloc > maxReviewFactor*uint64(len(body)) {
			t.Errorf("%s: a review of %d bytes allocated %d, over %d times its body", shape, len(body), alloc, maxReviewFactor)
		}
	}
}

// BenchmarkReviewLarge is a review of each of largePods.
func BenchmarkReviewLarge(b *testing.B) {
	for shape, pod := range largePods() {
		body := request(b, pod, nil)
		b.Run(shape, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				Review(body, Defaults(), true)
			}
		})
	}
}
