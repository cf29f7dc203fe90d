// Package inject owns adding the sluice sidecar to Kubernetes pods: the
// YAML rewrite of `sluice inject` (YAML) and the admission review of
// `sluice injector` (Review). Both edit a pod spec through one function
// (PodSpec), so the two cannot drift: the review reads the pod's spec,
// JSON, as YAML, runs PodSpec on it and answers with the difference as a
// JSON Patch. It edits YAML as a yaml.Node tree rather than decoding into
// types, so comments, key order and fields it does not know survive the
// round trip. Options come from the commands' flags (Defaults), overridden
// for one pod by its sluice.io/ annotations.
package inject

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/sluicehq/sluice/config"
)

// Names and paths that inject owns in a pod spec. Running inject again finds
// them by these names and replaces them instead of adding a second copy.
const (
	ContainerName = "sluice"
	DataVolume    = "sluice-data"
	ConfigVolume  = "sluice-config"
	SecretsVolume = "sluice-secrets"
	// NoTokenVolume is an empty volume the sidecar mounts where the
	// service account's token would go (serviceAccountDir): sluice calls
	// no Kubernetes API, so it has no token. A container with a mount
	// there is one the API server's ServiceAccount plugin leaves alone,
	// so it does not change the pod after the injector did, and the
	// injector is not called a second time (reinvocationPolicy: IfNeeded
	// re-runs the webhooks only when a later plugin changed the pod).
	// automountServiceAccountToken is pod-wide: the app keeps its token.
	NoTokenVolume     = "sluice-no-token"
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	DataDir           = "/var/lib/sluice"
	ConfigDir         = "/etc/sluice"
	ConfigFile        = ConfigDir + "/sluice.yaml"
	SecretsDir        = "/etc/sluice-secrets"
	DefaultImage      = "ghcr.io/sluicehq/sluice:latest"
	DefaultConfigMap  = "sluice-config"
	graceHeadroom     = 5 // seconds beyond the drain grace for the kubelet
	// apiServerGrace is the terminationGracePeriodSeconds the API server
	// gives a pod that sets none: a manifest without one already has it.
	apiServerGrace    = 30
	imageUID          = 65532
	DefaultIngestPort = 8700
	DefaultAdminPort  = 8701
	DefaultGrace      = "10s"
)

// podSpecPaths says where each kind keeps its pod spec. Other kinds pass
// through untouched.
var podSpecPaths = map[string][]string{
	"Pod":         {"spec"},
	"Deployment":  {"spec", "template", "spec"},
	"StatefulSet": {"spec", "template", "spec"},
	"DaemonSet":   {"spec", "template", "spec"},
	"Job":         {"spec", "template", "spec"},
}

// dns1123 is a Kubernetes resource name (ConfigMap, Secret, PVC).
var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)

// Options say what sidecar to add: the flags of `sluice inject` and
// `sluice injector`, which a pod's annotations override.
type Options struct {
	Image      string
	ConfigMap  string
	PVC        string
	Secret     string
	Grace      time.Duration
	IngestPort int
	AdminPort  int
	// The sidecar's resources, as Kubernetes quantities ("50m", "64Mi");
	// empty leaves that request or limit unset.
	CPURequest, MemoryRequest string
	CPULimit, MemoryLimit     string
	// JetStreamURLs, when set, put the sidecar in fleet mode: the log is in JetStream at these servers, and each pod's node
	// id is its name.
	JetStreamURLs []string
}

// Defaults are the options `sluice inject` and `sluice injector` start
// from: their flags' defaults.
func Defaults() Options {
	return Options{
		Image:      DefaultImage,
		ConfigMap:  DefaultConfigMap,
		Grace:      10 * time.Second, // DefaultGrace
		IngestPort: DefaultIngestPort,
		AdminPort:  DefaultAdminPort,
		// Idle, sluice holds tens of MiB. Under a sustained burst its live
		// set is bounded but large, up to ~550 MiB measured: ingest
		// admission and the ring of recent events (64 MiB each) and
		// mostly Badger's table builders, whose buffers its allocator
		// pool keeps (docs/reliability.md). sluice sets GOMEMLIMIT to 85% of
		// the limit, which must leave that room. No CPU limit: throttling
		// a delivery sidecar only turns into latency.
		CPURequest:    "50m",
		MemoryRequest: "64Mi",
		MemoryLimit:   "1Gi",
	}
}

// Validate checks o; its errors name the flags of `sluice inject`.
func (o Options) Validate() error {
	return o.validate(func(key string) string { return "--" + key })
}

// validate checks o; name turns an option's key (the flag's name without
// its dashes: "config-map") into what the user set it with, so an error
// from a pod's annotation names the annotation rather than a flag.
func (o Options) validate(name func(key string) string) error {
	switch {
	case o.Image == "":
		return fmt.Errorf("%s must not be empty", name("image"))
	case !dns1123.MatchString(o.ConfigMap):
		return fmt.Errorf("%s %q is not a Kubernetes resource name", name("config-map"), o.ConfigMap)
	case o.PVC != "" && !dns1123.MatchString(o.PVC):
		return fmt.Errorf("%s %q is not a Kubernetes resource name", name("pvc"), o.PVC)
	case o.Secret != "" && !dns1123.MatchString(o.Secret):
		return fmt.Errorf("%s %q is not a Kubernetes resource name", name("secret"), o.Secret)
	case o.Grace < 0 || o.Grace > 24*time.Hour:
		return fmt.Errorf("%s %s is out of range (0 to 24h)", name("grace"), o.Grace)
	case o.IngestPort < 1 || o.IngestPort > 65535:
		return fmt.Errorf("%s %d is out of range (1 to 65535)", name("ingest-port"), o.IngestPort)
	case o.AdminPort < 1 || o.AdminPort > 65535:
		return fmt.Errorf("%s %d is out of range (1 to 65535)", name("admin-port"), o.AdminPort)
	case o.IngestPort == o.AdminPort:
		return fmt.Errorf("%s and %s are both %d", name("ingest-port"), name("admin-port"), o.IngestPort)
	}
	for _, pair := range [][2]string{{"cpu-request", "cpu-limit"}, {"memory-request", "memory-limit"}} {
		var q [2]resource.Quantity
		for i, key := range pair {
			v := o.resource(key)
			if v == "" {
				continue
			}
			var err error
			if q[i], err = resource.ParseQuantity(v); err != nil {
				return fmt.Errorf("%s %q is not a Kubernetes quantity (like 50m, 64Mi or 1Gi)", name(key), v)
			}
			if q[i].Sign() < 0 {
				return fmt.Errorf("%s %q is negative", name(key), v)
			}
		}
		if o.resource(pair[0]) != "" && o.resource(pair[1]) != "" && q[0].Cmp(q[1]) > 0 {
			return fmt.Errorf("%s %s is above %s %s", name(pair[0]), o.resource(pair[0]), name(pair[1]), o.resource(pair[1]))
		}
	}
	for i, u := range o.JetStreamURLs {
		shown := u
		if strings.Contains(u, "@") {
			shown = "[redacted]" // it may hold a password
		}
		if err := config.ValidateJetStreamURL(u); err != nil {
			return fmt.Errorf("%s %q: %w", name("jetstream-url"), shown, err)
		}
		if slices.Index(o.JetStreamURLs, u) < i {
			return fmt.Errorf("%s %q: given twice", name("jetstream-url"), shown)
		}
	}
	return nil
}

// resource returns the resource option named by its flag's key.
func (o Options) resource(key string) string {
	switch key {
	case "cpu-request":
		return o.CPURequest
	case "memory-request":
		return o.MemoryRequest
	case "cpu-limit":
		return o.CPULimit
	case "memory-limit":
		return o.MemoryLimit
	}
	return ""
}

// fleet reports whether the sidecar runs in fleet mode.
func (o Options) fleet() bool { return len(o.JetStreamURLs) > 0 }

// terminationGrace is the smallest terminationGracePeriodSeconds that lets
// the sidecar drain for the full grace.
func (o Options) terminationGrace() int {
	return int(math.Ceil(o.Grace.Seconds())) + graceHeadroom
}

// YAML returns src with the sidecar added to every workload in it. On any
// error it returns nothing, so a caller never writes half a file.
func YAML(src []byte, o Options) ([]byte, error) {
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var docs []*yaml.Node
	for i := 1; ; i++ {
		doc := new(yaml.Node)
		if err := dec.Decode(doc); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("document %d: not valid YAML: %w", i, err)
		}
		if err := document(doc, o); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		docs = append(docs, doc)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	written := 0
	for i, doc := range docs {
		if emptyDocument(doc) {
			continue // nothing but comments, or "---" at the end
		}
		if err := enc.Encode(doc); err != nil {
			return nil, fmt.Errorf("document %d: write: %w", i+1, err)
		}
		written++
	}
	if written == 0 {
		return src, nil // no object at all: nothing to change
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func emptyDocument(doc *yaml.Node) bool {
	if len(doc.Content) == 0 {
		return true
	}
	n := doc.Content[0]
	return len(doc.Content) == 1 && n.Kind == yaml.ScalarNode && n.Tag == "!!null" && n.Value == "" &&
		doc.HeadComment == "" && doc.FootComment == "" && n.HeadComment == "" && n.LineComment == "" && n.FootComment == ""
}

// document edits one document in place if it is a workload.
func document(doc *yaml.Node, o Options) error {
	if len(doc.Content) == 0 {
		return nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil // not a Kubernetes object: pass through
	}
	kindNode := mapGet(root, "kind")
	if kindNode == nil || kindNode.Kind != yaml.ScalarNode {
		return nil
	}
	path, ok := podSpecPaths[kindNode.Value]
	if !ok {
		return nil
	}
	what := kindNode.Value
	if meta := mapGet(root, "metadata"); meta != nil {
		if n := mapGet(meta, "name"); n != nil && n.Kind == yaml.ScalarNode {
			what = fmt.Sprintf("%s %q", what, n.Value)
			// The pods' names derive from the workload's and become their
			// node ids, which cannot hold a "." (config.Config.NodeID):
			// refuse here rather than let every pod fail to start.
			if err := nodeIDName(n.Value); o.fleet() && err != nil {
				return fmt.Errorf("%s: with --jetstream-url %w; rename the %s", what, err, kindNode.Value)
			}
		}
	}
	spec := root
	for i, key := range path {
		next := mapGet(spec, key)
		if next == nil || next.Kind != yaml.MappingNode {
			where := strings.Join(path[:i+1], ".")
			if next == nil {
				return fmt.Errorf("%s has no %s", what, where)
			}
			return fmt.Errorf("%s: %s is not a mapping", what, where)
		}
		spec = next
	}
	// In a StatefulSet, --pvc may name one of its volumeClaimTemplates: the
	// sidecar then mounts that claim, one per replica, and the pod needs no
	// sluice-data volume.
	dataVolume := ""
	if kindNode.Value == "StatefulSet" && o.PVC != "" {
		if tpl := mapGet(mapGet(root, "spec"), "volumeClaimTemplates"); tpl != nil && tpl.Kind == yaml.SequenceNode {
			for _, t := range tpl.Content {
				if n := mapGet(mapGet(t, "metadata"), "name"); n != nil && n.Value == o.PVC {
					dataVolume = o.PVC
				}
			}
		}
	}
	if err := PodSpec(spec, o, dataVolume); err != nil {
		return fmt.Errorf("%s: %s: %w", what, strings.Join(path, "."), err)
	}
	return nil
}

// PodSpec adds or replaces the sidecar, its volumes and the grace
// period in one pod spec. claimTemplate, if set, names the StatefulSet
// volumeClaimTemplate that holds the data dir.
func PodSpec(spec *yaml.Node, o Options, claimTemplate string) error {
	if c := mapGet(spec, "containers"); c == nil || c.Kind != yaml.SequenceNode || len(c.Content) == 0 {
		return errors.New("containers is missing or not a list")
	}
	// A pod the StatefulSet controller made from a volumeClaimTemplate
	// named --pvc (what the webhook sees) already has a volume of that
	// name bound to the replica's own claim ("sluice-queue-ledger-0"):
	// the sidecar mounts it, as sluice inject does for the template.
	if claimTemplate == "" && o.PVC != "" && claimVolume(spec, o.PVC) {
		claimTemplate = o.PVC
	}
	sidecar, err := toNode(sidecarContainer(o, cmp.Or(claimTemplate, DataVolume)))
	if err != nil {
		return err
	}
	if err := upsertNamed(spec, "initContainers", ContainerName, sidecar); err != nil {
		return err
	}
	volumes := []any{
		volume{Name: DataVolume, EmptyDir: &struct{}{}},
		volume{Name: ConfigVolume, ConfigMap: &configMapSource{Name: o.ConfigMap}},
		volume{Name: NoTokenVolume, EmptyDir: &struct{}{}},
	}
	switch {
	case claimTemplate != "":
		volumes = volumes[1:]
	case o.PVC != "":
		volumes[0] = volume{Name: DataVolume, PersistentVolumeClaim: &pvcSource{ClaimName: o.PVC}}
	}
	if o.Secret != "" {
		volumes = append(volumes, volume{Name: SecretsVolume, Secret: &secretSource{SecretName: o.Secret}})
	}
	for _, v := range volumes {
		n, err := toNode(v)
		if err != nil {
			return err
		}
		if err := upsertNamed(spec, "volumes", v.(volume).Name, n); err != nil {
			return err
		}
	}
	// The grace is only ever raised. A spec without one has the API
	// server's 30 s (the webhook sees it defaulted, sluice inject sees it
	// absent): it gets one written only when the drain needs more, so
	// both paths leave the same pod.
	want := o.terminationGrace()
	if g := mapGet(spec, "terminationGracePeriodSeconds"); g != nil {
		have, err := strconv.Atoi(g.Value)
		if g.Kind != yaml.ScalarNode || err != nil {
			return fmt.Errorf("terminationGracePeriodSeconds %q is not an integer", g.Value)
		}
		if have < want {
			g.Value, g.Tag, g.Style = strconv.Itoa(want), "!!int", 0
		}
	} else if want > apiServerGrace {
		mapSet(spec, "terminationGracePeriodSeconds", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(want)})
	}
	return nil
}

// claimVolume reports whether spec has a volume called name that is a
// persistentVolumeClaim.
func claimVolume(spec *yaml.Node, name string) bool {
	vols := mapGet(spec, "volumes")
	if vols == nil || vols.Kind != yaml.SequenceNode {
		return false
	}
	for _, v := range vols.Content {
		if n := mapGet(v, "name"); n != nil && n.Value == name && mapGet(v, "persistentVolumeClaim") != nil {
			return true
		}
	}
	return false
}

// upsertNamed replaces the item called name in the list spec[key], or
// appends item, creating the list if needed. A replaced item keeps its
// position and comments.
func upsertNamed(spec *yaml.Node, key, name string, item *yaml.Node) error {
	list := mapGet(spec, key)
	if list == nil || (list.Kind == yaml.ScalarNode && list.Tag == "!!null") {
		list = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		mapSet(spec, key, list)
	}
	if list.Kind != yaml.SequenceNode {
		return fmt.Errorf("%s is not a list", key)
	}
	for i, old := range list.Content {
		if old.Kind != yaml.MappingNode {
			return fmt.Errorf("%s[%d] is not a mapping", key, i)
		}
		if n := mapGet(old, "name"); n != nil && n.Value == name {
			item.HeadComment, item.LineComment, item.FootComment = old.HeadComment, old.LineComment, old.FootComment
			list.Content[i] = item
			return nil
		}
	}
	list.Content = append(list.Content, item)
	return nil
}

// mapGet returns the value of key in mapping m, or nil.
func mapGet(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// mapSet sets key in mapping m, appending it if absent.
func mapSet(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
}

// toNode is v as a yaml.Node, as yaml.Node.Encode makes it (the same
// styles and tags, honouring omitempty and flow) but without rendering the
// YAML text and parsing it back, which took a third of an admission
// review. It knows only the kinds the types below use.
func toNode(v any) (*yaml.Node, error) {
	return valueNode(reflect.ValueOf(v), false)
}

func valueNode(v reflect.Value, flow bool) (*yaml.Node, error) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}, nil
		}
		return valueNode(v.Elem(), flow)
	case reflect.Struct:
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			fv := v.Field(i)
			if strings.Contains(opts, "omitempty") && yamlZero(fv) {
				continue
			}
			c, err := valueNode(fv, strings.Contains(opts, "flow"))
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, stringNode(name), c)
		}
		if len(n.Content) == 0 || flow {
			n.Style = yaml.FlowStyle
		}
		return n, nil
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return nil, fmt.Errorf("toNode: map key %s", v.Type().Key())
		}
		n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return cmp.Compare(a.String(), b.String()) })
		for _, k := range keys {
			c, err := valueNode(v.MapIndex(k), false)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, stringNode(k.String()), c)
		}
		if len(n.Content) == 0 || flow {
			n.Style = yaml.FlowStyle
		}
		return n, nil
	case reflect.Slice:
		n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for i := range v.Len() {
			c, err := valueNode(v.Index(i), false)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, c)
		}
		if v.Len() == 0 || flow {
			n.Style = yaml.FlowStyle
		}
		return n, nil
	case reflect.String:
		return stringNode(v.String()), nil
	case reflect.Bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(v.Bool())}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(v.Int(), 10)}, nil
	}
	return nil, fmt.Errorf("toNode: unsupported kind %s", v.Kind())
}

// stringNode is a string scalar. The encoder quotes a plain !!str whose
// text would read back as another type ("1", "true", ""); like
// yaml.Marshal, quote also what YAML 1.1 readers (kubectl's) take for a
// bool or a sexagesimal number, and the merge key "<<", which Encode
// itself gets wrong.
func stringNode(s string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	switch {
	case strings.Contains(s, "\n"):
		n.Style = yaml.LiteralStyle
	case yaml11Special(s):
		n.Style = yaml.DoubleQuotedStyle
	}
	return n
}

var base60float = regexp.MustCompile(`^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$`)

func yaml11Special(s string) bool {
	switch s {
	case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "n", "N", "no", "No", "NO", "off", "Off", "OFF", "<<":
		return true
	}
	return strings.Contains(s, ":") && base60float.MatchString(s)
}

// yamlZero is omitempty's test in yaml v3: an empty map or slice, and a
// struct whose fields all are, count as zero.
func yamlZero(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Map, reflect.Slice:
		return v.Len() == 0
	case reflect.Pointer, reflect.Interface:
		return v.IsNil()
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() && !yamlZero(v.Field(i)) {
				return false
			}
		}
		return true
	}
	return v.IsZero()
}

// The pieces of a pod spec that inject writes, in the key order it writes
// them.
type (
	container struct {
		Name            string          `yaml:"name"`
		Image           string          `yaml:"image"`
		RestartPolicy   string          `yaml:"restartPolicy"`
		Args            []string        `yaml:"args"`
		Env             []envVar        `yaml:"env"`
		VolumeMounts    []volumeMount   `yaml:"volumeMounts"`
		StartupProbe    probe           `yaml:"startupProbe"`
		ReadinessProbe  probe           `yaml:"readinessProbe"`
		LivenessProbe   probe           `yaml:"livenessProbe"`
		Resources       resources       `yaml:"resources,omitempty"`
		SecurityContext securityContext `yaml:"securityContext"`
	}
	envVar struct {
		Name      string        `yaml:"name"`
		Value     string        `yaml:"value,omitempty"`
		ValueFrom *envVarSource `yaml:"valueFrom,omitempty"`
	}
	envVarSource struct {
		FieldRef fieldRef `yaml:"fieldRef"`
	}
	fieldRef struct {
		FieldPath string `yaml:"fieldPath"`
	}
	volumeMount struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly,omitempty"`
	}
	probe struct {
		Exec             execAction `yaml:"exec"`
		PeriodSeconds    int        `yaml:"periodSeconds"`
		TimeoutSeconds   int        `yaml:"timeoutSeconds"`
		FailureThreshold int        `yaml:"failureThreshold"`
	}
	execAction struct {
		Command []string `yaml:"command,flow"`
	}
	resources struct {
		Requests map[string]string `yaml:"requests,omitempty"`
		Limits   map[string]string `yaml:"limits,omitempty"`
	}
	securityContext struct {
		RunAsNonRoot             bool           `yaml:"runAsNonRoot"`
		RunAsUser                int            `yaml:"runAsUser"`
		RunAsGroup               int            `yaml:"runAsGroup"`
		ReadOnlyRootFilesystem   bool           `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation bool           `yaml:"allowPrivilegeEscalation"`
		Capabilities             capabilities   `yaml:"capabilities"`
		SeccompProfile           seccompProfile `yaml:"seccompProfile"`
	}
	capabilities struct {
		Drop []string `yaml:"drop,flow"`
	}
	seccompProfile struct {
		Type string `yaml:"type"`
	}
	volume struct {
		Name                  string           `yaml:"name"`
		EmptyDir              *struct{}        `yaml:"emptyDir,omitempty"`
		PersistentVolumeClaim *pvcSource       `yaml:"persistentVolumeClaim,omitempty"`
		ConfigMap             *configMapSource `yaml:"configMap,omitempty"`
		Secret                *secretSource    `yaml:"secret,omitempty"`
	}
	pvcSource struct {
		ClaimName string `yaml:"claimName"`
	}
	configMapSource struct {
		Name string `yaml:"name"`
	}
	secretSource struct {
		SecretName string `yaml:"secretName"`
	}
)

// quantities is a requests or limits map holding the quantities set.
func quantities(cpu, memory string) map[string]string {
	m := make(map[string]string, 2)
	if cpu != "" {
		m["cpu"] = cpu
	}
	if memory != "" {
		m["memory"] = memory
	}
	return m
}

// sidecarContainer is the native sidecar: an init container that keeps
// running (restartPolicy: Always), started before the app containers and
// stopped after them. Its listeners stay on loopback, which the pod shares.
func sidecarContainer(o Options, dataVolume string) container {
	healthcheck := []string{"/sluice", "healthcheck"}
	c := container{
		Name:          ContainerName,
		Image:         o.Image,
		RestartPolicy: "Always",
		Args:          []string{"serve"},
		Env: []envVar{
			{Name: "SLUICE_CONFIG", Value: ConfigFile},
			{Name: "SLUICE_DATA_DIR", Value: DataDir},
			{Name: "SLUICE_LISTEN", Value: fmt.Sprintf("127.0.0.1:%d", o.IngestPort)},
			{Name: "SLUICE_ADMIN__LISTEN", Value: fmt.Sprintf("127.0.0.1:%d", o.AdminPort)},
			{Name: "SLUICE_SHUTDOWN_GRACE", Value: o.Grace.String()},
		},
		VolumeMounts: []volumeMount{
			{Name: dataVolume, MountPath: DataDir},
			{Name: ConfigVolume, MountPath: ConfigDir, ReadOnly: true},
			{Name: NoTokenVolume, MountPath: serviceAccountDir, ReadOnly: true},
		},
		// The kubelet starts the app containers once the startup probe
		// passes, so the app's first POST finds ingest listening.
		StartupProbe:   probe{Exec: execAction{healthcheck}, PeriodSeconds: 1, TimeoutSeconds: 3, FailureThreshold: 60},
		ReadinessProbe: probe{Exec: execAction{healthcheck}, PeriodSeconds: 10, TimeoutSeconds: 3, FailureThreshold: 3},
		LivenessProbe: probe{Exec: execAction{append(healthcheck, "--path", "/healthz")},
			PeriodSeconds: 10, TimeoutSeconds: 3, FailureThreshold: 6},
		Resources: resources{
			Requests: quantities(o.CPURequest, o.MemoryRequest),
			Limits:   quantities(o.CPULimit, o.MemoryLimit),
		},
		// What Pod Security "restricted" asks of every container: no
		// capabilities and the runtime's seccomp profile, besides running
		// as non-root without privilege escalation. sluice needs neither
		// (its ports are above 1024), and an injected pod in a namespace
		// enforcing the profile is otherwise refused.
		SecurityContext: securityContext{
			RunAsNonRoot: true, RunAsUser: imageUID, RunAsGroup: imageUID,
			ReadOnlyRootFilesystem: true, AllowPrivilegeEscalation: false,
			Capabilities:   capabilities{Drop: []string{"ALL"}},
			SeccompProfile: seccompProfile{Type: "RuntimeDefault"},
		},
	}
	if o.Secret != "" {
		c.VolumeMounts = append(c.VolumeMounts, volumeMount{Name: SecretsVolume, MountPath: SecretsDir, ReadOnly: true})
	}
	if o.fleet() {
		// Fleet mode: the log, the delivery state and the registry live in
		// JetStream, so deleting the pod loses nothing and the data
		// volume can stay an emptyDir (sluice keeps nothing in it). The
		// node id is the pod's name, unique among running pods, from the
		// downward API.
		c.Env = append(c.Env,
			envVar{Name: "SLUICE_LOG__BACKEND", Value: "jetstream"},
			envVar{Name: "SLUICE_JETSTREAM__URLS", Value: strings.Join(o.JetStreamURLs, ",")},
			envVar{Name: "SLUICE_NODE_ID", ValueFrom: &envVarSource{FieldRef: fieldRef{FieldPath: "metadata.name"}}},
		)
	}
	return c
}
