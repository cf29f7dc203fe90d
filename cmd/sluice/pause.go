package main

import (
	"fmt"
	"io"

	"github.com/sluicehq/sluice/proxy/api"
)

// pauseCmd pauses (pause) or resumes a subscription.
func pauseCmd(args []string, stdout, stderr io.Writer, pause bool) error {
	name := "resume"
	if pause {
		name = "pause"
	}
	about := `Pauses subscription ID: nothing is delivered to it, and its events are
kept and wait, in order, until 'sluice resume ID'. status shows it paused,
with --reason.`
	if !pause {
		about = `Resumes subscription ID, paused by 'sluice pause' (or by the sidecar, as
on a 410 Gone): the events that waited are delivered, in order.`
	}
	fs := newFlagSet(name, adminAbout(about), stdout)
	af := addAdminFlags(fs)
	var reason *string
	if pause {
		reason = fs.String("reason", "", "why, shown by status (default: paused by an operator)")
	}
	id, ac, err := oneArg(name, "ID", fs, af, args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	var st *api.StateAnswer
	if pause {
		st, err = ac.Pause(ctx, id, *reason)
	} else {
		st, err = ac.Resume(ctx, id)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", name, id, explain(err))
	}
	if *af.json {
		return printJSON(stdout, st)
	}
	if pause {
		fmt.Fprintf(stdout, "paused %s: its events are kept and wait until 'sluice resume %s'\n", id, id)
	} else {
		fmt.Fprintf(stdout, "resumed %s\n", id)
	}
	return nil
}
