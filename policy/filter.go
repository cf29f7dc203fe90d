package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Bounds of a filter, checked by ParseFilter. A filter runs for every event
// of its subscription's types, and subscriptions can come from the API, so
// its cost per event must be bounded by sluice rather than by whoever
// writes the filter.
const (
	// MaxFilterDepth bounds nesting: the filter object itself is level 1,
	// each $and, $or and $not goes one level deeper, and a list or object
	// inside an operand nests the same way.
	MaxFilterDepth = 16

	// MaxFilterNodes bounds a filter's size: each filter object, logical
	// operator ($and, $or, $not) and comparison (one operator on one path,
	// shorthand equality included) is a node.
	MaxFilterNodes = 256

	// MaxFilterList bounds the items of one $in or $nin list, and the
	// values (counting nested ones) of any one operand.
	MaxFilterList = 1024
)

// Filter is a parsed body filter of a subscription: a predicate over the
// event's JSON body. It is immutable and safe for concurrent
// use.
//
// A filter is a JSON object whose keys are dotted paths or logical
// operators, all of which must hold:
//
//	{"data.depot": {"$in": ["A", "B"]},
//	 "$or": [{"data.speed": {"$gt": 80}}, {"data.kind": {"$startsWith": "alarm"}}]}
//
// A path's segments name object members; a segment that is a decimal
// index ("items.0.sku") also indexes an array. There is no implicit
// traversal of arrays: a path names one value, and "$in" asks whether that
// value is one of a list, not whether an array holds an item. A key starting
// with "$" is an operator, so a path cannot start with one.
//
// A path's value is either a plain value, shorthand for "$eq", or an
// object of comparison operators, all of which must hold:
//
//   - "$eq", "$neq": equality of JSON values: numbers numerically (1 and
//     1.0 are equal), strings, booleans, null, and lists and objects
//     deeply. Values of different JSON types are never equal.
//   - "$gt", "$gte", "$lt", "$lte": order of numbers, or of strings
//     byte-wise (so RFC 3339 timestamps written the same way compare in
//     time order). The operand must be a number or a string; a value of
//     the other type never matches.
//   - "$in", "$nin": whether the value equals one of a non-empty list.
//   - "$exists": true or false, whether the path is present (a null value
//     is present).
//   - "$startsWith": a string prefix; only string values match.
//
// Logical operators: "$and" and "$or" take a non-empty list of filter
// objects, "$not" one filter object.
//
// A shorthand object must not hold "$" keys ({"data": {"depot": {"$in":
// …}}} is a nested filter where a dotted path was meant, and would
// silently match nothing); "$eq" compares with such an object. An empty
// object is refused for the same reason: {"$eq": {}} says what it means.
//
// A missing path (a member that is absent, an index past the end, or a
// segment below a value that is not an object or an array) matches only
// "$exists": false, "$neq" and "$nin": like MongoDB, a value that is not
// there is not equal to anything and not in any list. Every other operator
// needs the value. So "$neq" is exactly {"$not": {path: {"$eq": …}}}, and
// "$nin" is "$not" "$in". "$not" is plain negation: for every filter F and
// JSON document D exactly one of F and {"$not": F} matches D.
//
// Numbers: one that is an integer within int64's range is kept exactly
// (whatever its spelling: 1e3 and 1000.0 are the integer 1000), any other
// is rounded to the nearest float64 as JSON decoders do, and the values
// are then compared exactly. So integers compare exactly up to ±2^63,
// well past the 2^53 of a float64; integers beyond that, and decimals,
// compare as the float64s they round to.
type Filter struct {
	root node // an opObject
}

// ParseFilter parses a filter as decoded from YAML or JSON: a map of
// dotted paths and operators as Filter describes, whose values are nil,
// bool, string, numbers (any Go integer or float type, or json.Number),
// []any and map[string]any (or other slices, and maps with string keys). A
// YAML timestamp (time.Time) is taken as its RFC 3339 text. A nil or empty
// spec matches every JSON body.
//
// An invalid filter returns a *FilterError naming where it went wrong:
// "filter: data.speed: $gt: want a number or a string, got true". The
// filter does not keep spec or anything in it.
func ParseFilter(spec map[string]any) (*Filter, error) {
	var p parser
	root, err := p.object(spec, "", 1)
	if err != nil {
		return nil, err
	}
	return &Filter{root: root}, nil
}

// Match reports whether doc, a body as DecodeDocument returned it, passes
// f. The caller decodes a body once per event, however many filters look
// at it.
//
// A body that is not JSON passes no filter: DecodeDocument returns a nil
// doc for it, and Match(nil) is false for every filter, {"$not": F}
// included, so that a filter never selects what it cannot read. (A JSON
// null body is not nil: DecodeDocument returns a document in which every
// path is missing.) Callers may skip Match when DecodeDocument says !ok;
// the outcome is the same.
//
// A nil *Filter is no filter: it matches every body, JSON or not.
//
// Match also accepts documents decoded by encoding/json without
// DecodeDocument, numbers as float64 or json.Number. It does not allocate.
func (f *Filter) Match(doc any) bool {
	if f == nil {
		return true
	}
	switch doc.(type) {
	case nil:
		return false
	case jsonNull:
		doc = nil
	}
	return f.root.eval(doc)
}

// String returns f in canonical JSON: keys sorted, shorthand equality
// written as "$eq", numbers in their shortest form. Two filters with the
// same String match the same documents, and ParseFilter reads String back
// into an equal filter, so it can tell whether a reload changed a filter.
// It returns "<nil>" for a nil *Filter.
func (f *Filter) String() string {
	if f == nil {
		return "<nil>"
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // "<" in a string is no risk in a log line
	if err := enc.Encode(f.root.spec()); err != nil {
		// Cannot happen: spec builds only maps, slices, strings, bools,
		// nil and valid json.Numbers.
		return fmt.Sprintf("<filter: %v>", err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// jsonNull is the document of a body that is the JSON literal null, told
// apart from the nil that stands for a body that is not JSON.
type jsonNull struct{}

// DecodeDocument decodes an event body for Match, once per event however
// many filters look at it. ok is false, and doc nil, for a body that is not
// exactly one JSON value (empty, malformed, or followed by more than white
// space); no filter matches it.
//
// Numbers are decoded as json.Number, so Match compares integers exactly
// (see Filter) however large they are in the body; a float64 would round
// those beyond 2^53. Strings with invalid UTF-8 are decoded with U+FFFD
// in place of the bad bytes, as encoding/json does.
//
// doc holds no reference to body.
func DecodeDocument(body []byte) (doc any, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, false
	}
	// Only white space may follow the value. Reading the rest ourselves
	// costs a scan of a few bytes; asking dec.Token for io.EOF cost a
	// quarter of the whole decode.
	for _, c := range body[dec.InputOffset():] {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return nil, false
		}
	}
	if doc == nil {
		return jsonNull{}, true
	}
	return doc, true
}

// op is what a node of a parsed filter does.
type op uint8

const (
	opObject op = iota // a filter object: all kids hold
	opAnd              // all kids (filter objects) hold
	opOr               // some kid holds
	opNot              // kids[0] does not hold
	opPath             // the value at path passes all kids (comparisons)

	// Comparisons, the kids of an opPath.
	opEq
	opNeq
	opGt
	opGte
	opLt
	opLte
	opIn
	opNin
	opExists
	opStartsWith
)

var opNames = [...]string{
	opAnd: "$and", opOr: "$or", opNot: "$not",
	opEq: "$eq", opNeq: "$neq", opGt: "$gt", opGte: "$gte", opLt: "$lt", opLte: "$lte",
	opIn: "$in", opNin: "$nin", opExists: "$exists", opStartsWith: "$startsWith",
}

// comparisons maps a comparison operator's name to its op.
var comparisons = map[string]op{
	"$eq": opEq, "$neq": opNeq, "$gt": opGt, "$gte": opGte, "$lt": opLt, "$lte": opLte,
	"$in": opIn, "$nin": opNin, "$exists": opExists, "$startsWith": opStartsWith,
}

// node is one node of a parsed filter. The tree mirrors the spec (an
// opPath per path key, its comparisons as kids) so that String can write
// it back.
type node struct {
	op   op
	kids []node
	key  string    // opPath: the path as written
	path []segment // opPath: key, split once here rather than per event
	arg  value     // comparisons: the operand ($in, $nin: a list)
	in   *set      // $in, $nin: arg's items, indexed
}

// segment is one segment of a path.
type segment struct {
	name  string
	index int // name as an array index, or -1 when it is not one
}

func (n *node) eval(doc any) bool {
	switch n.op {
	case opObject, opAnd:
		for i := range n.kids {
			if !n.kids[i].eval(doc) {
				return false
			}
		}
		return true
	case opOr:
		for i := range n.kids {
			if n.kids[i].eval(doc) {
				return true
			}
		}
		return false
	case opNot:
		return !n.kids[0].eval(doc)
	case opPath:
		v, present := lookup(doc, n.path)
		for i := range n.kids {
			if !n.kids[i].test(v, present) {
				return false
			}
		}
		return true
	}
	return false
}

// test applies comparison n to v, the value at its path if present.
func (n *node) test(v any, present bool) bool {
	switch n.op {
	case opExists:
		return present == n.arg.b
	case opNeq:
		return !present || !equal(v, &n.arg)
	case opNin:
		return !present || !n.in.has(v)
	}
	if !present {
		return false
	}
	switch n.op {
	case opEq:
		return equal(v, &n.arg)
	case opIn:
		return n.in.has(v)
	case opGt:
		c, ok := order(v, &n.arg)
		return ok && c > 0
	case opGte:
		c, ok := order(v, &n.arg)
		return ok && c >= 0
	case opLt:
		c, ok := order(v, &n.arg)
		return ok && c < 0
	case opLte:
		c, ok := order(v, &n.arg)
		return ok && c <= 0
	case opStartsWith:
		s, ok := v.(string)
		return ok && strings.HasPrefix(s, n.arg.s)
	}
	return false
}

// lookup returns the value at path in doc, and whether there is one.
func lookup(doc any, path []segment) (any, bool) {
	v := doc
	for _, s := range path {
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[s.name]; !ok {
				return nil, false
			}
		case []any:
			if s.index < 0 || s.index >= len(c) {
				return nil, false
			}
			v = c[s.index]
		default:
			return nil, false
		}
	}
	return v, true
}

// spec returns n as the map, list and value tree String encodes.
func (n *node) spec() any {
	switch n.op {
	case opObject:
		m := make(map[string]any, len(n.kids))
		for i := range n.kids {
			k := &n.kids[i]
			switch k.op {
			case opPath:
				m[k.key] = k.spec()
			case opAnd, opOr:
				l := make([]any, len(k.kids))
				for j := range k.kids {
					l[j] = k.kids[j].spec()
				}
				m[opNames[k.op]] = l
			case opNot:
				m[opNames[k.op]] = k.kids[0].spec()
			}
		}
		return m
	case opPath:
		m := make(map[string]any, len(n.kids))
		for i := range n.kids {
			m[opNames[n.kids[i].op]] = n.kids[i].arg.spec()
		}
		return m
	}
	return nil
}

// parser holds what ParseFilter counts across the whole filter.
type parser struct {
	nodes int
}

func (p *parser) count(at string) error {
	p.nodes++
	if p.nodes > MaxFilterNodes {
		return tooBig(at)
	}
	return nil
}

func tooBig(at string) error {
	return &FilterError{At: at, Reason: fmt.Sprintf("more than %d nodes (filter objects, logical operators and comparisons)", MaxFilterNodes)}
}

// object parses a filter object found at at ("" for the top, "$or[1]" for
// one in a list), at nesting level depth.
func (p *parser) object(spec map[string]any, at string, depth int) (node, error) {
	if depth > MaxFilterDepth {
		return node{}, &FilterError{At: at, Reason: fmt.Sprintf("nested deeper than %d levels", MaxFilterDepth)}
	}
	if err := p.count(at); err != nil {
		return node{}, err
	}
	// Checked before sorting the keys, so that a huge spec is refused
	// for the price of a small one.
	if len(spec) > MaxFilterNodes {
		return node{}, tooBig(at)
	}
	n := node{op: opObject, kids: make([]node, 0, len(spec))}
	// Sorted so that the first error reported does not depend on map
	// order; paths first, since Match stops at the first entry that fails
	// and a path costs a lookup where $or and $not cost a subtree.
	keys := slices.Sorted(maps.Keys(spec))
	for _, logical := range []bool{false, true} {
		for _, key := range keys {
			if strings.HasPrefix(key, "$") != logical {
				continue
			}
			kid, err := p.entry(key, spec[key], at, depth)
			if err != nil {
				return node{}, err
			}
			n.kids = append(n.kids, kid)
		}
	}
	return n, nil
}

// entry parses one key of a filter object and its value.
func (p *parser) entry(key string, val any, at string, depth int) (node, error) {
	if !strings.HasPrefix(key, "$") {
		return p.path(key, val, at, depth)
	}
	fail := func(format string, args ...any) (node, error) {
		return node{}, &FilterError{At: at, Op: key, Reason: fmt.Sprintf(format, args...)}
	}
	switch key {
	case "$and", "$or":
		list, ok := asList(val)
		if !ok || len(list) == 0 {
			if ok || val == nil {
				return fail("want a non-empty list of filters")
			}
			return fail("want a non-empty list of filters, got %s", describe(val))
		}
		if err := p.count(at); err != nil {
			return node{}, err
		}
		n := node{op: opAnd, kids: make([]node, len(list))}
		if key == "$or" {
			n.op = opOr
		}
		for i, x := range list {
			in := fmt.Sprintf("%s[%d]", join(at, key), i)
			m, ok := asObject(x)
			if !ok {
				return node{}, &FilterError{At: in, Reason: fmt.Sprintf("want a filter object, got %s", describe(x))}
			}
			kid, err := p.object(m, in, depth+1)
			if err != nil {
				return node{}, err
			}
			n.kids[i] = kid
		}
		return n, nil
	case "$not":
		m, ok := asObject(val)
		if !ok {
			return fail("want a filter object, got %s", describe(val))
		}
		if err := p.count(at); err != nil {
			return node{}, err
		}
		kid, err := p.object(m, join(at, key), depth+1)
		if err != nil {
			return node{}, err
		}
		return node{op: opNot, kids: []node{kid}}, nil
	}
	if _, ok := comparisons[key]; ok {
		return fail(`a comparison needs a path, as in {"data.x": {%q: …}}`, key)
	}
	return node{}, &FilterError{At: at, Reason: fmt.Sprintf("unknown operator %q", key)}
}

// path parses a path key and its comparisons.
func (p *parser) path(key string, val any, at string, depth int) (node, error) {
	fail := func(op, format string, args ...any) (node, error) {
		return node{}, &FilterError{At: at, Path: key, Op: op, Reason: fmt.Sprintf(format, args...)}
	}
	segs, reason := splitPath(key)
	if reason != "" {
		return fail("", "%s", reason)
	}
	n := node{op: opPath, key: key, path: segs}

	m, isObject := asObject(val)
	if !isObject {
		c, err := p.comparison(opEq, val, true, at, key, depth)
		if err != nil {
			return node{}, err
		}
		n.kids = []node{c}
		return n, nil
	}
	if len(m) == 0 {
		return fail("", `empty object: give operators, or {"$eq": {}} to match an empty object`)
	}
	var ops, fields []string
	for k := range m {
		if strings.HasPrefix(k, "$") {
			ops = append(ops, k)
		} else {
			fields = append(fields, k)
		}
	}
	if len(ops) == 0 {
		// Shorthand equality with an object; literal, so that a "$" key
		// below is refused rather than compared (see operand.convert).
		c, err := p.comparison(opEq, val, true, at, key, depth)
		if err != nil {
			return node{}, err
		}
		n.kids = []node{c}
		return n, nil
	}
	if len(fields) > 0 {
		slices.Sort(ops)
		slices.Sort(fields)
		return fail("", "mixes operators (%s) with fields (%s): use $eq to compare with an object", ops[0], fields[0])
	}
	if len(ops) > MaxFilterNodes {
		return node{}, tooBig(at)
	}
	slices.Sort(ops)
	n.kids = make([]node, 0, len(ops))
	for _, name := range ops {
		o, ok := comparisons[name]
		if !ok {
			if name == "$and" || name == "$or" || name == "$not" {
				return fail(name, `use it at the level of a filter object, as in {%q: …} around {%q: …}`, name, key)
			}
			return fail("", "unknown operator %q", name)
		}
		c, err := p.comparison(o, m[name], false, at, key, depth)
		if err != nil {
			return node{}, err
		}
		n.kids = append(n.kids, c)
	}
	return n, nil
}

// comparison parses operator o with operand x on path key, in a filter
// object at level depth. literal is set for shorthand equality (see
// operand.literal).
func (p *parser) comparison(o op, x any, literal bool, at, key string, depth int) (node, error) {
	if err := p.count(at); err != nil {
		return node{}, err
	}
	name := opNames[o]
	fail := func(format string, args ...any) (node, error) {
		return node{}, &FilterError{At: at, Path: key, Op: name, Reason: fmt.Sprintf(format, args...)}
	}
	conv := operand{path: key, literal: literal}
	n := node{op: o}
	switch o {
	case opExists:
		b, ok := x.(bool)
		if !ok {
			return fail("want true or false, got %s", describe(x))
		}
		n.arg = value{kind: kindBool, b: b}
		return n, nil
	case opStartsWith:
		s, ok := x.(string)
		if !ok {
			return fail("want a string, got %s", describe(x))
		}
		n.arg = value{kind: kindString, s: s}
		return n, nil
	case opIn, opNin:
		list, ok := asList(x)
		if !ok || len(list) == 0 {
			return fail("want a non-empty list, got %s", describe(x))
		}
		if len(list) > MaxFilterList {
			return fail("more than %d items", MaxFilterList)
		}
		if depth+1 > MaxFilterDepth {
			return fail("nested deeper than %d levels", MaxFilterDepth)
		}
		n.arg = value{kind: kindList, list: make([]value, len(list))}
		for i, item := range list {
			v, err := conv.convert(item, depth+2)
			if err != nil {
				return fail("%v", err)
			}
			n.arg.list[i] = v
		}
		n.in = newSet(n.arg.list)
		return n, nil
	}
	// Checked before converting, so that a list is refused as a list
	// rather than for what is inside it.
	if o >= opGt && o <= opLte && !isNumberOrString(x) {
		return fail("want a number or a string, got %s", describe(x))
	}
	// The operand sits one level below its filter object.
	v, err := conv.convert(x, depth+1)
	if err != nil {
		return fail("%v", err)
	}
	n.arg = v
	return n, nil
}

// splitPath splits a dotted path, or returns why it is not one.
func splitPath(key string) ([]segment, string) {
	if key == "" {
		return nil, `empty path ""`
	}
	names := strings.Split(key, ".")
	segs := make([]segment, len(names))
	for i, name := range names {
		if name == "" {
			return nil, "empty segment in path"
		}
		segs[i] = segment{name: name, index: arrayIndex(name)}
	}
	return segs, ""
}

// arrayIndex returns name as an array index, or -1 when it is not the
// canonical decimal form of one ("01" and "-1" are member names only).
func arrayIndex(name string) int {
	if len(name) > 9 || (len(name) > 1 && name[0] == '0') {
		return -1
	}
	i, err := strconv.Atoi(name)
	if err != nil || i < 0 || name[0] == '+' || name[0] == '-' {
		return -1
	}
	return i
}

// join appends a step to a location for error messages.
func join(at, step string) string {
	if at == "" {
		return step
	}
	return at + "." + step
}
