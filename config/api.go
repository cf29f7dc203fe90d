package config

import (
	"encoding/json"
	"errors"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// The subscription documents of the admin API (POST and PATCH of
// /v1/subscriptions): JSON objects with the keys of one subscription of
// the config file, decoded, defaulted and validated by the file's own code.

// apiPrefix is the key Validate gives the one subscription of a document;
// ParseSubscription's errors drop it.
const apiPrefix = "subscriptions[0]"

// ParseSubscription decodes and validates doc, a JSON object with the keys
// of one subscription in the config file (id, url, secret or secrets,
// types, filter, body, tenant, rate, concurrency, retry, breaker, backlog,
// headers, timeout, classify, paused, ordering, format), filling in the same
// defaults. The result has passed the same checks, with Resolved,
// ClassifyOverrides, ParsedFilter and ParsedVariant filled in.
//
// Secrets must be inline (secret or secrets): secret_file and secret_env
// are refused, since an API client must not make the sidecar read its
// files or its environment; a document without a secret is an error.
// What Validate checks across subscriptions (unique ids, a tenant's
// max_subscriptions) and the SSRF guard, which depends on
// allow_private_targets (CheckPrivateTarget), are the caller's.
//
// Errors are *ValidationError naming the key as the document spells it
// ("url", "retry.max_attempts", unknown key "colour"), without the
// "config: " prefix, and never showing a secret.
func ParseSubscription(doc []byte) (*SubscriptionConfig, error) {
	m, err := parseJSONConfig(doc)
	if err != nil {
		return nil, &ValidationError{Err: invalidf("not a JSON object: %v", err), bare: true}
	}
	for _, key := range []string{"secret_file", "secret_env"} {
		if _, ok := m[key]; ok {
			return nil, apiError(fieldErr(apiPrefix+"."+key, nil, errNotOverAPI))
		}
	}
	for _, key := range []string{"egress", "tls", "auth"} {
		if _, ok := m[key]; ok {
			return nil, apiError(fieldErr(apiPrefix+"."+key, nil, errFilesNotOverAPI))
		}
	}
	if err := strictTypes(apiPrefix, m, reflect.TypeFor[SubscriptionConfig]()); err != nil {
		return nil, apiError(err)
	}
	subs, err := decodeSubs([]any{m}, "")
	if err != nil {
		return nil, apiError(err)
	}
	c := Config{Subscriptions: subs}
	c.applyDefaults()
	s := &c.Subscriptions[0]
	if err := s.validate(apiPrefix, nil); err != nil {
		return nil, apiError(err)
	}
	return s, nil
}

// CheckDocument reads doc, an API request's body (a subscription document
// or a merge patch of one), as ParseSubscription and the config file read
// JSON, without judging its keys: it must be one JSON object, and no
// object in it may give a key twice (decoding into a map keeps the last
// one silently). The error names the line and the key, bare like
// ParseSubscription's.
func CheckDocument(doc []byte) error {
	if _, err := parseJSONConfig(doc); err != nil {
		return &ValidationError{Err: invalidf("not a JSON object: %v", err), bare: true}
	}
	return nil
}

// strictTypes refuses a scalar of an API document whose JSON type is not
// its key's (v is the value at path, t the type of its field). The file's
// decoding converts, because YAML and the environment spell numbers and
// strings loosely ("10" for 10, X-Version: 2 for "2"); a JSON document
// says what it means, so {"id": 5} or {"max": "10"} is a client's bug,
// which the API names instead of guessing. A value of the wrong shape (a
// list for a mapping), an unknown key, a fractional integer and a
// duration (a string with a unit) are left to the decoding, whose
// messages are the file's; null is a key left out, as in the file.
func strictTypes(path string, v any, t reflect.Type) error {
	if v == nil || t == durationType {
		return nil
	}
	bad := func(what string) error { return fieldErr(path, scalarValue(v), invalidf("must be %s", what)) }
	switch k := t.Kind(); {
	case k == reflect.String:
		if _, ok := v.(string); !ok {
			return bad("a string")
		}
	case isIntKind(k):
		switch v.(type) {
		case int, float64:
		default:
			return bad("an integer")
		}
	case isFloatKind(k):
		switch v.(type) {
		case int, float64:
		default:
			return bad("a number")
		}
	case k == reflect.Bool:
		if _, ok := v.(bool); !ok {
			return bad("true or false")
		}
	case k == reflect.Slice:
		l, _ := v.([]any)
		for i, e := range l {
			if err := strictTypes(path+"["+strconv.Itoa(i)+"]", e, t.Elem()); err != nil {
				return err
			}
		}
	case k == reflect.Map:
		m, _ := v.(map[string]any)
		for _, key := range slices.Sorted(maps.Keys(m)) {
			if err := strictTypes(path+"["+key+"]", m[key], t.Elem()); err != nil {
				return err
			}
		}
	case k == reflect.Struct:
		m, _ := v.(map[string]any)
		for _, key := range slices.Sorted(maps.Keys(m)) {
			if f, ok := fieldByKey(t, key); ok {
				if err := strictTypes(joinPath(path, key), m[key], f.Type); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// CheckPrivateTarget refuses the URL when the SSRF guard would refuse it
// without asking DNS: an IP literal in a forbidden range, or localhost.
// Validate runs it on the file's subscriptions unless
// allow_private_targets is set; the caller of ParseSubscription does the
// same. The error names the key "url" and is bare like
// ParseSubscription's.
func (s *SubscriptionConfig) CheckPrivateTarget() error {
	if err := checkTarget(apiPrefix+".url", s.URL); err != nil {
		return apiError(err)
	}
	return nil
}

// apiError turns a ValidationError about the document's one subscription
// into the API's form: keys without the subscriptions[0] prefix, no
// source, no "config: ".
func apiError(err error) error {
	var ve *ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	if ve.Field == apiPrefix {
		ve.Field = ""
	}
	ve.Field = strings.TrimPrefix(ve.Field, apiPrefix+".")
	ve.Source = ""
	ve.bare = true
	return ve
}

// RedactSubscriptionDoc returns a subscription document as API clients
// are shown it: "secret" and "secrets" are replaced by "secrets_count",
// the values of credential-like headers (Authorization, *token*, ...) are
// "[redacted]", and the URL loses its query values, as when a Config is
// printed. A doc that is not a JSON object gives an empty map: nothing of
// it can be shown safely.
func RedactSubscriptionDoc(doc []byte) map[string]any {
	m, err := parseJSONConfig(doc)
	if err != nil {
		return map[string]any{}
	}
	return redactDoc(m)
}

// redactDoc is RedactSubscriptionDoc on a parsed document, which it does
// not modify; the result can be encoded as JSON.
func redactDoc(m map[string]any) map[string]any {
	out := make(map[string]any, len(m)+1)
	n, counted := 0, false
	for k, v := range m {
		switch {
		case k == "secret":
			counted = true
			if s, ok := v.(string); ok && s != "" {
				n++
			}
			continue
		case k == "secrets":
			counted = true
			switch l := v.(type) {
			case []any:
				n += len(l)
			case []string:
				n += len(l)
			}
			continue
		case isSensitiveField(k): // token, or a key yet to come
			continue
		case k == "url":
			if s, ok := v.(string); ok {
				v = safeURL(s)
			}
		case k == "headers":
			if h, ok := jsonable(v).(map[string]any); ok {
				out[k] = redactHeaders(h)
				continue
			}
		}
		out[k] = jsonable(v)
	}
	if counted {
		out["secrets_count"] = n
	}
	return out
}

// redactHeaders returns h with the values of credential-like headers
// redacted: h itself when there are none, else a copy.
func redactHeaders(h map[string]any) map[string]any {
	var out map[string]any
	for name := range h {
		if sensitiveHeader(name) {
			if out == nil {
				out = maps.Clone(h)
			}
			out[name] = redactedText
		}
	}
	if out == nil {
		return h
	}
	return out
}

// jsonable returns v with the shapes YAML may give that encoding/json
// cannot take turned into ones it can: maps with other keys than strings
// (classify: {409: ack}) and NaN or infinite numbers (.nan). What needs
// no change is returned as it is, not copied (most of a file's 50,000
// subscriptions); what does is copied, never changed in place.
func jsonable(v any) any {
	out, _ := fixJSON(v)
	return out
}

// fixJSON is jsonable, and reports whether anything was changed.
func fixJSON(v any) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		var out map[string]any
		for k, e := range x {
			if f, changed := fixJSON(e); changed {
				if out == nil {
					out = maps.Clone(x)
				}
				out[k] = f
			}
		}
		if out == nil {
			return x, false
		}
		return out, true
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[formatKey(k)] = jsonable(e)
		}
		return out, true
	case []any:
		var out []any
		for i, e := range x {
			if f, changed := fixJSON(e); changed {
				if out == nil {
					out = slices.Clone(x)
				}
				out[i] = f
			}
		}
		if out == nil {
			return x, false
		}
		return out, true
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return strconv.FormatFloat(x, 'g', -1, 64), true
		}
	}
	return v, false
}

func formatKey(k any) string {
	if s, ok := k.(string); ok {
		return s
	}
	return formatValue("", k)
}

// specOf is the redacted JSON of one subscription as its source wrote it,
// or nil when it is not a mapping.
func specOf(raw any) []byte {
	var m map[string]any
	switch x := raw.(type) {
	case map[string]any:
		m = x
	case map[any]any:
		m, _ = jsonable(x).(map[string]any)
	default:
		return nil
	}
	b, err := json.Marshal(redactDoc(m))
	if err != nil {
		return nil
	}
	return b
}

// Spec returns the subscription as its source wrote it (the keys the file
// or the overrides spell out, without the defaults Load fills in),
// redacted as RedactSubscriptionDoc redacts a document of the API, as a
// JSON object: what the admin API shows of a file subscription
// (delivery.Subscription.Spec). With secret_file or secret_env,
// "secrets_count" is the number of secrets read. A SubscriptionConfig
// built by hand gives all of its settings instead. The bytes are shared:
// do not modify them.
func (s *SubscriptionConfig) Spec() []byte {
	spec := s.spec
	if spec == nil {
		spec, _ = json.Marshal(redactDoc(s.redacted().toMap()))
	}
	if (s.SecretFile == "" && s.SecretEnv == "") || len(s.Resolved) == 0 || len(spec) < 2 {
		return spec
	}
	// The count is known only once the secrets are read, after decoding
	// wrote spec; adding a key at the front of the object is cheaper than
	// encoding it again.
	count := `{"secrets_count":` + strconv.Itoa(len(s.Resolved))
	if len(spec) == 2 { // {}
		return []byte(count + "}")
	}
	return append([]byte(count+","), spec[1:]...)
}
