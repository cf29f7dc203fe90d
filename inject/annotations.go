package inject

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The pod annotations (and, for AnnotationInject, the pod label) the
// injector reads. Every other option is AnnotationPrefix followed by the
// name of its flag, so one name is learnt for both; jetstream-urls is
// plural because an annotation, unlike the flag, cannot be repeated.
const (
	AnnotationPrefix   = "sluice.io/"
	AnnotationInject   = AnnotationPrefix + "inject"   // "true" or "false"
	AnnotationRequired = AnnotationPrefix + "required" // "true": bad input is refused rather than let through
)

// optionAnnotations are the annotations that override an option, by the
// suffix after AnnotationPrefix, each setting its field from the value.
var optionAnnotations = map[string]func(o *Options, v string) error{
	"image":          func(o *Options, v string) error { o.Image = v; return nil },
	"config-map":     func(o *Options, v string) error { o.ConfigMap = v; return nil },
	"pvc":            func(o *Options, v string) error { o.PVC = v; return nil },
	"secret":         func(o *Options, v string) error { o.Secret = v; return nil },
	"cpu-request":    func(o *Options, v string) error { o.CPURequest = v; return nil },
	"memory-request": func(o *Options, v string) error { o.MemoryRequest = v; return nil },
	"cpu-limit":      func(o *Options, v string) error { o.CPULimit = v; return nil },
	"memory-limit":   func(o *Options, v string) error { o.MemoryLimit = v; return nil },
	"grace": func(o *Options, v string) (err error) {
		if o.Grace, err = time.ParseDuration(v); err != nil {
			return errors.New("not a duration")
		}
		return nil
	},
	"ingest-port": func(o *Options, v string) (err error) { o.IngestPort, err = port(v); return err },
	"admin-port":  func(o *Options, v string) (err error) { o.AdminPort, err = port(v); return err },
	// An empty value turns fleet mode off for this pod when the
	// injector's --jetstream-url turned it on.
	"jetstream-urls": func(o *Options, v string) error {
		o.JetStreamURLs = nil
		if strings.TrimSpace(v) != "" {
			for _, u := range strings.Split(v, ",") {
				o.JetStreamURLs = append(o.JetStreamURLs, strings.TrimSpace(u))
			}
		}
		return nil
	},
}

func port(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, errors.New("not a port number")
	}
	return n, nil
}

// annotationOptions returns defaults overridden by a pod's sluice.io/
// annotations, checked. Each error names the annotation, and its value
// unless that may hold a password. An unknown sluice.io/ key is an error:
// it is most likely a typo, which would otherwise pass silently.
func annotationOptions(annotations map[string]string, defaults Options) (Options, error) {
	o := defaults
	o.JetStreamURLs = slices.Clone(defaults.JetStreamURLs)
	keys := make([]string, 0, len(annotations))
	for k := range annotations {
		if strings.HasPrefix(k, AnnotationPrefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys) // the first error is the same on every call
	for _, k := range keys {
		v := annotations[k]
		switch k {
		case AnnotationInject, AnnotationRequired:
			if v != "true" && v != "false" {
				return o, fmt.Errorf("annotation %s %s: not \"true\" or \"false\"", k, shortQuote(v))
			}
			continue
		}
		set, ok := optionAnnotations[strings.TrimPrefix(k, AnnotationPrefix)]
		if !ok {
			if near := nearest(k, knownAnnotations()); near != "" {
				return o, fmt.Errorf("unknown annotation %s (did you mean %s?)", shortQuote(k), near)
			}
			return o, fmt.Errorf("unknown annotation %s", shortQuote(k))
		}
		if err := set(&o, v); err != nil {
			return o, fmt.Errorf("annotation %s %s: %w", k, shortQuote(v), err)
		}
	}
	err := o.validate(func(key string) string {
		if key == "jetstream-url" {
			key = "jetstream-urls"
		}
		if _, ok := annotations[AnnotationPrefix+key]; ok {
			return "annotation " + AnnotationPrefix + key
		}
		// A check across two options can fail on a value the pod did
		// not set.
		if key == "jetstream-urls" {
			key = "jetstream-url"
		}
		return "the injector's --" + key
	})
	return o, err
}

// knownAnnotations lists the annotations the injector reads, sorted.
func knownAnnotations() []string {
	names := []string{AnnotationInject, AnnotationRequired}
	for k := range optionAnnotations {
		names = append(names, AnnotationPrefix+k)
	}
	slices.Sort(names)
	return names
}

// nearest returns the name in names closest to s, if it is close enough
// to be the one meant. The whole list would not fit a warning, which the
// API server may cut at 256 characters.
func nearest(s string, names []string) string {
	best, bestDist := "", 4 // more edits than this is not a typo
	for _, n := range names {
		if d := editDistance(s, n); d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	if len(a) > 128 || len(b) > 128 {
		return 1 << 30 // not a typo of a short name, and no quadratic work on long keys
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// shortQuote quotes v for a message, cut short: an annotation's value may
// be up to 256 KiB, and the message ends up in a warning and in events.
func shortQuote(v string) string {
	const max = 64
	if len(v) > max {
		cut := max
		for cut > 0 && !isRuneStart(v[cut]) {
			cut--
		}
		return strconv.Quote(v[:cut]) + "…"
	}
	return strconv.Quote(v)
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
