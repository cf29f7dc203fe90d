package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// testbedCmd runs a local receiver until SIGTERM or SIGINT. Runbook: keep a
// black hole in staging.
func testbedCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("testbed", `A local webhook receiver to point subscriptions at while trying sluice or
testing a setup: it answers every POST as --mode says (ok: 200; fail: 500;
slow: 200 after --delay; blackhole: never answers; ratelimit: 429 with
Retry-After --retry-after; flaky: every other request 500), counts what it
got at /_stats, and changes a path's mode at run time with
POST /_mode?path=/p&mode=m. With --secret it checks each request's
signature against the subscription's whsec_ secrets and answers 401 to an
unsigned or badly signed one. It runs until SIGTERM or SIGINT. Keep a
blackhole one in staging: it is how to see a stuck endpoint before
production does.`, stdout)
	listen := fs.String("listen", "127.0.0.1:9000", "address to listen on")
	mode := fs.String("mode", "ok", "ok|fail|slow|blackhole|ratelimit|flaky (per path at run time: POST /_mode?path=/p&mode=m)")
	delay := fs.Duration("delay", testbed.DefaultDelay, "answer delay in slow mode")
	retryAfter := fs.String("retry-after", testbed.DefaultRetryAfter, "Retry-After value in ratelimit mode")
	secret := fs.String("secret", "", "verify signatures with these whsec_ secrets (space separated); unsigned or bad ones get 401")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("testbed", pos); err != nil {
		return err
	}
	m, err := testbed.ParseMode(*mode)
	if err != nil {
		return fmt.Errorf("testbed: --mode: %w", err)
	}
	var secrets []signing.Secret
	for i, s := range strings.Fields(*secret) {
		k, err := signing.ParseSecret(s)
		if err != nil {
			return fmt.Errorf("testbed: --secret entry %d: %w", i+1, err)
		}
		secrets = append(secrets, k)
	}
	srv := testbed.New(testbed.Options{
		Mode: m, Delay: *delay, RetryAfter: *retryAfter, Secrets: secrets,
		Logger: slog.New(slog.NewTextHandler(stderr, nil)),
	})
	if err := srv.Open(*listen); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	fmt.Fprintf(stdout, "testbed listening on %s (mode %s); counts at %s/_stats\n", srv.URL(), m, srv.URL())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	done := make(chan error, 1)
	go func() { done <- srv.Close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		return fmt.Errorf("testbed: close timed out")
	}
}
