package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/v2"
)

var durationType = reflect.TypeFor[time.Duration]()

// keySet records which keys of a subscription its source spelled out, for
// the keys where leaving the key out (take the default, or no limit) and
// setting it to zero (an error, or a zero that stands) must differ. The
// zero value of the field alone cannot tell. decodeSubs and Load fill
// it from the parsed source; applyDefaults and Validate read it. A Config
// built by hand has none, so there only the values count.
type keySet uint32

const (
	keyRatePerSecond keySet = 1 << iota
	keyRateBurst
	keyConcurrencyMin
	keyConcurrencyHeadroom
	keyBreakerFailureRatio
	keyBreakerMinRequests
	keyBreakerWindow
	keyBreakerConsecutiveTimeouts
	keyBreakerCoolDown
	keyBreakerMaxCoolDown
	keyBody // the body section, even empty
	keyBodyEnvelope
	keyBodyFields
	keyEgress      // the subscription has an egress section, even one with nothing in it
	keyEgressProxy // egress.proxy, even "" (refused: direct: true says that)
	keyTimeout
	keyConcurrencyMax
	keyRetryMaxAttempts
	keyRetryMaxAge
	keyRetryBase
	keyRetryCap
)

// trackedKeys maps a subscription's sections to the keys in them that
// keySet records.
var trackedKeys = []struct {
	section string
	keys    map[string]keySet
}{
	{"rate", map[string]keySet{"per_second": keyRatePerSecond, "burst": keyRateBurst}},
	{"concurrency", map[string]keySet{"min": keyConcurrencyMin, "max": keyConcurrencyMax, "headroom": keyConcurrencyHeadroom}},
	{"retry", map[string]keySet{
		"max_attempts": keyRetryMaxAttempts,
		"max_age":      keyRetryMaxAge,
		"base":         keyRetryBase,
		"cap":          keyRetryCap,
	}},
	{"breaker", map[string]keySet{
		"failure_ratio":        keyBreakerFailureRatio,
		"min_requests":         keyBreakerMinRequests,
		"window":               keyBreakerWindow,
		"consecutive_timeouts": keyBreakerConsecutiveTimeouts,
		"cool_down":            keyBreakerCoolDown,
		"max_cool_down":        keyBreakerMaxCoolDown,
	}},
	{"body", map[string]keySet{"envelope": keyBodyEnvelope, "fields": keyBodyFields}},
	{"egress", map[string]keySet{"proxy": keyEgressProxy}},
}

func (k keySet) has(key keySet) bool { return k&key != 0 }

// explicitKeys returns the tracked keys that one parsed subscription sets
// to a value; a key set to null (burst: ~) counts as left out, as it
// decodes to nothing.
func explicitKeys(raw any) keySet {
	m, ok := raw.(map[string]any)
	if !ok {
		return 0
	}
	var set keySet
	if _, ok := m["body"].(map[string]any); ok {
		set |= keyBody
	}
	if _, ok := m["egress"]; ok {
		set |= keyEgress
	}
	if m["timeout"] != nil {
		set |= keyTimeout
	}
	for _, t := range trackedKeys {
		sec, ok := m[t.section].(map[string]any)
		if !ok {
			continue
		}
		for key, v := range sec {
			if bit, ok := t.keys[key]; ok && v != nil {
				set |= bit
			}
		}
	}
	return set
}

// markSource records, for subs decoded from raw (the parsed list: a []any
// of maps, or any other slice of maps from the overrides), explicitKeys
// and the redacted document of each, for Spec.
func markSource(subs []SubscriptionConfig, raw any) {
	v := reflect.ValueOf(raw)
	if v.Kind() != reflect.Slice {
		return
	}
	for i := range min(v.Len(), len(subs)) {
		e := v.Index(i).Interface()
		subs[i].explicit = explicitKeys(e)
		subs[i].spec = specOf(e)
	}
}

// markTenants records which tenants of raw, the parsed list, spell out
// concurrency.max (an explicit 0 is refused rather than read as left
// out), max_subscriptions (an explicit 0 is no limit, one left out the
// default's) and max_subscription_concurrency.
func markTenants(tenants []TenantConfig, raw any) {
	v := reflect.ValueOf(raw)
	if v.Kind() != reflect.Slice {
		return
	}
	for i := range min(v.Len(), len(tenants)) {
		m, _ := v.Index(i).Interface().(map[string]any)
		c, _ := m["concurrency"].(map[string]any)
		tenants[i].Concurrency.maxSet = c["max"] != nil
		tenants[i].maxSubscriptionsSet = m["max_subscriptions"] != nil
		tenants[i].maxSubscriptionConcurrencySet = m["max_subscription_concurrency"] != nil
	}
}

// decode unmarshals k onto out (which holds the defaults) strictly: unknown
// keys are errors, keys match tags exactly, durations need a unit.
func decode(k *koanf.Koanf, out *Config) error {
	err := k.UnmarshalWithConf("", out, koanf.UnmarshalConf{
		DecoderConfig: &mapstructure.DecoderConfig{
			DecodeHook:  mapstructure.DecodeHookFuncType(decodeHook),
			ErrorUnused: true,
			TagName:     "koanf",
			MatchName:   func(key, field string) bool { return key == field },
			Result:      out,
		},
	})
	if err != nil {
		return translateDecodeError(err)
	}
	return nil
}

// decodeHook converts the values YAML, the environment and flags produce into
// Config's field types. Durations must be strings with a unit: a bare 10
// would silently mean 10 ns. Strings from the environment become integers,
// floats and booleans; integers and booleans become strings (headers:
// {X-Version: 2}); a fractional number is never truncated into an integer.
// An integer for a float field (ratio: 1) needs no hook: mapstructure
// converts it.
func decodeHook(from, to reflect.Type, data any) (any, error) {
	switch {
	case to == durationType:
		return decodeDuration(from, data)
	case from.Kind() == reflect.String && isIntKind(to.Kind()):
		s := strings.TrimSpace(reflect.ValueOf(data).String())
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, &reason{kind: ErrInvalidValue, msg: "must be an integer", value: data}
		}
		return n, nil
	case from.Kind() == reflect.String && isFloatKind(to.Kind()):
		f, err := strconv.ParseFloat(strings.TrimSpace(reflect.ValueOf(data).String()), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, &reason{kind: ErrInvalidValue, msg: "must be a number", value: data}
		}
		return f, nil
	case from.Kind() == reflect.String && to.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(reflect.ValueOf(data).String()))
		if err != nil {
			return nil, &reason{kind: ErrInvalidValue, msg: "must be true or false", value: data}
		}
		return b, nil
	case isFloatKind(from.Kind()) && isIntKind(to.Kind()):
		f := reflect.ValueOf(data).Float()
		if f != math.Trunc(f) || f > math.MaxInt64 || f < math.MinInt64 {
			return nil, &reason{kind: ErrInvalidValue, msg: "must be a whole number", value: data}
		}
		return int64(f), nil
	case to.Kind() == reflect.String && (isIntKind(from.Kind()) || from.Kind() == reflect.Bool):
		return fmt.Sprint(data), nil
	}
	return data, nil
}

func decodeDuration(from reflect.Type, data any) (any, error) {
	if from == durationType {
		return data, nil // typed overrides
	}
	switch {
	case from.Kind() == reflect.String:
		s := strings.TrimSpace(reflect.ValueOf(data).String())
		d, err := time.ParseDuration(s)
		if err == nil {
			return d, nil
		}
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return nil, &reason{kind: ErrInvalidValue, msg: `duration needs a unit, like "10s" or "1h30m"`, value: data}
		}
		return nil, &reason{kind: ErrInvalidValue, msg: `must be a duration like "10s" or "1h30m"`, value: data}
	case isIntKind(from.Kind()) || isFloatKind(from.Kind()) || isUintKind(from.Kind()):
		return nil, &reason{kind: ErrInvalidValue, msg: `bare number is not a duration: add a unit, like "10s" or "1h30m"`, value: data}
	}
	return data, nil
}

func isIntKind(k reflect.Kind) bool { return k >= reflect.Int && k <= reflect.Int64 }

func isUintKind(k reflect.Kind) bool { return k >= reflect.Uint && k <= reflect.Uintptr }

func isFloatKind(k reflect.Kind) bool { return k == reflect.Float32 || k == reflect.Float64 }

// translateDecodeError turns mapstructure's joined errors into one
// ValidationError for the first failing field (by name).
func translateDecodeError(err error) error {
	var leaves []*mapstructure.DecodeError
	collectDecodeErrors(err, &leaves)
	if len(leaves) == 0 {
		return &ValidationError{Err: invalidf("%v", err)}
	}
	sort.Slice(leaves, func(i, j int) bool { return leaves[i].Name() < leaves[j].Name() })
	de := leaves[0]
	field := de.Name()
	inner := de.Unwrap()

	var r *reason
	if errors.As(inner, &r) {
		return fieldErr(field, scalarValue(r.value), r)
	}
	var ute *mapstructure.UnconvertibleTypeError
	if errors.As(inner, &ute) {
		msg := fmt.Sprintf("expected %s, got %s", describeType(ute.Expected.Type()), describeValue(ute.Value))
		return fieldErr(field, scalarValue(ute.Value), invalidf("%s", msg))
	}
	var pe *mapstructure.ParseError
	if errors.As(inner, &pe) {
		return fieldErr(field, scalarValue(pe.Value), invalidf("expected %s", describeType(pe.Expected.Type())))
	}
	// Two more type errors that mapstructure reports as plain text.
	if inner != nil && strings.HasPrefix(inner.Error(), "source data must be an array or slice") {
		return fieldErr(field, nil, invalidf("expected a list"))
	}
	if inner != nil && strings.HasPrefix(inner.Error(), "expected a map or struct") {
		return fieldErr(field, nil, invalidf("expected a mapping"))
	}
	if inner != nil && strings.HasPrefix(inner.Error(), "has invalid keys: ") {
		// Backstop: unknownKey should have caught this already.
		keys := strings.Split(strings.TrimPrefix(inner.Error(), "has invalid keys: "), ", ")
		return &ValidationError{Field: joinPath(field, keys[0]), Err: ErrUnknownKey}
	}
	msg := "invalid"
	if inner != nil {
		msg = inner.Error()
	}
	return fieldErr(field, nil, invalidf("%s", msg))
}

func collectDecodeErrors(err error, out *[]*mapstructure.DecodeError) {
	switch e := err.(type) {
	case *mapstructure.DecodeError:
		var nested []*mapstructure.DecodeError
		collectDecodeErrors(e.Unwrap(), &nested)
		if len(nested) > 0 {
			*out = append(*out, nested...)
		} else {
			*out = append(*out, e)
		}
	case interface{ Unwrap() []error }:
		for _, x := range e.Unwrap() {
			collectDecodeErrors(x, out)
		}
	case interface{ Unwrap() error }:
		collectDecodeErrors(e.Unwrap(), out)
	}
}

// scalarValue keeps scalars for error messages and drops lists and maps.
func scalarValue(v any) any {
	switch v.(type) {
	case nil, []any, map[string]any, map[any]any:
		return nil
	}
	return v
}

func describeType(t reflect.Type) string {
	switch {
	case t == durationType:
		return "a duration"
	case t.Kind() == reflect.String:
		return "a string"
	case isIntKind(t.Kind()):
		return "an integer"
	case isFloatKind(t.Kind()):
		return "a number"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Slice:
		return "a list"
	case t.Kind() == reflect.Map, t.Kind() == reflect.Struct:
		return "a mapping"
	}
	return t.String()
}

func describeValue(v any) string {
	switch v.(type) {
	case nil:
		return "nothing"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any, map[any]any:
		return "a mapping"
	}
	k := reflect.TypeOf(v).Kind()
	if isIntKind(k) || isUintKind(k) || isFloatKind(k) {
		return "a number (quote it to make it a string)"
	}
	return reflect.TypeOf(v).String()
}

// unknownKey returns the path of the first key in v (sorted) that has no
// koanf-tagged field in t, or "".
func unknownKey(path string, v any, t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if m, ok := v.(map[any]any); ok && t.Kind() == reflect.Struct {
		// YAML gives map[any]any when a key is not a string (`0: x`), and
		// mapstructure panics decoding that into a struct (found by
		// FuzzLoadConfig): report the first such key as unknown instead.
		// Maps (classify: {409: ack}) decode such keys fine.
		keys := make([]string, 0, len(m))
		for k := range m {
			if _, isString := k.(string); !isString {
				keys = append(keys, fmt.Sprint(k))
			}
		}
		if len(keys) > 0 {
			return joinPath(path, secretText(slices.Min(keys)))
		}
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return "" // a type error; decode reports it
		}
		for _, key := range slices.Sorted(maps.Keys(m)) {
			f, ok := fieldByKey(t, key)
			if !ok {
				return joinPath(path, secretText(key))
			}
			if bad := unknownKey(joinPath(path, key), m[key], f.Type); bad != "" {
				return bad
			}
		}
	case reflect.Slice:
		s, ok := v.([]any)
		if !ok {
			return ""
		}
		for i, e := range s {
			if bad := unknownKey(fmt.Sprintf("%s[%d]", path, i), e, t.Elem()); bad != "" {
				return bad
			}
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		for _, key := range slices.Sorted(maps.Keys(m)) {
			if bad := unknownKey(path+"["+key+"]", m[key], t.Elem()); bad != "" {
				return bad
			}
		}
	}
	return ""
}

func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if name != "" && name != "-" && name == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
