package config

import (
	"bytes"
	"runtime"
	"slices"
	"sync"

	"github.com/knadh/koanf/parsers/yaml"
	yamlv3 "go.yaml.in/yaml/v3"
)

// yaml.v3 parses about 15 MB/s here: the 7 MiB of lanes-50k's 50,000
// subscriptions took 0.5 s of CPU, one core, the largest serial part of
// start-up once decoding was fast. A long block list under a
// top-level "subscriptions:" key is therefore parsed in pieces, one per
// core, each piece by yaml.v3 itself, so every value is what yaml.v3 makes
// of it; this file only decides where the pieces begin, and it splits only
// where the pieces cannot mean anything else than they do in the whole
// file:
//
//   - the list is a block sequence indented by at least one space, each
//     item starting on a line with that indentation and "- ", ending at the
//     first line that starts in column 0 (other than a comment);
//   - the file has no tab, carriage return, byte order mark, directive or
//     document marker, and no "&" (so no anchor, and so no alias that
//     could reach across pieces; an alias to nothing fails the piece);
//     the key's line and any comments before the first item, which no
//     piece holds, are printable ASCII;
//   - the part before "subscriptions:", if any, starts with a plain key
//     and parses alone as a mapping (so that line is a key of the same
//     block mapping, not inside a quoted scalar), and so
//     does each piece (so no quoted scalar or flow collection runs from one
//     piece into the next or past the end of the list), and the rest of
//     the file with them; the part after the list, if any, starts with a
//     plain key ("log_level:"; not "- x", which would be the value of a
//     key left empty before the list, nor a lone scalar); the rest must
//     not set subscriptions again.
//
// Anything else, and any error, and the whole file is parsed in one piece,
// which reports errors with their lines as before. TestParseYAMLSplit and
// FuzzParseYAMLSplit check that both give equal maps wherever the split
// answers.

// yamlSplitMinBytes is the smallest file worth splitting: below it the
// goroutines and the extra parses of the head cost more than they save.
const yamlSplitMinBytes = 256 << 10

// parseYAMLConfig parses a YAML config file as koanf's YAML parser does.
func parseYAMLConfig(b []byte) (map[string]any, error) {
	if n := runtime.GOMAXPROCS(0); n > 1 && len(b) >= yamlSplitMinBytes {
		if m, ok := parseYAMLSplit(b, n); ok {
			return m, nil
		}
	}
	return yaml.Parser().Unmarshal(b)
}

// parseYAMLSplit parses b with its subscriptions list in n pieces, or
// reports false.
func parseYAMLSplit(b []byte, n int) (map[string]any, bool) {
	if bytes.ContainsAny(b, "\t\r&") || bytes.HasPrefix(b, []byte("\xef\xbb\xbf")) {
		return nil, false
	}
	head, items, _, end, ok := findSubscriptionItems(b)
	if !ok || len(items) < 2*n {
		return nil, false
	}
	// The key's line and the comments before the first item are the only
	// bytes no piece holds: they must be what yaml.v3 takes (it refuses
	// control characters, even in a comment).
	for off := head; off < items[0]; {
		line, next := nextLine(b, off)
		if !printableASCII(line) {
			return nil, false
		}
		off = next
	}
	if !startsWithKey(b[:head]) || !startsWithKey(b[end:]) {
		return nil, false
	}
	var prefix map[string]any
	if yamlv3.Unmarshal(b[:head], &prefix) != nil {
		return nil, false
	}
	pieces := make([][]any, n)
	oks := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		from, to := items[len(items)*i/n], end
		if i+1 < n {
			to = items[len(items)*(i+1)/n]
		}
		wg.Go(func() {
			var v any
			if yamlv3.Unmarshal(b[from:to], &v) == nil {
				pieces[i], oks[i] = v.([]any)
			}
		})
	}
	rest := make([]byte, 0, head+len(b)-end)
	rest = append(append(rest, b[:head]...), b[end:]...)
	var m map[string]any
	err := yamlv3.Unmarshal(rest, &m)
	wg.Wait()
	if err != nil {
		return nil, false
	}
	if _, again := m["subscriptions"]; again {
		return nil, false
	}
	if slices.Contains(oks, false) {
		return nil, false
	}
	if m == nil {
		m = map[string]any{}
	}
	m["subscriptions"] = slices.Concat(pieces...)
	return m, true
}

// findSubscriptionItems finds, in b, the line "subscriptions:" in column
// 0 (head is its offset), the offsets of the lines where the items of its
// block list start, their indentation, and end, the offset of the first
// line after the list.
// It reports false unless the list has the shape parseYAMLSplit needs.
func findSubscriptionItems(b []byte) (head int, items []int, indent, end int, ok bool) {
	// Directives and document markers start in column 0.
	for _, mark := range []string{"%", "---", "..."} {
		if bytes.HasPrefix(b, []byte(mark)) || bytes.Contains(b, []byte("\n"+mark)) {
			return 0, nil, 0, 0, false
		}
	}
	const key = "subscriptions:"
	head = -1
	for off := 0; off < len(b); {
		line, next := nextLine(b, off)
		if bytes.HasPrefix(line, []byte(key)) && onlyComment(line[len(key):]) {
			head = off
			break
		}
		off = next
	}
	if head < 0 {
		return 0, nil, 0, 0, false
	}
	indent = -1
	end = len(b)
	_, off := nextLine(b, head)
	for off < len(b) {
		line, next := nextLine(b, off)
		sp := leadingSpaces(line)
		rest := line[sp:]
		switch {
		case len(rest) == 0 || rest[0] == '#': // blank or comment: belongs to no item
		case sp == 0:
			end = off
			return head, items, indent, end, indent > 0
		case indent < 0 && isItem(rest):
			indent = sp
			items = append(items, off)
		case sp == indent && isItem(rest):
			items = append(items, off)
		case indent > 0 && sp > indent: // the inside of an item
		default: // a line that is neither an item nor inside one
			return 0, nil, 0, 0, false
		}
		off = next
	}
	return head, items, indent, end, indent > 0
}

// nextLine returns the line starting at off, without its newline, and the
// offset of the next line.
func nextLine(b []byte, off int) (line []byte, next int) {
	if i := bytes.IndexByte(b[off:], '\n'); i >= 0 {
		return b[off : off+i], off + i + 1
	}
	return b[off:], len(b)
}

// onlyComment reports whether s, the rest of a line after a key's colon,
// holds nothing but spaces and perhaps a comment.
func onlyComment(s []byte) bool {
	t := bytes.TrimLeft(s, " ")
	return len(t) == 0 || (t[0] == '#' && len(t) < len(s))
}

// isItem reports whether s, a line without its indentation, starts a
// block sequence item: "-" then a space or the end of the line.
func isItem(s []byte) bool {
	return len(s) > 0 && s[0] == '-' && (len(s) == 1 || s[1] == ' ')
}

func leadingSpaces(s []byte) int {
	n := 0
	for n < len(s) && s[n] == ' ' {
		n++
	}
	return n
}

// startsWithKey reports whether the first line of s that is not blank or
// a comment is a plain key at column 0 ("name:" then a space or the end
// of the line), or s has no such line.
func startsWithKey(s []byte) bool {
	for off := 0; off < len(s); {
		line, next := nextLine(s, off)
		off = next
		t := bytes.TrimLeft(line, " ")
		if len(t) == 0 || t[0] == '#' {
			continue
		}
		k := 0
		for k < len(line) && (line[k] >= 'a' && line[k] <= 'z' || line[k] >= 'A' && line[k] <= 'Z' || line[k] == '_' || k > 0 && (line[k] >= '0' && line[k] <= '9' || line[k] == '.' || line[k] == '-')) {
			k++
		}
		return k > 0 && k < len(line) && line[k] == ':' && (k+1 == len(line) || line[k+1] == ' ')
	}
	return true
}

// printableASCII reports whether s is only printable ASCII (spaces
// included), which yaml.v3 takes anywhere.
func printableASCII(s []byte) bool {
	for _, c := range s {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}
