package config

import (
	"bytes"
	"strconv"
)

// Generated fleets write one subscription a line as a YAML flow mapping
// ("  - {id: s1, url: "https://...", types: [a.b], concurrency: {max: 8}}",
// the shape of lanes-50k), and yaml.v3 spends about 10 µs on each. A piece
// of the split list (yamlsplit.go) made only of such lines is read by
// fastFlowItems instead, which knows a small part of YAML well enough to
// give yaml.v3's values for it and gives up on everything else, the piece
// then going to yaml.v3 whole:
//
//   - flow mappings and flow sequences, nested, on one line;
//   - keys and values double-quoted or single-quoted with printable ASCII
//     and no escapes (no backslash, no '' in single quotes);
//   - plain scalars: decimal integers that fit an int ("0", "8", "-3"),
//     and words starting with a letter or "_" made of letters, digits and
//     "_./-", except the words yaml.v3 reads as booleans or null (true,
//     False, NULL, ...), all of which yaml.v3 reads as strings;
//   - a plain key followed by ": ", a quoted one by ":" (JSON's style),
//     no key twice in a mapping, spaces between tokens, blank and comment
//     lines between items.
//
// FuzzFastFlowItems compares it with yaml.v3 wherever it answers.

// fastFlowItems reads piece, lines each of which is an item of the list
// at the given indentation ("- {...}"), a blank line or a comment.
func fastFlowItems(piece []byte, indent int) ([]any, bool) {
	items := make([]any, 0, bytes.Count(piece, []byte{'\n'})+1)
	p := new(flowScanner) // one per piece: as a collectionScanner it is on the heap
	for off := 0; off < len(piece); {
		line, next := nextLine(piece, off)
		off = next
		sp := leadingSpaces(line)
		if sp == len(line) {
			continue
		}
		if line[sp] == '#' {
			// yaml.v3 refuses control characters even in comments.
			if !printableASCII(line) {
				return nil, false
			}
			continue
		}
		if sp != indent || len(line) < sp+3 || line[sp] != '-' || line[sp+1] != ' ' {
			return nil, false
		}
		*p = flowScanner{b: line, i: sp + 2}
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != '{' {
			return nil, false
		}
		v, ok := p.value()
		if !ok {
			return nil, false
		}
		p.space()
		if p.i != len(p.b) {
			return nil, false
		}
		items = append(items, v)
	}
	return items, true
}

type flowScanner struct {
	b []byte
	i int
}

func (p *flowScanner) space() {
	for p.i < len(p.b) && p.b[p.i] == ' ' {
		p.i++
	}
}

func (p *flowScanner) value() (any, bool) {
	if p.i >= len(p.b) {
		return nil, false
	}
	switch p.b[p.i] {
	case '{':
		return p.mapping()
	case '[':
		return p.sequence()
	case '"', '\'':
		s, ok := p.quoted()
		return s, ok
	}
	return p.plain()
}

func (p *flowScanner) mapping() (any, bool) {
	p.i++ // '{'
	return readMapping(p)
}

func (p *flowScanner) sequence() (any, bool) {
	p.i++ // '['
	return readSequence(p)
}

// key reads a mapping's key, its colon and the spaces after it.
func (p *flowScanner) key() (string, bool) {
	var key string
	quotedKey := p.i < len(p.b) && (p.b[p.i] == '"' || p.b[p.i] == '\'')
	if quotedKey {
		k, ok := p.quoted()
		if !ok {
			return "", false
		}
		key = k
	} else {
		k, ok := p.plain()
		s, isString := k.(string)
		if !ok || !isString {
			return "", false // a number as a key is yaml.v3's map[any]any
		}
		key = s
	}
	// After a quoted key, as in JSON, the value may follow the colon at
	// once; after a plain one a space must, else the colon is part of the
	// scalar.
	if p.i+1 >= len(p.b) || p.b[p.i] != ':' || (p.b[p.i+1] != ' ' && !quotedKey) {
		return "", false
	}
	p.i++
	p.space()
	return key, true
}

func (p *flowScanner) at(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// next reads the ", " between entries or the closing character, and
// reports which it was (a trailing comma is left to yaml.v3).
func (p *flowScanner) next(closing byte) (closed, ok bool) {
	p.space()
	if p.i >= len(p.b) {
		return false, false
	}
	switch p.b[p.i] {
	case closing:
		p.i++
		return true, true
	case ',':
		p.i++
		p.space()
		return false, p.i < len(p.b) && p.b[p.i] != closing && p.b[p.i] != ','
	}
	return false, false
}

// quoted reads a quoted scalar of printable ASCII without escapes.
func (p *flowScanner) quoted() (string, bool) {
	q := p.b[p.i]
	for j := p.i + 1; j < len(p.b); j++ {
		switch c := p.b[j]; {
		case c == q:
			if q == '\'' && j+1 < len(p.b) && p.b[j+1] == '\'' {
				return "", false // '' is an escaped quote
			}
			s := string(p.b[p.i+1 : j])
			p.i = j + 1
			return s, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", false
		}
	}
	return "", false
}

// plain reads a plain scalar of the kinds listed above: an int, or a word
// that yaml.v3 reads as a string.
func (p *flowScanner) plain() (any, bool) {
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '/' || c == '-' {
			p.i++
			continue
		}
		break
	}
	s := p.b[start:p.i]
	if len(s) == 0 {
		return nil, false
	}
	switch c := s[0]; {
	case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_':
		switch string(s) {
		case "true", "True", "TRUE", "false", "False", "FALSE", "null", "Null", "NULL":
			return nil, false
		}
		return string(s), true
	case c == '0' && len(s) == 1:
		return 0, true
	case c >= '1' && c <= '9', c == '-' && len(s) > 1 && s[1] >= '1' && s[1] <= '9':
		digits := s
		if c == '-' {
			digits = s[1:]
		}
		if len(digits) > 18 {
			return nil, false
		}
		for _, d := range digits {
			if d < '0' || d > '9' {
				return nil, false
			}
		}
		n, err := strconv.Atoi(string(s))
		return n, err == nil
	}
	return nil, false
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
