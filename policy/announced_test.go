package policy

import (
	"net/http"
	"testing"
	"time"
)

func TestParseAnnounced(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		headers map[string]string
		ok      bool
		want    Announced
	}{
		{"structured, one member", map[string]string{"RateLimit": `"default";r=0;t=30`}, true, Announced{0, 30 * time.Second, "RateLimit"}},
		{"structured, the most restrictive member", map[string]string{"RateLimit": `"burst";r=5;t=1, "day";r=0;t=3600, "hour";r=0;t=60`}, true, Announced{0, time.Hour, "RateLimit"}},
		{"structured, token name", map[string]string{"RateLimit": `default;r=12;t=5`}, true, Announced{12, 5 * time.Second, "RateLimit"}},
		{"earlier draft's dictionary", map[string]string{"RateLimit": `limit=100, remaining=0, reset=30`}, true, Announced{0, 30 * time.Second, "RateLimit"}},
		{"separate fields", map[string]string{"RateLimit-Remaining": "0", "RateLimit-Reset": "7"}, true, Announced{0, 7 * time.Second, "RateLimit-Remaining"}},
		{"X- with seconds", map[string]string{"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "20"}, true, Announced{3, 20 * time.Second, "X-RateLimit-Remaining"}},
		{"X- with a Unix time", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1796472045"}, true, Announced{0, time.Unix(1796472045, 0).Sub(now), "X-RateLimit-Remaining"}},
		{"X- with a Unix time against the response's Date", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1796472045",
			"Date": time.Unix(1796472045-90, 0).UTC().Format(http.TimeFormat)}, true, Announced{0, 90 * time.Second, "X-RateLimit-Remaining"}},
		{"X- with a Unix time past", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1000000000"}, true, Announced{0, 0, "X-RateLimit-Remaining"}},
		{"structured wins over X-", map[string]string{"RateLimit": `"a";r=1;t=2`, "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60"}, true, Announced{1, 2 * time.Second, "RateLimit"}},
		{"bad structured falls back", map[string]string{"RateLimit": `"a";r=x;t=2`, "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60"}, true, Announced{0, time.Minute, "X-RateLimit-Remaining"}},
		{"remaining without reset", map[string]string{"X-RateLimit-Remaining": "0"}, false, Announced{}},
		{"negative", map[string]string{"X-RateLimit-Remaining": "-1", "X-RateLimit-Reset": "5"}, false, Announced{}},
		{"fraction", map[string]string{"RateLimit-Remaining": "0", "RateLimit-Reset": "1.5"}, false, Announced{}},
		{"nothing", map[string]string{}, false, Announced{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := ParseAnnounced(func(k string) string { return c.headers[k] }, now)
			if ok != c.ok || got != c.want {
				t.Errorf("got %+v, %v; want %+v, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

// FuzzParseAnnounced: whatever the fields say, no panic, and what is
// returned is a count and a wait that can be used as they are.
func FuzzParseAnnounced(f *testing.F) {
	f.Add(`"default";r=0;t=30`, "0", "1796472045", "Sat, 05 Dec 2026 12:00:00 GMT")
	f.Add(`limit=100, remaining=0, reset=30`, "", "", "")
	f.Add(`a;r=99999999999999999999;t=99999999999999999999`, "1", "99999999999999999999", "")
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, structured, remaining, reset, date string) {
		h := map[string]string{"RateLimit": structured, "X-RateLimit-Remaining": remaining, "X-RateLimit-Reset": reset, "Date": date}
		a, ok := ParseAnnounced(func(k string) string { return h[k] }, now)
		if ok && (a.Remaining < 0 || a.Reset < 0 || a.Source == "") {
			t.Fatalf("%+v from %q", a, h)
		}
	})
}
