package policy

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// kind is the JSON type of a filter operand.
type kind uint8

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindList
	kindObject
)

// value is a filter operand, normalised at parse time so that Match never
// converts one: numbers whatever Go type the decoder chose, lists and
// objects whatever their Go container.
type value struct {
	kind kind
	b    bool
	n    number
	s    string
	list []value  // kindList
	keys []string // kindObject, sorted
	vals []value  // kindObject: vals[i] is the member keys[i]
}

// number is a JSON number: an int64 when it is an integer in range (so
// that integers compare exactly), a float64 otherwise.
type number struct {
	isInt bool
	i     int64
	f     float64 // when !isInt: not an integer, or out of int64 range
}

func intNumber(i int64) number { return number{isInt: true, i: i} }

func floatNumber(f float64) number {
	// -2^63 is an int64, 2^63 is not; NaN fails the first test.
	if f == math.Trunc(f) && f >= -(1<<63) && f < 1<<63 {
		return intNumber(int64(f))
	}
	return number{f: f}
}

// cmpNumbers compares the values a and b hold exactly, so that it is a
// total order (for sorting a set) and 2^53+1 > 2^53.
func cmpNumbers(a, b number) int {
	switch {
	case a.isInt && b.isInt:
		return cmp.Compare(a.i, b.i)
	case a.isInt:
		return -cmpFloatInt(b.f, a.i)
	case b.isInt:
		return cmpFloatInt(a.f, b.i)
	}
	return cmp.Compare(a.f, b.f)
}

// cmpFloatInt compares f, which floatNumber did not make an integer, with
// i. Converting i to a float64 instead would round it past 2^53.
func cmpFloatInt(f float64, i int64) int {
	switch {
	case math.IsNaN(f):
		return -1 // never from JSON; below everything, as cmp.Compare puts it
	case f >= 1<<63:
		return 1
	case f < -(1 << 63):
		return -1
	}
	// f is not an integer, so floor(f) < f < floor(f)+1, and floor(f) fits.
	if i <= int64(math.Floor(f)) {
		return 1
	}
	return -1
}

func (n number) String() string {
	if n.isInt {
		return strconv.FormatInt(n.i, 10)
	}
	return strconv.FormatFloat(n.f, 'g', -1, 64)
}

// parseNumber parses a JSON number's text without allocating (except for
// one beyond float64's range, which is rare enough).
func parseNumber(s string) (number, bool) {
	if i, ok := parseInt(s); ok {
		return intNumber(i), true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		var ne *strconv.NumError
		if !errors.As(err, &ne) || ne.Err != strconv.ErrRange {
			return number{}, false
		}
		// Out of range: ParseFloat returned ±Inf or 0, the nearest it has.
	}
	return floatNumber(f), true
}

// parseInt parses an optional minus and decimal digits, the integers of
// JSON. strconv.ParseInt would allocate its error for every "1.5".
func parseInt(s string) (int64, bool) {
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	if s == "" || len(s) > 19 {
		return 0, false
	}
	var u uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		u = u*10 + uint64(c-'0') // 19 digits cannot overflow a uint64
	}
	switch {
	case neg && u <= 1<<63:
		return int64(-u), true
	case !neg && u < 1<<63:
		return int64(u), true
	}
	return 0, false
}

// docNumber returns v as a number if it is one: json.Number from
// DecodeDocument, float64 from plain encoding/json, or any Go number a
// caller built a document with.
func docNumber(v any) (number, bool) {
	switch x := v.(type) {
	case json.Number:
		return parseNumber(string(x))
	case float64:
		return floatNumber(x), true
	case int:
		return intNumber(int64(x)), true
	case int64:
		return intNumber(x), true
	case float32:
		return floatNumber(float64(x)), true
	case int8:
		return intNumber(int64(x)), true
	case int16:
		return intNumber(int64(x)), true
	case int32:
		return intNumber(int64(x)), true
	case uint:
		return uintNumber(uint64(x)), true
	case uint8:
		return intNumber(int64(x)), true
	case uint16:
		return intNumber(int64(x)), true
	case uint32:
		return intNumber(int64(x)), true
	case uint64:
		return uintNumber(x), true
	}
	return number{}, false
}

func uintNumber(u uint64) number {
	if u < 1<<63 {
		return intNumber(int64(u))
	}
	return number{f: float64(u)}
}

// equal reports whether document value doc equals operand v.
func equal(doc any, v *value) bool {
	switch v.kind {
	case kindNull:
		return doc == nil
	case kindBool:
		b, ok := doc.(bool)
		return ok && b == v.b
	case kindString:
		s, ok := doc.(string)
		return ok && s == v.s
	case kindNumber:
		n, ok := docNumber(doc)
		return ok && cmpNumbers(n, v.n) == 0
	case kindList:
		l, ok := doc.([]any)
		if !ok || len(l) != len(v.list) {
			return false
		}
		for i := range l {
			if !equal(l[i], &v.list[i]) {
				return false
			}
		}
		return true
	case kindObject:
		m, ok := doc.(map[string]any)
		if !ok || len(m) != len(v.keys) {
			return false
		}
		for i, k := range v.keys {
			x, ok := m[k]
			if !ok || !equal(x, &v.vals[i]) {
				return false
			}
		}
		return true
	}
	return false
}

// order compares document value doc with operand v, a number or a string;
// ok is false when doc is not of v's type.
func order(doc any, v *value) (c int, ok bool) {
	switch v.kind {
	case kindNumber:
		n, ok := docNumber(doc)
		if !ok {
			return 0, false
		}
		return cmpNumbers(n, v.n), true
	case kindString:
		s, ok := doc.(string)
		if !ok {
			return 0, false
		}
		return strings.Compare(s, v.s), true
	}
	return 0, false
}

// set is the items of an $in or $nin list, indexed by type so that a test
// costs a lookup rather than a scan of up to MaxFilterList items.
type set struct {
	strings map[string]struct{}
	numbers []number // sorted by cmpNumbers
	others  []value  // null, booleans, lists, objects
}

func newSet(items []value) *set {
	s := &set{}
	for _, v := range items {
		switch v.kind {
		case kindString:
			if s.strings == nil {
				s.strings = make(map[string]struct{})
			}
			s.strings[v.s] = struct{}{}
		case kindNumber:
			s.numbers = append(s.numbers, v.n)
		default:
			s.others = append(s.others, v)
		}
	}
	slices.SortFunc(s.numbers, cmpNumbers)
	return s
}

// has reports whether document value v equals an item.
func (s *set) has(v any) bool {
	if str, ok := v.(string); ok {
		_, ok := s.strings[str]
		return ok
	}
	if n, ok := docNumber(v); ok {
		_, found := slices.BinarySearchFunc(s.numbers, n, cmpNumbers)
		return found
	}
	for i := range s.others {
		if equal(v, &s.others[i]) {
			return true
		}
	}
	return false
}

// spec returns v as String encodes it.
func (v *value) spec() any {
	switch v.kind {
	case kindBool:
		return v.b
	case kindNumber:
		return json.Number(v.n.String())
	case kindString:
		return v.s
	case kindList:
		l := make([]any, len(v.list))
		for i := range v.list {
			l[i] = v.list[i].spec()
		}
		return l
	case kindObject:
		m := make(map[string]any, len(v.keys))
		for i, k := range v.keys {
			m[k] = v.vals[i].spec()
		}
		return m
	}
	return nil
}

// operand converts one operand of a filter, counting its values against
// MaxFilterList.
type operand struct {
	path   string
	values int
	// literal is set for shorthand equality ({"data": {"depot": "A"}}).
	// A "$" key in an object inside it is refused: it is nearly always a
	// filter written nested instead of dotted, which as a literal would
	// silently match nothing. $eq compares with such an object.
	literal bool
	trail   []string // keys from the operand down, for literal's message
}

// convert converts operand x, found at nesting level depth of the filter
// (see MaxFilterDepth): a list or an object deeper than the bound is
// refused.
func (c *operand) convert(x any, depth int) (value, error) {
	c.values++
	if c.values > MaxFilterList {
		return value{}, fmt.Errorf("more than %d values", MaxFilterList)
	}
	switch x := x.(type) {
	case nil:
		return value{kind: kindNull}, nil
	case bool:
		return value{kind: kindBool, b: x}, nil
	case string:
		return value{kind: kindString, s: x}, nil
	case time.Time:
		// A YAML timestamp, unquoted in the config: bodies carry time as
		// RFC 3339 text, so that is what it is compared with.
		return value{kind: kindString, s: x.Format(time.RFC3339Nano)}, nil
	case json.Number:
		n, ok := parseNumber(string(x))
		if !ok || (!n.isInt && (math.IsInf(n.f, 0) || math.IsNaN(n.f))) {
			return value{}, fmt.Errorf("want a finite number, got %s", describe(x))
		}
		return value{kind: kindNumber, n: n}, nil
	case float64:
		return floatOperand(x)
	case float32:
		return floatOperand(float64(x))
	}
	if n, ok := docNumber(x); ok {
		return value{kind: kindNumber, n: n}, nil
	}
	if l, ok := asList(x); ok {
		if depth > MaxFilterDepth {
			return value{}, fmt.Errorf("nested deeper than %d levels", MaxFilterDepth)
		}
		v := value{kind: kindList, list: make([]value, len(l))}
		for i, item := range l {
			c.trail = append(c.trail, strconv.Itoa(i))
			var err error
			if v.list[i], err = c.convert(item, depth+1); err != nil {
				return value{}, err
			}
			c.trail = c.trail[:len(c.trail)-1]
		}
		return v, nil
	}
	if m, ok := asObject(x); ok {
		if depth > MaxFilterDepth {
			return value{}, fmt.Errorf("nested deeper than %d levels", MaxFilterDepth)
		}
		v := value{kind: kindObject, keys: slices.Sorted(maps.Keys(m))}
		v.vals = make([]value, len(v.keys))
		for i, k := range v.keys {
			if c.literal && strings.HasPrefix(k, "$") {
				dotted := strings.Join(append([]string{c.path}, c.trail...), ".")
				return value{}, fmt.Errorf(`operator %q inside a plain object: write the path dotted, as in {%q: {%q: …}}, or use "$eq" to compare with the object as it is`, k, dotted, k)
			}
			c.trail = append(c.trail, k)
			var err error
			if v.vals[i], err = c.convert(m[k], depth+1); err != nil {
				return value{}, err
			}
			c.trail = c.trail[:len(c.trail)-1]
		}
		return v, nil
	}
	return value{}, fmt.Errorf("unsupported value of type %T", x)
}

func floatOperand(f float64) (value, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return value{}, fmt.Errorf("want a finite number, got %v", f)
	}
	return value{kind: kindNumber, n: floatNumber(f)}, nil
}

// isNumberOrString reports whether x converts to a number or a string,
// the operands that have an order.
func isNumberOrString(x any) bool {
	switch x.(type) {
	case string, time.Time, json.Number, float64, float32:
		return true
	}
	_, ok := docNumber(x)
	return ok
}

// asList returns x as a list if it is a slice or an array ([]any from
// JSON and YAML, or a typed slice a caller built).
func asList(x any) ([]any, bool) {
	switch l := x.(type) {
	case []any:
		return l, true
	case nil, string, []byte:
		return nil, false
	}
	rv := reflect.ValueOf(x)
	if rv.Kind() != reflect.Slice && rv.Kind() != reflect.Array {
		return nil, false
	}
	l := make([]any, rv.Len())
	for i := range l {
		l[i] = rv.Index(i).Interface()
	}
	return l, true
}

// asObject returns x as an object if it is a map with string keys
// (map[string]any from JSON and YAML; map[any]any from YAML with keys that
// happen to be strings).
func asObject(x any) (map[string]any, bool) {
	switch m := x.(type) {
	case map[string]any:
		return m, true
	case nil:
		return nil, false
	}
	rv := reflect.ValueOf(x)
	if rv.Kind() != reflect.Map {
		return nil, false
	}
	m := make(map[string]any, rv.Len())
	for it := rv.MapRange(); it.Next(); {
		k := it.Key()
		if k.Kind() == reflect.Interface {
			k = k.Elem()
		}
		if k.Kind() != reflect.String {
			return nil, false
		}
		m[k.String()] = it.Value().Interface()
	}
	return m, true
}

// describe renders a spec value for an error message, short: the message
// goes to a log or an API answer.
func describe(x any) string {
	switch x := x.(type) {
	case nil:
		return "null"
	case string:
		const max = 40
		if len(x) > max {
			i := max
			for i > 0 && !utf8.RuneStart(x[i]) {
				i--
			}
			return strconv.Quote(x[:i]) + "…"
		}
		return strconv.Quote(x)
	case bool:
		return strconv.FormatBool(x)
	case json.Number:
		if len(x) > 40 {
			return string(x[:40]) + "…"
		}
		return string(x)
	}
	if n, ok := docNumber(x); ok {
		return n.String()
	}
	if _, ok := asList(x); ok {
		return "a list"
	}
	if _, ok := asObject(x); ok {
		return "an object"
	}
	return fmt.Sprintf("a %T", x)
}
