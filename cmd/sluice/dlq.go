package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/api"
)

func dlqCmd(args []string, stdout, stderr io.Writer) error {
	const sub = "want 'dlq list', 'dlq show SUBSCRIPTION SEQ' or 'dlq replay'"
	if len(args) == 0 {
		return errors.New("dlq: " + sub)
	}
	switch args[0] {
	case "list":
		return dlqList(args[1:], stdout, stderr)
	case "show":
		return dlqShow(args[1:], stdout, stderr)
	case "replay":
		return dlqReplay(args[1:], stdout, stderr)
	}
	if isHelp(args[0]) {
		return groupHelp(stdout, "dlq", adminAbout(`The dead letters: deliveries sluice gave up on, kept with why (the
reason), the last answer and the body, until replayed. list pages through
them, show prints one with its body, replay schedules them again.`))
	}
	return fmt.Errorf("dlq: unknown subcommand %q: %s", args[0], sub)
}

func dlqList(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq list", adminAbout(`Lists dead letters by subscription and sequence number, a page at a time (--limit, the API's
100 by default; it prints the --cursor of the next page, and --all follows
the pages to the end): subscription, sequence number, event, type, reason,
attempts, the last status, when it died and whether a replay delivered it.
The reasons: `+reasonList+`.`), stdout)
	af := addAdminFlags(fs)
	sub := fs.String("subscription", "", "only this subscription's dead letters")
	reason := fs.String("reason", "", "only dead letters with this reason: "+reasonList)
	limit := fs.Int("limit", 0, "dead letters per page, 1..1000 (default: the API's 100)")
	cursor := fs.String("cursor", "", "start after this SUBSCRIPTION/SEQ (the 'next' of a previous page)")
	all := fs.Bool("all", false, "follow the pages to the end")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("dlq list", pos); err != nil {
		return err
	}
	if err := checkReason("dlq list", *reason); err != nil {
		return err
	}
	ac, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("dlq list: %w", err)
	}
	q := client.DeadLetterQuery{Subscription: *sub, Reason: *reason, Limit: *limit, Cursor: *cursor}
	out := api.DeadLetterPage{DeadLetters: []api.DeadLetterInfo{}}
	for {
		ctx, cancel := callCtx(cliCallTimeout)
		page, err := ac.DeadLetters(ctx, q)
		cancel()
		if err != nil {
			return fmt.Errorf("dlq list: %w", explain(err))
		}
		out.DeadLetters, out.Next = append(out.DeadLetters, page.DeadLetters...), page.Next
		if !*all || out.Next == "" {
			break
		}
		q.Cursor = out.Next
	}
	if *af.json {
		return printJSON(stdout, out)
	}
	if len(out.DeadLetters) == 0 {
		fmt.Fprintln(stdout, "no dead letters")
		return nil
	}
	now := time.Now()
	tw := newTable(stdout)
	fmt.Fprintln(tw, "SUBSCRIPTION\tSEQ\tEVENT\tTYPE\tREASON\tATTEMPTS\tLAST\tDEAD\tREPLAYED")
	for _, d := range out.DeadLetters {
		last := "-"
		if d.LastStatus != 0 {
			last = strconv.Itoa(d.LastStatus)
		} else if d.LastError != "" {
			last = "error"
		}
		replayed := "-"
		if d.Replays > 0 {
			replayed = fmt.Sprintf("%dx", d.Replays)
			if !d.DeliveredAt.IsZero() {
				replayed += ", delivered"
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", d.Subscription, d.Seq, d.EventID, d.Type, d.Reason,
			d.Attempts, last, ago(d.DeadAt, now), replayed)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "%d dead letter(s)\n", len(out.DeadLetters))
	if out.Next != "" {
		fmt.Fprintf(stdout, "more: add --cursor %s for the next page, or --all\n", out.Next)
	}
	return nil
}

// reasonList is the dead-letter reasons, for help and errors.
var reasonList = strings.Join(policy.DeadLetterReasons, ", ")

// checkReason refuses a --reason that no dead letter can have: the API
// would answer it with an empty list, which reads as "none of those".
func checkReason(cmd, reason string) error {
	if reason != "" && !slices.Contains(policy.DeadLetterReasons, reason) {
		return fmt.Errorf("%s: --reason: no dead letter has reason %q; the reasons are %s", cmd, reason, reasonList)
	}
	return nil
}

// flagSpeak turns the API's word for its force field into the flag that
// sets it, in a skip's explanation.
func flagSpeak(skipped string) string {
	return strings.Replace(skipped, api.ReplayForceHint, "add --force to replay it again", 1)
}

func parseSeq(cmd, s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%s: SEQ must be a sequence number, got %q", cmd, s)
	}
	return n, nil
}

func dlqShow(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq show", adminAbout(`Prints one dead letter: its event, type, when it was accepted and died,
the reason, the attempts, the last status, error and response, its replays
and whether one was delivered, and the body (base64 when it is not UTF-8).
SUBSCRIPTION and SEQ are the first two columns of 'sluice dlq list'.`), stdout)
	af := addAdminFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("dlq show", pos, "SUBSCRIPTION", "SEQ"); err != nil {
		return err
	}
	seq, err := parseSeq("dlq show", pos[1])
	if err != nil {
		return err
	}
	ac, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("dlq show: %w", err)
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	d, err := ac.DeadLetter(ctx, pos[0], seq)
	if err != nil {
		return fmt.Errorf("dlq show: %w", explain(err))
	}
	if *af.json {
		return printJSON(stdout, d)
	}
	now := time.Now()
	tw := newTable(stdout)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	row("subscription", d.Subscription)
	row("seq", strconv.FormatUint(d.Seq, 10))
	row("event", d.EventID)
	row("type", d.Type)
	row("accepted", stamp(d.AcceptedAt, now))
	row("dead", stamp(d.DeadAt, now))
	row("reason", d.Reason)
	row("attempts", strconv.Itoa(d.Attempts))
	if d.LastStatus != 0 {
		row("last status", strconv.Itoa(d.LastStatus))
	}
	row("last error", d.LastError)
	row("response", strings.TrimSpace(d.Response))
	row("replays", strconv.Itoa(d.Replays))
	if !d.ReplayedAt.IsZero() {
		row("replayed", stamp(d.ReplayedAt, now))
	}
	if !d.DeliveredAt.IsZero() {
		row("delivered", stamp(d.DeliveredAt, now))
	}
	row("content type", d.ContentType)
	tw.Flush()
	switch {
	case d.Body != nil:
		fmt.Fprintf(stdout, "\nbody (%d bytes):\n%s", d.BodyBytes, *d.Body)
		if !strings.HasSuffix(*d.Body, "\n") {
			fmt.Fprintln(stdout)
		}
	case d.BodyBase64 != "":
		fmt.Fprintf(stdout, "\nbody (%d bytes, not UTF-8, base64):\n%s\n", d.BodyBytes, d.BodyBase64)
	}
	return nil
}

func dlqReplay(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq replay", adminAbout(`Schedules dead letters for delivery again: the one SUBSCRIPTION SEQ
names, or with --all every one matching --subscription and --reason (of
every subscription without --subscription). A dead letter already replayed is skipped unless --force, so running a replay twice
does not deliver twice; a dead letter that does not exist is an error.`), stdout)
	af := addAdminFlags(fs)
	sub := fs.String("subscription", "", "with --all: replay this subscription's dead letters")
	reason := fs.String("reason", "", "with --all: replay only dead letters with this reason: "+reasonList)
	all := fs.Bool("all", false, "replay every dead letter matching --subscription and --reason (all subscriptions without --subscription)")
	force := fs.Bool("force", false, "replay dead letters already replayed once")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := checkReason("dlq replay", *reason); err != nil {
		return err
	}
	req := api.ReplayRequest{Force: *force}
	single := len(pos) > 0
	switch {
	case single && (*all || *sub != "" || *reason != ""):
		return errors.New("dlq replay: give SUBSCRIPTION SEQ, or --all with --subscription/--reason, not both")
	case single:
		if err := wantArgs("dlq replay", pos, "SUBSCRIPTION", "SEQ"); err != nil {
			return err
		}
		seq, err := parseSeq("dlq replay", pos[1])
		if err != nil {
			return err
		}
		req.Subscription, req.Seq = pos[0], seq
	case *all:
		req.Filter = &api.ReplayFilter{Subscription: *sub, Reason: *reason}
	default:
		return errors.New("dlq replay: give SUBSCRIPTION SEQ for one dead letter, or --all (with --subscription, --reason) for many")
	}
	ac, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("dlq replay: %w", err)
	}
	// The client does not send a forced replay twice; replaying again
	// without force is skipped by the sidecar, so that one may be.
	ctx, cancel := callCtx(cliReplayTimeout)
	defer cancel()
	res, err := ac.Replay(ctx, req)
	if err != nil {
		return fmt.Errorf("dlq replay: %w", explain(err))
	}
	if *af.json {
		if err := printJSON(stdout, res); err != nil {
			return err
		}
	} else {
		tw := newTable(stdout)
		for _, r := range res.Results {
			what := "replayed"
			if !r.Replayed {
				what = "skipped"
			}
			fmt.Fprintf(tw, "%s\t%s/%d\t%s\t%s\n", what, r.Subscription, r.Seq, r.EventID, flagSpeak(r.Skipped))
		}
		tw.Flush()
		fmt.Fprintf(stdout, "replayed %d, skipped %d\n", res.Replayed, len(res.Results)-res.Replayed)
	}
	// One named dead letter that does not exist is an error; a skip
	// because it was replayed already is not (running a replay twice is
	// safe, and scripts may).
	if single && len(res.Results) == 1 && !res.Results[0].Replayed && strings.HasSuffix(res.Results[0].Skipped, admin.ErrNotFound.Error()) {
		return fmt.Errorf("dlq replay: %s", res.Results[0].Skipped)
	}
	return nil
}
