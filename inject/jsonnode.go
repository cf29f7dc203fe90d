package inject

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice/internal/jsonscan"
	"go.yaml.in/yaml/v3"
)

// A review hands PodSpec the pod's spec as a yaml.Node and turns the
// changed nodes back into JSON. yaml.v3's parser and Node.Decode did both
// (JSON is YAML), at about half of a review's time (BenchmarkReview); these
// make the same nodes from encoding/json's tokens and write JSON from the
// nodes directly. FuzzJSONNode holds them to the yaml.v3 paths.

// jsonNode parses one JSON value into the node yaml.v3 would make of it:
// mappings and sequences, and scalars tagged !!str, !!int, !!float,
// !!bool or !!null, a number keeping its literal. It reads the tokens with
// internal/jsonscan: encoding/json's Decoder.Token, which it replaced,
// allocated per token and was a quarter of a review.
func jsonNode(raw []byte) (*yaml.Node, error) {
	p := jsonParser{Scanner: jsonscan.Scanner{B: raw}}
	n, err := p.value(0)
	if err != nil {
		return nil, err
	}
	if p.Space(); p.I != len(p.B) {
		return nil, p.errorf("more than one JSON value")
	}
	return n, nil
}

// maxJSONDepth is encoding/json's nesting limit, which json.Valid applies.
const maxJSONDepth = 10000

type jsonParser struct {
	jsonscan.Scanner
	nodes []yaml.Node // allocated a batch at a time
}

func (p *jsonParser) errorf(format string, args ...any) error {
	return fmt.Errorf("JSON at offset %d: %s", p.I, fmt.Sprintf(format, args...))
}

func (p *jsonParser) node(kind yaml.Kind, tag, value string) *yaml.Node {
	if len(p.nodes) == cap(p.nodes) {
		p.nodes = make([]yaml.Node, 0, 64)
	}
	p.nodes = append(p.nodes, yaml.Node{Kind: kind, Tag: tag, Value: value})
	return &p.nodes[len(p.nodes)-1]
}

func (p *jsonParser) value(depth int) (*yaml.Node, error) {
	if p.Space(); p.I == len(p.B) {
		return nil, p.errorf("unexpected end")
	}
	switch c := p.B[p.I]; {
	case c == '{' || c == '[':
		if depth >= maxJSONDepth {
			return nil, p.errorf("nested too deep")
		}
		return p.collection(depth + 1)
	case c == '"':
		v, ok := p.String()
		if !ok {
			return nil, p.errorf("bad string")
		}
		n := p.node(yaml.ScalarNode, "!!str", v)
		n.Style = yaml.DoubleQuotedStyle
		return n, nil
	case c == '-' || c >= '0' && c <= '9':
		lit, ok := p.Number()
		if !ok {
			return nil, p.errorf("bad number")
		}
		tag := "!!float"
		if bytes.IndexAny(lit, ".eE") < 0 {
			if _, err := strconv.ParseInt(string(lit), 10, 64); err == nil {
				tag = "!!int"
			}
		}
		return p.node(yaml.ScalarNode, tag, string(lit)), nil
	}
	for _, lit := range [...]struct{ text, tag string }{{"true", "!!bool"}, {"false", "!!bool"}, {"null", "!!null"}} {
		if p.Literal(lit.text) {
			return p.node(yaml.ScalarNode, lit.tag, lit.text), nil
		}
	}
	return nil, p.errorf("unexpected %q", p.B[p.I])
}

// collection reads an object or an array, I at its opening delimiter.
func (p *jsonParser) collection(depth int) (*yaml.Node, error) {
	n := p.node(yaml.MappingNode, "!!map", "")
	end := byte('}')
	if p.B[p.I] == '[' {
		n.Kind, n.Tag, end = yaml.SequenceNode, "!!seq", ']'
	}
	p.I++
	if p.Space(); p.I < len(p.B) && p.B[p.I] == end {
		p.I++
		return n, nil
	}
	for {
		if n.Kind == yaml.MappingNode {
			if p.Space(); p.I == len(p.B) || p.B[p.I] != '"' {
				return nil, p.errorf("want a key")
			}
			k, ok := p.String()
			if !ok {
				return nil, p.errorf("bad key")
			}
			if p.Space(); p.I == len(p.B) || p.B[p.I] != ':' {
				return nil, p.errorf("want :")
			}
			p.I++
			n.Content = append(n.Content, p.node(yaml.ScalarNode, "!!str", k))
		}
		v, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		n.Content = append(n.Content, v)
		closed, ok := p.Next(end)
		if !ok {
			return nil, p.errorf("want , or %c", end)
		}
		if closed {
			return n, nil
		}
	}
}

// nodeJSON is n as JSON, mapping keys in the node's order. A scalar whose
// text is not already JSON of its tag (an int written 0x1f, a YAML-only
// form) goes through Node.Decode and json.Marshal, as does anything but a
// plain mapping, sequence or scalar.
func nodeJSON(n *yaml.Node) (json.RawMessage, error) {
	return appendNodeJSON(nil, n)
}

func appendNodeJSON(b []byte, n *yaml.Node) ([]byte, error) {
	var err error
	switch n.Kind {
	case yaml.MappingNode:
		start := len(b)
		b = append(b, '{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
				return slowNodeJSON(b[:start], n) // a key JSON cannot hold as written
			}
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendJSONString(b, k.Value); err != nil {
				return nil, err
			}
			b = append(b, ':')
			if b, err = appendNodeJSON(b, n.Content[i+1]); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case yaml.SequenceNode:
		b = append(b, '[')
		for i, c := range n.Content {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendNodeJSON(b, c); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!str":
			return appendJSONString(b, n.Value)
		case "!!int", "!!float":
			if isJSONNumber(n.Value) {
				return append(b, n.Value...), nil
			}
		case "!!bool":
			if n.Value == "true" || n.Value == "false" {
				return append(b, n.Value...), nil
			}
		case "!!null":
			return append(b, "null"...), nil
		}
	}
	v, err := slowNodeJSON(nil, n)
	if err != nil {
		return nil, err
	}
	return append(b, v...), nil
}

func slowNodeJSON(b []byte, n *yaml.Node) ([]byte, error) {
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, err
	}
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, j...), nil
}

func appendJSONString(b []byte, s string) ([]byte, error) {
	j, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	return append(b, j...), nil
}

// isJSONNumber reports whether s is a number as JSON writes one.
func isJSONNumber(s string) bool {
	return s != "" && (s[0] == '-' || s[0] >= '0' && s[0] <= '9') && json.Valid([]byte(s))
}
