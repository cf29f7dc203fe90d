package policy_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

func TestOutcomeString(t *testing.T) {
	tests := []struct {
		name string
		o    policy.Outcome
		want string
	}{
		{"ack", policy.Ack, "ack"},
		{"retry", policy.Retry, "retry"},
		{"dead letter", policy.DeadLetter, "dead_letter"},
		{"zero", 0, "Outcome(0)"},
		{"out of range", 42, "Outcome(42)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.o.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestParseOutcome(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    policy.Outcome
		wantErr bool
	}{
		{"ack", "ack", policy.Ack, false},
		{"retry", "retry", policy.Retry, false},
		{"dead letter", "dead_letter", policy.DeadLetter, false},
		{"empty", "", 0, true},
		{"upper case", "ACK", 0, true},
		{"mixed case", "Retry", 0, true},
		{"leading space", " ack", 0, true},
		{"trailing space", "ack ", 0, true},
		{"hyphen", "dead-letter", 0, true},
		{"no separator", "deadletter", 0, true},
		{"string of zero", "Outcome(0)", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := policy.ParseOutcome(tt.in)
			if tt.wantErr {
				if !errors.Is(err, policy.ErrUnknownOutcome) {
					t.Fatalf("ParseOutcome(%q) error = %v, want ErrUnknownOutcome", tt.in, err)
				}
				if q := `"` + tt.in + `"`; !strings.Contains(err.Error(), q) {
					t.Errorf("error %q does not name the value %s", err, q)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseOutcome(%q) = %v, %v; want %v, nil", tt.in, got, err, tt.want)
			}
			if got.String() != tt.in {
				t.Errorf("round trip: %q → %v → %q", tt.in, got, got.String())
			}
		})
	}
}

func TestClassify(t *testing.T) {
	errRefused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	overrides := map[int]policy.Outcome{
		409: policy.Ack,
		404: policy.Retry,
		500: policy.DeadLetter,
		200: policy.DeadLetter,
		302: policy.Retry,
		418: 0,  // invalid outcome: ignored
		451: 99, // invalid outcome: ignored
	}
	tests := []struct {
		name      string
		status    int
		err       error
		overrides map[int]policy.Outcome
		want      policy.Outcome
	}{
		// 2xx: the endpoint has it.
		{"200 ok", 200, nil, nil, policy.Ack},
		{"201 created", 201, nil, nil, policy.Ack},
		{"202 accepted", 202, nil, nil, policy.Ack},
		{"204 no content", 204, nil, nil, policy.Ack},
		{"299 highest 2xx", 299, nil, nil, policy.Ack},

		// 1xx as a final answer: protocol glitch, may pass.
		{"100 continue", 100, nil, nil, policy.Retry},
		{"101 switching protocols", 101, nil, nil, policy.Retry},
		{"199 highest 1xx", 199, nil, nil, policy.Retry},

		// 3xx: redirects are not followed and will not fix themselves.
		{"300 multiple choices", 300, nil, nil, policy.DeadLetter},
		{"301 moved permanently", 301, nil, nil, policy.DeadLetter},
		{"302 found", 302, nil, nil, policy.DeadLetter},
		{"304 not modified", 304, nil, nil, policy.DeadLetter},
		{"307 temporary redirect", 307, nil, nil, policy.DeadLetter},
		{"308 permanent redirect", 308, nil, nil, policy.DeadLetter},
		{"399 highest 3xx", 399, nil, nil, policy.DeadLetter},

		// 4xx: rejected, except the two that mean "later".
		{"400 bad request", 400, nil, nil, policy.DeadLetter},
		{"401 unauthorized", 401, nil, nil, policy.DeadLetter},
		{"403 forbidden", 403, nil, nil, policy.DeadLetter},
		{"404 not found", 404, nil, nil, policy.DeadLetter},
		{"405 method not allowed", 405, nil, nil, policy.DeadLetter},
		{"407 proxy auth required", 407, nil, nil, policy.DeadLetter},
		{"408 request timeout", 408, nil, nil, policy.Retry},
		{"409 conflict", 409, nil, nil, policy.DeadLetter},
		{"410 gone", 410, nil, nil, policy.DeadLetter},
		{"413 content too large", 413, nil, nil, policy.DeadLetter},
		{"422 unprocessable", 422, nil, nil, policy.DeadLetter},
		{"429 too many requests", 429, nil, nil, policy.Retry},
		{"499 highest 4xx", 499, nil, nil, policy.DeadLetter},

		// 5xx: the endpoint is in trouble; try later.
		{"500 internal error", 500, nil, nil, policy.Retry},
		{"501 not implemented", 501, nil, nil, policy.Retry},
		{"502 bad gateway", 502, nil, nil, policy.Retry},
		{"503 unavailable", 503, nil, nil, policy.Retry},
		{"504 gateway timeout", 504, nil, nil, policy.Retry},
		{"599 highest 5xx", 599, nil, nil, policy.Retry},

		// No valid status.
		{"0 without error", 0, nil, nil, policy.Retry},
		{"negative", -1, nil, nil, policy.Retry},
		{"99 below range", 99, nil, nil, policy.Retry},
		{"600 above range", 600, nil, nil, policy.Retry},
		{"999 above range", 999, nil, nil, policy.Retry},

		// Transport errors win over any status and any override.
		{"connection refused", 0, errRefused, nil, policy.Retry},
		{"timeout", 0, context.DeadlineExceeded, nil, policy.Retry},
		{"error after 200", 200, errRefused, nil, policy.Retry},
		{"error after 404", 404, errRefused, nil, policy.Retry},
		{"error ignores override", 409, errRefused, overrides, policy.Retry},

		// Overrides win over the defaults for their exact code only.
		{"override 409 ack", 409, nil, overrides, policy.Ack},
		{"override 404 retry", 404, nil, overrides, policy.Retry},
		{"override 500 dead letter", 500, nil, overrides, policy.DeadLetter},
		{"override 200 dead letter", 200, nil, overrides, policy.DeadLetter},
		{"override 302 retry", 302, nil, overrides, policy.Retry},
		{"no override for 400", 400, nil, overrides, policy.DeadLetter},
		{"no override for 503", 503, nil, overrides, policy.Retry},
		{"no override for 201", 201, nil, overrides, policy.Ack},
		{"invalid override zero ignored", 418, nil, overrides, policy.DeadLetter},
		{"invalid override 99 ignored", 451, nil, overrides, policy.DeadLetter},
		{"empty overrides", 409, nil, map[int]policy.Outcome{}, policy.DeadLetter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := policy.Classify(tt.status, tt.err, tt.overrides); got != tt.want {
				t.Errorf("Classify(%d, %v, overrides) = %v, want %v", tt.status, tt.err, got, tt.want)
			}
		})
	}
}

func TestParseClassify(t *testing.T) {
	tests := []struct {
		name    string
		in      map[string]string
		want    map[int]policy.Outcome
		wantErr error
		errHas  []string // substrings the error must contain
	}{
		{
			name: "design example",
			in:   map[string]string{"409": "ack", "404": "dead_letter"},
			want: map[int]policy.Outcome{409: policy.Ack, 404: policy.DeadLetter},
		},
		{
			name: "every outcome and range edges",
			in:   map[string]string{"100": "retry", "301": "retry", "503": "ack", "599": "dead_letter"},
			want: map[int]policy.Outcome{100: policy.Retry, 301: policy.Retry, 503: policy.Ack, 599: policy.DeadLetter},
		},
		{name: "nil", in: nil, want: nil},
		{name: "empty", in: map[string]string{}, want: nil},

		{name: "class range", in: map[string]string{"4xx": "retry"}, wantErr: policy.ErrInvalidStatus, errHas: []string{`"4xx"`}},
		{name: "below range", in: map[string]string{"099": "ack"}, wantErr: policy.ErrInvalidStatus, errHas: []string{`"099"`}},
		{name: "above range", in: map[string]string{"600": "ack"}, wantErr: policy.ErrInvalidStatus, errHas: []string{`"600"`}},
		{name: "two digits", in: map[string]string{"40": "ack"}, wantErr: policy.ErrInvalidStatus, errHas: []string{`"40"`}},
		{name: "four digits", in: map[string]string{"4040": "ack"}, wantErr: policy.ErrInvalidStatus, errHas: []string{`"4040"`}},
		{name: "leading zero", in: map[string]string{"0404": "ack"}, wantErr: policy.ErrInvalidStatus, errHas: []string{`"0404"`}},
		{name: "plus sign", in: map[string]string{"+40": "ack"}, wantErr: policy.ErrInvalidStatus, errHas: []string{`"+40"`}},
		{name: "space", in: map[string]string{" 404": "ack"}, wantErr: policy.ErrInvalidStatus, errHas: []string{`" 404"`}},
		{name: "exponent", in: map[string]string{"1e2": "ack"}, wantErr: policy.ErrInvalidStatus, errHas: []string{`"1e2"`}},
		{name: "empty key", in: map[string]string{"": "ack"}, wantErr: policy.ErrInvalidStatus, errHas: []string{`""`}},
		{name: "word", in: map[string]string{"conflict": "ack"}, wantErr: policy.ErrInvalidStatus, errHas: []string{`"conflict"`}},

		{name: "unknown value", in: map[string]string{"404": "drop"}, wantErr: policy.ErrUnknownOutcome, errHas: []string{`"404"`, `"drop"`}},
		{name: "upper-case value", in: map[string]string{"409": "ACK"}, wantErr: policy.ErrUnknownOutcome, errHas: []string{`"409"`, `"ACK"`}},
		{name: "empty value", in: map[string]string{"409": ""}, wantErr: policy.ErrUnknownOutcome, errHas: []string{`"409"`, `""`}},
		{name: "one bad among good", in: map[string]string{"409": "ack", "410": "gone", "500": "retry"}, wantErr: policy.ErrUnknownOutcome, errHas: []string{`"410"`, `"gone"`}},
		{
			name:    "several bad: smallest key reported",
			in:      map[string]string{"5xx": "ack", "404": "nope", "2xx": "ack"},
			wantErr: policy.ErrInvalidStatus,
			errHas:  []string{`"2xx"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := policy.ParseClassify(tt.in)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("ParseClassify(%v) error = %v, want %v", tt.in, err, tt.wantErr)
				}
				for _, s := range tt.errHas {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %s", err, s)
					}
				}
				if got != nil {
					t.Errorf("ParseClassify(%v) returned %v with an error", tt.in, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseClassify(%v) error = %v", tt.in, err)
			}
			if len(got) != len(tt.want) || (got == nil) != (tt.want == nil) {
				t.Fatalf("ParseClassify(%v) = %v, want %v", tt.in, got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("ParseClassify(%v)[%d] = %v, want %v", tt.in, k, got[k], v)
				}
			}
		})
	}
}

// The reported entry must not depend on map iteration order.
func TestParseClassifyDeterministicError(t *testing.T) {
	in := map[string]string{"5xx": "ack", "404": "nope", "2xx": "ack", "x": "y", "300": "?"}
	_, first := policy.ParseClassify(in)
	for range 50 {
		if _, err := policy.ParseClassify(in); err == nil || err.Error() != first.Error() {
			t.Fatalf("error changed between calls: %v, then %v", first, err)
		}
	}
}

func TestClassifyAllocs(t *testing.T) {
	overrides := map[int]policy.Outcome{409: policy.Ack}
	err := errors.New("reset")
	allocs := testing.AllocsPerRun(100, func() {
		policy.Classify(503, nil, nil)
		policy.Classify(409, nil, overrides)
		policy.Classify(0, err, overrides)
	})
	if allocs != 0 {
		t.Errorf("Classify allocates %v times per run, want 0", allocs)
	}
}

func BenchmarkClassify(b *testing.B) {
	overrides := map[int]policy.Outcome{409: policy.Ack, 404: policy.DeadLetter}
	statuses := []int{200, 204, 404, 409, 429, 500, 503, 301}
	b.Run("defaults", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			policy.Classify(statuses[i%len(statuses)], nil, nil)
		}
	})
	b.Run("overrides", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			policy.Classify(statuses[i%len(statuses)], nil, overrides)
		}
	})
}
