package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/testbed"
)

type batchAnswer struct {
	Accepted   int    `json:"accepted"`
	Duplicates int    `json:"duplicates"`
	Refused    int    `json:"refused"`
	Error      string `json:"error"`
	Line       int    `json:"line"`
	Field      string `json:"field"`
	Results    []struct {
		ID     string `json:"id"`
		Seq    uint64 `json:"seq"`
		Status string `json:"status"`
	} `json:"results"`
}

// postBatch posts an NDJSON batch to the sidecar's POST /v1/events, with
// the headers hdr (name, value pairs).
func postBatch(t *testing.T, s *proxy.Server, body string, hdr ...string) (int, batchAnswer) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-ndjson")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a batchAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("batch answered %d with non-JSON %q", resp.StatusCode, b)
	}
	return resp.StatusCode, a
}

// batchOf is an NDJSON batch of n events of typ with ids prefix-0..n-1.
func batchOf(typ, prefix string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"type":%q,"id":"%s-%d","body":{"n":%d}}`+"\n", typ, prefix, i, i)
	}
	return b.String()
}

// TestBatchDelivered: a batch of 100 posted to a real sidecar is
// delivered to a real receiver, each event once, signed, with its own id
// and body; the same batch sent again (a producer that timed out) is
// answered all duplicate and delivers nothing more; a batch with one
// malformed line stores and delivers nothing, its answer naming the line
// and the key.
func TestBatchDelivered(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	s := startServer(t, "", sub("orders", tb.URL()+"/orders", "order.created"))
	body := batchOf("order.created", "ord", 100)
	code, a := postBatch(t, s, body)
	if code != http.StatusAccepted || a.Accepted != 100 || len(a.Results) != 100 {
		t.Fatalf("batch of 100: %d %+v", code, a)
	}
	waitFor(t, tb, "100 deliveries", uniqueAt("/orders", 100))
	code, a = postBatch(t, s, body)
	if code != http.StatusOK || a.Duplicates != 100 || a.Accepted != 0 {
		t.Fatalf("the batch again: %d %+v, want 200 and 100 duplicates", code, a)
	}
	bad := batchOf("order.created", "late", 3) + `{"type":"order.created","body":{}}` + "\n"
	code, a = postBatch(t, s, bad)
	if code != http.StatusBadRequest || a.Line != 4 || a.Field != "id" {
		t.Fatalf("a batch with a line without id: %d %+v", code, a)
	}
	// A last event through the same lane: once it is delivered, anything
	// the duplicates or the refused batch had set going would have been.
	if c, ans := post(t, s, "order.created", "marker", `{}`); c != http.StatusAccepted {
		t.Fatalf("marker: %d %+v", c, ans)
	}
	waitFor(t, tb, "the marker", uniqueAt("/orders", 101))
	st := tb.Stats()["/orders"]
	if st.Requests != 101 || st.Duplicates != 0 || st.BadSignatures != 0 {
		t.Fatalf("receiver saw %+v; want 101 requests, each event once, signed", st)
	}
}

// TestBatchTenant: a batch's Sluice-Tenant header makes every event of it
// the tenant's: its subscriptions and the operator's receive them, another
// tenant's do not.
func TestBatchTenant(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	acme := sub("acme-orders", tb.URL()+"/acme", "*")
	acme.Tenant = "acme"
	globex := sub("globex-orders", tb.URL()+"/globex", "*")
	globex.Tenant = "globex"
	s := startServer(t, "", acme, globex, sub("operator", tb.URL()+"/operator", "*"))
	if code, a := postBatch(t, s, batchOf("order.created", "acme", 20), ingest.HeaderTenant, "acme"); code != http.StatusAccepted || a.Accepted != 20 {
		t.Fatalf("acme's batch: %d %+v", code, a)
	}
	waitFor(t, tb, "acme's and the operator's deliveries", func(m map[string]testbed.PathStats) bool {
		return m["/acme"].Unique == 20 && m["/operator"].Unique == 20
	})
	// The marker is globex's own: once delivered, acme's events would
	// have been, had they been globex's.
	if code, a := postWith(t, s, "order.created", "globex-marker", `{}`, map[string]string{ingest.HeaderTenant: "globex"}); code != http.StatusAccepted {
		t.Fatalf("globex's marker: %d %+v", code, a)
	}
	waitFor(t, tb, "globex's marker", uniqueAt("/globex", 1))
	if n := tb.Stats()["/globex"].Requests; n != 1 {
		t.Fatalf("globex's subscription got %d requests, want its own 1", n)
	}
}

// TestBatchLimitsFromOptions: the batch limits an operator configures
// (Options.Ingest, from the config's ingest block) are the ones the
// sidecar enforces, and each refusal names its setting.
func TestBatchLimitsFromOptions(t *testing.T) {
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(),
		Logger: quietLogger(), MaxBodyBytes: 2048, Ingest: ingest.Limits{MaxBatchEvents: 10, MaxBatchBytes: 4096}})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, time.Second) })
	if code, a := postBatch(t, s, batchOf("t", "many", 11)); code != http.StatusRequestEntityTooLarge || !strings.Contains(a.Error, "ingest.max_batch_events (10)") {
		t.Fatalf("11 events: %d %+v", code, a)
	}
	big := `{"type":"t","id":"big","body":"` + strings.Repeat("x", 3000) + `"}`
	if code, a := postBatch(t, s, big); code != http.StatusRequestEntityTooLarge || a.Line != 1 || !strings.Contains(a.Error, "max_body_bytes (2048 bytes)") {
		t.Fatalf("a body over max_body_bytes: %d %+v", code, a)
	}
	if code, a := postBatch(t, s, strings.Repeat(big+"\n", 2)); code != http.StatusRequestEntityTooLarge || !strings.Contains(a.Error, "ingest.max_batch_bytes (4096 bytes)") {
		t.Fatalf("a batch over max_batch_bytes: %d %+v", code, a)
	}
	if code, a := postBatch(t, s, batchOf("t", "fits", 10)); code != http.StatusAccepted || a.Accepted != 10 {
		t.Fatalf("10 events within every limit: %d %+v", code, a)
	}
}

// TestFleetBatch: in fleet mode a batch goes to the JetStream log as on
// Badger: accepted in order, delivered once by the lane's owner, a batch
// sent again (to another node) answered all duplicate by the stream's
// duplicate window.
func TestFleetBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node NATS cluster")
	}
	f := newFleet(t)
	tb := startTestbed(t, testbed.ModeOK)
	a := f.node("a", sub("s1", tb.URL()+"/s1", "*"))
	b := f.node("b", sub("s1", tb.URL()+"/s1", "*"))
	body := batchOf("fleet.order", "f", 100)
	code, ans := postBatch(t, a, body)
	if code != http.StatusAccepted || ans.Accepted != 100 {
		t.Fatalf("batch on node a: %d %+v", code, ans)
	}
	for i := 1; i < len(ans.Results); i++ {
		if ans.Results[i].Seq <= ans.Results[i-1].Seq {
			t.Fatalf("seqs out of batch order: %+v then %+v", ans.Results[i-1], ans.Results[i])
		}
	}
	code, again := postBatch(t, b, body)
	if code != http.StatusOK || again.Duplicates != 100 {
		t.Fatalf("the batch again on node b: %d %+v", code, again)
	}
	for i, r := range again.Results {
		if r.Seq != ans.Results[i].Seq {
			t.Fatalf("duplicate %d answered seq %d, the original is %d", i, r.Seq, ans.Results[i].Seq)
		}
	}
	waitFor(t, tb, "100 deliveries", uniqueAt("/s1", 100))
	if d := tb.Stats()["/s1"].Duplicates; d != 0 {
		t.Fatalf("%d duplicates delivered", d)
	}
}
