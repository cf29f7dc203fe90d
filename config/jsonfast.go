package config

import (
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"
)

// A fast path in front of parseJSONConfig's token reader: encoding/json's
// Decoder.Token boxes every token and was, with 50,000 subscriptions
// (7 MiB), about 0.2 s of CPU on the serial part of start-up (issue 14).
// fastJSONConfig reads the same grammar straight from the bytes and gives
// the same values (objects map[string]any, arrays []any, whole numbers in
// range int, other numbers float64, strings as encoding/json decodes them),
// but it only ever answers "here is the document" or "not me": on any
// syntax error, a key given twice, a number out of range or a top level
// that is not an object it gives up, and parseJSONConfig's reader parses
// the document again and words the error with its line. FuzzJSONFast
// checks that both agree wherever the fast one answers.

// fastJSONConfig parses b as parseJSONConfig does, or reports false.
func fastJSONConfig(b []byte) (map[string]any, bool) {
	p := jsonScanner{b: b}
	p.space()
	if p.i >= len(b) || b[p.i] != '{' {
		return nil, false
	}
	v, ok := p.value()
	if !ok {
		return nil, false
	}
	p.space()
	if p.i != len(b) {
		return nil, false
	}
	return v.(map[string]any), true
}

type jsonScanner struct {
	b []byte
	i int
}

func (p *jsonScanner) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonScanner) value() (any, bool) {
	if p.i >= len(p.b) {
		return nil, false
	}
	switch c := p.b[p.i]; {
	case c == '{':
		return p.object()
	case c == '[':
		return p.array()
	case c == '"':
		s, ok := p.string()
		return s, ok
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	case c == 'n':
		return nil, p.literal("null")
	}
	return nil, false
}

func (p *jsonScanner) literal(word string) bool {
	if len(p.b)-p.i < len(word) || string(p.b[p.i:p.i+len(word)]) != word {
		return false
	}
	p.i += len(word)
	return true
}

func (p *jsonScanner) object() (any, bool) {
	p.i++ // '{'
	m := map[string]any{}
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return m, true
	}
	for {
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return nil, false
		}
		key, ok := p.string()
		if !ok {
			return nil, false
		}
		if _, dup := m[key]; dup {
			return nil, false
		}
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return nil, false
		}
		p.i++
		p.space()
		v, ok := p.value()
		if !ok {
			return nil, false
		}
		m[key] = v
		closed, ok := p.next('}')
		if !ok {
			return nil, false
		}
		if closed {
			return m, true
		}
	}
}

func (p *jsonScanner) array() (any, bool) {
	p.i++ // '['
	l := []any{}
	p.space()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return l, true
	}
	for {
		v, ok := p.value()
		if !ok {
			return nil, false
		}
		l = append(l, v)
		closed, ok := p.next(']')
		if !ok {
			return nil, false
		}
		if closed {
			return l, true
		}
	}
}

// next reads the "," between entries, and the space after it, or the
// closing character, and reports which it was.
func (p *jsonScanner) next(closing byte) (closed, ok bool) {
	p.space()
	if p.i >= len(p.b) {
		return false, false
	}
	switch p.b[p.i] {
	case ',':
		p.i++
		p.space()
		return false, true
	case closing:
		p.i++
		return true, true
	}
	return false, false
}

// string reads a string. One of plain ASCII without escapes is copied;
// any other (escapes, UTF-8, which encoding/json checks and repairs) is
// decoded by encoding/json itself, so that both paths agree on it.
func (p *jsonScanner) string() (string, bool) {
	start := p.i
	p.i++ // '"'
	plain := true
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			if plain {
				return string(p.b[start+1 : p.i-1]), true
			}
			var s string
			if json.Unmarshal(p.b[start:p.i], &s) != nil {
				return "", false
			}
			return s, true
		case c == '\\':
			plain = false
			p.i += 2 // the escaped byte cannot end the string
			continue
		case c < 0x20:
			return "", false
		case c >= utf8.RuneSelf:
			plain = false
		}
		p.i++
	}
	return "", false
}

// number reads a number by JSON's grammar and converts it as jsonValue
// converts a json.Number.
func (p *jsonScanner) number() (any, bool) {
	start := p.i
	if p.b[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.b) && p.b[p.i] == '0':
		p.i++
	case p.i < len(p.b) && p.b[p.i] >= '1' && p.b[p.i] <= '9':
		p.digits()
	default:
		return nil, false
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if !p.digits() {
			return nil, false
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if !p.digits() {
			return nil, false
		}
	}
	s := string(p.b[start:p.i])
	if i, err := strconv.ParseInt(s, 10, 64); err == nil && i >= math.MinInt && i <= math.MaxInt {
		return int(i), true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return nil, false
	}
	return f, true
}

// digits reads one or more decimal digits.
func (p *jsonScanner) digits() bool {
	start := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	return p.i > start
}
