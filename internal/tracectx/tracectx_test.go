package tracectx

import "testing"

// W3C Trace Context's example ids.
const (
	testTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	testParentID    = "00f067aa0ba902b7"
	testTraceParent = "00-" + testTraceID + "-" + testParentID + "-01"
)

// dropped, not the traceparent.
func TestRemote(t *testing.T) {
	for _, tc := range []struct {
		name, parent, state string
		ok                  bool
		wantState           string
	}{
		{"valid", testTraceParent, "", true, ""},
		{"with tracestate", testTraceParent, "a=1,b=2", true, "a=1,b=2"},
		{"bad tracestate dropped", testTraceParent, "not a list member", true, ""},
		{"not sampled", "00-" + testTraceID + "-" + testParentID + "-00", "", true, ""},
		{"empty", "", "", false, ""},
		{"uppercase hex", "00-" + "4BF92F3577B34DA6A3CE929D0E0E4736" + "-" + testParentID + "-01", "", false, ""},
		{"zero trace id", "00-00000000000000000000000000000000-" + testParentID + "-01", "", false, ""},
		{"zero span id", "00-" + testTraceID + "-0000000000000000-01", "", false, ""},
		{"version ff", "ff" + testTraceParent[2:], "", false, ""},
		{"short", testTraceParent[:54], "", false, ""},
		{"bad separator", "00_" + testTraceParent[3:], "", false, ""},
	} {
		sc, ok := Remote(tc.parent, tc.state)
		if ok != tc.ok {
			t.Errorf("%s: ok %v, want %v", tc.name, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		if sc.TraceID().String() != testTraceID || sc.SpanID().String() != testParentID || !sc.IsRemote() {
			t.Errorf("%s: %v", tc.name, sc)
		}
		if got := sc.TraceState().String(); got != tc.wantState {
			t.Errorf("%s: tracestate %q, want %q", tc.name, got, tc.wantState)
		}
		if got := string(AppendParent(nil, sc.TraceID(), sc.SpanID(), sc.TraceFlags())); got != tc.parent {
			t.Errorf("%s: formats back as %q", tc.name, got)
		}
	}
}
