package config

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// envPrefix marks the environment variables Load reads.
const envPrefix = "SLUICE_"

// EnvFile is the environment variable that names the config file when a
// command is given no --config, so that `sluice healthcheck` in a container
// finds the same file as `serve`. Load skips it: it names the file, not a
// key.
const EnvFile = "SLUICE_CONFIG"

// envKeys is every config key the environment may set; envListKeys are
// those that hold a list, which a variable gives comma-separated
// (SLUICE_JETSTREAM__URLS=nats://a:4222,nats://b:4222). fileOnlyKeys hold
// lists of mappings (subscriptions, tenants, admin.tokens), which a
// variable cannot spell: setting one from the environment is an error.
var envKeys, envListKeys, fileOnlyKeys = func() (map[string]bool, map[string]bool, map[string]bool) {
	keys, lists, fileOnly := map[string]bool{}, map[string]bool{}, map[string]bool{}
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("koanf")
			if tag == "" || tag == "-" {
				continue
			}
			switch {
			case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]():
				walk(f.Type, prefix+tag+".")
			case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
				fileOnly[prefix+tag] = true
			default:
				keys[prefix+tag] = true
				if f.Type.Kind() == reflect.Slice {
					lists[prefix+tag] = true
				}
			}
		}
	}
	walk(reflect.TypeFor[Config](), "")
	return keys, lists, fileOnly
}()

// fileOnlyKey returns the key of fileOnlyKeys that key is or lies under,
// or "".
func fileOnlyKey(key string) string {
	for k := key; ; {
		if fileOnlyKeys[k] {
			return k
		}
		i := strings.LastIndexByte(k, '.')
		if i < 0 {
			return ""
		}
		k = k[:i]
	}
}

// Load builds a Config from, later sources winning:
//
//  1. Default;
//  2. the file at path, unless path is "": YAML, or JSON when its name
//     ends in .json;
//  3. environ (pass os.Environ()): variables named SLUICE_<KEY>, lowercased,
//     with "__" for nesting: SLUICE_DATA_DIR sets data_dir,
//     SLUICE_ADMIN__LISTEN sets admin.listen, and a list key takes a
//     comma-separated value. Subscriptions cannot be set from the
//     environment;
//  4. overrides, usually from flags: keys are paths like "listen" or
//     "admin.listen" (or nested maps), values strings or typed values.
//
// Unknown keys are errors in every source, durations must be strings with a
// unit ("10s"), and each subscription's zero fields get the subscription
// defaults. secret_env references are looked up in environ. With
// log.backend jetstream and no node_id, node_id is the host name, each "."
// replaced by "_". The result has passed Validate. Errors are *ValidationError, except that a missing
// or unreadable file and malformed YAML return an error naming the file (and
// the line).
func Load(path string, environ []string, overrides map[string]any) (*Config, error) {
	var ls []layer
	var subs *rawSubs

	if path != "" {
		b, err := file.Provider(path).ReadBytes()
		if err != nil {
			return nil, fmt.Errorf("config: read file: %w", err)
		}
		var m map[string]any
		if isJSONConfig(path) {
			m, err = parseJSONConfig(b)
		} else if m, err = yaml.Parser().Unmarshal(b); err != nil {
			err = errors.New(redactYAMLError(err))
		}
		if err != nil {
			return nil, fmt.Errorf("config: parse file %q: %w", path, err)
		}
		src := fmt.Sprintf("file %q", path)
		// Subscriptions bypass koanf's layers: only the file (or an
		// override) sets them, and koanf deep-copies a map on every merge
		// and read, which made 50,000 subscriptions take seconds to load.
		if raw, ok := m["subscriptions"]; ok {
			subs = &rawSubs{raw: raw, source: src}
			delete(m, "subscriptions")
		}
		k := koanf.New(".")
		if err := k.Load(confmap.Provider(m, ""), nil); err != nil {
			return nil, fmt.Errorf("config: load file %q: %w", path, err)
		}
		ls = append(ls, layer{k: k, source: func(string) string { return src }})
	}

	envLayer, err := loadEnv(environ)
	if err != nil {
		return nil, err
	}
	ls = append(ls, envLayer)

	if len(overrides) > 0 {
		clean := make(map[string]any, len(overrides))
		for key, v := range overrides {
			if v != nil { // an unset flag must not erase a lower layer
				clean[key] = v
			}
		}
		k := koanf.New(".")
		if err := k.Load(confmap.Provider(clean, "."), nil); err != nil {
			return nil, fmt.Errorf("config: load overrides: %w", err)
		}
		ls = append(ls, layer{k: k, source: func(string) string { return "flags" }})
	}

	// Check each source alone first so an unknown key or a badly typed value
	// is reported with the file or variable it came from.
	merged := koanf.New(".")
	for _, l := range ls {
		if err := l.check(); err != nil {
			return nil, err
		}
		if err := merged.Merge(l.k); err != nil {
			return nil, fmt.Errorf("config: merge: %w", err)
		}
	}

	cfg := Default()
	if err := decode(merged, cfg); err != nil {
		return nil, err
	}
	if subs != nil && !merged.Exists("subscriptions") {
		if err := subs.decode(cfg); err != nil {
			return nil, err
		}
	} else {
		subs = nil
		if len(cfg.Subscriptions) > 0 { // from the overrides
			markSource(cfg.Subscriptions, merged.Get("subscriptions"))
		}
	}
	markTenants(cfg.Tenants, merged.Get("tenants"))
	cfg.applyDefaults()
	cfg.lookupEnv = envLookup(environ)
	cfg.IgnoredEnv = envLayer.ignored
	cfg.jetstreamKeys = keysUnder(merged, "jetstream")
	if cfg.Log.Backend == BackendJetStream && cfg.NodeID == "" {
		id, err := hostNodeID()
		if err != nil {
			return nil, &ValidationError{Field: "node_id", Err: err}
		}
		cfg.NodeID = id
	}

	if err := cfg.Validate(); err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) && ve.Source == "" {
			ve.Source = sourceOf(ls, ve.Field)
			if subs != nil && koanfKey(ve.Field) == "subscriptions" {
				ve.Source = subs.source
			}
		}
		return nil, err
	}
	return cfg, nil
}

// keysUnder lists the keys the merged sources set under section, sorted;
// the section itself when it is set but holds no key (jetstream: {}).
func keysUnder(k *koanf.Koanf, section string) []string {
	if !k.Exists(section) {
		return nil
	}
	var keys []string
	for _, key := range k.Keys() {
		if strings.HasPrefix(key, section+".") {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return []string{section}
	}
	slices.Sort(keys)
	return keys
}

// rawSubs is the file's subscriptions list as YAML parsed it.
type rawSubs struct {
	raw    any
	source string
}

// decode checks the list for unknown keys and decodes it into cfg, both
// straight from the parsed YAML, without copies. A long list is decoded in
// chunks on every core, each into its part of the one result; on any
// error the whole list is decoded again in one piece, so the message
// names the right index.
func (r *rawSubs) decode(cfg *Config) error {
	list, ok := r.raw.([]any)
	if n := runtime.GOMAXPROCS(0); ok && n > 1 && len(list) >= 4096 {
		out := make([]SubscriptionConfig, len(list))
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			lo, hi := len(list)*i/n, len(list)*(i+1)/n
			wg.Go(func() { errs[i] = decodeSubsInto(out[lo:hi], list[lo:hi], r.source) })
		}
		wg.Wait()
		if errors.Join(errs...) == nil {
			cfg.Subscriptions = out
			return nil
		}
	}
	subs, err := decodeSubs(r.raw, r.source)
	if err != nil {
		return err
	}
	cfg.Subscriptions = subs
	return nil
}

// decodeSubs decodes the parsed list raw: each subscription by
// decodeSubFast where it can, the others by mapstructure. Errors come from
// decoding the whole list again with mapstructure alone, so that they are
// the ones it always gave (the first unknown key in list order, then the
// first bad value by field path) whichever subscriptions the fast path
// took.
func decodeSubs(raw any, source string) ([]SubscriptionConfig, error) {
	list, ok := raw.([]any)
	if !ok {
		out, err := decodeSubsSlow(raw, source)
		if err != nil {
			return nil, err
		}
		markSource(out, raw)
		return out, nil
	}
	out := make([]SubscriptionConfig, len(list))
	if err := decodeSubsInto(out, list, source); err != nil {
		// The same error as the list gives, with its index there.
		if _, whole := decodeSubsSlow(list, source); whole != nil {
			err = whole
		}
		return nil, err
	}
	return out, nil
}

// decodeSubsInto is decodeSubs of list into out, of the same length and
// zero, except that an error is only a sign: its index is within the
// subscriptions the fast path left, and decodeSubs words it again.
func decodeSubsInto(out []SubscriptionConfig, list []any, source string) error {
	var slow []int
	for i, e := range list {
		if !decodeSubFast(e, &out[i]) {
			out[i] = SubscriptionConfig{}
			slow = append(slow, i)
		}
	}
	if len(slow) > 0 {
		rest := make([]any, len(slow))
		for j, i := range slow {
			rest[j] = list[i]
		}
		dec, err := decodeSubsSlow(rest, source)
		if err != nil {
			return err
		}
		for j, i := range slow {
			out[i] = dec[j]
		}
	}
	markSource(out, list)
	return nil
}

// decodeSubsSlow is decodeSubs by mapstructure alone, without markSource:
// decodeSubsInto marks the whole list once, the ones mapstructure decoded
// among the others.
func decodeSubsSlow(raw any, source string) ([]SubscriptionConfig, error) {
	in := map[string]any{"subscriptions": raw}
	if key := unknownKey("", in, reflect.TypeFor[Config]()); key != "" {
		return nil, &ValidationError{Field: key, Err: ErrUnknownKey, Source: source}
	}
	var out struct {
		Subscriptions []SubscriptionConfig `koanf:"subscriptions"`
	}
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		DecodeHook:  mapstructure.DecodeHookFuncType(decodeHook),
		ErrorUnused: true,
		TagName:     "koanf",
		MatchName:   func(key, field string) bool { return key == field },
		Result:      &out,
	})
	if err != nil {
		return nil, err
	}
	if err := dec.Decode(in); err != nil {
		err = translateDecodeError(err)
		var ve *ValidationError
		if errors.As(err, &ve) {
			ve.Source = source
		}
		return nil, err
	}
	return out.Subscriptions, nil
}

// layer is one configuration source and a way to name where a key came from.
type layer struct {
	k       *koanf.Koanf
	source  func(key string) string
	ignored []string // environment variables that name no key
}

// check reports the first unknown key of the layer, then the first value
// that does not decode into Config.
func (l layer) check() error {
	if key := unknownKey("", l.k.Raw(), reflect.TypeFor[Config]()); key != "" {
		return &ValidationError{Field: key, Err: ErrUnknownKey, Source: l.source(koanfKey(key))}
	}
	if err := decode(l.k, Default()); err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) {
			ve.Source = l.source(koanfKey(ve.Field))
		}
		return err
	}
	return nil
}

// sourceOf names the highest layer that sets field, or "" for defaults.
func sourceOf(ls []layer, field string) string {
	key := koanfKey(field)
	for i := len(ls) - 1; i >= 0; i-- {
		if key != "" && ls[i].k.Exists(key) {
			return ls[i].source(key)
		}
	}
	return ""
}

// koanfKey turns a field path into the koanf key that holds it: list
// elements and map entries belong to the key of their list or map.
func koanfKey(field string) string {
	if i := strings.IndexByte(field, '['); i >= 0 {
		return field[:i]
	}
	return field
}

// loadEnv reads the SLUICE_* variables of environ into a layer.
func loadEnv(environ []string) (layer, error) {
	names := map[string]string{} // koanf key → variable name
	var bad []*ValidationError
	var ignored []string
	transform := func(name, value string) (string, any) {
		rest := strings.TrimPrefix(name, envPrefix)
		if rest == "" {
			return "", nil
		}
		parts := strings.Split(strings.ToLower(rest), "__")
		for _, p := range parts {
			if p == "" || strings.Contains(p, ".") {
				bad = append(bad, &ValidationError{
					Field:  strings.ToLower(rest),
					Err:    invalidf("cannot be mapped to a key: use letters, digits, _ and __ for nesting"),
					Source: "environment variable " + name,
				})
				return "", nil
			}
		}
		key := strings.Join(parts, ".")
		if k := fileOnlyKey(key); k != "" {
			bad = append(bad, &ValidationError{
				Field:  k,
				Err:    invalidf("cannot be set from the environment; use the config file"),
				Source: "environment variable " + name,
			})
			return "", nil
		}
		if name == EnvFile {
			return "", nil // names the file itself, read by main
		}
		if !envKeys[key] {
			ignored = append(ignored, name)
			return "", nil
		}
		names[key] = name
		if envListKeys[key] {
			return key, splitList(value)
		}
		return key, value
	}

	k := koanf.New(".")
	err := k.Load(env.Provider(".", env.Opt{
		Prefix:        envPrefix,
		TransformFunc: transform,
		EnvironFunc:   func() []string { return environ },
	}), nil)
	if err != nil {
		return layer{}, fmt.Errorf("config: read environment: %w", err)
	}
	if len(bad) > 0 {
		sort.Slice(bad, func(i, j int) bool { return bad[i].Source < bad[j].Source })
		return layer{}, bad[0]
	}
	sort.Strings(ignored)
	return layer{k: k, ignored: ignored, source: func(key string) string {
		for k := key; k != ""; {
			if n, ok := names[k]; ok {
				return "environment variable " + n
			}
			// A variable may set a parent ("admin") of the reported key.
			i := strings.LastIndexByte(k, '.')
			if i < 0 {
				break
			}
			k = k[:i]
		}
		// Or a child: SLUICE_ADMIN__LISTEN for a problem reported at "admin".
		for k, n := range names {
			if strings.HasPrefix(k, key+".") {
				return "environment variable " + n
			}
		}
		return "the environment"
	}}, nil
}

// splitList turns a variable's comma-separated value into list items,
// each trimmed: "" is the empty list, and an empty item stays for
// Validate to name ("a,,b").
func splitList(v string) []any {
	if strings.TrimSpace(v) == "" {
		return []any{}
	}
	parts := strings.Split(v, ",")
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = strings.TrimSpace(p)
	}
	return out
}

// envLookup returns a lookup over environ; the last definition wins, as in
// os/exec.
func envLookup(environ []string) func(string) (string, bool) {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}
