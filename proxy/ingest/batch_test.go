package ingest_test

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

type result struct {
	ID     string `json:"id"`
	Seq    uint64 `json:"seq"`
	Status string `json:"status"`
	Error  string `json:"error"`
}

type batchAnswer struct {
	Accepted   int      `json:"accepted"`
	Duplicates int      `json:"duplicates"`
	Refused    int      `json:"refused"`
	Results    []result `json:"results"`
	Error      string   `json:"error"`
	Line       int      `json:"line"`
	Index      *int     `json:"index"`
	Field      string   `json:"field"`
}

// postBatch posts body to POST /v1/events as ctype with the headers hdr
// (name, value pairs).
func postBatch(t *testing.T, url, ctype, body string, hdr ...string) (*http.Response, batchAnswer) {
	t.Helper()
	return postAs[batchAnswer](t, url+"/v1/events", body, append([]string{"Content-Type", ctype}, hdr...)...)
}

func ndjson(t *testing.T, url, body string, hdr ...string) (*http.Response, batchAnswer) {
	t.Helper()
	return postBatch(t, url, "application/x-ndjson", body, hdr...)
}

// lines is an NDJSON batch of n events with ids prefix-0..n-1.
func lines(prefix string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"type":"order.created","id":"%s-%d","body":{"n":%d}}`+"\n", prefix, i, i)
	}
	return b.String()
}

// TestBatchNDJSON: a batch's events are all in the log once it is
// answered 202, in order, with consecutive seqs (one commit), each with
// its own type, id, body as sent, content type (application/json for a
// body, application/octet-stream for body_base64, or the one given) and
// ordering key, and the request's tenant and trace context; the batchAnswer
// names each event's seq.
func TestBatchNDJSON(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{Sync: true})
	url := serve(t, ingest.Config{}, q)
	bin := []byte{0, 1, 2, 0xff}
	body := lines("ord", 97) +
		"\r\n   \n" + // blank lines are skipped
		`{"type":"order.paid","id":"pay-1","body_base64":"` + base64.StdEncoding.EncodeToString(bin) + `","ordering_key":"customer-7"}` + "\r\n" +
		`{ "id" : "note-1", "type" : "order.note", "content_type" : "text/plain; charset=utf-8", "body" : "hi \"there\"" }` + "\n" +
		`{"type":"order.raw","id":"raw\/1","body":[1, 2, {"x":null}],"content_type":"application/vnd.x+json"}`
	const traceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	resp, a := ndjson(t, url, body, ingest.HeaderTenant, "acme", "traceparent", traceParent)
	if resp.StatusCode != http.StatusAccepted || a.Accepted != 100 || a.Duplicates != 0 || a.Refused != 0 || len(a.Results) != 100 {
		t.Fatalf("batch of 100: %d %+v", resp.StatusCode, a)
	}
	for i, r := range a.Results {
		if r.Seq != uint64(i+1) || r.Status != "accepted" || r.Error != "" {
			t.Fatalf("result %d = %+v, want seq %d accepted", i, r, i+1)
		}
	}
	if h := q.Head(); h != 100 {
		t.Fatalf("head = %d, want 100", h)
	}
	for i := range 97 {
		ev, err := q.Event(uint64(i + 1))
		if err != nil || ev.ID != fmt.Sprintf("ord-%d", i) || ev.Type != "order.created" || string(ev.Body) != fmt.Sprintf(`{"n":%d}`, i) ||
			ev.ContentType != "application/json" || ev.Tenant != "acme" || ev.TraceParent != traceParent || ev.OrderingKey != "" {
			t.Fatalf("event %d = %+v, %v", i+1, ev, err)
		}
	}
	for seq, want := range map[uint64]*queue.Event{
		98:  {ID: "pay-1", Type: "order.paid", Body: bin, ContentType: "application/octet-stream", OrderingKey: "customer-7"},
		99:  {ID: "note-1", Type: "order.note", Body: []byte(`"hi \"there\""`), ContentType: "text/plain; charset=utf-8"},
		100: {ID: "raw/1", Type: "order.raw", Body: []byte(`[1, 2, {"x":null}]`), ContentType: "application/vnd.x+json"},
	} {
		ev, err := q.Event(seq)
		if err != nil || ev.ID != want.ID || ev.Type != want.Type || string(ev.Body) != string(want.Body) ||
			ev.ContentType != want.ContentType || ev.OrderingKey != want.OrderingKey || ev.Tenant != "acme" {
			t.Fatalf("event %d = %+v, %v; want %+v", seq, ev, err, want)
		}
	}
	if a.Results[99].ID != "raw/1" {
		t.Fatalf("result of an escaped id: %+v", a.Results[99])
	}
}

// TestBatchRetryIsDuplicate: a batch sent again (its batchAnswer lost to a
// timeout) stores nothing twice: 200 with every event a duplicate of its
// first seq; an id repeated within a batch is a duplicate of its first
// event; an id stored by a single post is a duplicate too.
func TestBatchRetryIsDuplicate(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{Sync: true})
	reg := prometheus.NewRegistry()
	url := serve(t, ingest.Config{Registry: reg}, q)
	single, err := http.Post(url+"/v1/events/order.created", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	single.Body.Close()
	body := lines("b", 10) + `{"type":"order.created","id":"b-3","body":{"again":true}}` + "\n"
	resp, a := ndjson(t, url, body)
	if resp.StatusCode != http.StatusAccepted || a.Accepted != 10 || a.Duplicates != 1 {
		t.Fatalf("first send: %d %+v", resp.StatusCode, a)
	}
	if r := a.Results[10]; r.Status != "duplicate" || r.Seq != a.Results[3].Seq {
		t.Fatalf("an id repeated within the batch: %+v, want a duplicate of seq %d", r, a.Results[3].Seq)
	}
	first := a.Results
	resp, a = ndjson(t, url, body)
	if resp.StatusCode != http.StatusOK || a.Accepted != 0 || a.Duplicates != 11 || a.Refused != 0 {
		t.Fatalf("the batch again: %d %+v, want 200 and 11 duplicates", resp.StatusCode, a)
	}
	for i, r := range a.Results {
		if r.Status != "duplicate" || r.Seq != first[i].Seq || r.ID != first[i].ID {
			t.Fatalf("the batch again, event %d: %+v, want a duplicate of %+v", i, r, first[i])
		}
	}
	if h := q.Head(); h != 11 {
		t.Fatalf("head = %d, want 11: the retried batch stored something", h)
	}
	ev, _ := q.Event(first[3].Seq)
	if string(ev.Body) != `{"n":3}` {
		t.Fatalf("a duplicate replaced the original body: %s", ev.Body)
	}
	// sluice_ingest_events_total counts events, not requests.
	for result, want := range map[string]float64{"accepted": 11, "duplicate": 12, "rejected": 0} {
		if got := ingested(t, reg, result); got != want {
			t.Errorf("sluice_ingest_events_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	if n := histogramCount(t, reg, "sluice_ingest_batch_events"); n != 2 {
		t.Errorf("sluice_ingest_batch_events counted %d batches, want 2", n)
	}
}

// ingested reads sluice_ingest_events_total{result}.
func ingested(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	for _, m := range metric(t, reg, "sluice_ingest_events_total") {
		if m.GetLabel()[0].GetValue() == result {
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no sluice_ingest_events_total{result=%q}", result)
	return 0
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	return metric(t, reg, name)[0].GetHistogram().GetSampleCount()
}

// metric gathers reg and returns the series of the metric name; it fails
// the test when there is none.
func metric(t *testing.T, reg *prometheus.Registry, name string) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()
		}
	}
	t.Fatalf("%s not registered", name)
	return nil
}

// TestBatchRefusedWhole: one malformed event refuses the whole batch,
// 400, naming its line and its key (as the "line" and "field" of the
// batchAnswer, and in the message), and nothing of the batch is appended; the
// rules are a single post's.
func TestBatchRefusedWhole(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	url := serve(t, ingest.Config{Reserved: func(typ []byte) bool { return string(typ) == "dead_letter.created" }}, q)
	good := lines("g", 3)
	for _, c := range []struct {
		name, line, field, want string
	}{
		{"no id", `{"type":"t","body":{}}`, "id", "missing"},
		{"no type", `{"id":"x","body":{}}`, "type", "missing"},
		{"no body", `{"type":"t","id":"x"}`, "body", "missing"},
		{"both bodies", `{"type":"t","id":"x","body":{},"body_base64":"AA=="}`, "body_base64", "give one of them"},
		{"bad type", `{"type":"a b","id":"x","body":{}}`, "type", `invalid event type "a b"`},
		{"reserved type", `{"type":"dead_letter.created","id":"x","body":{}}`, "type", "reserved"},
		{"bad id", `{"type":"t","id":"-x","body":{}}`, "id", "must start with a letter or digit"},
		{"long id", `{"type":"t","id":"` + strings.Repeat("i", 201) + `","body":{}}`, "id", "longer than 200 bytes"},
		{"bad ordering key", `{"type":"t","id":"x","body":{},"ordering_key":"a\u0001"}`, "ordering_key", "printable ASCII only"},
		{"bad content type", `{"type":"t","id":"x","body":{},"content_type":"text/plain\r\nX-Evil: 1"}`, "content_type", "printable ASCII only"},
		{"empty content type", `{"type":"t","id":"x","body":{},"content_type":""}`, "content_type", "empty"},
		{"unknown key", `{"type":"t","id":"x","body":{},"Priority":1}`, "Priority", "unknown key"},
		{"key in another case", `{"Type":"t","id":"x","body":{}}`, "Type", "unknown key"},
		{"tenant per line", `{"type":"t","id":"x","body":{},"tenant":"acme"}`, "tenant", "Sluice-Tenant header"},
		{"key twice", `{"type":"t","id":"x","id":"y","body":{}}`, "id", "given twice"},
		{"type not a string", `{"type":7,"id":"x","body":{}}`, "type", "want a string"},
		{"body not JSON", `{"type":"t","id":"x","body":{"a":}}`, "body", "not valid JSON"},
		{"body bare word", `{"type":"t","id":"x","body":hello}`, "body", "not valid JSON"},
		{"body unterminated", `{"type":"t","id":"x","body":{"a":[1}`, "body", "not valid JSON"},
		{"bad base64", `{"type":"t","id":"x","body_base64":"not base64!"}`, "body_base64", "not standard base64"},
		{"not an object", `["t","x"]`, "", "not a JSON object"},
		{"two objects", `{"type":"t","id":"x","body":{}} {"type":"t","id":"y","body":{}}`, "", "one event per line"},
		{"truncated", `{"type":"t","id":"x","body":{}`, "body", "want ',' or '}'"},
		{"control character", "{\"type\":\"t\",\"id\":\"x\u0001\",\"body\":{}}", "id", "control character"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, a := ndjson(t, url, good+c.line+"\n"+lines("h", 2))
			if resp.StatusCode != http.StatusBadRequest || a.Line != 4 || a.Field != c.field ||
				!strings.Contains(a.Error, c.want) || !strings.HasPrefix(a.Error, "line 4: ") {
				t.Fatalf("%d %+v; want 400 at line 4, field %q, %q", resp.StatusCode, a, c.field, c.want)
			}
			if c.field != "" && !strings.Contains(a.Error, `"`+c.field+`"`) {
				t.Errorf("the message does not name the field: %q", a.Error)
			}
			if h := q.Head(); h != 0 {
				t.Fatalf("head = %d: a refused batch appended", h)
			}
		})
	}
	for name, c := range map[string]struct {
		body, tenant, want string
	}{
		"empty batch":        {"\n\n", "", "no events"},
		"bad tenant header":  {good, "Acme Corp", "invalid Sluice-Tenant header"},
		"empty tenant value": {good, " ", "invalid Sluice-Tenant header"},
	} {
		t.Run(name, func(t *testing.T) {
			var hdr []string
			if c.tenant != "" {
				hdr = []string{ingest.HeaderTenant, c.tenant}
			}
			resp, a := ndjson(t, url, c.body, hdr...)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(a.Error, c.want) {
				t.Fatalf("%d %+v, want 400 %q", resp.StatusCode, a, c.want)
			}
		})
	}
	if h := q.Head(); h != 0 {
		t.Fatalf("head = %d: a refused batch appended", h)
	}
}

// TestBatchLimits: each limit of a batch is enforced and named: the
// events in one batch (ingest.max_batch_events), its bytes
// (ingest.max_batch_bytes, checked before the body is read), an event's
// body (max_body_bytes, naming its line); a batch above max_body_bytes but
// within its own bound is accepted, while a single post stays bound by
// max_body_bytes.
func TestBatchLimits(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	url := serve(t, ingest.Config{MaxBodyBytes: 1000, Limits: ingest.Limits{MaxBatchEvents: 50, MaxBatchBytes: 8000}}, q)

	resp, a := ndjson(t, url, lines("many", 51))
	if resp.StatusCode != http.StatusRequestEntityTooLarge || a.Line != 51 || !strings.Contains(a.Error, "ingest.max_batch_events (50)") {
		t.Fatalf("51 events with max_batch_events 50: %d %+v", resp.StatusCode, a)
	}
	big := `{"type":"t","id":"big","body":"` + strings.Repeat("x", 1000) + `"}` // 1002 bytes of body: a JSON string's quotes count
	resp, a = ndjson(t, url, lines("ok", 2)+big+"\n")
	if resp.StatusCode != http.StatusRequestEntityTooLarge || a.Line != 3 || a.Field != "body" || !strings.Contains(a.Error, "max_body_bytes (1000 bytes)") {
		t.Fatalf("an event over max_body_bytes: %d %+v", resp.StatusCode, a)
	}
	b64 := `{"type":"t","id":"big","body_base64":"` + base64.StdEncoding.EncodeToString(make([]byte, 1001)) + `"}`
	resp, a = ndjson(t, url, b64)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || a.Field != "body_base64" || !strings.Contains(a.Error, "max_body_bytes") {
		t.Fatalf("a base64 body over max_body_bytes: %d %+v", resp.StatusCode, a)
	}
	resp, a = ndjson(t, url, strings.Repeat(lines("pad", 1), 200)) // about 10 KB
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(a.Error, "body exceeds ingest.max_batch_bytes (8000 bytes)") {
		t.Fatalf("a batch over max_batch_bytes: %d %+v", resp.StatusCode, a)
	}
	if h := q.Head(); h != 0 {
		t.Fatalf("head = %d: a batch over a limit appended", h)
	}
	// 40 events of 150 bytes: 6 KB, over max_body_bytes, within the batch's bound.
	var sb strings.Builder
	for i := range 40 {
		fmt.Fprintf(&sb, `{"type":"t","id":"fit-%d","body":{"pad":"%s"}}`+"\n", i, strings.Repeat("p", 100))
	}
	resp, a = ndjson(t, url, sb.String())
	if resp.StatusCode != http.StatusAccepted || a.Accepted != 40 {
		t.Fatalf("a 6 KB batch of small events: %d %+v", resp.StatusCode, a)
	}
	r, err := http.Post(url+"/v1/events/t", "application/json", strings.NewReader(strings.Repeat("x", 2000)))
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(msg), "body exceeds max_body_bytes (1000 bytes)") {
		t.Fatalf("a single post of 2000 bytes with max_batch_bytes 8000: %d %s", r.StatusCode, msg)
	}
}

// failing is a log that refuses the events whose ids start with "fail"
// with err (fleet mode's log without a quorum, a full disk), and stores
// the rest.
type failing struct {
	*badger.Log
	err error // nil: refuses nothing
}

func (f *failing) AppendBatch(evs []*queue.Event, res []queue.AppendResult) {
	var keep []*queue.Event
	var at []int
	for i, ev := range evs {
		if f.err != nil && strings.HasPrefix(ev.ID, "fail") {
			res[i] = queue.AppendResult{Err: fmt.Errorf("append %s: %w", ev.ID, f.err)}
			continue
		}
		keep, at = append(keep, ev), append(at, i)
	}
	kr := make([]queue.AppendResult, len(keep))
	f.Log.AppendBatch(keep, kr)
	for j, i := range at {
		res[i] = kr[j]
	}
}

// TestBatchPartlyRefused: when the log refuses some events of a valid
// batch, the batchAnswer is 503 with Retry-After, the error, and every event's
// result (the refused ones with their reason); the same batch sent again
// stores the rest and answers the others as duplicates.
func TestBatchPartlyRefused(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	log := &failing{Log: q, err: fmt.Errorf("%w: no quorum", queue.ErrUnavailable)}
	reg := prometheus.NewRegistry()
	url := serve(t, ingest.Config{Registry: reg}, log)
	body := lines("ok", 2) + lines("fail", 2) + lines("also", 1)
	resp, a := ndjson(t, url, body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || a.Accepted != 3 || a.Refused != 2 ||
		!strings.Contains(a.Error, "2 of 5 events not accepted") || !strings.Contains(a.Error, "send the whole batch again") {
		t.Fatalf("partly refused: %d %q %+v", resp.StatusCode, resp.Header.Get("Retry-After"), a)
	}
	for i, want := range []string{"accepted", "accepted", "refused", "refused", "accepted"} {
		r := a.Results[i]
		if r.Status != want || (want == "refused") != (r.Error != "") || (want == "refused") != (r.Seq == 0) {
			t.Fatalf("result %d = %+v, want %s", i, r, want)
		}
	}
	if !strings.Contains(a.Results[2].Error, "log unavailable") {
		t.Errorf("a refused event's error: %q", a.Results[2].Error)
	}
	// A full disk outranks it, with its own Retry-After.
	log.err = fmt.Errorf("%w: over max_disk_bytes", queue.ErrDiskFull)
	resp, a = ndjson(t, url, lines("fail", 1)+lines("ok", 1))
	if resp.StatusCode != http.StatusInsufficientStorage || resp.Header.Get("Retry-After") != "5" || a.Refused != 1 || a.Duplicates != 1 ||
		!strings.Contains(a.Results[0].Error, "disk full") {
		t.Fatalf("an event refused for a full disk: %d %q %+v", resp.StatusCode, resp.Header.Get("Retry-After"), a)
	}
	log.err = nil
	resp, a = ndjson(t, url, body)
	if resp.StatusCode != http.StatusAccepted || a.Accepted != 2 || a.Duplicates != 3 {
		t.Fatalf("sent again: %d %+v", resp.StatusCode, a)
	}
	if h := q.Head(); h != 5 {
		t.Fatalf("head = %d, want 5", h)
	}
	if got := ingested(t, reg, "rejected"); got != 3 {
		t.Errorf("rejected = %v, want 3 (the refused events)", got)
	}
}

// TestBatchLargerThanTheGate: a batch of more events than the ingest gate
// admits at once is admitted when nothing else waits, as a single event
// larger than the gate's bytes is.
func TestBatchLargerThanTheGate(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	url := serve(t, ingest.Config{MaxPendingEvents: 10, MaxPendingBytes: 100}, q)
	resp, a := ndjson(t, url, lines("g", 50))
	if resp.StatusCode != http.StatusAccepted || a.Accepted != 50 {
		t.Fatalf("a batch of 50 with a gate of 10: %d %+v", resp.StatusCode, a)
	}
}

// TestBatchCloudEvents: a CloudEvents batch (application/cloudevents-
// batch+json, a JSON array of structured mode events) is read as a single
// CloudEvent is, each event with its own attributes, data, content type
// and partitionkey, its log id its source and id together; sent again it
// is all duplicates; a malformed event refuses the batch, naming its
// index and attribute; the batch limits hold.
func TestBatchCloudEvents(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{Sync: true})
	url := serve(t, ingest.Config{Limits: ingest.Limits{MaxBatchEvents: 3},
		Reserved: func(typ []byte) bool { return string(typ) == "dead_letter.created" }}, q)
	const ctype = "application/cloudevents-batch+json"
	body := `[
	  {"specversion":"1.0","id":"c-1","source":"/fleet/a","type":"geofence.entered","partitionkey":"vehicle-17","data":{"v":1}},
	  {"specversion":"1.0","id":"c-2","source":"/fleet/a","type":"invoice.pdf","data_base64":"AAEC"},
	  {"specversion":"1.0","id":"c-1","source":"/fleet/b","type":"note.added","datacontenttype":"text/plain","data":"hi","subject":"s"}
	]`
	resp, a := postBatch(t, url, ctype, body, ingest.HeaderTenant, "acme")
	if resp.StatusCode != http.StatusAccepted || a.Accepted != 3 {
		t.Fatalf("a CloudEvents batch: %d %+v", resp.StatusCode, a)
	}
	want := []struct {
		source, id, typ, ct, body, key, attrs string
	}{
		{"/fleet/a", "c-1", "geofence.entered", "application/json", `{"v":1}`, "vehicle-17",
			`{"specversion":"1.0","id":"c-1","source":"/fleet/a","type":"geofence.entered","partitionkey":"vehicle-17"}`},
		{"/fleet/a", "c-2", "invoice.pdf", "application/octet-stream", "\x00\x01\x02", "",
			`{"specversion":"1.0","id":"c-2","source":"/fleet/a","type":"invoice.pdf"}`},
		{"/fleet/b", "c-1", "note.added", "text/plain", "hi", "",
			`{"specversion":"1.0","id":"c-1","source":"/fleet/b","type":"note.added","subject":"s"}`},
	}
	for i, w := range want {
		r := a.Results[i]
		ev, err := q.Event(r.Seq)
		if err != nil || r.ID != cloudevents.Key(w.source, w.id) || ev.ID != r.ID || ev.Type != w.typ || ev.ContentType != w.ct ||
			string(ev.Body) != w.body || ev.OrderingKey != w.key || ev.CloudEvent != w.attrs || ev.Tenant != "acme" {
			t.Fatalf("event %d: result %+v, stored %+v, %v", i, r, ev, err)
		}
	}
	resp, again := postBatch(t, url, ctype, body)
	if resp.StatusCode != http.StatusOK || again.Duplicates != 3 {
		t.Fatalf("the batch again: %d %+v", resp.StatusCode, again)
	}
	for _, c := range []struct {
		name, body   string
		status       int
		index        int
		attr, phrase string
	}{
		{"no source", `[{"specversion":"1.0","id":"x","source":"/s","type":"t"},{"specversion":"1.0","id":"y","type":"t"}]`,
			400, 1, "source", "missing"},
		{"reserved type", `[{"specversion":"1.0","id":"x","source":"/s","type":"dead_letter.created"}]`, 400, 0, "type", "reserved"},
		{"bad type", `[{"specversion":"1.0","id":"x","source":"/s","type":"a b"}]`, 400, 0, "type", "an event type"},
		{"not an array", `{"specversion":"1.0","id":"x","source":"/s","type":"t"}`, 400, -1, "", "want a JSON array"},
		{"too many", `[{"specversion":"1.0","id":"1","source":"/s","type":"t"},{"specversion":"1.0","id":"2","source":"/s","type":"t"},` +
			`{"specversion":"1.0","id":"3","source":"/s","type":"t"},{"specversion":"1.0","id":"4","source":"/s","type":"t"}]`,
			413, 3, "", "ingest.max_batch_events (3)"},
		{"empty", `[]`, 400, -1, "", "no events"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, a := postBatch(t, url, ctype, c.body)
			index := -1
			if a.Index != nil {
				index = *a.Index
			}
			if resp.StatusCode != c.status || index != c.index || a.Field != c.attr || !strings.Contains(a.Error, c.phrase) {
				t.Fatalf("%d %+v (index %d); want %d, index %d, field %q, %q", resp.StatusCode, a, index, c.status, c.index, c.attr, c.phrase)
			}
		})
	}
	if h := q.Head(); h != 3 {
		t.Fatalf("head = %d: a refused batch appended", h)
	}
}

// TestBatchHeadersRefused: the headers that are per event in a single
// post are per line in a batch; sent on a batch they are refused, named,
// rather than silently ignored.
func TestBatchHeadersRefused(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	url := serve(t, ingest.Config{}, q)
	for _, h := range []string{"Idempotency-Key", "Ordering-Key"} {
		resp, a := ndjson(t, url, lines("h", 2), h, "k-1")
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(a.Error, "send no "+h+" header") {
			t.Errorf("a batch with %s: %d %+v", h, resp.StatusCode, a)
		}
	}
	if h := q.Head(); h != 0 {
		t.Fatalf("head = %d", h)
	}
}

// TestBatchDocExamples: the batches docs/batch-ingest.md shows are
// accepted as it says: its NDJSON example (the heredoc the curl posts),
// its first three-line example, and its CloudEvents batch.
func TestBatchDocExamples(t *testing.T) {
	text := docPage(t, "batch-ingest.md")
	heredoc := regexp.MustCompile(`(?s)cat > batch\.ndjson <<'EOF'\n(.*?)\nEOF\n`).FindStringSubmatch(text)
	lines := regexp.MustCompile("(?s)```\n(\\{\"type\".*?)```").FindStringSubmatch(text)
	ce := regexp.MustCompile("(?s)```\n(\\[\\{\"specversion\".*?)```").FindStringSubmatch(text)
	if heredoc == nil || lines == nil || ce == nil {
		t.Fatalf("docs/batch-ingest.md lacks an example: heredoc %v, lines %v, CloudEvents batch %v", heredoc != nil, lines != nil, ce != nil)
	}
	q := queuetest.MustOpen(t, "", badger.Options{})
	url := serve(t, ingest.Config{}, q)
	for _, c := range []struct{ ctype, body string }{
		{"application/x-ndjson", heredoc[1] + "\n"},
		{"application/x-ndjson", lines[1]},
		{"application/cloudevents-batch+json", ce[1]},
	} {
		resp, a := postBatch(t, url, c.ctype, c.body)
		if resp.StatusCode != http.StatusAccepted || a.Accepted < 2 || a.Refused != 0 {
			t.Errorf("example answered %d %+v:\n%s", resp.StatusCode, a, c.body)
		}
	}
}

// TestBatchSpan: with tracing on, a batch is one ingest span that counts
// its events, and events posted without a traceparent take the span's
// context, all of them the same, as a single post's event does.
func TestBatchSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	q := queuetest.MustOpen(t, "", badger.Options{})
	url := serve(t, ingest.Config{Tracer: tp.Tracer("test")}, q)
	if resp, a := ndjson(t, url, lines("s", 3)); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("%d %+v", resp.StatusCode, a)
	}
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want the batch's one", len(spans))
	}
	sc := spans[0].SpanContext()
	var events int64
	for _, kv := range spans[0].Attributes() {
		if kv.Key == "sluice.ingest.batch_events" {
			events = kv.Value.AsInt64()
		}
	}
	if events != 3 {
		t.Errorf("sluice.ingest.batch_events = %d, want 3", events)
	}
	want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	for seq := uint64(1); seq <= 3; seq++ {
		if ev, err := q.Event(seq); err != nil || ev.TraceParent != want {
			t.Fatalf("event %d: traceparent %q, %v; want the span's %q", seq, ev.TraceParent, err, want)
		}
	}
}
