package policy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

var variantAt = time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)

func mustVariant(tb testing.TB, spec policy.VariantSpec) *policy.Variant {
	tb.Helper()
	v, err := policy.ParseVariant(spec)
	if err != nil {
		tb.Fatalf("ParseVariant(%+v): %v", spec, err)
	}
	return v
}

func envelope(fields ...string) policy.VariantSpec {
	return policy.VariantSpec{Envelope: policy.EnvelopeStandardWebhooks, Fields: fields}
}

func fields(paths ...string) policy.VariantSpec { return policy.VariantSpec{Fields: paths} }

func TestVariantRender(t *testing.T) {
	const ts = `"timestamp":"2026-03-01T12:00:00.123456789Z"`
	for _, tc := range []struct {
		name string
		spec policy.VariantSpec
		at   time.Time
		body string
		want string
	}{
		{"envelope", envelope(), variantAt, `{"id":1}`,
			`{"type":"geofence.enter",` + ts + `,"data":{"id":1}}`},
		{"envelope keeps the payload as stored, trimmed", envelope(), variantAt, " {\"b\": 1,  \"a\":\"<&>\"}\r\n",
			`{"type":"geofence.enter",` + ts + `,"data":{"b": 1,  "a":"<&>"}}`},
		{"envelope of a scalar", envelope(), variantAt, `42`,
			`{"type":"geofence.enter",` + ts + `,"data":42}`},
		{"envelope of null", envelope(), variantAt, `null`,
			`{"type":"geofence.enter",` + ts + `,"data":null}`},
		{"envelope timestamp is UTC whatever the zone", envelope(), variantAt.In(time.FixedZone("X", 5*3600)), `{}`,
			`{"type":"geofence.enter",` + ts + `,"data":{}}`},
		{"envelope timestamp drops trailing zeros", envelope(), time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), `{}`,
			`{"type":"geofence.enter","timestamp":"2026-03-01T12:00:00Z","data":{}}`},
		{"fields", fields("data.id", "data.depot"), variantAt, `{"type":"x","data":{"id":7,"speed":3,"depot":"A"}}`,
			`{"data":{"depot":"A","id":7}}`},
		{"fields nested deep", fields("a.b.c.d"), variantAt, `{"a":{"b":{"c":{"d":[1,{"e":2}],"x":1},"y":2},"z":3}}`,
			`{"a":{"b":{"c":{"d":[1,{"e":2}]}}}}`},
		{"fields keep values as written", fields("n", "big", "s", "o"), variantAt,
			`{"n": 1.0e2, "big": 12345678901234567890, "s": "\u00e9<&>", "o": { "k" : [ 1 , 2 ] }, "x": 0}`,
			`{"big":12345678901234567890,"n":1.0e2,"o":{"k":[1,2]},"s":"\u00e9<&>"}`},
		{"fields array items keep their index", fields("items.0.sku", "items.2.sku"), variantAt,
			`{"items":[{"sku":"X1","n":1},{"sku":"X2"},{"sku":"X3","n":3}]}`,
			`{"items":[{"sku":"X1"},null,{"sku":"X3"}]}`},
		{"fields array index sorted numerically", fields("l.10", "l.2"), variantAt,
			`{"l":[0,1,2,3,4,5,6,7,8,9,10,11]}`,
			`{"l":[null,null,2,null,null,null,null,null,null,null,10]}`},
		{"fields whole array", fields("items"), variantAt, `{"items":[1,{"a":[]}],"x":1}`,
			`{"items":[1,{"a":[]}]}`},
		{"fields index past the end is omitted", fields("items.5", "id"), variantAt, `{"items":[1],"id":1}`,
			`{"id":1}`},
		{"fields top-level array", fields("1", "3.a"), variantAt, `[0, 1, 2, {"a": 3, "b": 4}]`,
			`[null,1,null,{"a":3}]`},
		{"fields index on an object is a member name", fields("m.0"), variantAt, `{"m":{"0":"zero","1":"one"}}`,
			`{"m":{"0":"zero"}}`},
		{"fields missing paths are omitted", fields("data.id", "other"), variantAt, `{"data":{"x":1}}`,
			`{}`},
		{"fields below a scalar are missing", fields("data.id.x", "n.0"), variantAt, `{"data":{"id":"s"},"n":null}`,
			`{}`},
		{"fields of a top-level array keeping nothing", fields("a"), variantAt, `[1]`, `[]`},
		{"fields of a scalar body", fields("a"), variantAt, `"text"`, `{}`},
		{"fields overlapping: the shorter wins", fields("data.id", "data"), variantAt, `{"data":{"id":1,"x":2},"y":3}`,
			`{"data":{"id":1,"x":2}}`},
		{"fields keep null", fields("a"), variantAt, `{"a":null}`, `{"a":null}`},
		{"fields repeated member takes the last", fields("a"), variantAt, `{"a":1,"a":2}`, `{"a":2}`},
		{"fields then envelope", envelope("data.id"), variantAt, `{"data":{"id":1,"secret":"x"}}`,
			`{"type":"geofence.enter",` + ts + `,"data":{"data":{"id":1}}}`},
		{"fields then envelope keeping nothing", envelope("nope"), variantAt, `{"data":1}`,
			`{"type":"geofence.enter",` + ts + `,"data":{}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := mustVariant(t, tc.spec)
			body := []byte(tc.body)
			got, err := v.Render("geofence.enter", tc.at, body)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if string(got) != tc.want {
				t.Fatalf("Render:\n got %s\nwant %s", got, tc.want)
			}
			if !json.Valid(got) {
				t.Fatalf("not JSON: %s", got)
			}
			if string(body) != tc.body {
				t.Fatalf("Render modified the body: %q", body)
			}
			if tc.spec.Envelope == "" {
				if model := modelProject(t, v.Spec().Fields, body); !bytes.Equal(model, got) {
					t.Fatalf("encoding/json's model gives %s", model)
				}
			}
			again, _ := v.Render("geofence.enter", tc.at, []byte(tc.body))
			if !bytes.Equal(again, got) {
				t.Fatalf("not deterministic: %s then %s", got, again)
			}
		})
	}
}

func TestVariantRenderEscapesTheType(t *testing.T) {
	v := mustVariant(t, envelope())
	got, err := v.Render(`a"b<`, variantAt, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var env struct{ Type string }
	if err := json.Unmarshal(got, &env); err != nil || env.Type != `a"b<` {
		t.Fatalf("type %q from %s: %v", env.Type, got, err)
	}
}

func TestVariantNilIsTheStoredBody(t *testing.T) {
	var v *policy.Variant
	body := []byte("not json")
	got, err := v.Render("t", variantAt, body)
	if err != nil || &got[0] != &body[0] {
		t.Fatalf("nil variant: %q %v, want the body itself", got, err)
	}
	if v.Key() != "" || v.String() != "<nil>" || v.Spec().Fields != nil {
		t.Fatalf("nil variant: key %q, string %q", v.Key(), v.String())
	}
}

// TestVariantRenderErrors: a body that is not exactly one JSON value is
// refused, the error naming where it breaks off, and never its content.
func TestVariantRenderErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want string
	}{
		{"not JSON", `depot=A`, "body variant: body is not valid JSON at its top level (byte 0)"},
		{"empty", ``, "body variant: body is empty, not JSON"},
		{"white space", " \n\t", "body variant: body is empty, not JSON"},
		{"a member", `{"data":{"id":1,"depot":}}`, "at data.depot (byte 24)"},
		{"an item", `{"data":{"items":[1,{"sku":"A"},tru]}}`, "at data.items.2 "},
		{"a member name", `{"data":{"id":1,"depot" 2}}`, "at data.depot "},
		{"between members", `{"data":{"id":1 "depot":2}}`, "at data (byte 16)"},
		{"between items", `{"data":{"items":[1 2]}}`, "at data.items (byte 20)"},
		{"the first item", `{"data":{"items":[x]}}`, "at data.items.0 "},
		{"cut off", `{"data":{"items":[1,2`, "at data.items (byte 21)"},
		{"two values", `{"a":1} {"b":2}`, "at its top level (byte 8)"},
		{"two scalars", "1\n 22", "at its top level (byte 3)"},
		{"after the value", `{"a":1} x`, "at its top level"},
		{"names that could be data are hidden", `{"user@example.com":{"ok":{"card 4242":}}}`, "at ?.ok.? "},
		{"deep nesting is cut short", strings.Repeat(`{"a":`, 40) + "x", "at a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.… "},
	} {
		for _, spec := range []policy.VariantSpec{envelope(), fields("data.id"), envelope("data.depot")} {
			v := mustVariant(t, spec)
			t.Run(tc.name+"/"+v.Key(), func(t *testing.T) {
				got, err := v.Render("t", variantAt, []byte(tc.body))
				if err == nil {
					t.Fatalf("Render = %s, want an error", got)
				}
				var ve *policy.VariantError
				if !errors.As(err, &ve) || !errors.Is(err, policy.ErrVariantFailed) {
					t.Fatalf("error %T %v: want a *VariantError wrapping ErrVariantFailed", err, err)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %q, want it to contain %q", err, tc.want)
				}
				for _, secret := range []string{"example.com", "4242", "depot=A", "sku", "tru"} {
					if strings.Contains(err.Error(), secret) {
						t.Fatalf("error %q shows the body's %q", err, secret)
					}
				}
			})
		}
	}
}

func TestParseVariantErrors(t *testing.T) {
	many := make([]string, policy.MaxVariantFields+1)
	for i := range many {
		many[i] = "f" + strconv.Itoa(i)
	}
	for _, tc := range []struct {
		name  string
		spec  policy.VariantSpec
		field string
		want  string
	}{
		{"nothing", policy.VariantSpec{}, "body", "set envelope or fields"},
		{"unknown envelope", policy.VariantSpec{Envelope: "svix"}, "body.envelope", `svix: unknown envelope (want "standard-webhooks")`},
		{"empty fields", policy.VariantSpec{Fields: []string{}}, "body.fields", "must list at least one path"},
		{"empty path", fields("a", ""), "body.fields[1]", `empty path ""`},
		{"empty segment", fields("data..id"), "body.fields[0]", "empty segment in path"},
		{"trailing dot", fields("data."), "body.fields[0]", "empty segment in path"},
		{"operator", fields("$and"), "body.fields[0]", `not "$"`},
		{"listed twice", fields("a", "b", "a"), "body.fields[2]", "listed twice (body.fields[0]"},
		{"too many", fields(many...), "body.fields", "more than 256 paths"},
		{"too deep", fields(strings.Repeat("a.", policy.MaxVariantPathSegments) + "a"), "body.fields[0]", "more than 32 segments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := policy.ParseVariant(tc.spec)
			if err == nil {
				t.Fatalf("ParseVariant = %v, want an error", v)
			}
			var fe *policy.FieldError
			if !errors.As(err, &fe) || !errors.Is(err, policy.ErrInvalidConfig) {
				t.Fatalf("error %T %v: want a *FieldError", err, err)
			}
			if fe.Field != tc.field || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q (field %q), want field %q and %q", err, fe.Field, tc.field, tc.want)
			}
		})
	}
}

// TestVariantKey: variants that render the same have one key, others
// another, and a key reads back into the same variant.
func TestVariantKey(t *testing.T) {
	same := [][]policy.VariantSpec{
		{fields("data.id", "data.depot"), fields("data.depot", "data.id"), fields("data.depot", "data.id", "data.depot.x")},
		{fields("data"), fields("data.id", "data"), fields("data", "data.a.b.c")},
		{envelope(), {Envelope: policy.EnvelopeStandardWebhooks}},
		{envelope("b", "a"), envelope("a", "b", "a.x")},
	}
	keys := map[string]int{}
	for i, group := range same {
		want := mustVariant(t, group[0]).Key()
		for _, spec := range group {
			v := mustVariant(t, spec)
			if v.Key() != want {
				t.Errorf("%+v: key %s, want %s", spec, v.Key(), want)
			}
			back := mustVariant(t, v.Spec())
			if back.Key() != v.Key() || back.String() != v.Key() {
				t.Errorf("%+v: Spec reads back with key %s, want %s", spec, back.Key(), v.Key())
			}
			var fromKey policy.VariantSpec
			if err := json.Unmarshal([]byte(v.Key()), &fromKey); err != nil || mustVariant(t, fromKey).Key() != v.Key() {
				t.Errorf("key %s does not read back: %v", v.Key(), err)
			}
		}
		if j, dup := keys[want]; dup {
			t.Errorf("groups %d and %d share key %s", j, i, want)
		}
		keys[want] = i
	}
	if k := mustVariant(t, envelope("data.id", "data.depot")).Key(); k != `{"envelope":"standard-webhooks","fields":["data.depot","data.id"]}` {
		t.Errorf("key %s", k)
	}
}

// FuzzVariant checks that ParseVariant and Render never panic, and for the
// variants ParseVariant accepts: Render is deterministic; it renders
// exactly the bodies json.Valid accepts, into JSON; a fields variant
// keeps each listed path's value as the body has it; an envelope holds
// the type, the time and the payload.
func FuzzVariant(f *testing.F) {
	if testing.Short() {
		f.Skip("fuzz targets are skipped with -short")
	}
	for _, seed := range []struct {
		fields   string
		envelope bool
		typ      string
		body     string
	}{
		{"data.id,data.depot", false, "geofence.enter", `{"data":{"id":1,"depot":"A","x":[1,2]}}`},
		{"", true, "card.shipped", `{"a":1}`},
		{"items.0.sku,items.2", true, "t", `{"items":[{"sku":"a"},{"sku":"b"},3]}`},
		{"0,1.a", false, "t", `[{"a":1},{"a":2}]`},
		{"a", false, "t", `{"a":1,"a":2}`},
		{"a.b", true, "t", `{"a":{"b":"\u2028<>"}}`},
		{"a", false, "t", `{"a":}`},
		{"a", true, "t\x00\"", ``},
		{"a..b", false, "t", `{}`},
		{"a", false, "t", `{} {}`},
		{"n", false, "t", `{"n":-0.0e-0}`},
		{"a\u00e9,b", false, "t", "{\"a\\u00e9\":1,\"b\":{\"x\":\"\xff\"},\"a\u00e9\":2,\"\\u0062\":[ 1 , {\"y\" : null} ]}"},
		{"\ufffd,<&>", false, "t", "{\"\xff\":1,\"<&>\":2}"},
		{"l.1.a,l.3,l.10", false, "t", `{"l":[0,{"a":1,"b":2},2,[3],4,5,6,7,8,9,{"z":1}]}`},
	} {
		f.Add(seed.fields, seed.envelope, seed.typ, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, list string, env bool, typ string, body []byte) {
		spec := policy.VariantSpec{}
		if list != "" {
			spec.Fields = strings.Split(list, ",")
		}
		if env {
			spec.Envelope = policy.EnvelopeStandardWebhooks
		}
		v, err := policy.ParseVariant(spec)
		if err != nil {
			var fe *policy.FieldError
			if !errors.As(err, &fe) || !strings.HasPrefix(fe.Field, "body") {
				t.Fatalf("ParseVariant error %T %v", err, err)
			}
			return
		}
		if back := mustVariant(t, v.Spec()); back.Key() != v.Key() {
			t.Fatalf("Spec reads back with key %s, want %s", back.Key(), v.Key())
		}
		in := bytes.Clone(body)
		got, err := v.Render(typ, variantAt, body)
		if !bytes.Equal(in, body) {
			t.Fatal("Render modified the body")
		}
		valid := json.Valid(body)
		if err != nil {
			var ve *policy.VariantError
			if !errors.As(err, &ve) || !errors.Is(err, policy.ErrVariantFailed) {
				t.Fatalf("Render error %T %v", err, err)
			}
			if valid {
				t.Fatalf("Render(%q) refused a valid body: %v", body, err)
			}
			return
		}
		if !valid {
			t.Fatalf("Render(%q) = %s for a body json.Valid refuses", body, got)
		}
		if !json.Valid(got) {
			t.Fatalf("Render(%q) = %s, not JSON", body, got)
		}
		if again, _ := v.Render(typ, variantAt, body); !bytes.Equal(again, got) {
			t.Fatalf("not deterministic: %s then %s", got, again)
		}
		payload := got
		if env {
			var e struct {
				Type      string          `json:"type"`
				Timestamp time.Time       `json:"timestamp"`
				Data      json.RawMessage `json:"data"`
			}
			if err := json.Unmarshal(got, &e); err != nil {
				t.Fatalf("envelope %s: %v", got, err)
			}
			var want string // typ as JSON carries it (invalid UTF-8 replaced)
			b, _ := json.Marshal(typ)
			_ = json.Unmarshal(b, &want)
			if e.Type != want || !e.Timestamp.Equal(variantAt) {
				t.Fatalf("envelope %s: type %q, time %v", got, e.Type, e.Timestamp)
			}
			payload = e.Data
		}
		if spec.Fields == nil {
			if !reflect.DeepEqual(mustDoc(t, string(payload)), mustDoc(t, string(body))) {
				t.Fatalf("envelope data %s, body %s", payload, body)
			}
			return
		}
		if model := modelProject(t, v.Spec().Fields, body); !bytes.Equal(payload, model) {
			t.Fatalf("fields %q of %q: rendered\n%s\nencoding/json's model gives\n%s", v.Spec().Fields, body, payload, model)
		}
		src, out := mustDoc(t, string(body)), mustDoc(t, string(payload))
		for _, p := range v.Spec().Fields {
			want, ok := docAt(src, p)
			have, kept := docAt(out, p)
			if ok != kept || !reflect.DeepEqual(want, have) {
				t.Fatalf("path %s: body has %v (%v), rendering %s has %v (%v)", p, want, ok, payload, have, kept)
			}
		}
	})
}

// docAt looks up a dotted path in a document as DecodeDocument returns it,
// by the rules of a filter's paths.
func docAt(doc any, path string) (any, bool) {
	for _, seg := range strings.Split(path, ".") {
		switch c := doc.(type) {
		case map[string]any:
			var ok bool
			if doc, ok = c[seg]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(c) || strconv.Itoa(i) != seg {
				return nil, false
			}
			doc = c[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

// BenchmarkVariantRender renders the delivery benchmark's 512-byte body
// (BenchmarkDeliveryVariants) with each of its variants.
func BenchmarkVariantRender(b *testing.B) {
	body := []byte(`{"type":"geofence.enter","data":{"depot":"A","speed":42,"kind":"alarm.high","pad":"` + strings.Repeat("x", 420) + `"}}`)
	for _, tc := range []struct {
		name string
		spec policy.VariantSpec
	}{
		{"envelope", envelope()},
		{"fields", fields("data.depot", "data.speed", "data.kind")},
		{"both", envelope("data.depot")},
	} {
		b.Run(tc.name, func(b *testing.B) {
			v := mustVariant(b, tc.spec)
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := v.Render("geofence.enter", variantAt, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// modelProject is the projection Variant documents, built the plain way:
// the body decoded into maps and lists of json.RawMessage, the kept values
// put in maps and lists (null between kept items), encoded by
// encoding/json with SetEscapeHTML(false). Render's projector, which reads
// the body in place, must give the same bytes.
func modelProject(tb testing.TB, paths []string, body []byte) []byte {
	tb.Helper()
	type node struct {
		keep bool
		kids map[string]*node
	}
	root := &node{}
	for _, p := range paths {
		n := root
		for _, seg := range strings.Split(p, ".") {
			if n.keep {
				break
			}
			if n.kids == nil {
				n.kids = map[string]*node{}
			}
			if n.kids[seg] == nil {
				n.kids[seg] = &node{}
			}
			n = n.kids[seg]
		}
		n.keep, n.kids = true, nil
	}
	index := func(seg string) int {
		i, err := strconv.Atoi(seg)
		if err != nil || i < 0 || strconv.Itoa(i) != seg || len(seg) > 9 {
			return -1
		}
		return i
	}
	var project func(raw json.RawMessage, n *node) (any, bool)
	project = func(raw json.RawMessage, n *node) (any, bool) {
		if n.keep {
			return raw, true
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) == nil && m != nil {
			out := map[string]any{}
			for name, k := range n.kids {
				if x, ok := m[name]; ok {
					if y, kept := project(x, k); kept {
						out[name] = y
					}
				}
			}
			return out, len(out) > 0
		}
		var l []json.RawMessage
		if json.Unmarshal(raw, &l) == nil && l != nil {
			var out []any
			for name, k := range n.kids {
				if i := index(name); i >= 0 && i < len(l) {
					if y, kept := project(l[i], k); kept {
						for len(out) <= i {
							out = append(out, nil)
						}
						out[i] = y
					}
				}
			}
			return out, len(out) > 0
		}
		return nil, false
	}
	trimmed := bytes.Trim(body, " \t\r\n")
	out, kept := project(trimmed, root)
	if !kept {
		if trimmed[0] == '[' {
			return []byte("[]")
		}
		return []byte("{}")
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		tb.Fatalf("model: %v", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}
