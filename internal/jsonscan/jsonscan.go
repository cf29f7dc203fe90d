// Package jsonscan reads JSON's tokens straight from the bytes, for the fast
// path in front of encoding/json in config's reader of JSON config files.
// encoding/json's Decoder.Token boxes every token, which was most of that
// path's cost. The caller builds its own tree from these tokens and is
// fuzzed against encoding/json (config.FuzzJSONFast). A string that is not
// plain ASCII goes to encoding/json to decode, so both agree on escapes and
// on invalid UTF-8.
package jsonscan

import (
	"encoding/json"
	"unicode/utf8"
)

// Scanner is a position I in the JSON text B. A method that reports false
// leaves I somewhere within what it could not read.
type Scanner struct {
	B []byte
	I int
}

// Space skips white space.
func (p *Scanner) Space() {
	for p.I < len(p.B) {
		switch p.B[p.I] {
		case ' ', '\t', '\n', '\r':
			p.I++
		default:
			return
		}
	}
}

// Literal reads word (true, false or null).
func (p *Scanner) Literal(word string) bool {
	if len(p.B)-p.I < len(word) || string(p.B[p.I:p.I+len(word)]) != word {
		return false
	}
	p.I += len(word)
	return true
}

// Next reads the "," between entries, and the space after it, or the
// closing character, and reports which it was.
func (p *Scanner) Next(closing byte) (closed, ok bool) {
	p.Space()
	if p.I >= len(p.B) {
		return false, false
	}
	switch p.B[p.I] {
	case ',':
		p.I++
		p.Space()
		return false, true
	case closing:
		p.I++
		return true, true
	}
	return false, false
}

// String reads a string, I at its opening quote. One of plain ASCII
// without escapes is copied; any other (escapes, UTF-8, which
// encoding/json checks and repairs) is decoded by encoding/json itself, so
// that both paths agree on it.
func (p *Scanner) String() (string, bool) {
	start := p.I
	p.I++ // '"'
	plain := true
	for p.I < len(p.B) {
		c := p.B[p.I]
		switch {
		case c == '"':
			p.I++
			if plain {
				return string(p.B[start+1 : p.I-1]), true
			}
			var s string
			if json.Unmarshal(p.B[start:p.I], &s) != nil {
				return "", false
			}
			return s, true
		case c == '\\':
			plain = false
			p.I += 2 // the escaped byte cannot end the string
			continue
		case c < 0x20:
			return "", false
		case c >= utf8.RuneSelf:
			plain = false
		}
		p.I++
	}
	return "", false
}

// Number reads a number by JSON's grammar, I at its first byte, and
// returns its text.
func (p *Scanner) Number() ([]byte, bool) {
	start := p.I
	if p.I < len(p.B) && p.B[p.I] == '-' {
		p.I++
	}
	switch {
	case p.I < len(p.B) && p.B[p.I] == '0':
		p.I++
	case p.I < len(p.B) && p.B[p.I] >= '1' && p.B[p.I] <= '9':
		p.digits()
	default:
		return nil, false
	}
	if p.I < len(p.B) && p.B[p.I] == '.' {
		p.I++
		if !p.digits() {
			return nil, false
		}
	}
	if p.I < len(p.B) && (p.B[p.I] == 'e' || p.B[p.I] == 'E') {
		p.I++
		if p.I < len(p.B) && (p.B[p.I] == '+' || p.B[p.I] == '-') {
			p.I++
		}
		if !p.digits() {
			return nil, false
		}
	}
	return p.B[start:p.I], true
}

// digits reads one or more decimal digits.
func (p *Scanner) digits() bool {
	start := p.I
	for p.I < len(p.B) && p.B[p.I] >= '0' && p.B[p.I] <= '9' {
		p.I++
	}
	return p.I > start
}
