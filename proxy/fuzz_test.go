package proxy

import (
	"testing"
	"unicode/utf8"
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
