package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/signing"
)

// stdin is where verify reads the body; tests replace it.
var stdin io.Reader = os.Stdin

// listFlag collects a repeated string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// verifyCmd checks a delivery's signature: the body on stdin, the headers
// from flags or a file of "Name: value" lines.
func verifyCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("verify", `Checks a delivery's Standard Webhooks signature by hand: the body on
stdin, the webhook-id, webhook-timestamp and webhook-signature headers from
--id, --timestamp and --signature or a --headers file, against the
subscription's whsec_ secret (or the whpk_ public key of a whsk_ one). It
prints "valid" and exits 0, or exits 1 saying why not: a header missing, a
timestamp further from now than --tolerance, or no signature that matches.`, stdout)
	var secretArgs listFlag
	fs.Var(&secretArgs, "secret", "a whsec_ secret of the subscription, or the whpk_ public key of its whsk_ one (GET /v1/subscriptions/{id} shows it); repeat it (or separate with spaces) while rotating")
	id := fs.String("id", "", "the webhook-id header")
	ts := fs.String("timestamp", "", "the webhook-timestamp header")
	sig := fs.String("signature", "", "the webhook-signature header")
	headers := fs.String("headers", "", "a file of raw 'Name: value' header lines (as curl -D writes them); --id, --timestamp and --signature override it")
	tolerance := fs.Duration("tolerance", signing.DefaultTolerance, "how far webhook-timestamp may be from now")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("verify", pos); err != nil {
		return err
	}
	var secrets []signing.Secret
	var keys []signing.PublicKey // whpk_: checks v1a entries
	for _, a := range secretArgs {
		for _, s := range strings.Fields(a) {
			if strings.HasPrefix(s, "whpk_") {
				pk, err := signing.ParsePublicKey(s)
				if err != nil {
					return fmt.Errorf("verify: --secret: %w", err)
				}
				keys = append(keys, pk)
				continue
			}
			k, err := signing.ParseSecret(s)
			if err != nil {
				return fmt.Errorf("verify: --secret: %w", err)
			}
			secrets = append(secrets, k)
		}
	}
	if len(secrets) == 0 && len(keys) == 0 {
		return errors.New("verify: give the subscription's secret with --secret whsec_... (or its public key, --secret whpk_...)")
	}
	h := map[string]string{}
	if *headers != "" {
		b, err := os.ReadFile(*headers)
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		h = parseHeaderLines(string(b))
	}
	for k, v := range map[string]string{signing.HeaderID: *id, signing.HeaderTimestamp: *ts, signing.HeaderSignature: *sig} {
		if v != "" {
			h[k] = v
		}
	}
	body, err := io.ReadAll(stdin)
	if err != nil {
		return fmt.Errorf("verify: read body from stdin: %w", err)
	}
	err = signing.Verify(secrets, h[signing.HeaderID], h[signing.HeaderTimestamp], h[signing.HeaderSignature], body, time.Now(), *tolerance, keys...)
	switch {
	case err == nil:
		fmt.Fprintln(stdout, "valid")
		return nil
	case errors.Is(err, signing.ErrMissingHeader):
		return fmt.Errorf("invalid: %w (give --id, --timestamp and --signature, or --headers FILE)", err)
	case errors.Is(err, signing.ErrTimestampTooOld), errors.Is(err, signing.ErrTimestampTooNew):
		return fmt.Errorf("invalid: %w (to check an older capture, raise --tolerance)", err)
	case errors.Is(err, signing.ErrSignatureMismatch):
		return fmt.Errorf("invalid: %w (the body on stdin must be the exact bytes received, %d here: a trailing newline added by echo or an editor breaks it)", err, len(body))
	}
	return fmt.Errorf("invalid: %w", err)
}

// parseHeaderLines reads the webhook headers from "Name: value" lines,
// skipping status and request lines. Names are matched without regard to
// case; several webhook-signature lines are joined, since the header is a
// space-separated list.
func parseHeaderLines(s string) map[string]string {
	h := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		name, value, ok := strings.Cut(strings.TrimRight(line, "\r"), ":")
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			continue
		}
		name, value = strings.ToLower(name), strings.TrimSpace(value)
		switch name {
		case signing.HeaderSignature:
			if h[name] != "" {
				value = h[name] + " " + value
			}
			h[name] = value
		case signing.HeaderID, signing.HeaderTimestamp:
			h[name] = value
		}
	}
	return h
}
