package inject

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/config"
	"go.yaml.in/yaml/v3"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Result is how one admission review ended: the result label of
// sluice_injector_reviews_total.
type Result string

const (
	Injected  Result = "injected"  // the pod gets the sidecar (a patch)
	Skipped   Result = "skipped"   // not asked for, opted out, or the sidecar is there already
	Warned    Result = "warned"    // bad input: allowed without the sidecar, with a warning
	Denied    Result = "denied"    // bad input and sluice.io/required: "true": refused
	Malformed Result = "malformed" // the body is not an AdmissionReview of a pod
)

// Results lists every Result, for metrics to start at zero.
var Results = []Result{Injected, Skipped, Warned, Denied, Malformed}

var podKind = metav1.GroupVersionKind{Group: "", Version: "v1", Kind: "Pod"}

// Review answers one AdmissionReview (admission.k8s.io/v1) request body
// with an AdmissionReview response body. byDefault says the pod's
// namespace opted in (the webhook called at NamespacePath): the
// pod gets the sidecar unless it says sluice.io/inject: "false"; otherwise
// only a pod that says "true" does. defaults are the injector's flags,
// which the pod's annotations override. It never panics, and its answer is
// always a well-formed AdmissionReview.
func Review(body []byte, defaults Options, byDefault bool) (answer []byte, result Result) {
	o := reviewOutcome(body, defaults, byDefault)
	return o.answer, o.result
}

// outcome is a review's answer and, for the injector's log of bad input,
// which pod it was about and why it was not injected.
type outcome struct {
	answer         []byte
	result         Result
	uid            types.UID
	namespace, pod string // the pod's name, or its generateName
	reason         string // the denial's message or the first warning
}

func reviewOutcome(body []byte, defaults Options, byDefault bool) (o outcome) {
	o.result = Malformed
	defer func() {
		// A bug here must not take the injector down with every pod
		// creation in the cluster behind it; the panic's value may hold
		// pod data, so the warning says nothing of it.
		if r := recover(); r != nil {
			if o.result != Malformed {
				o.result = Warned
			}
			o.reason = "sluice: internal error in the injector; the pod was admitted without the sidecar"
			o.answer = encode(&admissionv1.AdmissionResponse{UID: o.uid, Allowed: true, Warnings: []string{o.reason}})
		}
	}()
	resp, result := decide(body, defaults, byDefault, &o)
	o.result = result
	if resp.Result != nil {
		o.reason = resp.Result.Message
	} else if len(resp.Warnings) > 0 {
		o.reason = resp.Warnings[0]
	}
	o.answer = encode(resp)
	return o
}

// decide is review; a test swaps it to make reviewOutcome's recover run.
var decide = review

// review decides; it fills in o's uid, result and pod as soon as it knows
// them, for reviewOutcome's recover and the log.
func review(body []byte, defaults Options, byDefault bool, o *outcome) (*admissionv1.AdmissionResponse, Result) {
	uid := &o.uid
	var ar admissionv1.AdmissionReview
	err := json.Unmarshal(body, &ar)
	if ar.Request != nil {
		*uid = ar.Request.UID
	}
	switch {
	case err != nil:
		*uid = types.UID(requestUID(body)) // a body cut short may still name it
		return malformed(*uid, "the body is not a JSON AdmissionReview")
	case ar.APIVersion != admissionv1.SchemeGroupVersion.String() || ar.Kind != "AdmissionReview":
		return malformed(*uid, fmt.Sprintf("the body is not an admission.k8s.io/v1 AdmissionReview (apiVersion %s, kind %s)",
			shortQuote(ar.APIVersion), shortQuote(ar.Kind)))
	case ar.Request == nil || ar.Request.UID == "":
		return malformed(*uid, "the AdmissionReview has no request or no request.uid")
	}
	req := ar.Request
	o.namespace, o.pod = req.Namespace, req.Name
	if req.Kind != podKind || req.Operation != admissionv1.Create || req.SubResource != "" {
		// The webhook's rules send only pod creations; anything else is a
		// misconfiguration, not a reason to get in the way.
		return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}, Skipped
	}
	// The keys are matched exactly, as the API server does and the patch's
	// paths assume; encoding/json would take "Spec" for "spec".
	var pod map[string]json.RawMessage
	var meta podMeta
	var spec podSpec
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return malformed(req.UID, "request.object is not a pod")
	}
	if raw := pod["metadata"]; raw != nil {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return malformed(req.UID, "request.object.metadata is not object metadata")
		}
		o.pod = cmp.Or(meta.Name, meta.GenerateName)
	}
	if raw := pod["spec"]; raw != nil {
		if err := json.Unmarshal(raw, &spec); err != nil {
			return malformed(req.UID, "request.object.spec is not a pod spec")
		}
	}
	o.result = Skipped
	if _, ok := optedIn(&meta, byDefault); !ok {
		return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}, Skipped
	}
	if hasSidecar(&spec) {
		// Also what a reinvocation finds: the patch below is applied.
		return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}, Skipped
	}
	o.result = Warned
	required := meta.Annotations[AnnotationRequired] == "true"
	opts, err := takes(&meta, &spec, defaults)
	var patch []byte
	if err == nil {
		patch, err = specPatch(pod["spec"], opts)
	}
	if err != nil {
		if required {
			return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: false, Result: &metav1.Status{
				Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest,
				Message: "sluice: " + err.Error() + ` (the pod says sluice.io/required: "true")`,
			}}, Denied
		}
		return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true,
			Warnings: []string{"sluice: " + err.Error() + "; the pod starts without the sidecar"}}, Warned
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true, Patch: patch, PatchType: &pt}, Injected
}

func malformed(uid types.UID, why string) (*admissionv1.AdmissionResponse, Result) {
	return &admissionv1.AdmissionResponse{UID: uid, Allowed: true,
		Warnings: []string{"sluice: " + why + "; admitted unchanged"}}, Malformed
}

// encodeMalformed is the whole answer to a body that is no review: the
// uid is the request's if the body's start names one (requestUID), so the
// API server takes the answer rather than calling it a webhook failure.
func encodeMalformed(uid string, why string) ([]byte, Result) {
	resp, result := malformed(types.UID(uid), why)
	return encode(resp), result
}

// encode wraps resp in an AdmissionReview.
func encode(resp *admissionv1.AdmissionResponse) []byte {
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	})
	if err != nil { // cannot happen: every field is a plain value
		return []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":true}}`)
	}
	return b
}

// podMeta and podSpec are the parts of a pod a review decides on. The API
// server has decoded and defaulted the pod before any webhook sees it, so
// the rest need not be decoded again; typed as corev1's, they cost a
// review a third of its time (BenchmarkReview).
type (
	podMeta struct {
		Name         string            `json:"name"`
		GenerateName string            `json:"generateName"`
		Labels       map[string]string `json:"labels"`
		Annotations  map[string]string `json:"annotations"`
	}
	podSpec struct {
		HostNetwork    bool           `json:"hostNetwork"`
		InitContainers []podContainer `json:"initContainers"`
		Containers     []podContainer `json:"containers"`
		Volumes        []struct {
			Name string `json:"name"`
		} `json:"volumes"`
	}
	podContainer struct {
		Name  string `json:"name"`
		Ports []struct {
			ContainerPort int32 `json:"containerPort"`
		} `json:"ports"`
	}
)

// optedIn says whether a pod whose metadata is meta asked for the sidecar,
// reviewed at the webhook for opted-in namespaces (byDefault) or at the
// one for opted-in pods, and why, in words for `sluice check-inject`.
func optedIn(meta *podMeta, byDefault bool) (why string, ok bool) {
	switch {
	case meta.Annotations[AnnotationInject] == "false":
		return `it is annotated ` + AnnotationInject + `: "false"`, false
	case meta.Labels[AnnotationInject] == "false":
		return `it is labelled ` + AnnotationInject + `: "false"`, false
	case byDefault:
		return "its namespace is opted in", true
	case meta.Labels[AnnotationInject] == "true":
		return `it is labelled ` + AnnotationInject + `: "true"`, true
	case meta.Annotations[AnnotationInject] == "true":
		return `it is annotated ` + AnnotationInject + `: "true"`, true
	}
	return `its namespace is not opted in and it says no ` + AnnotationInject + `: "true"`, false
}

// takes is the options a pod opted in gets, its annotations over
// defaults, or why it cannot take the sidecar: the review's warning.
func takes(meta *podMeta, spec *podSpec, defaults Options) (Options, error) {
	opts, err := annotationOptions(meta.Annotations, defaults)
	if err == nil {
		err = canTake(meta, spec, opts)
	}
	return opts, err
}

// hasSidecar reports whether spec has a container named like the sidecar,
// injected by us (an earlier review, or `sluice inject` on the workload) or
// by hand: either way a second one must not be added.
func hasSidecar(spec *podSpec) bool {
	for _, list := range [][]podContainer{spec.InitContainers, spec.Containers} {
		for _, c := range list {
			if c.Name == ContainerName {
				return true
			}
		}
	}
	return false
}

// canTake says why a pod cannot take the sidecar with options o, if it
// cannot: the patch would make a pod that the API server refuses or that
// does not work.
func canTake(meta *podMeta, spec *podSpec, o Options) error {
	if len(spec.Containers) == 0 {
		return errors.New("the pod has no containers")
	}
	if spec.HostNetwork {
		// Loopback is the node's then: the second such pod on a node
		// would find the ports taken.
		return fmt.Errorf("the pod uses hostNetwork, where the sidecar's loopback ports %d and %d would collide with other pods' on the node", o.IngestPort, o.AdminPort)
	}
	for _, list := range [][]podContainer{spec.InitContainers, spec.Containers} {
		for _, c := range list {
			for _, p := range c.Ports {
				switch int(p.ContainerPort) {
				case o.IngestPort:
					return fmt.Errorf("container %s already uses port %d, the sidecar's ingest port (set %singest-port to another)", shortQuote(c.Name), p.ContainerPort, AnnotationPrefix)
				case o.AdminPort:
					return fmt.Errorf("container %s already uses port %d, the sidecar's admin port (set %sadmin-port to another)", shortQuote(c.Name), p.ContainerPort, AnnotationPrefix)
				}
			}
		}
	}
	for _, v := range spec.Volumes {
		switch v.Name {
		case DataVolume, ConfigVolume, SecretsVolume:
			return fmt.Errorf("the pod already has a volume %q, a name the sidecar needs", v.Name)
		}
	}
	if o.fleet() {
		// A name given is the node id as it is; a generated one is the
		// base, cut to 58 bytes, and 5 more, so only its "." can fail.
		if meta.Name != "" {
			if config.ValidateNodeID(meta.Name) != nil { // its words are too long for a warning
				return fmt.Errorf(`pod name %s: in fleet mode each pod's name is its node_id, which must be 1 to 64 letters, digits, "_" or "-"`, shortQuote(meta.Name))
			}
		} else if err := nodeIDName(meta.GenerateName); err != nil {
			return fmt.Errorf("pod name %s: in fleet mode %w", shortQuote(meta.GenerateName), err)
		}
	}
	return nil
}

// errNodeIDDot is why a pod name with a "." cannot be the node id of a
// sidecar in fleet mode (config.Config.NodeID).
var errNodeIDDot = errors.New(`each pod's name is its node_id, which cannot contain "."`)

// nodeIDName checks a pod's name, or the name its pods derive from, for use
// as the fleet node id.
func nodeIDName(name string) error {
	if strings.Contains(name, ".") {
		return errNodeIDDot
	}
	return nil
}

// specPatch is the JSON Patch that adds the sidecar to the pod spec raw (its
// JSON). It runs PodSpec, the rewrite `sluice inject` makes, on the spec
// (JSON is YAML) and turns what changed into patch operations, so the two
// paths share every decision.
func specPatch(raw []byte, o Options) ([]byte, error) {
	spec, err := specNode(raw)
	if err != nil {
		return nil, fmt.Errorf("read the pod spec: %w", err)
	}
	if spec.Kind != yaml.MappingNode {
		return nil, errors.New("the pod spec is not an object")
	}
	old := deepCopy(spec)
	if err := PodSpec(spec, o, ""); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	ops, err := diff("/spec", old, spec)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ops)
}

// patchOp is one JSON Patch (RFC 6902) operation.
type patchOp struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	Value json.RawMessage `json:"value,omitempty"`
}

// diff returns the operations that turn mapping old into new, key by key:
// a list that only grew gets its new items appended (so a patch does not
// rewrite what another webhook may have added meanwhile), a changed item of
// a list is replaced at its index, and anything else is replaced whole.
func diff(path string, old, new *yaml.Node) ([]patchOp, error) {
	var ops []patchOp
	add := func(op, p string, n *yaml.Node) error {
		v, err := nodeJSON(n)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		ops = append(ops, patchOp{Op: op, Path: p, Value: v})
		return nil
	}
	for i := 0; i+1 < len(new.Content); i += 2 {
		key, nv := new.Content[i].Value, new.Content[i+1]
		p := path + "/" + pointerEscaper.Replace(key)
		ov := mapGet(old, key)
		var err error
		switch {
		case ov == nil:
			err = add("add", p, nv)
		case equal(ov, nv):
		case ov.Kind == yaml.SequenceNode && nv.Kind == yaml.SequenceNode && len(nv.Content) >= len(ov.Content):
			for j, item := range ov.Content {
				if err == nil && !equal(item, nv.Content[j]) {
					err = add("replace", fmt.Sprintf("%s/%d", p, j), nv.Content[j])
				}
			}
			for _, item := range nv.Content[len(ov.Content):] {
				if err == nil {
					err = add("add", p+"/-", item)
				}
			}
		default:
			err = add("replace", p, nv)
		}
		if err != nil {
			return nil, err
		}
	}
	for i := 0; i+1 < len(old.Content); i += 2 {
		if mapGet(new, old.Content[i].Value) == nil {
			ops = append(ops, patchOp{Op: "remove", Path: path + "/" + pointerEscaper.Replace(old.Content[i].Value)})
		}
	}
	return ops, nil
}

// pointerEscaper escapes a JSON Pointer (RFC 6901) reference token.
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// equal reports whether a and b hold the same YAML data, whatever their
// style and comments.
func equal(a, b *yaml.Node) bool {
	if a.Kind != b.Kind || a.Value != b.Value || a.ShortTag() != b.ShortTag() || len(a.Content) != len(b.Content) {
		return false
	}
	for i := range a.Content {
		if !equal(a.Content[i], b.Content[i]) {
			return false
		}
	}
	return a.Kind != yaml.AliasNode || a.Alias == b.Alias
}

// deepCopy copies n's tree into one allocation of nodes.
func deepCopy(n *yaml.Node) *yaml.Node {
	var count func(*yaml.Node) int
	count = func(n *yaml.Node) int {
		c := 1
		for _, child := range n.Content {
			c += count(child)
		}
		return c
	}
	nodes := make([]yaml.Node, 0, count(n))
	var cp func(*yaml.Node) *yaml.Node
	cp = func(n *yaml.Node) *yaml.Node {
		nodes = append(nodes, *n) // within capacity: earlier pointers stay valid
		c := &nodes[len(nodes)-1]
		if n.Content != nil {
			c.Content = make([]*yaml.Node, len(n.Content))
			for i, child := range n.Content {
				c.Content[i] = cp(child)
			}
		}
		return c
	}
	return cp(n)
}

// rawTag marks a node that stands for JSON the review passes through
// unread: its Value is the JSON text, which nodeJSON writes back as it is.
// A raw mapping (a list item PodSpec looks up by name) also holds, in
// Content, the keys PodSpec reads.
const rawTag = "!sluice.io/json"

// specNode is the pod spec raw as PodSpec needs it, and no more: a node
// tree of the whole spec took 30 to 60 times the spec's size (a 3 MiB spec
// of env vars took 93 MiB; one of 1,500 containers, 124 MiB), and the
// injector answers reviews of up to 3 MiB. PodSpec reads and changes
// three keys: initContainers and volumes (each item's name, and whether a
// volume is a claim) and terminationGracePeriodSeconds; of containers it
// needs to know only that there is one. Those items are raw mappings,
// the grace a scalar, and every other value one raw node, so a review
// takes a few times the spec whatever its shape (BenchmarkReviewLarge).
func specNode(raw []byte) (*yaml.Node, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil {
		return nil, err
	} else if t != json.Delim('{') {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: rawTag, Value: string(raw)}, nil // not a mapping: specPatch says so
	}
	spec := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for dec.More() {
		k, err := dec.Token() // a string: Token refuses any other key
		if err != nil {
			return nil, err
		}
		key := k.(string)
		var v *yaml.Node
		switch key {
		case "terminationGracePeriodSeconds":
			v, err = readNode(dec)
		case "initContainers", "volumes", "containers":
			v, err = rawList(dec, raw, key != "containers")
		default:
			v, err = rawValue(dec)
		}
		if err != nil {
			return nil, err
		}
		spec.Content = append(spec.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value")
	}
	return spec, nil
}

// rawValue reads the next value as one raw node.
func rawValue(dec *json.Decoder) (*yaml.Node, error) {
	var m json.RawMessage
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: rawTag, Value: string(m)}, nil
}

// rawList reads a list as a sequence of raw items; named, each item that
// is an object is a raw mapping holding its name and, for a volume, its
// persistentVolumeClaim. A value that is not a list is one raw node.
func rawList(dec *json.Decoder, raw []byte, named bool) (*yaml.Node, error) {
	if t, ok := peekDelim(dec, raw); !ok || t != '[' {
		return rawValue(dec)
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	list := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	for dec.More() {
		var item json.RawMessage
		if err := dec.Decode(&item); err != nil {
			return nil, err
		}
		n := &yaml.Node{Kind: yaml.ScalarNode, Tag: rawTag, Value: string(item)}
		if named && item[0] == '{' {
			var keys map[string]json.RawMessage // exact keys, as mapGet matches them
			if err := json.Unmarshal(item, &keys); err != nil {
				return nil, err
			}
			n.Kind = yaml.MappingNode
			for _, k := range []string{"name", "persistentVolumeClaim"} {
				if v, ok := keys[k]; ok {
					vn, err := jsonNode(v) // small: a name, or a claim's two fields
					if err != nil {
						return nil, err
					}
					n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, vn)
				}
			}
		}
		list.Content = append(list.Content, n)
	}
	_, err := dec.Token() // the closing bracket
	return list, err
}

// peekDelim reports the delimiter the next value of dec, reading raw,
// starts with, if it is one, without reading it.
func peekDelim(dec *json.Decoder, raw []byte) (byte, bool) {
	for _, b := range raw[dec.InputOffset():] {
		switch b {
		case ' ', '\t', '\n', '\r', ':', ',':
			continue
		case '[', '{':
			return b, true
		}
		return 0, false
	}
	return 0, false
}

// jsonNode is the JSON value raw as the yaml.Node yaml.v3 makes of it:
// mappings, sequences, and scalars tagged !!str, !!int, !!float, !!bool
// or !!null, a number keeping its text. encoding/json reads it, not
// yaml.v3's parser: that refuses a string holding DEL or a C1 control
// character, which JSON allows and the API server writes unescaped.
func jsonNode(raw []byte) (*yaml.Node, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	n, err := readNode(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value")
	}
	return n, nil
}

// readNode reads one value of jsonNode's.
func readNode(dec *json.Decoder) (*yaml.Node, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	scalar := func(tag, value string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value} }
	switch t := t.(type) {
	case json.Delim: // an opening one: Token refuses a misplaced closing one
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		if t == '[' {
			n.Kind, n.Tag = yaml.SequenceNode, "!!seq"
		}
		for dec.More() {
			if n.Kind == yaml.MappingNode {
				k, err := dec.Token() // a string: Token refuses any other key
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, scalar("!!str", k.(string)))
			}
			v, err := readNode(dec)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, v)
		}
		_, err := dec.Token() // the closing delimiter
		return n, err
	case string:
		n := scalar("!!str", t)
		n.Style = yaml.DoubleQuotedStyle
		return n, nil
	case json.Number:
		if _, err := t.Int64(); err == nil {
			return scalar("!!int", t.String()), nil
		}
		return scalar("!!float", t.String()), nil
	case bool:
		return scalar("!!bool", strconv.FormatBool(t)), nil
	}
	return scalar("!!null", "null"), nil
}

// nodeJSON is n as JSON: what Node.Decode and json.Marshal make of it, but
// a mapping keeps its keys' order (decoded into a map, they would be
// sorted) and a number its text when that is JSON (1.0 stays 1.0).
func nodeJSON(n *yaml.Node) (json.RawMessage, error) {
	if n.Tag == rawTag {
		return json.RawMessage(n.Value), nil
	}
	switch n.Kind {
	case yaml.MappingNode, yaml.SequenceNode:
		open, end := byte('['), byte(']')
		if n.Kind == yaml.MappingNode {
			open, end = '{', '}'
		}
		b := []byte{open}
		for i, c := range n.Content {
			key := n.Kind == yaml.MappingNode && i%2 == 0
			if key && (c.Kind != yaml.ScalarNode || c.ShortTag() != "!!str") {
				return decodedJSON(n) // a key JSON holds only as a string
			}
			switch {
			case i == 0:
			case n.Kind == yaml.MappingNode && !key:
				b = append(b, ':')
			default:
				b = append(b, ',')
			}
			j, err := nodeJSON(c)
			if err != nil {
				return nil, err
			}
			b = append(b, j...)
		}
		return append(b, end), nil
	case yaml.ScalarNode:
		switch v := n.Value; n.ShortTag() {
		case "!!str":
			return json.Marshal(v)
		case "!!int", "!!float":
			if v != "" && (v[0] == '-' || v[0] >= '0' && v[0] <= '9') && json.Valid([]byte(v)) {
				return json.RawMessage(v), nil
			}
		}
	}
	return decodedJSON(n)
}

// decodedJSON is n as JSON by Node.Decode and json.Marshal.
func decodedJSON(n *yaml.Node) (json.RawMessage, error) {
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}
