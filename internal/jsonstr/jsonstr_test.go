package jsonstr_test

import (
	"encoding/json"
	"testing"

	"github.com/sluicehq/sluice/internal/jsonstr"
)

// FuzzAppend: Append writes what encoding/json writes, after what dst
// held.
func FuzzAppend(f *testing.F) {
	for _, s := range []string{"", "geofence.enter", `a"b\c`, "<&>", "\x00\n\t", "é ✓", "\xff\xfe"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := jsonstr.Append([]byte("x"), s); string(got) != "x"+string(want) {
			t.Fatalf("Append(%q) = %s, want x%s", s, got, want)
		}
	})
}
