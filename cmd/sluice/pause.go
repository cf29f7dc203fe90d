package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/sluicehq/sluice/proxy"
)

// pauseCmd pauses (pause) or resumes a subscription.
func pauseCmd(args []string, stdout, stderr io.Writer, pause bool) error {
	name := "resume"
	if pause {
		name = "pause"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	af := addAdminFlags(fs)
	var reason *string
	if pause {
		reason = fs.String("reason", "", "why, shown by status (default: paused by an operator)")
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(name, pos, "ID"); err != nil {
		return err
	}
	api, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	var st *proxy.StateAnswer
	if pause {
		st, err = api.Pause(ctx, pos[0], *reason)
	} else {
		st, err = api.Resume(ctx, pos[0])
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", name, pos[0], explain(err))
	}
	if *af.json {
		return printJSON(stdout, st)
	}
	if pause {
		fmt.Fprintf(stdout, "paused %s: its events are kept and wait until 'sluice resume %s'\n", pos[0], pos[0])
	} else {
		fmt.Fprintf(stdout, "resumed %s\n", pos[0])
	}
	return nil
}
