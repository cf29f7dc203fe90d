package main

// sluice tokens: the operator's view of tenant tokens. A token is shown
// once, when it is issued; afterwards it is named by its id, which is not
// secret.

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sluicehq/sluice/client"
)

func tokensCmd(args []string, stdout, stderr io.Writer) error {
	const want = "want one of issue, list, revoke"
	if len(args) == 0 {
		return errors.New("tokens: " + want)
	}
	switch args[0] {
	case "issue":
		return tokensIssue(args[1:], stdout, stderr)
	case "list":
		return tokensList(args[1:], stdout, stderr)
	case "revoke":
		return tokensRevoke(args[1:], stdout, stderr)
	}
	if isHelp(args[0]) {
		return groupHelp(stdout, "tokens", adminAbout(`Tenant tokens: admin tokens scoped to one tenant. issue makes one (shown
once), list shows them by id, which is not secret, and revoke ends one.`))
	}
	return fmt.Errorf("tokens: unknown subcommand %q: %s", args[0], want)
}

func tokensIssue(args []string, stdout, stderr io.Writer) error {
	const name = "tokens issue"
	fs, af := subFlags(name, `Issues an admin token scoped to TENANT, with an id to list and revoke it
by and, given --expires-in, an expiry; without it the token works until
revoked. The sidecar keeps only its hash: the token is printed this once.`, stdout)
	expiresIn := fs.Duration("expires-in", 0, "the token stops working this long after it is issued, at most 8784h (a year); 0: when revoked")
	tenant, api, err := oneArg(name, "TENANT", fs, af, args, stderr)
	if err != nil {
		return err
	}
	if *expiresIn < 0 {
		return fmt.Errorf("%s: --expires-in: want a positive duration such as 720h, got %s", name, *expiresIn)
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	ans, err := api.IssueTenantTokenExpiring(ctx, tenant, *expiresIn)
	if err != nil {
		if client.IsMaybeDone(err) {
			err = fmt.Errorf("%w (a token may have been issued that nobody was shown: see 'sluice tokens list %s', revoke what you do not know, and issue another)", err, tenant)
		}
		return fmt.Errorf("%s %s: %w", name, tenant, explain(err))
	}
	if *af.json {
		fmt.Fprintln(stderr, "sluice: the answer holds the token: "+onceNote)
		return printJSON(stdout, ans)
	}
	expires := "never (revoke it with 'sluice tokens revoke " + ans.Tenant + " " + ans.ID + "')"
	if ans.ExpiresAt != nil {
		expires = stamp(*ans.ExpiresAt, time.Now())
	}
	fmt.Fprintf(stdout, "token %s of tenant %s: %s\n  expires: %s\n  %s\n", ans.ID, ans.Tenant, ans.Token, expires, onceNote)
	return nil
}

func tokensList(args []string, stdout, stderr io.Writer) error {
	const name = "tokens list"
	fs, af := subFlags(name, `Lists the tenant tokens, of TENANT or of all tenants: tenant, id, where it
comes from (the config's admin.tokens, or the API), when it was made and
when it expires. The tokens themselves are not shown: the sidecar does not
keep them.`, stdout)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("%s: want at most TENANT, got %d arguments", name, len(pos))
	}
	api, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	tenant := ""
	if len(pos) == 1 {
		tenant = pos[0]
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	list, err := api.TenantTokens(ctx, tenant)
	if err != nil {
		return fmt.Errorf("%s: %w", name, explain(err))
	}
	if *af.json {
		return printJSON(stdout, list)
	}
	if len(list.Tokens) == 0 {
		fmt.Fprintln(stdout, "no tenant tokens")
		return nil
	}
	now := time.Now()
	tw := newTable(stdout)
	fmt.Fprintln(tw, "TENANT\tID\tSOURCE\tCREATED\tEXPIRES")
	for _, t := range list.Tokens {
		created, expires := "-", "never"
		if t.CreatedAt != nil {
			created = stamp(*t.CreatedAt, now)
		}
		if t.ExpiresAt != nil {
			expires = stamp(*t.ExpiresAt, now)
		}
		if t.Expired {
			expires += ", expired"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Tenant, t.ID, cmp.Or(t.Source, "-"), created, expires)
	}
	return tw.Flush()
}

func tokensRevoke(args []string, stdout, stderr io.Writer) error {
	const name = "tokens revoke"
	fs, af := subFlags(name, `Revokes the token ID of TENANT (the ids are in 'sluice tokens list'): it
stops working at once.`, stdout)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(name, pos, "TENANT", "ID"); err != nil {
		return err
	}
	api, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	info, err := api.RevokeTenantToken(ctx, pos[0], pos[1])
	if err != nil {
		return fmt.Errorf("%s %s %s: %w", name, pos[0], pos[1], explain(err))
	}
	if *af.json {
		return printJSON(stdout, info)
	}
	fmt.Fprintf(stdout, "revoked token %s of tenant %s\n", info.ID, info.Tenant)
	return nil
}
