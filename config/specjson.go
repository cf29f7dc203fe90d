package config

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
)

// specJSON encodes a redacted subscription document (redactDoc's result)
// as json.Marshal does, byte for byte. json.Marshal reflects over every
// map and sorts its keys through reflect.Value, which for 50,000
// subscriptions was a tenth of start-up's CPU; the documents
// are small trees of maps, lists, strings, whole numbers and booleans,
// which this writes directly. Anything else (floats, whose formatting is
// json's own, other types) and every string that needs escaping are left
// to encoding/json itself, so the bytes are always json.Marshal's
// (TestSpecJSON, FuzzSpecJSON).
// The result is exactly its length: every lane keeps its Spec.
func specJSON(doc map[string]any) ([]byte, error) {
	var buf [512]byte
	if b, ok := appendSpecJSON(buf[:0], doc); ok {
		return bytes.Clone(b), nil
	}
	return json.Marshal(doc)
}

func appendSpecJSON(b []byte, v any) ([]byte, bool) {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), true
	case bool:
		return strconv.AppendBool(b, x), true
	case int:
		return strconv.AppendInt(b, int64(x), 10), true
	case string:
		return appendSpecString(b, x)
	case []any:
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendSpecJSON(b, e); !ok {
				return nil, false
			}
		}
		return append(b, ']'), true
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendSpecString(b, k); !ok {
				return nil, false
			}
			b = append(b, ':')
			if b, ok = appendSpecJSON(b, x[k]); !ok {
				return nil, false
			}
		}
		return append(b, '}'), true
	}
	return nil, false
}

// appendSpecString quotes s when it is printable ASCII that json.Marshal
// writes as it is (no quote, backslash or HTML character), else gives up.
func appendSpecString(b []byte, s string) ([]byte, bool) {
	for i := range len(s) {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			q, err := json.Marshal(s)
			if err != nil {
				return nil, false
			}
			return append(b, q...), true
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}
