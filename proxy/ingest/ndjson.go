package ingest

import (
	"encoding/json"
	"strconv"
)

// The reader of one line of an NDJSON batch. It is a scanner of its own,
// not encoding/json, for three reasons: a batch's answer must name the key
// at fault exactly as the producer wrote it (encoding/json matches keys
// case-insensitively and lets a repeated key silently win); "body" is kept
// as the bytes the producer sent, which a scan finds in place where a
// decode into json.RawMessage copies them; and it is on the path of every
// event of a batch, where encoding/json's validation alone took a tenth of
// the CPU. FuzzJSONValue holds the scanner to json.Valid, and
// FuzzBatchNDJSON the whole reader to encoding/json's reading of a line;
// a string with escapes is still unescaped by encoding/json.

// The keys of a line, one bit each.
const (
	keyType uint8 = 1 << iota
	keyID
	keyBody
	keyBodyBase64
	keyContentType
	keyOrderingKey
)

// keyBit is the bit of a line's key, 0 for a key a line may not have.
func keyBit(k []byte) uint8 {
	switch string(k) {
	case "type":
		return keyType
	case "id":
		return keyID
	case "body":
		return keyBody
	case "body_base64":
		return keyBodyBase64
	case "content_type":
		return keyContentType
	case "ordering_key":
		return keyOrderingKey
	}
	return 0
}

const lineKeyList = "type, id, body or body_base64, content_type, ordering_key"

// ndjsonLine is one line as read: the text of its string values
// (unescaped) and the JSON text of its body, aliasing the line unless a
// string had escapes. has says which keys were present.
type ndjsonLine struct {
	typ, id, body, bodyBase64, contentType, orderingKey []byte
	has                                                 uint8
}

// lineError is a line that cannot be read: the key at fault as the
// producer wrote it ("" when the line is not an object of keys), and what
// is wrong.
type lineError struct {
	key, problem string
}

// parseLine reads b, one line, into l: a JSON object of the keys above,
// each at most once. It checks the JSON, not the values (checkName and
// its kin do, in batch.go).
func parseLine(b []byte, l *ndjsonLine) *lineError {
	*l = ndjsonLine{}
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return &lineError{problem: "not a JSON object: each line of an NDJSON batch is one event, {\"type\":...,\"id\":...,\"body\":...}"}
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			if i >= len(b) || b[i] != '"' {
				return &lineError{problem: "malformed JSON: want a key (a string) at byte " + strconv.Itoa(i)}
			}
			k, end, problem := scanString(b, i)
			if problem != "" {
				return &lineError{problem: "malformed JSON: key at byte " + strconv.Itoa(i) + ": " + problem}
			}
			// The key as a string only for an error: one per key was most
			// of a line's allocations.
			key := func() string { return string(k) }
			i = skipSpace(b, end)
			if i >= len(b) || b[i] != ':' {
				return &lineError{key: key(), problem: "malformed JSON: want ':' after the key"}
			}
			i = skipSpace(b, i+1)
			bit := keyBit(k)
			switch {
			case bit == 0 && string(k) == "tenant":
				return &lineError{key: key(), problem: "unknown key: a batch's tenant is its " + HeaderTenant + " header, for every event of it"}
			case bit == 0:
				return &lineError{key: key(), problem: "unknown key (a line has " + lineKeyList + ")"}
			case l.has&bit != 0:
				return &lineError{key: key(), problem: "given twice"}
			}
			l.has |= bit
			if bit == keyBody {
				end, problem := valueEnd(b, i)
				if problem != "" {
					return &lineError{key: key(), problem: problem}
				}
				l.body, i = b[i:end], end
			} else {
				if i >= len(b) || b[i] != '"' {
					return &lineError{key: key(), problem: "want a string"}
				}
				v, end, problem := scanString(b, i)
				if problem != "" {
					return &lineError{key: key(), problem: "malformed JSON: " + problem}
				}
				switch bit {
				case keyType:
					l.typ = v
				case keyID:
					l.id = v
				case keyBodyBase64:
					l.bodyBase64 = v
				case keyContentType:
					l.contentType = v
				case keyOrderingKey:
					l.orderingKey = v
				}
				i = end
			}
			i = skipSpace(b, i)
			if i < len(b) && b[i] == ',' {
				i = skipSpace(b, i+1)
				continue
			}
			if i < len(b) && b[i] == '}' {
				i++
				break
			}
			return &lineError{key: key(), problem: "malformed JSON: want ',' or '}' after the value"}
		}
	}
	if skipSpace(b, i) != len(b) {
		return &lineError{problem: "more after the JSON object at byte " + strconv.Itoa(i) + " (one event per line)"}
	}
	return nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// scanString reads the JSON string starting at b[i] (a '"'): its text,
// unescaped (a fresh slice then; else it aliases b), and the index past
// its closing quote; or what is wrong with it.
func scanString(b []byte, i int) (text []byte, end int, problem string) {
	end, escaped, problem := skipString(b, i)
	if problem != "" {
		return nil, 0, problem
	}
	if !escaped {
		return b[i+1 : end-1], end, ""
	}
	var s string
	if err := json.Unmarshal(b[i:end], &s); err != nil {
		return nil, 0, "invalid string: " + err.Error()
	}
	return []byte(s), end, ""
}

// skipString returns the index past the JSON string starting at b[i] (a
// '"') and whether it has escapes, or what is wrong with it. Escapes are
// checked by whoever decodes them (scanString, json.Valid).
func skipString(b []byte, i int) (end int, escaped bool, problem string) {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1, escaped, ""
		case c == '\\':
			escaped = true
			j++ // the escaped byte: an escaped quote does not end the string
		case c < 0x20:
			return 0, false, "control character " + strconv.QuoteRuneToASCII(rune(c)) + " in a string (escape it)"
		}
	}
	return 0, false, "unterminated string"
}

// valueEnd returns the index past the JSON value starting at b[i], or
// what is wrong with it and where.
func valueEnd(b []byte, i int) (int, string) {
	end, ok := scanValue(b, i, 0)
	if !ok {
		return 0, "not valid JSON at byte " + strconv.Itoa(end) + " of the line (a body that is not JSON goes in body_base64)"
	}
	return end, ""
}

// maxDepth is encoding/json's bound on nesting, so that the two agree on
// what is valid.
const maxDepth = 10000

// scanValue checks the JSON value (RFC 8259) starting at b[i] and returns
// the index past it, or false and the index where it stops being JSON.
// It accepts exactly what json.Valid accepts of a value (bytes past 0x7f
// in strings are not checked as UTF-8, as encoding/json does not), in one
// pass: json.Valid after a scan for the value's end cost twice its time
// (a tenth of a batch's CPU).
func scanValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		return scanJSONString(b, i)
	case c == '{' || c == '[':
		if depth >= maxDepth {
			return i, false
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == closer {
			return i + 1, true
		}
		for {
			if c == '{' {
				if i >= len(b) || b[i] != '"' {
					return i, false
				}
				end, ok := scanJSONString(b, i)
				if !ok {
					return end, false
				}
				i = skipSpace(b, end)
				if i >= len(b) || b[i] != ':' {
					return i, false
				}
				i = skipSpace(b, i+1)
			}
			end, ok := scanValue(b, i, depth+1)
			if !ok {
				return end, false
			}
			i = skipSpace(b, end)
			switch {
			case i >= len(b):
				return i, false
			case b[i] == ',':
				i = skipSpace(b, i+1)
			case b[i] == closer:
				return i + 1, true
			default:
				return i, false
			}
		}
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return scanNumber(b, i)
	}
	return i, false
}

func literal(b []byte, i int, word string) (int, bool) {
	if len(b)-i >= len(word) && string(b[i:i+len(word)]) == word {
		return i + len(word), true
	}
	return i, false
}

// scanNumber checks -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at b[i].
func scanNumber(b []byte, i int) (int, bool) {
	digits := func(i int) int {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i
	}
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(i + 1)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

// scanJSONString checks the JSON string at b[i] (a '"'), escapes
// included, and returns the index past its closing quote.
func scanJSONString(b []byte, i int) (int, bool) {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1, true
		case c < 0x20:
			return j, false
		case c == '\\':
			j++
			if j >= len(b) {
				return j, false
			}
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(b)-j < 5 {
					return len(b), false
				}
				for _, h := range b[j+1 : j+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return j, false
					}
				}
				j += 4
			default:
				return j, false
			}
		}
	}
	return len(b), false
}
