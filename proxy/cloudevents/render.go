package cloudevents

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"iter"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/jsonstr"
)

// Writing an event out for a delivery. The delivery engine renders each
// event once per mode and body (and shares the bytes between every
// subscription that asks for the same), so these functions run once per
// event, not once per delivery; what runs per delivery is Headers.All,
// which allocates nothing.
//
// Attributes come from the log (queue.Event.CloudEvent) as the compact
// JSON object ingest kept, or, for an event not posted as a CloudEvent,
// from AppendDerived. Either way they are read here by one small scanner
// (eachAttr) that checks what a receiver needs (the required attributes,
// names a header can carry, values that are not objects or arrays) and
// reports the first attribute at fault by name: the log's attributes were
// checked at ingest, so an error here means a damaged record, and the
// delivery engine dead-letters it rather than sending a CloudEvent no
// receiver would take.

// ContentTypeStructured is the Content-Type of a structured-mode
// delivery (the CloudEvents JSON event format).
const ContentTypeStructured = "application/cloudevents+json"

// DefaultSource is the source of events not posted as CloudEvents when
// the operator names none. It is the same on every sidecar and every
// restart, so a receiver that deduplicates on source and id (as the spec
// tells it to) sees one event delivered twice (a retry, a replay, a lane
// moved to another node) as one. A relative URI-reference is what the
// spec suggests for a source with no global name.
const DefaultSource = "/sluice"

// maxSourceBytes bounds a configured source: it goes into every derived
// delivery's ce-source header.
const maxSourceBytes = 1024

// CheckSource reports whether s can be the source of derived events: a
// non-empty URI-reference (RFC 3986) of at most 1024 bytes, written with
// the characters a URI allows (anything else percent-encoded).
func CheckSource(s string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	if len(s) > maxSourceBytes {
		return errors.New("longer than 1024 bytes")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return errors.New(`"%" must start a percent-encoded byte (%XX)`)
			}
		case !uriChar(c):
			return errors.New("not a URI-reference: " + describeByte(c) + " must be percent-encoded")
		}
	}
	if _, err := url.Parse(s); err != nil {
		return errors.New("not a URI-reference")
	}
	return nil
}

// uriChar reports whether c may appear in a URI as it is: unreserved,
// gen-delims and sub-delims (RFC 3986, section 2).
func uriChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~:/?#[]@!$&'()*+,;=", c) >= 0
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func describeByte(c byte) string {
	if c == ' ' {
		return "a space"
	}
	if c < 0x20 || c >= 0x7f {
		return "a control or non-ASCII byte"
	}
	return `"` + string(c) + `"`
}

// AppendDerived appends the context attributes of an event not posted as
// a CloudEvent to dst, as the compact JSON object the log keeps for one
// that was: specversion 1.0, id, source, type, time (the acceptance time
// in RFC 3339 in UTC with as many fractional digits as it needs) and,
// for an event with an ordering key, partitionkey (the partitioning
// extension, which says what the key says). The time is the acceptance
// time, not the attempt's, so every attempt and replay of the event
// carries the same attributes.
func AppendDerived(dst []byte, id, typ, source, orderingKey string, acceptedAt time.Time) []byte {
	dst = append(dst, `{"specversion":"`+SpecVersion+`","id":`...)
	dst = jsonstr.Append(dst, id)
	dst = append(dst, `,"source":`...)
	dst = jsonstr.Append(dst, source)
	dst = append(dst, `,"type":`...)
	dst = jsonstr.Append(dst, typ)
	dst = append(dst, `,"time":"`...)
	dst = acceptedAt.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, '"')
	if orderingKey != "" {
		dst = append(dst, `,"partitionkey":`...)
		dst = jsonstr.Append(dst, orderingKey)
	}
	return append(dst, '}')
}

// Headers are the ce- headers of a binary-mode delivery, made once per
// event by AppendHeaders and read per delivery by All: each header is its
// canonical name and its value, each followed by a newline (a name is
// letters and digits, a value percent-encoded, so neither holds one).
type Headers []byte

// All yields each header's canonical name ("Ce-Id") and its value, ready
// for the wire. The slices are h's own: they must not be modified.
func (h Headers) All() iter.Seq2[[]byte, []byte] {
	return func(yield func(name, value []byte) bool) {
		rest := []byte(h)
		for len(rest) > 0 {
			i := bytes.IndexByte(rest, '\n')
			j := i + 1 + bytes.IndexByte(rest[i+1:], '\n')
			if !yield(rest[:i], rest[i+1:j]) {
				return
			}
			rest = rest[j+1:]
		}
	}
}

// AppendHeaders appends the binary-mode headers of attrs, a JSON object
// of context attributes (queue.Event.CloudEvent, or AppendDerived's), to
// dst: one ce- header per attribute, named as the HTTP binding names it,
// its value as text (a number or a boolean as its JSON text; a null
// attribute is absent) and percent-encoded where the binding says it
// must be: a space, '"', '%', and every byte outside printable ASCII,
// each as %XX. The datacontenttype attribute is not among them: it is the
// request's Content-Type. An error is an *AttrError naming the attribute.
func AppendHeaders(dst []byte, attrs []byte) (Headers, error) {
	// About the size of attrs: names lose their quotes and gain "Ce-"
	// and a newline; values lose their quotes and gain a newline.
	dst = slices.Grow(dst, len(attrs)+64)
	start := len(dst)
	err := eachAttr(attrs, func(name []byte, kind byte, text []byte) {
		if kind == 'n' {
			return
		}
		dst = append(dst, "Ce-"...)
		dst = append(dst, name[0]-'a'+'A')
		dst = append(dst, name[1:]...)
		dst = append(dst, '\n')
		dst = appendPercentEncoded(dst, text)
		dst = append(dst, '\n')
	})
	if err != nil {
		return nil, err
	}
	return Headers(dst[start:]), nil
}

// appendPercentEncoded appends v with the bytes the HTTP binding (section
// 3.1.3.2) says a header value must not carry as they are percent-encoded.
func appendPercentEncoded(dst, v []byte) []byte {
	const hex = "0123456789ABCDEF"
	for _, c := range v {
		if c <= ' ' || c >= 0x7f || c == '"' || c == '%' {
			dst = append(dst, '%', hex[c>>4], hex[c&0xf])
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

// AppendStructured appends the structured-mode body of an event to dst:
// the JSON object of its context attributes attrs (checked as
// AppendHeaders checks them) with datacontenttype and the data added, by
// splicing: attrs is copied as it is, never decoded and encoded again.
// Empty data is no data member. Otherwise the data goes in as the JSON
// value itself ("data") when it is one valid JSON value and contentType
// is application/json (parameters aside) or absent (which the JSON event
// format reads as JSON), and base64-encoded ("data_base64") in every
// other case.
//
// Why not every JSON type as "data": the spec counts any +json type as
// JSON, but the official Go SDK (v2.16) reads "data" as a JSON value only
// for exactly application/json and otherwise requires a JSON string, so
// an application/vnd.acme+json event sent as a JSON value fails there,
// and a JSON string would mean the wrong thing to a receiver that follows
// the spec. data_base64 is read the same by every receiver. An error is
// an *AttrError naming the attribute.
func AppendStructured(dst []byte, attrs []byte, contentType string, data []byte) ([]byte, error) {
	if err := eachAttr(attrs, func([]byte, byte, []byte) {}); err != nil {
		return nil, err
	}
	obj := bytes.TrimRight(attrs, jsonSpace)
	dst = append(dst, obj[:len(obj)-1]...) // eachAttr found an object with specversion in it: a member to follow
	if contentType != "" {
		dst = append(dst, `,"datacontenttype":`...)
		dst = jsonstr.Append(dst, contentType)
	}
	if len(data) > 0 {
		if payload := bytes.Trim(data, jsonSpace); dataAsJSON(contentType) && json.Valid(payload) {
			dst = append(dst, `,"data":`...)
			dst = append(dst, payload...) // valid, so not empty
		} else {
			dst = append(dst, `,"data_base64":"`...)
			dst = base64.StdEncoding.AppendEncode(dst, data)
			dst = append(dst, '"')
		}
	}
	return append(dst, '}'), nil
}

// dataAsJSON reports whether data of this content type goes into a
// structured body as a JSON value: for application/json, parameters
// aside, and for none, read as the Go SDK reads them (case-sensitive; see
// AppendStructured).
func dataAsJSON(contentType string) bool {
	mt := contentType
	if i := strings.IndexByte(mt, ';'); i >= 0 {
		mt = strings.TrimSpace(mt[:i])
	}
	return mt == "" || mt == "application/json"
}

// jsonSpace is the white space JSON allows around a value.
const jsonSpace = " \t\r\n"

// Kinds of an attribute's value, as eachAttr reports them.
const (
	kindString = 's'
	kindOther  = 'o' // a number, true or false: its JSON text is its text
	kindNull   = 'n'
)

// eachAttr calls f with each member of attrs, a JSON object of context
// attributes: its name, the kind of its value and its value as text (a
// string decoded, a number or boolean as written). Before the first
// call it checks the whole object, so f sees nothing of an object that
// is refused: attrs must be one JSON object whose names are attribute
// names (a-z and 0-9), whose values are strings, numbers, booleans or
// null, with specversion "1.0" and id, source and type non-empty strings,
// and without data, data_base64 and datacontenttype, which an event keeps
// apart from its attributes.
func eachAttr(attrs []byte, f func(name []byte, kind byte, text []byte)) error {
	if !json.Valid(attrs) {
		return &AttrError{Attr: "(all)", Problem: "the attributes are not valid JSON"}
	}
	obj := bytes.Trim(attrs, jsonSpace)
	if obj[0] != '{' {
		return &AttrError{Attr: "(all)", Problem: "the attributes are not a JSON object"}
	}
	var (
		required [4]bool // specversion, id, source, type
		seenBuf  [16][]byte
		seen     = seenBuf[:0] // names so far, for duplicates: an event has a handful
	)
	for pass := range 2 {
		rest := obj[1:]
		for {
			rest = bytes.TrimLeft(rest, jsonSpace+",")
			if rest[0] == '}' {
				break
			}
			var rawName, raw []byte
			rawName, rest = nextString(rest)
			rest = bytes.TrimLeft(rest, jsonSpace)
			rest = bytes.TrimLeft(rest[1:], jsonSpace) // the ':'
			raw, rest = nextValue(rest)
			name, kind, text, err := attr(rawName, raw)
			if err != nil {
				return err
			}
			if pass == 1 {
				f(name, kind, text)
				continue
			}
			for _, prev := range seen {
				if bytes.Equal(prev, name) {
					return &AttrError{Attr: string(name), Problem: "given twice"}
				}
			}
			seen = append(seen, name)
			for i, req := range [...]string{"specversion", "id", "source", "type"} {
				if string(name) != req {
					continue
				}
				switch {
				case kind != kindString || len(text) == 0:
					return &AttrError{Attr: req, Problem: "must be a non-empty string"}
				case i == 0 && string(text) != SpecVersion:
					return &AttrError{Attr: req, Problem: "must be " + SpecVersion}
				}
				required[i] = true
			}
		}
		if pass == 0 {
			for i, req := range [...]string{"specversion", "id", "source", "type"} {
				if !required[i] {
					return &AttrError{Attr: req, Problem: "missing"}
				}
			}
		}
	}
	return nil
}

// attr reads one member of an attributes object: rawName is its name as a
// JSON string, raw its value's JSON text.
func attr(rawName, raw []byte) (name []byte, kind byte, text []byte, err error) {
	name = unquote(rawName)
	switch string(name) {
	case "data", "data_base64", "datacontenttype":
		return nil, 0, nil, &AttrError{Attr: string(name), Problem: "is the event's body or content type, not an attribute the log keeps"}
	}
	if !attrName(name) {
		return nil, 0, nil, &AttrError{Attr: strings.ToValidUTF8(string(name[:min(len(name), 64)]), "\uFFFD"),
			Problem: "not an attribute name (lower-case letters and digits)"}
	}
	switch raw[0] {
	case '"':
		return name, kindString, unquote(raw), nil
	case '{', '[':
		return nil, 0, nil, &AttrError{Attr: string(name), Problem: "must be a string, a number or a boolean"}
	case 'n':
		return name, kindNull, nil, nil
	}
	return name, kindOther, raw, nil
}

// attrName reports whether name is a CloudEvents attribute name: lower-case
// ASCII letters and digits.
func attrName(name []byte) bool {
	if len(name) == 0 {
		return false
	}
	for _, c := range name {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// nextString splits a JSON string from the start of s, which is valid
// JSON from there.
func nextString(s []byte) (str, rest []byte) {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return s[:i+1], s[i+1:]
		}
	}
	return s, nil // not reached in valid JSON
}

// nextValue splits one JSON value from the start of s, which is valid
// JSON from there: a string, or a literal (number, true, false, null) up
// to the next delimiter. An object or an array is returned as its first
// byte, which is all attr needs to refuse it.
func nextValue(s []byte) (val, rest []byte) {
	switch s[0] {
	case '"':
		return nextString(s)
	case '{', '[':
		return s[:1], s[1:]
	}
	i := 0
	for i < len(s) && !bytes.ContainsRune([]byte(jsonSpace+",}]"), rune(s[i])) {
		i++
	}
	return s[:i], s[i:]
}

// unquote decodes a JSON string: its bytes between the quotes when it
// has no escape, as it almost always has none.
func unquote(q []byte) []byte {
	inner := q[1 : len(q)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return inner
	}
	var s string
	if err := json.Unmarshal(q, &s); err != nil {
		return inner // not reached: q is a valid JSON string
	}
	return []byte(s)
}
