package main

// What the admin-client subcommands (status, dlq, events, pause, resume,
// subscriptions, tenants, tokens) share: finding the admin API and its token, the flags for it, and
// parsing arguments. They speak the API through package client, whose
// retries make a command run while the sidecar restarts wait for it rather
// than fail.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/config"
)

// How long one admin call may take with its retries: client's schedule
// (about 5 s of waiting) and a slow answer fit in cliCallTimeout. A replay
// writes each dead letter it touches, so it has cliReplayTimeout.
const (
	cliCallTimeout   = 15 * time.Second
	cliReplayTimeout = 2 * time.Minute
)

// adminClient finds the admin API the way serve finds its listener: from
// the config file (configPath, else $SLUICE_CONFIG via the caller's flag
// default) and the SLUICE_ environment, then overrides (serve's flags, as
// config.Load takes them). adminURL, when set, overrides the
// address; the token still comes from the config. A wildcard listen
// address is reached on 127.0.0.1, a unix:// socket through a dialer for
// it. The returned client has no timeout; callers set their own.
func adminClient(configPath string, overrides map[string]any, adminURL string) (base string, client *http.Client, token string, err error) {
	cfg, err := config.Load(configPath, os.Environ(), overrides)
	if err != nil {
		return "", nil, "", err
	}
	base, client = adminURL, &http.Client{}
	if base == "" {
		listen := cfg.Admin.Listen
		base = "http://" + listen
		if sock, ok := strings.CutPrefix(listen, "unix://"); ok {
			base = "http://sluice"
			client.Transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			}}
		} else if host, port, err := net.SplitHostPort(listen); err == nil && (host == "" || host == "0.0.0.0" || host == "::") {
			base = "http://" + net.JoinHostPort("127.0.0.1", port)
		}
	}
	return strings.TrimRight(base, "/"), client, cfg.Admin.ResolvedToken, nil
}

// adminFlags are the flags every admin command shares.
type adminFlags struct {
	config, admin, token *string
	json                 *bool
}

func addAdminFlags(fs *flag.FlagSet) adminFlags {
	return adminFlags{
		config: fs.String("config", os.Getenv(config.EnvFile), "the sidecar's config file, for admin.listen and the admin token (default: $SLUICE_CONFIG)"),
		admin:  fs.String("admin", "", "admin API base URL (default: from the config)"),
		token:  fs.String("token", "", "admin bearer token (default: admin.token or admin.token_file of the config, which keeps it out of the process list)"),
		json:   fs.Bool("json", false, "print the API's JSON instead of text"),
	}
}

// adminAbout is an admin command's help paragraph, with what all of them
// share.
func adminAbout(about string) string { return about + "\n\n" + adminNote }

// open returns the admin API client the flags name. Each retry is told on
// stderr, so that the person waiting knows why nothing happens yet.
func (f adminFlags) open(stderr io.Writer) (*client.Client, error) {
	base, hc, token, err := adminClient(*f.config, nil, *f.admin)
	if err != nil {
		return nil, err
	}
	if *f.token != "" {
		token = *f.token
	}
	return client.New(base, client.Options{Token: token, Transport: hc.Transport, OnRetry: func(retry int, reason string) {
		fmt.Fprintf(stderr, "sluice: admin API at %s: %s; retry %d of %d\n", base, reason, retry, client.DefaultRetryMax)
	}})
}

// callCtx bounds one admin call with its retries.
func callCtx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// explain adds what to do about an answer a person can fix.
func explain(err error) error {
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
		return fmt.Errorf("%w (the token comes from admin.token or admin.token_file in the config: give --config or set $SLUICE_CONFIG, or give --token)", err)
	}
	return err
}

// parseArgs parses flags placed before, between or after the positional
// arguments, which it returns ("--" ends the flags).
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%s: %w (run 'sluice %s -h' for its flags)", fs.Name(), err, fs.Name())
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// oneArg parses the arguments of an admin command that takes one
// positional argument (what names it in the usage) and opens the client.
func oneArg(name, what string, fs *flag.FlagSet, af adminFlags, args []string, stderr io.Writer) (string, *client.Client, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return "", nil, err
	}
	if err := wantArgs(name, pos, what); err != nil {
		return "", nil, err
	}
	api, err := af.open(stderr)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", name, err)
	}
	return pos[0], api, nil
}

func wantArgs(cmd string, pos []string, names ...string) error {
	if len(pos) != len(names) {
		if len(names) == 0 {
			return fmt.Errorf("%s: unexpected argument %q", cmd, pos[0])
		}
		return fmt.Errorf("%s: want %s, got %d argument(s)", cmd, strings.Join(names, " "), len(pos))
	}
	return nil
}
