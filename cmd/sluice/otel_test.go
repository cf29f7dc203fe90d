package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/otlptest"
)

// TestOTelExportE2E runs a real `sluice serve` with the standard
// OTEL_EXPORTER_OTLP_ENDPOINT pointing at an OTLP/HTTP receiver and
// otel.service_name in its file: the endpoint gets a traceparent naming
// the attempt's span, and the receiver gets the ingest span and the
// attempt span, children of the producer's span, under the configured
// service name; a SIGTERM flushes what is still buffered.
func TestOTelExportE2E(t *testing.T) {
	const (
		traceID = "0af7651916cd43dd8448eb211c80319c"
		spanID  = "b7ad6b7169203331"
	)
	rcv := otlptest.New(t)
	var mu sync.Mutex
	var got []string // traceparent of each delivery
	ep := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("traceparent"))
		mu.Unlock()
	}))
	t.Cleanup(ep.Close)

	dir := t.TempDir()
	sc := newSidecar(t, dir, subYAML("alpha", ep.URL+"/alpha", `["*"]`))
	f, err := os.OpenFile(sc.config, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("otel:\n  service_name: sluice-e2e\n")
	f.Close()
	sc.cmd = sluiceCmd(t, sc.log, "serve", "--config", sc.config)
	// Batches wait a minute: what the receiver gets, SIGTERM flushed.
	sc.cmd.Env = append(sc.cmd.Env, "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.URL(), "OTEL_BSP_SCHEDULE_DELAY=60000")
	if err := sc.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		if c, err := net.Dial("unix", filepath.Join(dir, "ingest.sock")); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sidecar did not listen; log:\n%s", sc.log.String())
		}
		time.Sleep(10 * time.Millisecond) // another process binding; nothing to await
	}

	req, _ := http.NewRequest(http.MethodPost, "http://sluice/v1/events/t.one", strings.NewReader(`{"n":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "ev-1")
	req.Header.Set("traceparent", "00-"+traceID+"-"+spanID+"-01")
	resp, err := sc.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("post: %d", resp.StatusCode)
	}
	var tp string
	for deadline := time.Now().Add(20 * time.Second); tp == ""; {
		mu.Lock()
		if len(got) > 0 {
			tp = got[0]
		}
		mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no delivery; log:\n%s", sc.log.String())
		}
		time.Sleep(5 * time.Millisecond) // polling another process's effect
	}
	sc.cmd.Process.Signal(syscall.SIGTERM)
	if err := sc.cmd.Wait(); err != nil {
		t.Fatalf("serve exited with %v; log:\n%s", err, sc.log.String())
	}
	spans := rcv.Wait(t, "the ingest and attempt spans", 10*time.Second, func(ss []otlptest.Span) bool { return len(ss) >= 2 })

	if !strings.HasPrefix(tp, "00-"+traceID+"-") || !strings.HasSuffix(tp, "-01") || strings.Contains(tp, spanID) {
		t.Fatalf("endpoint got traceparent %q: want trace %s, a span of sluice's, flags 01", tp, traceID)
	}
	byName := map[string]otlptest.Span{}
	for _, sp := range spans {
		byName[sp.Name] = sp
		if sp.Resource["service.name"] != "sluice-e2e" {
			t.Errorf("%s: service.name %q, want otel.service_name's", sp.Name, sp.Resource["service.name"])
		}
		if sp.TraceID() != traceID || sp.ParentSpanID() != spanID {
			t.Errorf("%s: trace %s parent %s, want the producer's %s %s", sp.Name, sp.TraceID(), sp.ParentSpanID(), traceID, spanID)
		}
	}
	at, ok := byName["sluice.deliver"]
	if !ok || byName["sluice.ingest"].Span == nil {
		t.Fatalf("spans %v", byName)
	}
	if tp != "00-"+traceID+"-"+at.SpanID()+"-01" {
		t.Errorf("endpoint got %q, the attempt span is %s", tp, at.SpanID())
	}
	if at.Attr("sluice.subscription") != "alpha" || at.Attr("sluice.outcome") != "ack" || at.Attr("http.response.status_code") != "200" {
		t.Errorf("attempt span attributes %v", at.Attrs())
	}
}
