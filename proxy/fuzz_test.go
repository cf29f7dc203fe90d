package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// FuzzIngestRequest sends raw bytes to the real ingest server over
// loopback, as any local process could: whatever arrives, the server does
// not crash, answers (if at all) with a status of the ingest contract and a
// JSON body, and a 202 means the event is in the log under the id it
// names.
func FuzzIngestRequest(f *testing.F) {
	for _, s := range []string{
		"POST /v1/events/geofence.enter HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/events/t HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k-1\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
		"POST /v1/events/t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"POST /v1/events/t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
		"POST /v1/events/t HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
		"POST /v1/events/t HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
		"POST /v1/events/a%20b HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /v1/events/../../x HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/events/t HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /v1/events/t HTTP/1.0\r\n\r\n",
		"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nContent-Length: 30\r\n\r\n{\"type\":\"t\",\"id\":\"a\",\"body\":1}",
		"POST /v1/events HTTP/1.1\r\nHost: x\r\nce-specversion: 1.0\r\nce-id: 1\r\nce-source: /s\r\nce-type: t\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/events/t HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \xff\xfe\r\nContent-Length: 0\r\n\r\n",
		"\x00\x01\x02",
	} {
		f.Add([]byte(s))
	}
	s := New(Options{Listen: "127.0.0.1:0", AdminListen: "-", DataDir: f.TempDir(), MaxBodyBytes: 4096,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MinFreeDiskBytes: -1})
	if err := s.Open(); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close(context.Background()) })
	// 415: POST /v1/events that is neither a CloudEvent nor a batch.
	allowed := map[int]bool{200: true, 202: true, 400: true, 404: true, 405: true, 413: true, 415: true, 431: true, 503: true}

	f.Fuzz(func(t *testing.T, raw []byte) {
		c, err := net.Dial("tcp", s.ingestLn.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(raw)
		c.(*net.TCPConn).CloseWrite()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("no answer and no close within 10 s for %q", raw)
			}
			return // closed without an answer: fine for garbage
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if !allowed[resp.StatusCode] {
			t.Fatalf("status %d for %q: %s", resp.StatusCode, raw, body)
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("status %d with non-JSON body %q for %q", resp.StatusCode, body, raw)
		}
		if resp.StatusCode != 202 {
			return
		}
		// One event's answer, or a batch's with one per event.
		answers := []any{m}
		if rs, ok := m["results"].([]any); ok {
			answers = rs
		}
		for _, a := range answers {
			r, _ := a.(map[string]any)
			id, _ := r["id"].(string)
			seq, _, _, err := s.q.Lookup(id)
			if err != nil || float64(seq) != r["seq"] {
				t.Fatalf("202 %v but the log has seq %d (%v) for id %q", r, seq, err, id)
			}
		}
	})
}
