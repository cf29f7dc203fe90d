// Package tracectx reads and writes W3C Trace Context's version-00
// traceparent: the ingest server checks the one a producer sends, and
// the ingest and attempt spans turn the stored one into their parent.
package tracectx

import (
	"encoding/hex"

	"go.opentelemetry.io/otel/trace"
)

// ParentLen is the length of a version-00 traceparent.
const ParentLen = 55

// AppendParent appends the version-00 traceparent of a span to dst:
// "00-" trace id "-" span id "-" flags, lowercase hex. It allocates
// nothing when dst has room for ParentLen more bytes.
func AppendParent(dst []byte, tid trace.TraceID, sid trace.SpanID, flags trace.TraceFlags) []byte {
	dst = append(dst, "00-"...)
	dst = hex.AppendEncode(dst, tid[:])
	dst = append(dst, '-')
	dst = hex.AppendEncode(dst, sid[:])
	dst = append(dst, '-')
	const digits = "0123456789abcdef"
	return append(dst, digits[flags>>4], digits[flags&0xf])
}

// Remote parses a stored or received version-00 traceparent
// (and its tracestate; an invalid one is dropped) into the remote span
// context that is the parent of sluice's spans.
func Remote(parent, state string) (trace.SpanContext, bool) {
	// The checks of ValidParent, on a string: unhex takes lowercase
	// hex only, and IsValid refuses all-zero ids.
	if len(parent) != ParentLen || parent[:3] != "00-" || parent[35] != '-' || parent[52] != '-' {
		return trace.SpanContext{}, false
	}
	cfg := trace.SpanContextConfig{Remote: true}
	var flags [1]byte
	if !unhex(cfg.TraceID[:], parent[3:35]) || !unhex(cfg.SpanID[:], parent[36:52]) || !unhex(flags[:], parent[53:55]) {
		return trace.SpanContext{}, false
	}
	cfg.TraceFlags = trace.TraceFlags(flags[0])
	if state != "" {
		if ts, err := trace.ParseTraceState(state); err == nil {
			cfg.TraceState = ts
		}
	}
	sc := trace.NewSpanContext(cfg)
	return sc, sc.IsValid()
}

// unhex decodes the hex string s into dst, which is len(s)/2 long.
func unhex(dst []byte, s string) bool {
	for i := range dst {
		hi, ok1 := fromHex(s[2*i])
		lo, ok2 := fromHex(s[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func fromHex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// ValidParent reports whether b is a traceparent of version 00:
// "00-" 32 lowercase hex (trace id, not all zero) "-" 16 lowercase hex
// (parent id, not all zero) "-" 2 lowercase hex (flags), 55 bytes. Other
// versions are treated as invalid (ignored), which the spec allows of a
// receiver that knows only version 00.
func ValidParent(b []byte) bool {
	if len(b) != 55 || b[0] != '0' || b[1] != '0' || b[2] != '-' || b[35] != '-' || b[52] != '-' {
		return false
	}
	return lowerHex(b[3:35]) && lowerHex(b[36:52]) && lowerHex(b[53:55]) &&
		!allZero(b[3:35]) && !allZero(b[36:52])
}

func lowerHex(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != '0' {
			return false
		}
	}
	return true
}
