package ingest

import (
	"encoding/json"
	"strconv"
)

// The reader of one line of an NDJSON batch. It is a scanner of its own,
// not encoding/json, for two reasons: a batch's answer must name the key
// at fault exactly as the producer wrote it (encoding/json matches keys
// case-insensitively and lets a repeated key silently win), and "body" is
// kept as the bytes the producer sent, which a scan finds in place where
// a decode into json.RawMessage copies them. encoding/json still has the
// last word on what is valid JSON (json.Valid on the body, Unmarshal for
// a string with escapes), so the two cannot disagree about a value.

// The keys of a line, one bit each.
const (
	keyType uint8 = 1 << iota
	keyID
	keyBody
	keyBodyBase64
	keyContentType
	keyOrderingKey
)

// lineKeys are the keys a line may have, in the order errors list them.
var lineKeys = [...]struct {
	name string
	bit  uint8
}{
	{"type", keyType}, {"id", keyID}, {"body", keyBody}, {"body_base64", keyBodyBase64},
	{"content_type", keyContentType}, {"ordering_key", keyOrderingKey},
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
			key := string(k)
			i = skipSpace(b, end)
			if i >= len(b) || b[i] != ':' {
				return &lineError{key: key, problem: "malformed JSON: want ':' after the key"}
			}
			i = skipSpace(b, i+1)
			var bit uint8
			for _, lk := range lineKeys {
				if lk.name == key {
					bit = lk.bit
				}
			}
			switch {
			case bit == 0 && key == "tenant":
				return &lineError{key: key, problem: "unknown key: a batch's tenant is its " + HeaderTenant + " header, for every event of it"}
			case bit == 0:
				return &lineError{key: key, problem: "unknown key (a line has " + lineKeyList + ")"}
			case l.has&bit != 0:
				return &lineError{key: key, problem: "given twice"}
			}
			l.has |= bit
			if bit == keyBody {
				end, problem := valueEnd(b, i)
				if problem != "" {
					return &lineError{key: key, problem: problem}
				}
				l.body, i = b[i:end], end
			} else {
				if i >= len(b) || b[i] != '"' {
					return &lineError{key: key, problem: "want a string"}
				}
				v, end, problem := scanString(b, i)
				if problem != "" {
					return &lineError{key: key, problem: "malformed JSON: " + problem}
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
			return &lineError{key: key, problem: "malformed JSON: want ',' or '}' after the value"}
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

// valueEnd returns the index past the JSON value starting at b[i], once
// json.Valid agrees it is one, or what is wrong.
func valueEnd(b []byte, i int) (int, string) {
	if i >= len(b) {
		return 0, "malformed JSON: missing value"
	}
	j := i
	switch b[i] {
	case '"':
		end, _, problem := skipString(b, i)
		if problem != "" {
			return 0, "not valid JSON: " + problem
		}
		j = end
	case '{', '[':
		depth := 0
	scan:
		for j < len(b) {
			switch b[j] {
			case '"':
				end, _, problem := skipString(b, j)
				if problem != "" {
					return 0, "not valid JSON: " + problem
				}
				j = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					j++
					break scan
				}
			}
			j++
		}
		if depth != 0 {
			if b[i] == '[' {
				return 0, "not valid JSON: unterminated array"
			}
			return 0, "not valid JSON: unterminated object"
		}
	default:
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\r' && b[j] != '\n' {
			j++
		}
	}
	if !json.Valid(b[i:j]) {
		return 0, "not valid JSON (a body that is not JSON goes in body_base64)"
	}
	return j, ""
}
