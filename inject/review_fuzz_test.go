package inject

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
)

// FuzzReview: whatever the body, Review does not panic, and its answer is
// an AdmissionReview the API server accepts: it decodes strictly, with
// apiVersion, kind and a response, a patch only when Injected and then
// one that applies and leaves a pod.
func FuzzReview(f *testing.F) {
	for _, c := range reviewCases {
		body := request(f, c.pod, c.edit)
		f.Add(body, c.byDefault)
		for _, n := range []int{1, len(body) / 3, len(body) / 2, len(body) - 1} {
			f.Add(body[:n], c.byDefault)
		}
	}
	for _, s := range []string{"", "null", "{}", "[]", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":{"spec":{"containers":[{"name":"a"}]}}}}`} {
		f.Add([]byte(s), true)
	}
	defaults := Defaults()
	f.Fuzz(func(t *testing.T, body []byte, byDefault bool) {
		answer, result := Review(body, defaults, byDefault)
		var ar admissionv1.AdmissionReview
		dec := json.NewDecoder(bytes.NewReader(answer))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ar); err != nil {
			t.Fatalf("answer does not decode: %v\n%s", err, answer)
		}
		resp := ar.Response
		if ar.APIVersion != "admission.k8s.io/v1" || ar.Kind != "AdmissionReview" || resp == nil || ar.Request != nil {
			t.Fatalf("not an AdmissionReview response: %s", answer)
		}
		if resp.Allowed == (result == Denied) {
			t.Fatalf("%s with allowed %v", result, resp.Allowed)
		}
		if (resp.Patch != nil) != (result == Injected) || (resp.PatchType != nil) != (result == Injected) {
			t.Fatalf("%s with patch %q", result, resp.Patch)
		}
		if result != Injected {
			return
		}
		var req admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &req); err != nil {
			t.Fatalf("injected into a body that does not decode: %v", err)
		}
		patch, err := jsonpatch.DecodePatch(resp.Patch)
		if err != nil {
			t.Fatalf("patch does not decode: %v\n%s", err, resp.Patch)
		}
		out, err := patch.Apply(req.Request.Object.Raw)
		if err != nil {
			t.Fatalf("patch does not apply: %v\n%s\nto %s", err, resp.Patch, req.Request.Object.Raw)
		}
		var pod corev1.Pod
		if err := json.Unmarshal(out, &pod); err != nil {
			t.Fatalf("patched pod does not decode: %v\n%s", err, out)
		}
		if !slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == ContainerName }) {
			t.Fatalf("patched pod has no sidecar: %s", out)
		}
	})
}
