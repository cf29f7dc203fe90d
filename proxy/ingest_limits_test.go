package proxy_test

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/ingest"
)

// TestIngestLimitsFromOptions: the limits an operator configures
// (Options.Ingest, from the config's ingest block) are the ones enforced,
// not the defaults: 6 KiB of headers pass the default 16 KiB but not a
// configured 4 KiB, and the answer names the configured figure.
func TestIngestLimitsFromOptions(t *testing.T) {
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(),
		Logger: quietLogger(), Ingest: ingest.Limits{MaxHeaderBytes: 4096}})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, time.Second) })
	c, err := net.Dial("tcp", strings.TrimPrefix(s.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req := "POST /v1/events/t HTTP/1.1\r\nHost: sluice\r\nX-Pad: " + strings.Repeat("p", 6<<10) + "\r\nContent-Length: 2\r\n\r\n{}"
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	bufio.NewReader(resp.Body).WriteTo(&b)
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || !strings.Contains(b.String(), "request headers exceed 4096 bytes") {
		t.Fatalf("6 KiB of headers with max_header_bytes 4096: %d %s", resp.StatusCode, b.String())
	}
}
