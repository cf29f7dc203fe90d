package proxy

// The event's ordering key and trace context at ingest: what
// reaches the stored event, what is refused, what is ignored. The ledger
// does not show them and deliveries do not send them yet, so the tests
// read the event back from the store.

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/queue"
)

// W3C Trace Context's own example.
const (
	exampleTraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	exampleTraceState  = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
)

// postHeaders posts an event with the given headers (each value its own
// header line) and returns the status, the error message of a JSON error,
// and the seq of an accepted event.
func postHeaders(t *testing.T, s *Server, h map[string][]string) (status int, msg string, seq uint64) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/t", strings.NewReader(`{}`))
	for k, vs := range h {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r struct {
		Seq   uint64 `json:"seq"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("answer %d is not JSON: %q", resp.StatusCode, b)
	}
	return resp.StatusCode, r.Error, r.Seq
}

func storedEvent(t *testing.T, s *Server, seq uint64) *queue.Event {
	t.Helper()
	ev, err := s.q.Event(seq)
	if err != nil {
		t.Fatalf("event %d: %v", seq, err)
	}
	return ev
}

// TestIngestKeepsOrderingKeyAndTraceContext: the Ordering-Key,
// traceparent and tracestate headers reach the stored event as sent; an
// invalid traceparent is ignored (the event is accepted, with no trace
// context, and its tracestate dropped too), as is a tracestate that is too
// long or not printable.
func TestIngestKeepsOrderingKeyAndTraceContext(t *testing.T) {
	s := openTestServer(t, Options{}, nil)
	long := strings.Repeat("k", 256)
	state512 := "a=" + strings.Repeat("b", 510)
	for _, c := range []struct {
		name               string
		h                  map[string][]string
		key, parent, state string
	}{
		{"none", nil, "", "", ""},
		{"key", map[string][]string{"Ordering-Key": {"vehicle-17"}}, "vehicle-17", "", ""},
		{"key of printable ASCII", map[string][]string{"Ordering-Key": {`tenant 7/"v 1"~!`}}, `tenant 7/"v 1"~!`, "", ""},
		{"key of 256 bytes", map[string][]string{"Ordering-Key": {long}}, long, "", ""},
		{"empty key is none", map[string][]string{"Ordering-Key": {""}}, "", "", ""},
		{"traceparent", map[string][]string{"traceparent": {exampleTraceParent}}, "", exampleTraceParent, ""},
		{"trace context", map[string][]string{"Traceparent": {exampleTraceParent}, "Tracestate": {exampleTraceState}}, "", exampleTraceParent, exampleTraceState},
		{"all three", map[string][]string{"Ordering-Key": {"k"}, "traceparent": {exampleTraceParent}, "tracestate": {"rojo=1"}}, "k", exampleTraceParent, "rojo=1"},
		{"tracestate headers joined", map[string][]string{"traceparent": {exampleTraceParent}, "tracestate": {"congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7"}}, "", exampleTraceParent, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"},
		{"tracestate of 512 bytes", map[string][]string{"traceparent": {exampleTraceParent}, "tracestate": {state512}}, "", exampleTraceParent, state512},
		{"tracestate over 512 bytes dropped", map[string][]string{"traceparent": {exampleTraceParent}, "tracestate": {state512 + "c"}}, "", exampleTraceParent, ""},
		{"tracestate not ASCII dropped", map[string][]string{"traceparent": {exampleTraceParent}, "tracestate": {"a=\xc3\xa9"}}, "", exampleTraceParent, ""},
		{"tracestate without traceparent dropped", map[string][]string{"tracestate": {exampleTraceState}}, "", "", ""},
		{"invalid traceparent ignored with its tracestate", map[string][]string{"Ordering-Key": {"k"}, "traceparent": {"00-00000000000000000000000000000000-b7ad6b7169203331-01"}, "tracestate": {exampleTraceState}}, "k", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, msg, seq := postHeaders(t, s, c.h)
			if status != http.StatusAccepted {
				t.Fatalf("status %d (%s); want 202", status, msg)
			}
			ev := storedEvent(t, s, seq)
			if ev.OrderingKey != c.key || ev.TraceParent != c.parent || ev.TraceState != c.state {
				t.Fatalf("stored key %q traceparent %q tracestate %q; want %q %q %q", ev.OrderingKey, ev.TraceParent, ev.TraceState, c.key, c.parent, c.state)
			}
		})
	}
}

// TestIngestOrderingKeyRefused: a key too long, or with a control
// character or a byte past ASCII, is answered 400 with a JSON error
// naming the header, and nothing is stored.
func TestIngestOrderingKeyRefused(t *testing.T) {
	s := openTestServer(t, Options{}, nil)
	for name, key := range map[string]string{
		"257 bytes":  strings.Repeat("k", 257),
		"tab":        "a\tb",
		"past ASCII": "v\xc3\xa9hicle",
	} {
		t.Run(name, func(t *testing.T) {
			status, msg, _ := postHeaders(t, s, map[string][]string{"Ordering-Key": {key}})
			if status != http.StatusBadRequest || !strings.Contains(msg, "Ordering-Key") {
				t.Fatalf("status %d %q; want 400 naming Ordering-Key", status, msg)
			}
		})
	}
	if h := s.q.Head(); h != 0 {
		t.Fatalf("head %d after refused requests; want 0", h)
	}
}

// TestIngestInvalidTraceParentIgnored: each malformed traceparent is
// ignored, not refused.
func TestIngestInvalidTraceParentIgnored(t *testing.T) {
	s := openTestServer(t, Options{}, nil)
	for _, tp := range []string{
		"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",   // parent id all zero
		"00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",   // upper case
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",    // short
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x", // version 00 is 55 bytes
		"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",   // a version this sidecar does not know
		"00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",   // separators
		"00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",   // not hex
		"garbage",
	} {
		status, msg, seq := postHeaders(t, s, map[string][]string{"traceparent": {tp}, "tracestate": {"rojo=1"}})
		if status != http.StatusAccepted {
			t.Fatalf("traceparent %q: status %d (%s); want 202", tp, status, msg)
		}
		if ev := storedEvent(t, s, seq); ev.TraceParent != "" || ev.TraceState != "" {
			t.Fatalf("traceparent %q kept as %q / %q; want ignored", tp, ev.TraceParent, ev.TraceState)
		}
	}
}

// TestIngestEventContextReachesDeadLetter: a dead letter keeps the event's
// ordering key and trace context (a replay must carry the trace context).
func TestIngestEventContextReachesDeadLetter(t *testing.T) {
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadRequest) }))
	t.Cleanup(rcv.Close)
	s := openTestServer(t, Options{Subscriptions: []*delivery.Subscription{{ID: "a", URL: rcv.URL}}}, nil)
	status, msg, seq := postHeaders(t, s, map[string][]string{"Ordering-Key": {"vehicle-17"}, "traceparent": {exampleTraceParent}, "tracestate": {exampleTraceState}})
	if status != http.StatusAccepted {
		t.Fatalf("status %d (%s)", status, msg)
	}
	testwait.Await(t, "the dead letter written", func() bool { return s.Lanes()[0].DeadLettered == 1 })
	d, err := s.q.DeadLetter("a", seq)
	if err != nil {
		t.Fatal(err)
	}
	if d.OrderingKey != "vehicle-17" || d.TraceParent != exampleTraceParent || d.TraceState != exampleTraceState {
		t.Fatalf("dead letter keeps key %q traceparent %q tracestate %q", d.OrderingKey, d.TraceParent, d.TraceState)
	}
}
