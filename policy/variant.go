package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/jsonstr"
)

// Body variants: a subscription may ask for a rendering of the
// stored body instead of its exact bytes. Rendering is pure (the bytes
// depend on the event's type, its accepted-at time and its stored body
// only), so the delivery engine renders each distinct variant once per
// event for every lane that asks for it, and a replay renders the same
// bytes again from the dead letter's copy of the body.

// EnvelopeStandardWebhooks is the envelope of the Standard Webhooks
// specification's recommended payload shape: {"type", "timestamp",
// "data"}. It is the only envelope so far.
const EnvelopeStandardWebhooks = "standard-webhooks"

// Bounds of a variant, checked by ParseVariant. A variant renders once per
// event, and subscriptions can come from the API, so its cost per event
// must be bounded by sluice rather than by whoever writes it.
const (
	// MaxVariantFields bounds the paths of VariantSpec.Fields.
	MaxVariantFields = 256
	// MaxVariantPathSegments bounds the segments of one path.
	MaxVariantPathSegments = 32
)

// Bounds of the distinct variants a sidecar's subscriptions may ask for,
// checked where subscriptions are made through the admin API. Each
// distinct variant is rendered once per event it reaches, and the
// renderings are kept with the event, so the distinct variants multiply
// the CPU and the memory every event costs; subscriptions sharing an equal
// variant (the same Key) add nothing. A tenant's token makes
// subscriptions, so the bound is sluice's, not the tenant's: 8 covers a
// tenant's few receivers with different shapes, and 64 in all keeps an
// event's renderings within a small multiple of its body even for a
// platform event every tenant receives.
const (
	// MaxTenantVariants bounds the distinct variants of one tenant's
	// subscriptions.
	MaxTenantVariants = 8
	// MaxVariants bounds the distinct variants of all subscriptions,
	// the operator's included.
	MaxVariants = 64
)

// VariantContentType is the Content-Type of every rendered variant: they
// are all JSON.
const VariantContentType = "application/json"

// VariantSpec is a body variant as the configuration writes it (a
// subscription's body key); ParseVariant checks it.
type VariantSpec struct {
	// Envelope, when set, wraps the payload: EnvelopeStandardWebhooks.
	Envelope string `json:"envelope,omitempty"`
	// Fields, when set, keeps only these dotted paths of the stored body,
	// in the path syntax of a body filter ("data.id", "data.items.0.sku").
	// A nil Fields keeps the whole payload; an empty one is refused.
	Fields []string `json:"fields,omitempty"`
}

// Variant is a parsed body variant: how the bytes a subscription is sent
// are rendered from an event's stored body. It is immutable and safe for
// concurrent use; a nil *Variant is no variant (the stored bytes).
//
// Fields projects the stored body onto the listed paths: the result holds
// every listed path that is present in the body, with its value as the
// body has it (numbers and strings as written, white space removed), nested
// as in the body, and nothing else. Every kept path names the same value
// in the result as in the body:
//
//   - A path that is missing (an absent member, an index past the end, a
//     segment below a value that is neither an object nor an array) is
//     left out, as are the objects and arrays that would hold only
//     missing paths.
//   - An array keeps its selected items at their indexes; items not
//     selected below the highest selected index become null ("items.2"
//     alone renders "items": [null, null, {…}]).
//   - A path below another listed path adds nothing: "data" keeps the
//     whole of data whatever "data.id" says, and the two render, and key,
//     as "data" alone.
//   - Members are written in sorted order (encoding/json's), whatever
//     order the body has them in; a member the body repeats takes its last
//     value, as encoding/json reads it.
//   - When nothing is kept the result is {} ([] for a body that is an
//     array).
//
// Envelope wraps the payload, or with Fields the projection (fields
// first, then the envelope: the paths name the stored body, the same paths
// a body filter names, never the envelope's): {"type": <event type>,
// "timestamp": <accepted-at, RFC 3339 in UTC with the nanoseconds the log
// keeps>, "data": <the payload as stored, leading and trailing white space
// removed>}. The timestamp is when sluice accepted the event, not when the
// attempt is made: every attempt and every replay sends the same bytes.
//
// Both need a body that is exactly one JSON value; Render refuses any
// other with a *VariantError, which the delivery engine dead-letters with
// ReasonVariantFailed.
type Variant struct {
	envelope string
	fields   []string  // canonical: sorted, none below another
	tree     *pathNode // fields as a tree; nil without fields
	key      string
}

// pathNode is one segment of the variant's fields: keep takes the whole
// value there, else kids say which of its members or items to look at.
type pathNode struct {
	keep  bool
	kids  []pathKid // sorted by segment name
	items []int     // the kids whose name is an array index, by index
}

type pathKid struct {
	seg    segment
	node   *pathNode
	quoted []byte // seg.name as encoding/json writes a member name
}

// ParseVariant checks spec and returns its variant. Errors are
// *FieldError naming the key inside a subscription: "body.envelope",
// "body.fields" or "body.fields[2]" ("body" when spec asks for nothing);
// the configuration puts the subscription's key in front.
func ParseVariant(spec VariantSpec) (*Variant, error) {
	v := &Variant{}
	switch spec.Envelope {
	case "":
	case EnvelopeStandardWebhooks:
		v.envelope = spec.Envelope
	default:
		return nil, fieldError("body.envelope", spec.Envelope, "unknown envelope (want %q)", EnvelopeStandardWebhooks)
	}
	switch {
	case spec.Fields == nil && v.envelope == "":
		return nil, fieldError("body", nil, "set envelope or fields; leave body out to send the stored bytes")
	case spec.Fields == nil:
	case len(spec.Fields) == 0:
		return nil, fieldError("body.fields", []string{}, "must list at least one path; leave fields out to keep the whole payload")
	case len(spec.Fields) > MaxVariantFields:
		return nil, fieldError("body.fields", len(spec.Fields), "more than %d paths", MaxVariantFields)
	default:
		tree, err := parseFields(spec.Fields)
		if err != nil {
			return nil, err
		}
		v.tree = tree
		v.fields = tree.paths(nil, "")
		slices.Sort(v.fields)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the key is read in logs and snapshots
	_ = enc.Encode(v.Spec()) // a string and a list of strings: cannot fail
	v.key = strings.TrimSuffix(b.String(), "\n")
	return v, nil
}

// parseFields builds the tree of fields, refusing a bad or repeated path.
func parseFields(fields []string) (*pathNode, error) {
	root := &pathNode{}
	seen := make(map[string]int, len(fields))
	for i, path := range fields {
		key := fmt.Sprintf("body.fields[%d]", i)
		if j, dup := seen[path]; dup {
			return nil, fieldError(key, path, "listed twice (body.fields[%d] is the same path)", j)
		}
		seen[path] = i
		if strings.HasPrefix(path, "$") {
			return nil, fieldError(key, path, `a path starts with a member name, not "$"`)
		}
		segs, reason := splitPath(path)
		if reason != "" {
			return nil, fieldError(key, path, "%s", reason)
		}
		if len(segs) > MaxVariantPathSegments {
			return nil, fieldError(key, path, "more than %d segments", MaxVariantPathSegments)
		}
		root.insert(segs)
	}
	root.index()
	return root, nil
}

// index fills in what projecting needs below n: each kid's quoted name,
// each node's array items.
func (n *pathNode) index() {
	for i := range n.kids {
		k := &n.kids[i]
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(k.seg.name) // a string: cannot fail
		k.quoted = bytes.TrimSuffix(b.Bytes(), []byte("\n"))
		if k.seg.index >= 0 {
			n.items = append(n.items, i)
		}
		k.node.index()
	}
	slices.SortFunc(n.items, func(a, b int) int { return n.kids[a].seg.index - n.kids[b].seg.index })
}

// insert adds a path; one below a kept node adds nothing, and a kept node
// forgets what was below it.
func (n *pathNode) insert(segs []segment) {
	for _, s := range segs {
		if n.keep {
			return
		}
		i, found := slices.BinarySearchFunc(n.kids, s.name, func(k pathKid, name string) int { return strings.Compare(k.seg.name, name) })
		if !found {
			n.kids = slices.Insert(n.kids, i, pathKid{seg: s, node: &pathNode{}})
		}
		n = n.kids[i].node
	}
	n.keep, n.kids = true, nil
}

// paths appends the kept paths below n, prefix naming n.
func (n *pathNode) paths(out []string, prefix string) []string {
	if n.keep {
		return append(out, prefix)
	}
	for _, k := range n.kids {
		p := k.seg.name
		if prefix != "" {
			p = prefix + "." + p
		}
		out = k.node.paths(out, p)
	}
	return out
}

// Spec returns v as a VariantSpec in canonical form: Fields sorted, no
// path below another. ParseVariant reads it back into an equal variant.
func (v *Variant) Spec() VariantSpec {
	if v == nil {
		return VariantSpec{}
	}
	return VariantSpec{Envelope: v.envelope, Fields: slices.Clone(v.fields)}
}

// Key is v in canonical JSON, {"envelope":"standard-webhooks","fields":
// ["data.depot","data.id"]}: two variants have the same key exactly when
// they render the same bytes for every event (whatever the order or overlap
// of their fields), and ParseVariant reads a key, as a VariantSpec, back
// into an equal variant.
// The delivery engine caches renderings by it. "" for a nil *Variant.
func (v *Variant) Key() string {
	if v == nil {
		return ""
	}
	return v.key
}

// String is Key, or "<nil>" for a nil *Variant.
func (v *Variant) String() string {
	if v == nil {
		return "<nil>"
	}
	return v.key
}

// Render returns the bytes a subscription with v is sent for an event of
// type typ accepted at acceptedAt with the stored body body: body itself
// for a nil *Variant, else the rendering Variant describes, in a new
// slice. It is deterministic: the same arguments give the same bytes (the
// location and monotonic reading of acceptedAt do not count).
//
// A body that is not exactly one JSON value gives a *VariantError naming
// where in the body it stops being JSON. Render does not keep body.
func (v *Variant) Render(typ string, acceptedAt time.Time, body []byte) ([]byte, error) {
	if v == nil {
		return body, nil
	}
	payload := bytes.Trim(body, jsonSpace) // JSON's white space, not Unicode's
	if len(payload) == 0 {
		return nil, &VariantError{Reason: reasonEmpty}
	}
	if !json.Valid(payload) {
		return nil, locate(body)
	}
	if v.tree != nil {
		payload = v.project(payload)
	}
	if v.envelope == "" {
		return payload, nil
	}
	return appendEnvelope(make([]byte, 0, len(payload)+len(typ)+80), typ, acceptedAt, payload), nil
}

// project renders the fields of body, which is trimmed, not empty and
// valid JSON. It reads the body in place (a value it does not keep is
// skipped, not decoded) and writes the result straight out: one
// allocation, where decoding into maps and encoding them again took 50
// for the benchmark's 512-byte body. It writes what encoding/json would
// write for the same projection decoded into maps and encoded with
// SetEscapeHTML(false) (FuzzVariant checks it against that model).
func (v *Variant) project(body []byte) []byte {
	out, kept := projectInto(make([]byte, 0, len(body)/2), body, v.tree)
	switch {
	case kept:
		return out
	case body[0] == '[':
		return []byte("[]")
	}
	return []byte("{}")
}

// projectInto appends what n keeps of val, one valid JSON value without
// surrounding white space, to dst; kept reports whether it kept anything.
func projectInto(dst, val []byte, n *pathNode) (_ []byte, kept bool) {
	if n.keep {
		return appendCompact(dst, val), true
	}
	switch val[0] {
	case '{':
		return projectObject(dst, val, n)
	case '[':
		return projectArray(dst, val, n)
	}
	return dst, false // a scalar: nothing below it
}

// projectObject projects an object: the members n names, in n's (sorted)
// order; of a member the object repeats, the last, as encoding/json reads
// it.
func projectObject(dst, obj []byte, n *pathNode) ([]byte, bool) {
	var small [8][]byte
	spans := small[:0]
	if len(n.kids) <= len(small) {
		spans = small[:len(n.kids)]
	} else {
		spans = make([][]byte, len(n.kids))
	}
	for i := 1; ; {
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			break // the closing brace
		}
		ks := i
		i = skipString(obj, i)
		key := obj[ks:i]
		i = skipSpace(obj, skipSpace(obj, i)+1) // past the colon
		vs := i
		i = skipValue(obj, i)
		if k := n.find(key); k >= 0 {
			spans[k] = obj[vs:i]
		}
		if i = skipSpace(obj, i); i < len(obj) && obj[i] == ',' {
			i++
		}
	}
	start, wrote := len(dst), false
	dst = append(dst, '{')
	for k, span := range spans {
		if span == nil {
			continue
		}
		mark := len(dst)
		if wrote {
			dst = append(dst, ',')
		}
		dst = append(dst, n.kids[k].quoted...)
		dst = append(dst, ':')
		var kept bool
		if dst, kept = projectInto(dst, span, n.kids[k].node); kept {
			wrote = true
		} else {
			dst = dst[:mark]
		}
	}
	if !wrote {
		return dst[:start], false
	}
	return append(dst, '}'), true
}

// projectArray projects an array: the items n names keep their index,
// the ones between them are null.
func projectArray(dst, arr []byte, n *pathNode) ([]byte, bool) {
	if len(n.items) == 0 {
		return dst, false
	}
	var small [8][]byte
	spans := small[:0]
	if len(n.items) <= len(small) {
		spans = small[:len(n.items)]
	} else {
		spans = make([][]byte, len(n.items))
	}
	next := 0 // the next of n.items to look for
	for i, item := 1, 0; next < len(n.items); item++ {
		i = skipSpace(arr, i)
		if i >= len(arr) || arr[i] == ']' {
			break
		}
		vs := i
		i = skipValue(arr, i)
		if n.kids[n.items[next]].seg.index == item {
			spans[next] = arr[vs:i]
			next++
		}
		if i = skipSpace(arr, i); i < len(arr) && arr[i] == ',' {
			i++
		}
	}
	start, last := len(dst), -1 // last: the index of the last item written
	dst = append(dst, '[')
	for j, span := range spans {
		if span == nil {
			continue
		}
		k := &n.kids[n.items[j]]
		mark := len(dst)
		for p := last + 1; p <= k.seg.index; p++ {
			if p > 0 {
				dst = append(dst, ',')
			}
			if p < k.seg.index {
				dst = append(dst, "null"...)
			}
		}
		var kept bool
		if dst, kept = projectInto(dst, span, k.node); kept {
			last = k.seg.index
		} else {
			dst = dst[:mark]
		}
	}
	if last < 0 {
		return dst[:start], false
	}
	return append(dst, ']'), true
}

// find returns the index in n.kids of the member named by key, a JSON
// string as the body spells it (quotes and escapes included), or -1.
func (n *pathNode) find(key []byte) int {
	name := key[1 : len(key)-1]
	if bytes.IndexByte(name, '\\') >= 0 || !utf8.Valid(name) {
		// Escapes, or bytes encoding/json reads as U+FFFD: decode it as
		// encoding/json does (rare, so the allocation does not matter).
		var s string
		if json.Unmarshal(key, &s) != nil {
			return -1
		}
		name = []byte(s)
	}
	lo, hi := 0, len(n.kids)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		switch kid := n.kids[m].seg.name; {
		case kid == string(name):
			return m
		case kid < string(name):
			lo = m + 1
		default:
			hi = m
		}
	}
	return -1
}

// skipSpace returns the index of the first byte at or after i that is
// not JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the JSON string at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the index just past the valid JSON value at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		for depth := 0; i < len(b); {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	}
	for ; i < len(b); i++ { // a number, true, false or null
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return len(b)
}

// appendCompact appends the valid JSON value v without its white space,
// as encoding/json's Compact does (strings as they are).
func appendCompact(dst, v []byte) []byte {
	for i := 0; i < len(v); {
		switch c := v[i]; c {
		case ' ', '\t', '\n', '\r':
			i++
		case '"':
			j := skipString(v, i)
			dst = append(dst, v[i:j]...)
			i = j
		default:
			j := i + 1
			for j < len(v) && !isStructuralSpaceOrQuote(v[j]) {
				j++
			}
			dst = append(dst, v[i:j]...)
			i = j
		}
	}
	return dst
}

func isStructuralSpaceOrQuote(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '"'
}

// jsonSpace is the white space JSON allows around a value.
const jsonSpace = " \t\r\n"

// appendEnvelope appends the Standard Webhooks envelope of data.
func appendEnvelope(dst []byte, typ string, at time.Time, data []byte) []byte {
	dst = append(dst, `{"type":`...)
	dst = jsonstr.Append(dst, typ)
	dst = append(dst, `,"timestamp":"`...)
	dst = at.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, `","data":`...)
	dst = append(dst, data...)
	return append(dst, '}')
}

// ErrVariantFailed means a body could not be rendered for a body variant.
// Render returns it wrapped in a *VariantError.
var ErrVariantFailed = errors.New("body variant failed")

// Reasons of a VariantError.
const (
	reasonEmpty   = "empty"
	reasonInvalid = "not valid JSON"
)

// VariantError is what Render returns for a body it cannot render: the
// body is not exactly one JSON value. It names where the body stops being
// JSON, as a dotted path of the body (the path syntax of the variant's
// fields) and a byte offset, never with the body's content: the message
// goes into dead letters and logs. It wraps ErrVariantFailed.
type VariantError struct {
	// Path is where in the body the JSON breaks off: the member or item
	// being read ("data.items.2"), "" at the top level (the body does not
	// start as JSON, or more follows its value). A member name that is
	// not a short plain word (letters, digits, "_", "-", up to 32) is
	// shown as "?": names can carry data too.
	Path string
	// Offset is how many bytes of the body come before the token at
	// which it stops being JSON.
	Offset int64
	// Reason is "not valid JSON", or "empty" for a body of nothing but
	// white space.
	Reason string
}

// Error reads like "body variant: body is not valid JSON at data.depot
// (byte 27)", "body variant: body is not valid JSON at its top level
// (byte 0)" or "body variant: body is empty, not JSON".
func (e *VariantError) Error() string {
	switch {
	case e.Reason == reasonEmpty:
		return "body variant: body is empty, not JSON"
	case e.Path == "":
		return fmt.Sprintf("body variant: body is %s at its top level (byte %d)", e.Reason, e.Offset)
	}
	return fmt.Sprintf("body variant: body is %s at %s (byte %d)", e.Reason, e.Path, e.Offset)
}

// Unwrap returns ErrVariantFailed.
func (e *VariantError) Unwrap() error { return ErrVariantFailed }

// locate finds where body stops being one JSON value, for a VariantError.
// It walks the body token by token, which is slow, but runs only for a
// body already found invalid.
func locate(body []byte) *VariantError {
	type frame struct {
		object  bool
		key     string // object: the member being read
		wantKey bool   // object: the next string is a member name
		index   int    // array: the item being read, -1 before the first
	}
	var stack []frame
	path := func() string {
		var parts []string
		for _, f := range stack {
			switch {
			case len(parts) == maxErrorSegments:
				return strings.Join(parts, ".") + ".…"
			case f.object && !f.wantKey:
				parts = append(parts, safeName(f.key))
			case !f.object && f.index >= 0:
				parts = append(parts, strconv.Itoa(f.index))
			default:
				return strings.Join(parts, ".")
			}
		}
		return strings.Join(parts, ".")
	}
	// done notes that a value ended: its object waits for a member name.
	done := func() {
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].wantKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	started := false
	for {
		before := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			if err == io.EOF && !started {
				return &VariantError{Reason: reasonEmpty}
			}
			// Where the token that failed starts: past the white space
			// and the one "," or ":" after the last good token. This is
			// worked out from the body, not from Decoder.InputOffset or
			// SyntaxError.Offset after the error: those moved by a byte
			// between Go releases (go1.26 and go1.27 disagree).
			fault := skipSpace(body, int(before))
			if fault < len(body) && (body[fault] == ',' || body[fault] == ':') {
				fault = skipSpace(body, fault+1)
			}
			// An item that fails after "," or "[" is the next one; an
			// array that fails elsewhere (cut off, say) is named itself,
			// as an object failing between members is.
			if n := len(stack); n > 0 && !stack[n-1].object {
				if prev := bytes.TrimRight(body[:fault], jsonSpace); len(prev) > 0 && (prev[len(prev)-1] == ',' || prev[len(prev)-1] == '[') {
					stack[n-1].index++
				} else {
					stack[n-1].index = -1
				}
			}
			off := int64(fault)
			return &VariantError{Path: path(), Offset: off, Reason: reasonInvalid}
		}
		if len(stack) == 0 && started {
			// A second value after the first: Decoder reads streams,
			// a body holds one. Offset counts the bytes before it.
			return &VariantError{Offset: int64(skipSpace(body, int(before))), Reason: reasonInvalid}
		}
		started = true
		if n := len(stack); n > 0 {
			top := &stack[n-1]
			if top.object && top.wantKey {
				if d, ok := tok.(json.Delim); ok && d == '}' {
					stack = stack[:n-1]
					done()
					continue
				}
				top.key, top.wantKey = tok.(string), false
				continue
			}
			if !top.object {
				if d, ok := tok.(json.Delim); ok && d == ']' {
					stack = stack[:n-1]
					done()
					continue
				}
				top.index++
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{object: true, wantKey: true})
		case json.Delim('['):
			stack = append(stack, frame{index: -1})
		default:
			done()
		}
	}
}

// maxErrorSegments bounds the path a VariantError shows: a body nested
// thousands deep must not make a message as long.
const maxErrorSegments = 16

// safeName is a member name as a VariantError may show it.
func safeName(name string) string {
	if name == "" || len(name) > 32 {
		return "?"
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return "?"
		}
	}
	return name
}
