package config

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/knadh/koanf/parsers/yaml"
)

// TestDecodeSubFastCoversKeys: the fast path takes every key of a
// subscription except slowSubKeys, so that a key added to
// SubscriptionConfig is not silently left to the slow path (or a slow key
// taken without its richer checks).
func TestDecodeSubFastCoversKeys(t *testing.T) {
	st := reflect.TypeFor[SubscriptionConfig]()
	for i := range st.NumField() {
		f := st.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if !f.IsExported() || key == "" || key == "-" {
			continue
		}
		var v any
		switch {
		case f.Type == durationType:
			v = "1s"
		case f.Type.Kind() == reflect.String:
			v = "x"
		case f.Type.Kind() == reflect.Bool:
			v = true
		case f.Type.Kind() == reflect.Slice:
			v = []any{"x"}
		case f.Type.Kind() == reflect.Struct, f.Type.Kind() == reflect.Map:
			v = map[string]any{}
		default:
			t.Fatalf("%s: no sample value for %s", key, f.Type)
		}
		var s SubscriptionConfig
		got, want := decodeSubFast(map[string]any{key: v}, &s), !slices.Contains(slowSubKeys, key)
		if got != want {
			t.Errorf("decodeSubFast takes %q: %v, want %v (slowSubKeys and the switch disagree)", key, got, want)
		}
	}
}

// TestDecodeSubsFastEqualsSlow: on the subscriptions of the test configs,
// both parsers, the fast path and mapstructure give the same values.
func TestDecodeSubsFastEqualsSlow(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	taken := 0
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		taken += compareSubDecoders(t, name, b)
	}
	if taken < 20 {
		t.Fatalf("the fast path took only %d subscriptions of testdata", taken)
	}
}

// FuzzDecodeSubFast: wherever decodeSubFast takes a subscription,
// mapstructure decodes it too, to an equal value.
func FuzzDecodeSubFast(f *testing.F) {
	f.Add("subscriptions: [{id: a, url: 'http://x', secret: whsec_x, types: [t], rate: {per_second: 1, burst: 2}, concurrency: {max: 8}}]")
	f.Add("subscriptions: [{id: a, timeout: ' 5s', retry: {max_attempts: 3, base: 1s, cap: 1m, max_age: 1h}, backlog: {max_events: 10, max_age: 1h}}]")
	f.Add("subscriptions: [{headers: {}, classify: {'409': ack}, secrets: [], types: [], paused: true, ordering: key, format: cloudevents-binary, tenant: t}]")
	f.Add("subscriptions: [{breaker: {failure_ratio: 1, min_requests: 2, window: 1s, consecutive_timeouts: 3, cool_down: 1s, max_cool_down: 2s}}]")
	f.Add("subscriptions: [{concurrency: {auto: true, min: 0, max: 9, headroom: 0}, rate: {per_second: .nan}, timeout: 1.5}]")
	f.Add(`{"subscriptions": [{"id": "a", "rate": {"per_second": 2.5, "burst": 1e3}, "headers": {"X": "1"}, "timeout": null}]}`)
	f.Fuzz(func(t *testing.T, doc string) { compareSubDecoders(t, "fuzz", []byte(doc)) })
}

// compareSubDecoders parses doc as YAML and as JSON and, for each
// subscription the fast path takes, checks that mapstructure takes it too
// with an equal result. It returns how many the fast path took.
func compareSubDecoders(t *testing.T, name string, doc []byte) int {
	t.Helper()
	var docs []map[string]any
	if m, err := yaml.Parser().Unmarshal(doc); err == nil {
		docs = append(docs, m)
	}
	if m, err := parseJSONConfig(doc); err == nil {
		docs = append(docs, m)
	}
	taken := 0
	for _, m := range docs {
		list, _ := m["subscriptions"].([]any)
		for i, e := range list {
			fasts := make([]SubscriptionConfig, 1)
			if !decodeSubFast(e, &fasts[0]) {
				continue
			}
			taken++
			slow, err := decodeSubsSlow([]any{e}, "")
			if err != nil {
				t.Fatalf("%s: subscriptions[%d] %#v: the fast path takes it, mapstructure refuses it: %v", name, i, e, err)
			}
			markSource(fasts, []any{e})
			markSource(slow, []any{e})
			if fast := fasts[0]; !reflect.DeepEqual(fast, slow[0]) && !equalModuloNaN(fast, slow[0]) {
				t.Fatalf("%s: subscriptions[%d] %#v: the fast path and mapstructure differ in %s", name, i, e, diffField(reflect.ValueOf(fast), reflect.ValueOf(slow[0])))
			}
		}
	}
	return taken
}

// equalModuloNaN compares a and b with their float fields that are NaN in
// both set equal, since NaN != NaN defeats DeepEqual.
func equalModuloNaN(a, b SubscriptionConfig) bool {
	for _, p := range [][2]*float64{{&a.Rate.PerSecond, &b.Rate.PerSecond}, {&a.Breaker.FailureRatio, &b.Breaker.FailureRatio}} {
		if *p[0] != *p[0] && *p[1] != *p[1] {
			*p[0], *p[1] = 0, 0
		}
	}
	return reflect.DeepEqual(a, b)
}

// diffField names the first field where a and b, two structs of one type,
// differ (without printing values: they may be secrets).
func diffField(a, b reflect.Value) string {
	for i := range a.NumField() {
		if !a.Type().Field(i).IsExported() {
			continue
		}
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			return a.Type().Field(i).Name
		}
	}
	return "an unexported field (explicit or spec)"
}
