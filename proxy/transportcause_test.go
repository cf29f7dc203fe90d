package proxy_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
)

// TestUnclassifiedTransportErrorIsLoggedWithItsCause: an endpoint that
// answers something other than HTTP fails with last_error "transport",
// the one word that says nothing; the log then says what happened, under
// the subscription's id, without the endpoint's address or its URL's
// path (which may carry a token).
func TestUnclassifiedTransportErrorIsLoggedWithItsCause(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 4096)
			c.Read(buf)
			c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n\r\n"))
			c.Close()
		}
	}()

	var logs capture
	sb := sub("garbled", "http://"+ln.Addr().String()+"/hooks/tok_s3cr3t?key=k3y")
	sb.Retry = fastRetry(1)
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(),
		Subscriptions: []*delivery.Subscription{sb}, Logger: logs.logger()})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, time.Second) })
	publish(t, s, "t", "e", 1)
	eventually(t, "the event dead-lettered", func() bool { return lane(s, "garbled").DeadLettered == 1 })
	dls, err := s.DeadLetters("garbled", 10)
	if err != nil || len(dls) != 1 || dls[0].LastError != "transport" {
		t.Fatalf("dead letters %+v, %v; want one with last_error transport", dls, err)
	}

	var line string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "delivery attempt failed") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no log line names the failed attempt; log:\n%s", logs.String())
	}
	for _, want := range []string{"subscription=garbled", `error="transport: `} {
		if !strings.Contains(line, want) {
			t.Errorf("log line %q does not contain %q", line, want)
		}
	}
	for _, leak := range []string{"tok_s3cr3t", "k3y", ln.Addr().String()} {
		if strings.Contains(line, leak) {
			t.Errorf("log line %q carries %q", line, leak)
		}
	}
}
