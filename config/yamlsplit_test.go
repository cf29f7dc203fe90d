package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/knadh/koanf/parsers/yaml"
)

// subsYAML is a config with n subscriptions written by item, a function
// of the index giving one item's lines (each starting "  - ").
func subsYAML(head string, n int, item func(i int) string, tail string) string {
	var b strings.Builder
	b.WriteString(head)
	b.WriteString("subscriptions:\n")
	for i := range n {
		b.WriteString(item(i))
	}
	b.WriteString(tail)
	return b.String()
}

// TestParseYAMLSplit: where the subscriptions list is split, the map is
// the one the whole file parses to; the shapes a program or a person
// writes are split; the shapes that could mean something else in pieces
// are not.
func TestParseYAMLSplit(t *testing.T) {
	flow := func(i int) string {
		return fmt.Sprintf("  - {id: s%d, url: \"http://127.0.0.1:1/s%d\", secret: \"whsec_x\", types: [\"t\"], concurrency: {max: 8}}\n", i, i)
	}
	block := func(i int) string {
		return fmt.Sprintf("  # item %d\n  - id: s%d\n    url: 'http://a/%d'\n    headers:\n      X-A: \"1\"\n    note: |\n      - not an item\n      text\n\n", i, i, i)
	}
	for _, c := range []struct {
		name  string
		doc   string
		split bool // the split must answer
	}{
		{"flow items", subsYAML("listen: 127.0.0.1:1\nadmin:\n  listen: 127.0.0.1:2\n", 40, flow, "log_level: warn\n"), true},
		{"block items, comments", subsYAML("# c\n", 40, block, "# end\n"), true},
		{"list last, no newline", strings.TrimSuffix(subsYAML("", 40, flow, ""), "\n"), true},
		{"key with a comment", strings.Replace(subsYAML("", 40, flow, ""), "subscriptions:", "subscriptions:  # many", 1), true},
		{"deeper indent", subsYAML("", 40, func(i int) string { return "    " + flow(i) }, ""), true},
		{"item on the next line", subsYAML("", 40, func(i int) string { return "  -\n    id: a\n" }, ""), true},
		{"column-0 list", subsYAML("", 40, func(i int) string { return strings.TrimPrefix(flow(i), "  ") }, ""), false},
		{"flow list", "subscriptions: [" + strings.Repeat("{id: a}, ", 40) + "]\n", false},
		{"quote across items", subsYAML("", 40, func(i int) string {
			if i == 10 {
				return "  - {id: \"a\n  - b\"}\n"
			}
			return flow(i)
		}, ""), false},
		{"quote from the head to the tail", subsYAML("listen: \"a\n", 40, flow, "b\"\n"), false},
		{"quote from the list to the tail", subsYAML("", 40, func(i int) string {
			if i == 39 {
				return "  - \"a\n"
			}
			return flow(i)
		}, "b: c\"\n"), false},
		{"subscriptions twice", subsYAML("", 40, flow, "subscriptions: []\n"), false},
		{"anchors", subsYAML("", 40, func(i int) string {
			if i == 0 {
				return "  - &a {id: a}\n"
			}
			return "  - *a\n"
		}, ""), false},
		{"alias to nothing", subsYAML("", 40, func(i int) string { return "  - *a\n" }, ""), false},
		{"tab", subsYAML("", 40, flow, "x:\t1\n"), false},
		{"document marker", subsYAML("", 40, flow, "---\nlisten: x\n"), false},
		{"less indented line", subsYAML("", 40, func(i int) string { return "    - a\n  b: c\n" }, ""), false},
		{"head is a list", subsYAML("- a\n", 40, flow, ""), false},
		{"control character before the first item", strings.Replace(subsYAML("", 40, flow, ""), "subscriptions:\n", "subscriptions: # \x01\n# \x7f\n", 1), false},
		{"control character in a comment between items", subsYAML("", 40, func(i int) string { return flow(i) + "  # \x00\n" }, ""), false},
		{"tail is a list", subsYAML("a:\n", 40, flow, "- x\n"), false},
		{"tail is a lone tag", subsYAML("", 40, flow, "!\n"), false},
		{"head is a lone null", subsYAML("~\n", 40, flow, ""), false},
		{"head is a flow mapping", subsYAML("{a: 1}\n", 40, flow, ""), false},
		{"bad item", subsYAML("", 40, func(i int) string { return "  - {id: a\n" }, ""), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, n := range []int{2, 3, 8} {
				got, ok := parseYAMLSplit([]byte(c.doc), n)
				if c.split && !ok {
					t.Fatalf("n=%d: not split", n)
				}
				if ok {
					checkSplitEqualsWhole(t, c.doc, got)
				}
			}
		})
	}
}

// FuzzParseYAMLSplit: wherever the split answers, the whole file parses
// to an equal map.
func FuzzParseYAMLSplit(f *testing.F) {
	f.Add("a: 1\nsubscriptions:\n  - {id: a}\n  - {id: b}\n  - id: c\n    x: [1,\n      2]\n  - 'd'\nz: 2\n")
	f.Add("subscriptions:\n  - \"a\n  - b\"\n  - c\n  - d\n")
	f.Add("subscriptions: # x\n\n  - a: |\n      - b\n  - c\n# z\n  - d\n  - e\n")
	f.Fuzz(func(t *testing.T, doc string) {
		if got, ok := parseYAMLSplit([]byte(doc), 2); ok {
			checkSplitEqualsWhole(t, doc, got)
		}
	})
}

func checkSplitEqualsWhole(t *testing.T, doc string, got map[string]any) {
	t.Helper()
	want, err := yaml.Parser().Unmarshal([]byte(doc))
	if err != nil {
		t.Fatalf("split, but the whole file does not parse: %v\n%s", err, doc)
	}
	// %#v as well: NaN (.nan) is not DeepEqual to itself.
	if !reflect.DeepEqual(got, want) && fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", want) {
		t.Fatalf("split gives\n%#v\nthe whole file\n%#v\n%s", got, want, doc)
	}
}
