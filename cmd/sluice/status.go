package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
)

// statusJSON is what status --json prints: the two answers it reads.
type statusJSON struct {
	Subscriptions *api.SubscriptionList `json:"subscriptions"`
	RetryBudget   *policy.BudgetStats   `json:"retry_budget"`
}

// statusCmd prints every lane and the shared retry budget.
func statusCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", adminAbout(`Prints one row per subscription: its state, deliveries in flight against
its cap (marked ! at 80% of it or more), backlog, retries scheduled, the
breaker, and the delivered, retried and dead-lettered counts since start;
then why any paused subscription is paused, and how full the shared retry
budget is.`), stdout)
	af := addAdminFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("status", pos); err != nil {
		return err
	}
	api, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	var out statusJSON
	ctx, cancel := callCtx(cliCallTimeout)
	out.Subscriptions, err = api.Subscriptions(ctx)
	cancel()
	if err != nil {
		return fmt.Errorf("status: %w", explain(err))
	}
	ctx, cancel = callCtx(cliCallTimeout)
	out.RetryBudget, err = api.RetryBudget(ctx)
	cancel()
	if err != nil {
		return fmt.Errorf("status: %w", explain(err))
	}
	if *af.json {
		return printJSON(stdout, out)
	}
	writeStatus(stdout, out.Subscriptions.Subscriptions, *out.RetryBudget)
	return nil
}

// saturated says whether a lane uses 80% or more of its cap, the level the
// runbook's alert fires at.
func saturated(inFlight, limit int) bool { return limit > 0 && inFlight*5 >= limit*4 }

func writeStatus(w io.Writer, lanes []api.LaneStatus, b policy.BudgetStats) {
	if len(lanes) == 0 {
		fmt.Fprintln(w, "no subscriptions")
	} else {
		tw := newTable(w)
		// Fleet mode names each lane's owner; a single sidecar owns all.
		fleet := slices.ContainsFunc(lanes, func(l api.LaneStatus) bool { return l.Owner != "" })
		head := "SUBSCRIPTION\tSTATE\tIN FLIGHT/CAP\tBACKLOG\tOLDEST\tRETRIES\tBREAKER\tDELIVERED\tRETRIED\tDEAD"
		if fleet {
			head += "\tOWNER"
		}
		fmt.Fprintln(tw, head)
		for _, l := range lanes {
			fill := fmt.Sprintf("%d/%d", l.InFlight, l.Cap)
			if saturated(l.InFlight, l.Cap) {
				fill += " !"
			}
			oldest := "-"
			if l.OldestAge > 0 {
				oldest = (time.Duration(l.OldestAge * float64(time.Second))).Round(time.Second).String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%d\t%d\t%d", l.Subscription, l.State, fill, l.Backlog,
				oldest, l.Scheduled, l.Breaker, l.Delivered, l.Retried, l.DeadLettered)
			if fleet {
				fmt.Fprintf(tw, "\t%s", cmp.Or(l.Owner, "(none yet)"))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
		for _, l := range lanes {
			if l.PausedBy != "" {
				fmt.Fprintf(w, "%s is paused: %s\n", l.Subscription, l.PausedBy)
			}
			if l.HeldUntil != nil {
				fmt.Fprintf(w, "%s is held until %s: its endpoint announced its limit (%s)\n", l.Subscription, l.HeldUntil.Local().Format(time.TimeOnly), l.HeldBy)
			}
		}
	}
	fmt.Fprintf(w, "\nretry budget: %.0f%% available (successes %d, retries %d, allowed %d)", b.Available*100, b.Successes, b.Retries, b.Allowed)
	if b.Available <= 0 {
		fmt.Fprint(w, "; empty: due retries wait until deliveries succeed again")
	}
	fmt.Fprintln(w)
}
