package config

import (
	"math"
	"strconv"

	"github.com/sluicehq/sluice/internal/jsonscan"
)

// A fast path in front of parseJSONConfig's token reader: encoding/json's
// Decoder.Token boxes every token and was, with 50,000 subscriptions
// (7 MiB), about 0.2 s of CPU on the serial part of start-up.
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
	p := jsonScanner{jsonscan.Scanner{B: b}}
	p.Space()
	if p.I >= len(b) || b[p.I] != '{' {
		return nil, false
	}
	v, ok := p.value()
	if !ok {
		return nil, false
	}
	p.Space()
	if p.I != len(b) {
		return nil, false
	}
	return v.(map[string]any), true
}

type jsonScanner struct{ jsonscan.Scanner }

func (p *jsonScanner) value() (any, bool) {
	if p.I >= len(p.B) {
		return nil, false
	}
	switch c := p.B[p.I]; {
	case c == '{':
		return p.object()
	case c == '[':
		return p.array()
	case c == '"':
		s, ok := p.String()
		return s, ok
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return true, p.Literal("true")
	case c == 'f':
		return false, p.Literal("false")
	case c == 'n':
		return nil, p.Literal("null")
	}
	return nil, false
}

func (p *jsonScanner) object() (any, bool) {
	p.I++ // '{'
	return readMapping(p)
}

func (p *jsonScanner) array() (any, bool) {
	p.I++ // '['
	return readSequence(p)
}

// key reads an object's key, its colon and the space after it.
func (p *jsonScanner) key() (string, bool) {
	if p.I >= len(p.B) || p.B[p.I] != '"' {
		return "", false
	}
	key, ok := p.String()
	if !ok {
		return "", false
	}
	p.Space()
	if p.I >= len(p.B) || p.B[p.I] != ':' {
		return "", false
	}
	p.I++
	p.Space()
	return key, true
}

func (p *jsonScanner) space()                         { p.Space() }
func (p *jsonScanner) next(closing byte) (bool, bool) { return p.Next(closing) }
func (p *jsonScanner) at(c byte) bool {
	if p.I < len(p.B) && p.B[p.I] == c {
		p.I++
		return true
	}
	return false
}

// number reads a number by JSON's grammar and converts it as jsonValue
// converts a json.Number.
func (p *jsonScanner) number() (any, bool) {
	lit, ok := p.Number()
	if !ok {
		return nil, false
	}
	s := string(lit)
	if i, err := strconv.ParseInt(s, 10, 64); err == nil && i >= math.MinInt && i <= math.MaxInt {
		return int(i), true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return nil, false
	}
	return f, true
}
