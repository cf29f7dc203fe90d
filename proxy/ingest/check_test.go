package ingest

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

// FuzzCheckName: the ingest validation of event types and ids never
// panics, and what it accepts is plain ASCII of the documented charset.
func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"geofence.enter", "", ".x", "a b", "évènement", "k/1+2=3@x", string(make([]byte, 300))} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, punct := range []string{typeChars, idChars} {
			if checkName([]byte(s), maxIDLen, punct) != "" {
				continue
			}
			if len(s) == 0 || len(s) > maxIDLen || !utf8.ValidString(s) {
				t.Fatalf("accepted %q", s)
			}
			for _, c := range []byte(s) {
				if c >= 0x80 || c <= ' ' {
					t.Fatalf("accepted %q with byte %#x", s, c)
				}
			}
		}
	})
}

// TestIngestEventContextAllocations: reading the three headers allocates
// nothing when they are absent (the hot path), nor for a key and a valid
// traceparent and tracestate, which alias the request (the event's
// strings are the one copy).
func TestIngestEventContextAllocations(t *testing.T) {
	var none, full fasthttp.RequestHeader
	none.Set("Content-Type", "application/json")
	none.Set("Idempotency-Key", "e-1")
	full.Set("Ordering-Key", "vehicle-17")
	full.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	full.Set("tracestate", "congo=t61rcWkgMzE")
	for name, h := range map[string]*fasthttp.RequestHeader{"absent": &none, "present": &full} {
		var sink int
		n := testing.AllocsPerRun(1000, func() {
			key := h.Peek("Ordering-Key")
			if checkOrderingKey(key) != "" {
				t.Fatal("key refused")
			}
			p, st := traceContext(h)
			sink += len(key) + len(p) + len(st)
		})
		if n != 0 {
			t.Errorf("%s: %.1f allocations per request; want 0", name, n)
		}
		if name == "present" && sink == 0 {
			t.Fatal("headers not read")
		}
	}
}

// TestIngestCheckOrderingKey: the key's rules, including bytes an HTTP
// client will not send.
func TestIngestCheckOrderingKey(t *testing.T) {
	for key, ok := range map[string]bool{
		"":                       true, // none
		"k":                      true,
		" ~":                     true,
		strings.Repeat("k", 256): true,
		strings.Repeat("k", 257): false,
		"a\x00b":                 false,
		"a\x01b":                 false,
		"a\x1fb":                 false,
		"a\x7fb":                 false,
		"a\x80b":                 false,
		"a\tb":                   false,
	} {
		if got := checkOrderingKey([]byte(key)) == ""; got != ok {
			t.Errorf("checkOrderingKey(%q) ok = %v; want %v", key, got, ok)
		}
	}
}
