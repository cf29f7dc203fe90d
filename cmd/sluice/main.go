// Command sluice is the webhook delivery sidecar: `sluice serve` runs it,
// the other subcommands are tools around it. This package wires; the logic
// lives in config, proxy, queue, policy and signing.
//
// One file per subcommand (serve.go, healthcheck.go, demo.go, inject.go,
// testbed.go, version.go; status.go, dlq.go, events.go, pause.go,
// subscriptions.go, tenants.go and tokens.go are the admin-API clients).
// help.go holds the usage lines and the help every command prints. This
// file is the process's lifecycle: signals in, run, exit status out.
// main is the only caller of os.Exit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the subcommand args[0] and returns the process's exit status:
// 0 on success (and for -h), 1 when the command failed, 2 for a usage
// error.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "serve":
		err = serve(rest, stdout, stderr)
	case "demo":
		err = demo(rest, stdout)
	case "testbed":
		err = testbedCmd(rest, stdout, stderr)
	case "healthcheck":
		err = healthcheck(rest, stdout)
	case "status":
		err = statusCmd(rest, stdout, stderr)
	case "dlq":
		err = dlqCmd(rest, stdout, stderr)
	case "events":
		err = eventsCmd(rest, stdout, stderr)
	case "pause", "resume":
		err = pauseCmd(rest, stdout, stderr, cmd == "pause")
	case "subscriptions":
		err = subscriptionsCmd(rest, stdout, stderr)
	case "tenants":
		err = tenantsCmd(rest, stdout, stderr)
	case "tokens":
		err = tokensCmd(rest, stdout, stderr)
	case "verify":
		err = verifyCmd(rest, stdout, stderr)
	case "inject":
		err = injectCmd(rest, os.Stdin, stdout, stderr)
	case "injector":
		err = injectorCmd(rest, stdout, stderr)
	case "check-inject":
		err = checkInjectCmd(rest, stdout)
	case "version":
		err = versionCmd(rest, stdout)
	case "--version", "-version":
		err = versionCmd(nil, stdout)
	default:
		if !isHelp(cmd) {
			fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", cmd, usage())
			return 2
		}
		// `sluice help COMMAND` is `sluice COMMAND -h`.
		if len(rest) > 0 && !isHelp(rest[0]) {
			return run(append(slices.Clone(rest), "-h"), stdout, stderr)
		}
		fmt.Fprint(stdout, usage())
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "sluice:", err)
		return 1
	}
	return 0
}

// lifecycle turns the process's signals into the contexts of a
// long-running command, in litestream's manner: the first
// SIGTERM or SIGINT cancels drain (stop gracefully), the second cancels
// abort (stop at once), and SIGHUP asks for a reload. The cause of either
// context is a signalError naming the signal.
//
// Catching the signals replaces Go's default action, which kills the
// process without a drain; so a command calls notifySignals before it
// opens anything, and stop when it returns.
type lifecycle struct {
	drain, abort context.Context
	// reload receives once for any number of SIGHUPs since it was last
	// read: one reload reads the latest file.
	reload <-chan struct{}

	stop func()
}

// signalError is the cause of a lifecycle context.
type signalError struct{ sig os.Signal }

func (e signalError) Error() string { return "signal " + e.sig.String() }

// signalName names the signal that cancelled ctx, or "" if none did.
func signalName(ctx context.Context) string {
	var se signalError
	if errors.As(context.Cause(ctx), &se) {
		return se.sig.String()
	}
	return ""
}

func notifySignals() *lifecycle {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	drain, cancelDrain := context.WithCancelCause(context.Background())
	abort, cancelAbort := context.WithCancelCause(context.Background())
	reload := make(chan struct{}, 1)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case sig := <-sigs:
				switch {
				case sig == syscall.SIGHUP:
					select {
					case reload <- struct{}{}:
					default: // a reload is pending already
					}
				case drain.Err() == nil:
					cancelDrain(signalError{sig})
				default:
					cancelAbort(signalError{sig})
				}
			}
		}
	})
	return &lifecycle{drain: drain, abort: abort, reload: reload, stop: func() {
		signal.Stop(sigs)
		close(done)
		wg.Wait()
		cancelDrain(nil)
		cancelAbort(nil)
	}}
}
