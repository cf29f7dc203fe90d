package cloudevents

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/jsonstr"
)

// Bounds of what ingest keeps of a CloudEvent. The spec sets none; these
// keep one event's attributes from costing more than its data.
const (
	// MaxAttrsBytes bounds the attributes kept (Event.Attrs). A binary
	// mode event's headers are bounded below it by ingest's header limit.
	MaxAttrsBytes = 8 << 10
	// MaxIDLen bounds the id attribute: the spec asks producers for ids
	// unique within a source, typically a UUID or a counter.
	MaxIDLen = 256
	// maxNameLen bounds an attribute's name. The spec says names SHOULD
	// NOT exceed 20 characters; a longer one is accepted up to this.
	maxNameLen = 64
)

// Attribute names with rules of their own.
const (
	attrSpecVersion     = "specversion"
	attrID              = "id"
	attrSource          = "source"
	attrType            = "type"
	attrTime            = "time"
	attrSubject         = "subject"
	attrDataSchema      = "dataschema"
	attrDataContentType = "datacontenttype"
	attrData            = "data"
	attrDataBase64      = "data_base64"
	attrPartitionKey    = "partitionkey"
)

// HeaderPrefix leads every binary mode attribute header.
const HeaderPrefix = "ce-"

// ParseBinary reads a CloudEvent in binary mode: visit calls its argument
// with each request header (name and value, as received), contentType is
// the request's Content-Type (the datacontenttype) and body the data,
// which Data aliases. Header values are percent-decoded as the HTTP
// binding asks.
func ParseBinary(visit func(func(name, value []byte)), contentType string, body []byte) (Event, error) {
	var (
		b   attrsBuilder
		err error
	)
	// The headers are read once; the required attributes are kept first,
	// in the spec's order, then the rest as they came, so that what is
	// kept reads the same however a client ordered its headers (Go's
	// sorts them).
	var (
		arr  [16]header
		hdrs = arr[:0]
	)
	visit(func(name, value []byte) {
		if IsAttrHeader(name) {
			hdrs = append(hdrs, header{lowerName(name[len(HeaderPrefix):]), value})
		}
	})
	for _, pass := range [...]string{attrSpecVersion, attrID, attrSource, attrType, ""} {
		for _, h := range hdrs {
			if err == nil && (h.attr == pass || pass == "" && !isRequired(h.attr)) {
				err = b.addHeader(h.attr, h.value)
			}
		}
	}
	if err != nil {
		return Event{}, err
	}
	ev, err := b.finish(HeaderPrefix)
	if err != nil {
		return Event{}, err
	}
	ev.ContentType = contentType
	ev.Data = body
	return ev, nil
}

// IsAttrHeader reports whether a header name is a binary mode
// attribute's (ce-*, in any case).
func IsAttrHeader(name []byte) bool {
	return len(name) > len(HeaderPrefix) && strings.EqualFold(string(name[:len(HeaderPrefix)]), HeaderPrefix)
}

// header is one ce-* header: the attribute's name, lower case, and the
// raw value.
type header struct {
	attr  string
	value []byte
}

// lowerName is an attribute name as a lower-case string: a constant for
// the spec's own names, else one allocation.
func lowerName(b []byte) string {
	var buf [maxNameLen]byte
	if len(b) > len(buf) {
		return strings.ToLower(string(b)) // refused by add as too long
	}
	l := buf[:len(b)]
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		l[i] = c
	}
	switch string(l) { // no string is made to compare
	case attrSpecVersion:
		return attrSpecVersion
	case attrID:
		return attrID
	case attrSource:
		return attrSource
	case attrType:
		return attrType
	case attrTime:
		return attrTime
	case attrSubject:
		return attrSubject
	case attrDataSchema:
		return attrDataSchema
	case attrPartitionKey:
		return attrPartitionKey
	}
	return string(l)
}

func isRequired(attr string) bool {
	return attr == attrSpecVersion || attr == attrID || attr == attrSource || attr == attrType
}

// addHeader takes one binary mode attribute.
func (b *attrsBuilder) addHeader(attr string, value []byte) error {
	if attr == attrDataContentType {
		return &AttrError{Attr: HeaderPrefix + attr, Problem: "in binary mode the Content-Type header carries the datacontenttype; send no ce-datacontenttype header"}
	}
	v, err := percentDecode(value)
	if err != nil {
		return &AttrError{Attr: HeaderPrefix + attr, Problem: err.Error()}
	}
	return b.add(attr, stringValue(v), HeaderPrefix)
}

// ParseStructured reads a CloudEvent in structured mode: one JSON object
// (the JSON event format), whose data or data_base64 becomes Data.
//
// The object is read into a map, in one pass of encoding/json: what is
// kept is the required attributes, then the others by name. (A decoder's
// tokens would keep the members' order, at five times the allocations.)
// As with most JSON readers, of a member given twice the last counts.
func ParseStructured(body []byte) (Event, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return Event{}, jsonProblem(err)
	}
	return fromMembers(m)
}

// ParseBatch reads a CloudEvents batch: a JSON array of structured mode
// events (the JSON batch format). Any bad event fails the whole batch
// with a *BatchError naming it.
func ParseBatch(body []byte) ([]Event, error) {
	var ms []map[string]json.RawMessage
	if err := json.Unmarshal(body, &ms); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, errors.New("invalid batch: want a JSON array of CloudEvents (JSON objects)")
		}
		return nil, errors.New("invalid batch: invalid JSON: " + err.Error())
	}
	if ms == nil {
		return nil, errors.New("invalid batch: want a JSON array of CloudEvents, not null")
	}
	evs := make([]Event, len(ms))
	for i, m := range ms {
		ev, err := fromMembers(m)
		if err != nil {
			return nil, &BatchError{Index: i, Err: err}
		}
		evs[i] = ev
	}
	return evs, nil
}

// jsonProblem says what is wrong with a body json.Unmarshal refused.
func jsonProblem(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return errors.New("invalid event: want a JSON object")
	}
	return errors.New("invalid JSON: " + err.Error())
}

// fromMembers makes an event of a structured mode event's members, each
// value its raw JSON.
func fromMembers(m map[string]json.RawMessage) (Event, error) {
	if m == nil {
		return Event{}, errors.New("invalid event: want a JSON object, not null")
	}
	var (
		b     attrsBuilder
		arr   [16]string
		names = arr[:0]
	)
	for name := range m {
		switch {
		case name == attrData || name == attrDataBase64 || name == attrDataContentType:
		case isRequired(name):
		default:
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range slices.Concat([]string{attrSpecVersion, attrID, attrSource, attrType}, names) {
		raw, ok := m[name]
		if !ok {
			continue
		}
		v, err := jsonValue(name, raw)
		if err == nil && !v.null {
			err = b.add(name, v, "")
		}
		if err != nil {
			return Event{}, err
		}
	}
	ev, err := b.finish("")
	if err != nil {
		return Event{}, err
	}
	if dataType := m[attrDataContentType]; len(dataType) > 0 && string(dataType) != "null" {
		if err := json.Unmarshal(dataType, &ev.ContentType); err != nil || ev.ContentType == "" {
			return Event{}, &AttrError{Attr: attrDataContentType, Problem: "want a media type as a JSON string"}
		}
	}
	data, data64 := m[attrData], m[attrDataBase64]
	isNull := func(r json.RawMessage) bool { return len(r) == 0 || string(r) == "null" }
	switch {
	case !isNull(data) && !isNull(data64):
		return Event{}, &AttrError{Attr: attrDataBase64, Problem: "an event has data or data_base64, not both"}
	case !isNull(data64):
		var s string
		if err := json.Unmarshal(data64, &s); err != nil {
			return Event{}, &AttrError{Attr: attrDataBase64, Problem: "want base64 as a JSON string"}
		}
		if ev.Data, err = base64.StdEncoding.DecodeString(s); err != nil {
			return Event{}, &AttrError{Attr: attrDataBase64, Problem: "invalid base64: " + err.Error()}
		}
		if ev.ContentType == "" {
			ev.ContentType = "application/octet-stream"
		}
	case !isNull(data):
		// The JSON event format: data is JSON when datacontenttype is
		// absent or a JSON type; for any other type a JSON string holds
		// the data's text.
		if ev.ContentType == "" {
			ev.ContentType = "application/json"
		}
		ev.Data = data
		if !IsJSON(ev.ContentType) && data[0] == '"' {
			var s string
			if err := json.Unmarshal(data, &s); err != nil {
				return Event{}, &AttrError{Attr: attrData, Problem: "invalid JSON string"}
			}
			ev.Data = []byte(s)
		}
	default:
		ev.Data = []byte{}
	}
	return ev, nil
}

// IsJSON reports whether a media type is JSON: application/json, or any
// with a +json suffix (RFC 6839), parameters ignored.
func IsJSON(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// value is one attribute's value: its JSON text (kept as it will be
// written into Attrs) and, for a string, its text.
type value struct {
	json   []byte
	str    string
	isStr  bool
	null   bool
	binary bool // from a header: JSON text still to be made of str
}

func stringValue(s string) value { return value{str: s, isStr: true, binary: true} }

// jsonValue checks a structured mode attribute's raw JSON value: a
// string, a number or a boolean (the JSON format's forms of the
// CloudEvents types); null means absent.
func jsonValue(name string, raw []byte) (value, error) {
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return value{}, &AttrError{Attr: name, Problem: "invalid JSON string"}
		}
		return value{json: raw, str: s, isStr: true}, nil
	case 'n':
		return value{null: true}, nil
	case '{', '[':
		return value{}, &AttrError{Attr: name, Problem: "want a string, a number or a boolean, not a JSON object or array"}
	}
	return value{json: raw}, nil
}

// attrsBuilder collects an event's attributes into the JSON object the
// log keeps, in the order they came, checking each.
type attrsBuilder struct {
	buf   []byte
	names []string // added so far: a handful, so a scan beats a map
	arr   [16]string
	ev    Event
	spec  string
}

// add takes one attribute; prefix is how the error names it ("ce-" in
// binary mode).
func (b *attrsBuilder) add(name string, v value, prefix string) error {
	fail := func(problem string) error { return &AttrError{Attr: prefix + name, Problem: problem} }
	if !validName(name) {
		return fail("invalid attribute name: want 1 to " + strconv.Itoa(maxNameLen) + " lower-case letters and digits")
	}
	if slices.Contains(b.names, name) {
		return fail("given twice")
	}
	if b.names == nil {
		b.names = b.arr[:0]
	}
	b.names = append(b.names, name)
	if v.isStr && !utf8.ValidString(v.str) {
		return fail("not valid UTF-8")
	}
	switch name {
	case attrSpecVersion, attrID, attrSource, attrType, attrTime, attrDataSchema, attrPartitionKey:
		if !v.isStr {
			return fail("want a JSON string")
		}
	}
	switch name {
	case attrSpecVersion:
		if v.str != SpecVersion {
			return fail(strconv.Quote(v.str) + " is not supported: sluice reads CloudEvents " + SpecVersion)
		}
		b.spec = v.str
	case attrID:
		if v.str == "" || len(v.str) > MaxIDLen {
			return fail("want 1 to " + strconv.Itoa(MaxIDLen) + " bytes")
		}
		b.ev.ID = v.str
	case attrSource:
		if v.str == "" {
			return fail("want a non-empty URI-reference")
		}
		if _, err := url.Parse(v.str); err != nil {
			return fail("not a URI-reference")
		}
		b.ev.Source = v.str
	case attrType:
		if v.str == "" {
			return fail("want a non-empty string")
		}
		b.ev.Type = v.str
	case attrTime:
		if _, err := time.Parse(time.RFC3339Nano, v.str); err != nil {
			return fail("want an RFC 3339 timestamp such as 2026-12-05T17:31:00Z")
		}
	case attrDataSchema:
		if u, err := url.Parse(v.str); err != nil || !u.IsAbs() {
			return fail("want an absolute URI")
		}
	case attrPartitionKey:
		b.ev.PartitionKey = v.str
	case attrData, attrDataBase64:
		return fail("is not an attribute: in binary mode the body is the data")
	}
	if len(b.buf) == 0 {
		b.buf = append(make([]byte, 0, 256), '{')
	} else {
		b.buf = append(b.buf, ',')
	}
	b.buf = append(append(append(b.buf, '"'), name...), '"', ':')
	if v.binary {
		b.buf = jsonstr.Append(b.buf, v.str)
	} else {
		b.buf = append(b.buf, v.json...)
	}
	if len(b.buf) > MaxAttrsBytes {
		return &AttrError{Attr: "attributes", Problem: "more than " + strconv.Itoa(MaxAttrsBytes) + " bytes of them"}
	}
	return nil
}

// finish checks the required attributes and returns the event.
func (b *attrsBuilder) finish(prefix string) (Event, error) {
	for _, req := range []struct {
		name string
		set  bool
	}{{attrSpecVersion, b.spec != ""}, {attrID, b.ev.ID != ""}, {attrSource, b.ev.Source != ""}, {attrType, b.ev.Type != ""}} {
		if !req.set {
			return Event{}, &AttrError{Attr: prefix + req.name, Problem: "required, and missing"}
		}
	}
	b.buf = append(b.buf, '}')
	b.ev.Attrs = string(b.buf)
	return b.ev, nil
}

// validName reports whether name is a CloudEvents attribute name: ASCII
// lower-case letters and digits.
func validName(name string) bool {
	if name == attrDataBase64 { // named by the JSON format, refused by add
		return true
	}
	if name == "" || len(name) > maxNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// percentDecode decodes a binary mode header value: the HTTP binding
// percent-encodes a space, '"', '%' and everything outside printable
// ASCII, and the result must be UTF-8.
func percentDecode(v []byte) (string, error) {
	if bytes.IndexByte(v, '%') < 0 {
		return string(v), nil
	}
	out := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		if v[i] != '%' {
			out = append(out, v[i])
			continue
		}
		if i+2 >= len(v) || unhex(v[i+1]) < 0 || unhex(v[i+2]) < 0 {
			return "", errors.New("invalid percent-encoding: '%' must start %XX (a literal '%' is %25)")
		}
		out = append(out, byte(unhex(v[i+1])<<4|unhex(v[i+2])))
		i += 2
	}
	return string(out), nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}
