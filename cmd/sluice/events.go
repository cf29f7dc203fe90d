package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/proxy/api"
)

func eventsCmd(args []string, stdout, stderr io.Writer) error {
	const about = `Prints what became of one event, by the id its producer gave it: its
sequence number, type and when it was accepted, then a row per
subscription entitled to it with its delivery state (delivered, retrying
with the next attempt due, dead-lettered with the reason, ...), the attempt
and the last status.`
	if len(args) > 0 && isHelp(args[0]) {
		return groupHelp(stdout, "events", adminAbout(about))
	}
	if len(args) == 0 || args[0] != "show" {
		if len(args) > 0 {
			return fmt.Errorf("events: unknown subcommand %q: want 'events show ID'", args[0])
		}
		return errors.New("events: want 'events show ID'")
	}
	fs := newFlagSet("events show", adminAbout(about), stdout)
	af := addAdminFlags(fs)
	pos, err := parseArgs(fs, args[1:])
	if err != nil {
		return err
	}
	if err := wantArgs("events show", pos, "ID"); err != nil {
		return err
	}
	api, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("events show: %w", err)
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	ev, err := api.Event(ctx, pos[0])
	if err != nil {
		return fmt.Errorf("events show: %w", explain(err))
	}
	if *af.json {
		return printJSON(stdout, ev)
	}
	writeLedger(stdout, ev, time.Now())
	return nil
}

func writeLedger(w io.Writer, ev *api.EventStatus, now time.Time) {
	fmt.Fprintf(w, "event %s, seq %d", ev.ID, ev.Seq)
	if ev.Type != "" {
		fmt.Fprintf(w, ", type %s", ev.Type)
	}
	if ev.AcceptedAt != nil {
		fmt.Fprintf(w, ", accepted %s", stamp(*ev.AcceptedAt, now))
	}
	fmt.Fprintln(w)
	if len(ev.Deliveries) == 0 {
		fmt.Fprintln(w, "no subscription is entitled to it")
		return
	}
	fmt.Fprintln(w)
	tw := newTable(w)
	fmt.Fprintln(tw, "SUBSCRIPTION\tSTATE\tATTEMPT\tDUE/AT\tREASON")
	for _, d := range ev.Deliveries {
		attempt, when := "-", "-"
		if d.Attempt > 0 {
			attempt = strconv.Itoa(d.Attempt)
		}
		switch {
		case d.DueAt != nil:
			when = ago(*d.DueAt, now)
		case d.At != nil:
			when = ago(*d.At, now)
		}
		reason := d.Reason
		if d.LastStatus != 0 {
			reason = strings.TrimSpace(fmt.Sprintf("%s (last status %d)", reason, d.LastStatus))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Subscription, d.State, attempt, when, reason)
	}
	tw.Flush()
}
