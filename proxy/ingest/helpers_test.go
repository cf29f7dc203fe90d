package ingest_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy/ingest"
)

// serve starts an ingest server on loopback that appends to store, and
// returns its base URL.
func serve(t *testing.T, cfg ingest.Config, store ingest.Appender) string {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	s := ingest.New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	s.Start(store)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		ln.Close()
	})
	return "http://" + ln.Addr().String()
}

var client = &http.Client{Timeout: 10 * time.Second}

// postAs posts body to url with the headers hdr (name, value pairs), and
// decodes the JSON answer into an A.
func postAs[A any](t *testing.T, url, body string, hdr ...string) (*http.Response, A) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a A
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("answer %d is not JSON: %q", resp.StatusCode, b)
	}
	return resp, a
}

// docPage reads a page of docs/, whose examples the tests post.
func docPage(t *testing.T, name string) string {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(page)
}
