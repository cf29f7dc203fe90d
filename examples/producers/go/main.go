// Command producer posts events to a sluice sidecar with
// github.com/hashicorp/go-retryablehttp, which rides out a sidecar restart:
// connection errors, 429 and 5xx are retried with the same Idempotency-Key,
// honouring Retry-After, so a retry never creates a second event.
//
// Environment: SLUICE_URL (default http://127.0.0.1:8700) or SLUICE_SOCKET
// (unix socket path), EVENTS (10), EVENT_TYPE (example.created), KEY_PREFIX,
// INTERVAL_MS (0), OVERSIZE_BYTES (if > 0, one extra event of that size, to
// show 413). The last stdout line is a JSON summary.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

type summary struct {
	Producer   string   `json:"producer"`
	Sent       int      `json:"sent"`
	Accepted   int      `json:"accepted"`
	Duplicates int      `json:"duplicates"`
	TooLarge   int      `json:"too_large"`
	Failed     int      `json:"failed"`
	IDs        []string `json:"ids"`
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// newClient returns a retrying client for the sidecar and its base URL.
func newClient() (*retryablehttp.Client, string) {
	c := retryablehttp.NewClient()
	c.RetryMax = 12
	c.RetryWaitMin = 100 * time.Millisecond
	c.RetryWaitMax = 2 * time.Second // ~20 s in all: enough for a restart
	c.Logger = nil                   // the library logs every request at debug; log retries only
	c.RequestLogHook = func(_ retryablehttp.Logger, r *http.Request, retry int) {
		if retry > 0 {
			log.Printf("%s: retry %d", r.Header.Get("Idempotency-Key"), retry)
		}
	}
	// DefaultBackoff honours Retry-After on 429 and 503; DefaultRetryPolicy
	// retries connection errors, 429 and 5xx but not 501 or other 4xx.
	// Hand the last response back instead of an error when retries run out.
	c.ErrorHandler = retryablehttp.PassthroughErrorHandler
	c.HTTPClient.Timeout = 10 * time.Second

	if sock := os.Getenv("SLUICE_SOCKET"); sock != "" {
		tr := c.HTTPClient.Transport.(*http.Transport).Clone()
		tr.Proxy = nil
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
		c.HTTPClient.Transport = tr
		return c, "http://sluice" // the host is ignored by the dialer
	}
	base := os.Getenv("SLUICE_URL")
	if base == "" {
		base = "http://127.0.0.1:8700"
	}
	return c, strings.TrimSuffix(base, "/")
}

// post sends one event and returns accepted, duplicate, too_large or failed.
func post(c *retryablehttp.Client, url, key string, body []byte) string {
	req, err := retryablehttp.NewRequest(http.MethodPost, url, body)
	if err != nil {
		log.Printf("%s: %v", key, err)
		return "failed"
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		log.Printf("%s: giving up: %v", key, err)
		return "failed"
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
	switch resp.StatusCode {
	case http.StatusAccepted:
		return "accepted"
	case http.StatusOK:
		return "duplicate"
	case http.StatusRequestEntityTooLarge:
		log.Printf("%s: too large (%d bytes), giving up on this event", key, len(body))
		return "too_large"
	default:
		log.Printf("%s: giving up: %d %s", key, resp.StatusCode, text)
		return "failed"
	}
}

func main() {
	log.SetOutput(os.Stderr)
	n := envInt("EVENTS", 10)
	typ := os.Getenv("EVENT_TYPE")
	if typ == "" {
		typ = "example.created"
	}
	prefix := os.Getenv("KEY_PREFIX")
	if prefix == "" {
		prefix = fmt.Sprintf("go-%d", time.Now().Unix())
	}
	interval := time.Duration(envInt("INTERVAL_MS", 0)) * time.Millisecond
	oversize := envInt("OVERSIZE_BYTES", 0)

	c, base := newClient()
	url := base + "/v1/events/" + typ

	type event struct {
		key  string
		body []byte
	}
	var events []event
	for i := range n {
		b, _ := json.Marshal(map[string]any{"n": i, "source": "go"})
		events = append(events, event{fmt.Sprintf("%s-%d", prefix, i), b})
	}
	if oversize > 0 {
		b, _ := json.Marshal(map[string]string{"pad": strings.Repeat("x", oversize)})
		events = append(events, event{prefix + "-big", b})
	}

	s := summary{Producer: "go", IDs: []string{}}
	for _, e := range events {
		s.Sent++
		switch post(c, url, e.key, e.body) {
		case "accepted":
			s.Accepted++
			s.IDs = append(s.IDs, e.key)
		case "duplicate":
			s.Duplicates++
			s.IDs = append(s.IDs, e.key)
		case "too_large":
			s.TooLarge++
		default:
			s.Failed++
		}
		time.Sleep(interval)
	}
	out, _ := json.Marshal(s)
	fmt.Println(string(out))
	if s.Failed > 0 {
		os.Exit(1)
	}
}
