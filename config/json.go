package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"
)

// A config file whose name ends in .json is read as JSON, not with the
// YAML parser (which reads JSON too, being a superset): fleets of tens of
// thousands of generated subscriptions are usually written by a program,
// and yaml.v3 read them about four times slower than encoding/json (7 MiB,
// 50,000 subscriptions: about 0.8 s against 0.2 s), which was most of
// start-up at that size. See docs/benchmarks.md, lanes-50k.
//
// The result has the shapes the YAML parser gives, so everything after
// parsing (unknown keys, decoding, validation) is shared: objects become
// map[string]any, arrays []any, whole numbers int and other numbers
// float64. Unlike a plain json.Unmarshal, a key given twice in one object
// is an error naming it and its line, as yaml.v3 makes it, instead of the
// last one silently winning.

func isJSONConfig(path string) bool {
	return strings.EqualFold(filepath.Ext(path), ".json")
}

// parseJSONConfig decodes a JSON config document whose top level is an
// object, with encoding/json's token reader. Errors name the line.
func parseJSONConfig(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := jsonValue(dec, b)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("line 1: the top level must be an object ({...})")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("line %d: unexpected data after the top-level object", lineAt(b, dec.InputOffset()))
	}
	return m, nil
}

func jsonValue(dec *json.Decoder, b []byte) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, jsonSyntaxError(err, dec, b)
	}
	switch t := tok.(type) {
	case json.Delim:
		// Only '{' or '[' can come where a value belongs: the decoder
		// reports a closing delimiter there as a syntax error.
		if t == '{' {
			return jsonObject(dec, b)
		}
		return jsonArray(dec, b)
	case json.Number:
		if i, err := t.Int64(); err == nil && i >= math.MinInt && i <= math.MaxInt {
			return int(i), nil
		}
		f, err := t.Float64()
		if err != nil {
			return nil, fmt.Errorf("line %d: number %s is out of range", lineAt(b, dec.InputOffset()), t)
		}
		return f, nil
	default: // string, bool, nil
		return t, nil
	}
}

// jsonObject reads an object's members after its '{', and the '}'.
func jsonObject(dec *json.Decoder, b []byte) (map[string]any, error) {
	m := map[string]any{}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, jsonSyntaxError(err, dec, b)
		}
		k, ok := kt.(string)
		if !ok { // the decoder reports a non-string key itself; kept as a guard
			return nil, fmt.Errorf("line %d: an object key must be a string", lineAt(b, dec.InputOffset()))
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("line %d: key %q appears twice in the same object", lineAt(b, dec.InputOffset()), k)
		}
		if m[k], err = jsonValue(dec, b); err != nil {
			return nil, err
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, jsonSyntaxError(err, dec, b)
	}
	return m, nil
}

// jsonArray reads an array's elements after its '[', and the ']'.
func jsonArray(dec *json.Decoder, b []byte) ([]any, error) {
	l := []any{}
	for dec.More() {
		v, err := jsonValue(dec, b)
		if err != nil {
			return nil, err
		}
		l = append(l, v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, jsonSyntaxError(err, dec, b)
	}
	return l, nil
}

// jsonSyntaxError adds the line to a decoder error. encoding/json's syntax
// messages quote only the offending character, never a value, so they
// cannot leak a secret.
func jsonSyntaxError(err error, dec *json.Decoder, b []byte) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("line %d: unexpected end of file", lineAt(b, int64(len(b))))
	}
	off := dec.InputOffset()
	var se *json.SyntaxError
	if errors.As(err, &se) {
		off = se.Offset
	}
	return fmt.Errorf("line %d: %s", lineAt(b, off), strings.TrimPrefix(err.Error(), "json: "))
}

// lineAt is the 1-based line of byte offset off in b.
func lineAt(b []byte, off int64) int {
	off = min(max(off, 0), int64(len(b)))
	return 1 + bytes.Count(b[:off], []byte{'\n'})
}
