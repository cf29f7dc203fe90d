package inject

import (
	"bytes"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestToNodeMatchesEncode: toNode writes what yaml.Node.Encode would, for
// the values a pod's annotations can put in the sidecar, so taking the
// short cut changes no output of `sluice inject`.
func TestToNodeMatchesEncode(t *testing.T) {
	for _, s := range []string{"", "plain", "1", "0x1F", "1.5", "1e3", "true", "yes", "Off", "null", "~", "1:20", "-1:30.5",
		"a: b", "- x", "#c", "x #c", " lead", "trail ", "'q'", `"dq"`, "a\nb", "a\n", "tab\there", "ünï", "[x]", "{x}", "*a", "&a", "!t",
		"%p", "@a", "`b", "|", ">", "?", "? x", "2001-12-14", "=", ".inf", "-.5", "+1", "0o17", "1_000"} {
		o := Defaults()
		o.Image, o.ConfigMap, o.CPULimit = s, s, s
		o.JetStreamURLs = []string{s}
		for _, v := range []any{sidecarContainer(o, s), volume{Name: s, ConfigMap: &configMapSource{Name: s}}, volume{Name: s, EmptyDir: &struct{}{}}} {
			var want yaml.Node
			if err := want.Encode(v); err != nil {
				t.Fatal(err)
			}
			got, err := toNode(v)
			if err != nil {
				t.Fatal(err)
			}
			w, g := render(t, &want), render(t, got)
			if !bytes.Equal(w, g) {
				t.Errorf("%q:\n--- Encode\n%s\n--- toNode\n%s", s, w, g)
			}
		}
	}
}

// TestToNodeMergeKey: "<<" reads back as the string, where Encode's node
// turns it into a merge tag.
func TestToNodeMergeKey(t *testing.T) {
	n, err := toNode(volume{Name: "<<"})
	if err != nil {
		t.Fatal(err)
	}
	var v volume
	if err := yaml.Unmarshal(render(t, n)[len("spec:\n  - "):], &v); err != nil || v.Name != "<<" {
		t.Errorf("read back %q, %v:\n%s", v.Name, err, render(t, n))
	}
}

func render(t *testing.T, n *yaml.Node) []byte {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	// Inside a document, as YAML writes it.
	doc := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{{Kind: yaml.ScalarNode, Value: "spec"},
		{Kind: yaml.SequenceNode, Content: []*yaml.Node{n}}}}
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
