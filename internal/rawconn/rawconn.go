// Package rawconn reads and writes HTTP on a raw connection, for the
// tests that hold connections the way a misbehaving client does (headers
// or bodies trickled a byte at a time, idle floods): ingest's and the
// admin API's limits.
package rawconn

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Answer is one HTTP answer read off a raw connection: its status, its
// Retry-After, whether it closes the connection, and its JSON body's
// fields (every answer of ingest and of the admin API's refusals is
// JSON).
type Answer struct {
	Status     int    `json:"-"`
	RetryAfter string `json:"-"`
	Close      bool   `json:"-"`
	ID         string `json:"id"`
	Seq        uint64 `json:"seq"`
	Error      string `json:"error"`
}

// ReadAnswer reads one response from br and decodes its JSON body; every
// ingest answer, error or not, is JSON.
func ReadAnswer(br *bufio.Reader) (Answer, error) {
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return Answer{}, fmt.Errorf("read response: %w", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return Answer{}, fmt.Errorf("read response body: %w", err)
	}
	a := Answer{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After"), Close: resp.Close}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		return a, fmt.Errorf("answer %d has Content-Type %q, body %q", resp.StatusCode, ct, b)
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return a, fmt.Errorf("answer %d is not JSON: %q", resp.StatusCode, b)
	}
	return a, nil
}

// MustAnswer reads one answer from c, allowing 10 s: far longer than any
// limit the tests set, so hitting it means the server never answered.
func MustAnswer(t testing.TB, c net.Conn, br *bufio.Reader) Answer {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	a, err := ReadAnswer(br)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// AssertClosed checks the server closed c: a read ends with EOF or a reset,
// not with our own 10 s deadline.
func AssertClosed(t testing.TB, c net.Conn, br *bufio.Reader) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after the answer (read %d more bytes)", n)
	}
	if n > 0 {
		t.Fatalf("%d unexpected bytes after the answer", n)
	}
}

// Trickle writes b to c one byte every 20 ms, then p forever (when p is
// not empty), until a write fails: the server closed c, or the test did.
// started is done after the first byte.
func Trickle(c net.Conn, b, p []byte, started *sync.WaitGroup) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	first := true
	for i := 0; i < len(b) || len(p) > 0; i++ {
		<-tick.C
		var err error
		if i < len(b) {
			_, err = c.Write(b[i : i+1])
		} else {
			_, err = c.Write(p)
		}
		if first {
			started.Done()
			first = false
		}
		if err != nil {
			return
		}
	}
}
