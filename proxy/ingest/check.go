package ingest

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/tracectx"
	"github.com/valyala/fasthttp"
)

// Characters allowed after the first (a letter or digit). Types are what
// subscriptions filter on, so they match the config's type names; ids may
// also carry the characters of common id formats (emails, base64, paths).
const (
	typeChars = "._:-"
	idChars   = "._:@/+=-"
)

// checkName validates an event type or id: 1..maxLen bytes, a letter or
// digit, then letters, digits and the given punctuation. It returns what is
// wrong, or "".
func checkName(b []byte, maxLen int, punct string) string {
	switch {
	case len(b) == 0:
		return "empty"
	case len(b) > maxLen:
		return "longer than " + strconv.Itoa(maxLen) + " bytes"
	case !isAlnum(b[0]):
		return "must start with a letter or digit"
	}
	for i, c := range b {
		if !isAlnum(c) && strings.IndexByte(punct, c) < 0 {
			return "character " + strconv.QuoteRuneToASCII(rune(c)) + " at " + strconv.Itoa(i) + " not allowed (use letters, digits and " + punct + ")"
		}
	}
	return ""
}

// checkOrderingKey validates an Ordering-Key: at most maxOrderingKeyLen
// bytes of printable ASCII (space through '~'; no control characters, no
// bytes past ASCII). It returns what is wrong, or "". An empty header
// counts as none (as an empty Idempotency-Key does): fasthttp does not
// tell the two apart.
func checkOrderingKey(b []byte) string {
	if len(b) > maxOrderingKeyLen {
		return "longer than " + strconv.Itoa(maxOrderingKeyLen) + " bytes"
	}
	if i := notPrintable(b); i >= 0 {
		return "character " + strconv.QuoteRuneToASCII(rune(b[i])) + " at " + strconv.Itoa(i) + " not allowed (printable ASCII only)"
	}
	return ""
}

// notPrintable returns the index of the first byte of b that is not
// printable ASCII (space through '~'), or -1.
func notPrintable(b []byte) int {
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			return i
		}
	}
	return -1
}

// traceContext returns the request's W3C trace context (traceparent and
// tracestate headers) to keep with the event, or nils.
//
// An invalid traceparent is ignored, never refused: W3C Trace Context
// tells a receiver that cannot parse it to carry on as if there were
// none (and start a new trace), and an event must not be lost over its
// tracing. tracestate is kept only with a valid traceparent (the
// spec: without one it must not be parsed), when printable ASCII of at
// most maxTraceStateLen bytes; several tracestate headers are joined with
// commas, as the spec combines them. The result aliases the request's
// headers (or is a fresh join): the caller copies it.
func traceContext(h *fasthttp.RequestHeader) (parent, state []byte) {
	parent = h.Peek("traceparent")
	if len(parent) == 0 {
		return nil, nil // the common case: nothing, no allocation
	}
	if !tracectx.ValidParent(parent) {
		return nil, nil
	}
	state = h.Peek("tracestate")
	if len(state) == 0 {
		return parent, nil
	}
	if all := h.PeekAll("tracestate"); len(all) > 1 {
		state = bytes.Join(all, []byte(","))
	}
	if len(state) > maxTraceStateLen || notPrintable(state) >= 0 {
		return parent, nil
	}
	return parent, state
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
