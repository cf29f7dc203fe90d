package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/sluicehq/sluice/client"
)

// tenantsCmd: sluice tenants token TENANT issues an admin token scoped to
// one tenant (it sees and manages that tenant's subscriptions only). The
// sidecar keeps only the token's hash, so it is printed this once.
func tenantsCmd(args []string, stdout, stderr io.Writer) error {
	const about = `Issues an admin token scoped to TENANT: it sees and manages that
tenant's subscriptions, dead letters and events only. The sidecar keeps
only its hash, so it is printed this once; 'sluice tokens' lists and
revokes tokens, and issues ones that expire.`
	if len(args) > 0 && isHelp(args[0]) {
		return groupHelp(stdout, "tenants", adminAbout(about))
	}
	if len(args) == 0 || args[0] != "token" {
		if len(args) > 0 {
			return fmt.Errorf("tenants: unknown subcommand %q: want 'tenants token TENANT'", args[0])
		}
		return errors.New("tenants: want 'tenants token TENANT'")
	}
	const name = "tenants token"
	fs, af := subFlags(name, about, stdout)
	id, api, err := oneArg(name, "TENANT", fs, af, args[1:], stderr)
	if err != nil {
		return err
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	ans, err := api.IssueTenantToken(ctx, id)
	if err != nil {
		if client.IsMaybeDone(err) {
			err = fmt.Errorf("%w (a token may have been issued that nobody was shown: issue another)", err)
		}
		return fmt.Errorf("%s %s: %w", name, id, explain(err))
	}
	if *af.json {
		fmt.Fprintln(stderr, "sluice: the answer holds the token: "+onceNote)
		return printJSON(stdout, ans)
	}
	fmt.Fprintf(stdout, "token of tenant %s: %s\n  %s\n", ans.Tenant, ans.Token, onceNote)
	return nil
}
