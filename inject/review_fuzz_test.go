package inject

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"go.yaml.in/yaml/v3"
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

// specPatchWhole is specPatch as it was before specNode: a node tree of the
// whole spec, copied whole for the diff. FuzzSpecPatch holds the two to
// the same patch.
func specPatchWhole(raw []byte, o Options) ([]byte, error) {
	spec, err := jsonNode(raw)
	if err != nil {
		return nil, err
	}
	if spec.Kind != yaml.MappingNode {
		return nil, errors.New("the pod spec is not an object")
	}
	old := deepCopy(spec)
	if err := PodSpec(spec, o, ""); err != nil {
		return nil, err
	}
	ops, err := diff("/spec", old, spec)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ops)
}

// patched is the pod {"spec": spec} after patch, decoded.
func patched(t *testing.T, spec, patch []byte) any {
	t.Helper()
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
	out, err := p.Apply([]byte(`{"spec":` + string(spec) + `}`))
	if err != nil {
		t.Fatalf("patch %s does not apply: %v", patch, err)
	}
	var v any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// FuzzSpecPatch: for any pod spec the API server could send (the input
// decoded as a corev1.PodSpec and encoded again, as the API server
// re-encodes what it stores), the review's patch from specNode's partial
// tree makes the pod a tree of the whole spec makes, or both fail. (They
// may differ in a no-op: an item the sidecar rewrites as it was is
// replaced, unread, where the whole tree saw it unchanged.)
func FuzzSpecPatch(f *testing.F) {
	for _, c := range reviewCases {
		raw, err := json.Marshal(c.pod.Spec)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw, false)
		f.Add(raw, true)
	}
	f.Add([]byte(`{"containers":[{"name":"a"}],"volumes":[{"name":"q","persistentVolumeClaim":{"claimName":"q-0"}}],"initContainers":[{"name":"x","env":[{"name":"A","value":"b"}]}],"terminationGracePeriodSeconds":3}`), true)
	f.Fuzz(func(t *testing.T, in []byte, pvc bool) {
		var spec corev1.PodSpec
		if json.Unmarshal(in, &spec) != nil {
			return
		}
		raw, err := json.Marshal(spec)
		if err != nil {
			return
		}
		o := Defaults()
		if pvc {
			o.PVC = "q"
		}
		got, gotErr := specPatch(raw, o)
		want, wantErr := specPatchWhole(raw, o)
		if (gotErr == nil) != (wantErr == nil) || gotErr == nil && !reflect.DeepEqual(patched(t, raw, got), patched(t, raw, want)) {
			t.Fatalf("spec %s:\nspecNode: %s, %v\nwhole:    %s, %v", raw, got, gotErr, want, wantErr)
		}
	})
}
