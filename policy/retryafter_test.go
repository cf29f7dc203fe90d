package policy_test

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

func TestParseRetryAfter(t *testing.T) {
	// Sunday, 1 March 2026, 12:00:00 UTC.
	now := time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		in     string
		now    time.Time // zero means now
		want   time.Duration
		wantOK bool
	}{
		// delay-seconds
		{name: "seconds", in: "120", want: 120 * time.Second, wantOK: true},
		{name: "one second", in: "1", want: time.Second, wantOK: true},
		{name: "zero", in: "0", want: 0, wantOK: true},
		{name: "leading zeros", in: "007", want: 7 * time.Second, wantOK: true},
		{name: "surrounding spaces and tabs", in: " \t120 \t", want: 120 * time.Second, wantOK: true},
		{name: "one day", in: "86400", want: 24 * time.Hour, wantOK: true},
		{name: "saturates", in: "99999999999999999999999", want: math.MaxInt64, wantOK: true},
		{name: "largest exact", in: "9223372036", want: 9223372036 * time.Second, wantOK: true},
		{name: "first saturating", in: "9223372037", want: math.MaxInt64, wantOK: true},

		// garbage
		{name: "empty", in: "", wantOK: false},
		{name: "only spaces", in: "   ", wantOK: false},
		{name: "negative", in: "-1", wantOK: false},
		{name: "negative zero", in: "-0", wantOK: false},
		{name: "plus sign", in: "+5", wantOK: false},
		{name: "fraction", in: "1.5", wantOK: false},
		{name: "unit suffix", in: "120s", wantOK: false},
		{name: "go duration", in: "2m", wantOK: false},
		{name: "inner space", in: "1 20", wantOK: false},
		{name: "word", in: "soon", wantOK: false},
		{name: "newline is not OWS", in: "120\n", wantOK: false},
		{name: "rfc 3339", in: "2026-03-01T12:05:00Z", wantOK: false},
		{name: "imf date not gmt", in: "Sun, 01 Mar 2026 12:05:00 PST", wantOK: false},
		{name: "imf date utc label", in: "Sun, 01 Mar 2026 12:05:00 UTC", wantOK: false},
		{name: "imf date missing seconds", in: "Sun, 01 Mar 2026 12:05 GMT", wantOK: false},
		{name: "rfc 850 not gmt", in: "Sunday, 01-Mar-26 12:05:00 PST", wantOK: false},
		{name: "impossible date", in: "Mon, 30 Feb 2026 12:00:00 GMT", wantOK: false},

		// IMF-fixdate
		{name: "imf future", in: "Sun, 01 Mar 2026 12:01:30 GMT", want: 90 * time.Second, wantOK: true},
		{name: "imf next day", in: "Mon, 02 Mar 2026 12:00:00 GMT", want: 24 * time.Hour, wantOK: true},
		{name: "imf now", in: "Sun, 01 Mar 2026 12:00:00 GMT", want: 0, wantOK: true},
		{name: "imf past", in: "Sun, 01 Mar 2026 11:00:00 GMT", want: 0, wantOK: true},
		{name: "imf long past", in: "Thu, 01 Jan 1970 00:00:00 GMT", want: 0, wantOK: true},
		{name: "imf with whitespace", in: "  Sun, 01 Mar 2026 12:01:30 GMT\t", want: 90 * time.Second, wantOK: true},
		{
			name: "imf, now has sub-second part", in: "Sun, 01 Mar 2026 12:01:30 GMT",
			now: now.Add(250 * time.Millisecond), want: 89*time.Second + 750*time.Millisecond, wantOK: true,
		},
		{
			name: "imf, now in another zone", in: "Sun, 01 Mar 2026 12:01:30 GMT",
			now: now.In(time.FixedZone("UTC+9", 9*3600)), want: 90 * time.Second, wantOK: true,
		},

		// obsolete forms
		{name: "rfc 850 future", in: "Sunday, 01-Mar-26 12:05:00 GMT", want: 5 * time.Minute, wantOK: true},
		{name: "rfc 850 past", in: "Saturday, 28-Feb-26 12:00:00 GMT", want: 0, wantOK: true},
		{name: "asctime future", in: "Sun Mar  1 12:02:00 2026", want: 2 * time.Minute, wantOK: true},
		{name: "asctime two-digit day", in: "Thu Mar 12 12:00:00 2026", want: 11 * 24 * time.Hour, wantOK: true},
		{name: "asctime past", in: "Sat Feb 28 12:00:00 2026", want: 0, wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := tt.now
			if n.IsZero() {
				n = now
			}
			got, ok := policy.ParseRetryAfter(tt.in, n)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// TestParseRetryAfterAtUsesTheResponseDate: an endpoint whose clock is an
// hour behind ours asks for two minutes as an HTTP-date; read against our
// clock the date is long past (no wait at all), read against its own Date
// header it is two minutes.
func TestParseRetryAfterAtUsesTheResponseDate(t *testing.T) {
	theirs := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	ours := theirs.Add(time.Hour)
	ra := theirs.Add(2 * time.Minute).Format(http.TimeFormat)
	if d, ok := policy.ParseRetryAfter(ra, ours); !ok || d != 0 {
		t.Fatalf("against our clock: %v %v (the skew cancels the wait)", d, ok)
	}
	cases := []struct {
		date string
		want time.Duration
	}{
		{theirs.Format(http.TimeFormat), 2 * time.Minute},
		{"", 0},          // no Date: our clock
		{"yesterday", 0}, // unparseable: our clock
		{theirs.Format("Monday, 02-Jan-06 15:04:05 GMT"), 2 * time.Minute}, // RFC 850
	}
	for _, c := range cases {
		if d, ok := policy.ParseRetryAfterAt(ra, ours, c.date); !ok || d != c.want {
			t.Errorf("Date %q: %v %v, want %v", c.date, d, ok, c.want)
		}
	}
	if d, ok := policy.ParseRetryAfterAt("30", ours, theirs.Format(http.TimeFormat)); !ok || d != 30*time.Second {
		t.Errorf("delay-seconds with a Date: %v %v, want 30s", d, ok)
	}
}
