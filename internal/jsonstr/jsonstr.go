// Package jsonstr writes a Go string as a JSON string into a byte slice,
// for the places that build small JSON documents by hand on a hot path
// (a body variant's envelope, CloudEvents attributes) rather than through
// encoding/json's reflection.
package jsonstr

import "encoding/json"

// Append appends s as a JSON string: as it is when it needs no escape
// (the common case: event types, ids, sources), else exactly as
// encoding/json writes it (HTML characters and invalid UTF-8 included).
func Append(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string: cannot fail
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}
