package main

// sluice subscriptions: the subscription API in a terminal.
// Subscriptions made here are the API's (managed_by api): a reload of the
// config file never touches them, and the file's own cannot be changed
// here. A secret or token the sidecar generates is printed once, the only
// time it is shown.

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/proxy/api"
)

// onceNote follows every secret and token the sidecar shows: it keeps
// none of them in a form it could show again.
const onceNote = "store it now; it is not shown again"

func subscriptionsCmd(args []string, stdout, stderr io.Writer) error {
	const want = "want one of create, list, get, update, delete, rotate-secret, recover"
	if len(args) == 0 {
		return errors.New("subscriptions: " + want)
	}
	cmds := map[string]func([]string, io.Writer, io.Writer) error{
		"create": subCreate, "list": subList, "get": subGet, "update": subUpdate,
		"delete": subDelete, "rotate-secret": subRotate, "recover": subRecover,
	}
	if f, ok := cmds[args[0]]; ok {
		return f(args[1:], stdout, stderr)
	}
	if isHelp(args[0]) {
		return groupHelp(stdout, "subscriptions", adminAbout(`The subscription API in a terminal. Subscriptions made here are the API's
(managed by ac): they outlive restarts, a reload of the config file never
touches them, and the file's own cannot be changed or deleted here.`))
	}
	return fmt.Errorf("subscriptions: unknown subcommand %q: %s", args[0], want)
}

// subFlags are an admin command's flag set with its admin flags.
func subFlags(name, about string, stdout io.Writer) (*flag.FlagSet, adminFlags) {
	fs := newFlagSet(name, adminAbout(about), stdout)
	return fs, addAdminFlags(fs)
}

func subCreate(args []string, stdout, stderr io.Writer) error {
	const name = "subscriptions create"
	fs, af := subFlags(name, `Creates a subscription through the admin API, from --id and --url (and
--types, --tenant, --secret) or from one subscription in the config file's
keys in --file, the flags overriding its keys. A bad key is refused with
the sidecar's message naming it. Without --secret the sidecar generates a
whsec_ secret and this prints it once: store it then.`, stdout)
	file := fs.String("file", "", "the subscription as JSON or YAML, in the config file's keys (- for stdin); the flags below override its keys")
	fs.String("id", "", "the subscription's id ([a-z0-9._-], unique)")
	fs.String("url", "", "the endpoint, https://...")
	types := fs.String("types", "", "event types delivered, comma-separated (default: all)")
	fs.String("tenant", "", "the tenant the subscription belongs to")
	fs.String("secret", "", "the signing secret, whsec_... or an Ed25519 whsk_... (default: the sidecar generates a whsec_ one and prints it once; a flag shows in the process list)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(name, pos); err != nil {
		return err
	}
	doc := map[string]any{}
	if *file != "" {
		if doc, err = readDocument(*file); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "id", "url", "tenant", "secret":
			doc[f.Name] = f.Value.String()
		case "types":
			doc["types"] = splitComma(*types)
		}
	})
	if len(doc) == 0 {
		return fmt.Errorf("%s: give --file FILE, or at least --id and --url", name)
	}
	ac, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	info, err := ac.CreateSubscription(ctx, doc)
	if err != nil {
		if client.IsMaybeDone(err) {
			what, _ := doc["id"].(string)
			err = fmt.Errorf("%w (the sidecar may have created it: look with 'sluice subscriptions get %s' before creating it again; if it exists and had no --secret, run rotate-secret for one you know)", err, cmp.Or(what, "ID"))
		}
		return fmt.Errorf("%s: %w", name, explain(err))
	}
	if *af.json {
		if info.Secret != "" {
			fmt.Fprintln(stderr, "sluice: the answer holds the generated secret: "+onceNote)
		}
		return printJSON(stdout, info)
	}
	fmt.Fprintf(stdout, "created %s (%s)\n", info.Subscription, info.State)
	if info.Secret != "" {
		fmt.Fprintf(stdout, "secret: %s\n  %s\n", info.Secret, onceNote)
	}
	return nil
}

func subList(args []string, stdout, stderr io.Writer) error {
	const name = "subscriptions list"
	fs, af := subFlags(name, `Lists the subscriptions, of the config file and of the API, with their
state, tenant, who manages them (file or ac), deliveries in flight against
the cap, backlog, and the delivered and dead-lettered counts.`, stdout)
	tenant := fs.String("tenant", "", "only the subscriptions of this tenant")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(name, pos); err != nil {
		return err
	}
	ac, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	list, err := ac.SubscriptionsOfTenant(ctx, *tenant)
	if err != nil {
		return fmt.Errorf("%s: %w", name, explain(err))
	}
	if *af.json {
		return printJSON(stdout, list)
	}
	if len(list.Subscriptions) == 0 {
		fmt.Fprintln(stdout, "no subscriptions")
		return nil
	}
	tw := newTable(stdout)
	fmt.Fprintln(tw, "SUBSCRIPTION\tSTATE\tTENANT\tMANAGED BY\tIN FLIGHT/CAP\tBACKLOG\tDELIVERED\tDEAD")
	for _, l := range list.Subscriptions {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%d\t%d\t%d\n", l.Subscription, l.State, cmp.Or(l.Tenant, "-"),
			cmp.Or(l.ManagedBy, api.ManagedByFile), l.InFlight, l.Cap, l.Backlog, l.Delivered, l.DeadLettered)
	}
	return tw.Flush()
}

func subGet(args []string, stdout, stderr io.Writer) error {
	const name = "subscriptions get"
	fs, af := subFlags(name, `Prints subscription ID: its state, tenant, who manages it, its counts and
breaker, the public key of an Ed25519 secret, and its settings as YAML in
the config file's keys, secrets redacted.`, stdout)
	id, ac, err := oneArg(name, "ID", fs, af, args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	info, err := ac.Subscription(ctx, id)
	if err != nil {
		return fmt.Errorf("%s: %w", name, explain(err))
	}
	if *af.json {
		return printJSON(stdout, info)
	}
	return writeSubscription(stdout, info)
}

// writeSubscription prints a subscription's lane and its settings (as
// YAML, the config file's form; secrets are redacted by the sidecar).
func writeSubscription(w io.Writer, info *api.SubscriptionInfo) error {
	tw := newTable(w)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	l := info.LaneStatus
	row("subscription", l.Subscription)
	row("state", l.State)
	row("paused by", l.PausedBy)
	if l.HeldUntil != nil {
		row("held until", l.HeldUntil.Local().Format(time.RFC3339)+" (the endpoint's announced limit: "+l.HeldBy+")")
	}
	row("tenant", l.Tenant)
	row("managed by", cmp.Or(l.ManagedBy, api.ManagedByFile))
	row("owner", l.Owner)
	row("in flight/cap", fmt.Sprintf("%d/%d", l.InFlight, l.Cap))
	row("backlog", strconv.FormatUint(l.Backlog, 10))
	row("retries", strconv.FormatInt(l.Scheduled, 10))
	row("breaker", l.Breaker)
	row("delivered", strconv.FormatUint(l.Delivered, 10))
	row("retried", strconv.FormatUint(l.Retried, 10))
	row("dead", strconv.FormatUint(l.DeadLettered, 10))
	for _, pk := range info.PublicKeys {
		row("public key", pk) // of a whsk_ secret: receivers verify v1a with it
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(info.Config) == 0 {
		return nil
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(info.Config); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nconfig:\n")
	for _, line := range strings.SplitAfter(strings.TrimRight(b.String(), "\n"), "\n") {
		fmt.Fprint(w, "  "+line)
	}
	fmt.Fprintln(w)
	return nil
}

func subUpdate(args []string, stdout, stderr io.Writer) error {
	const name = "subscriptions update"
	fs, af := subFlags(name, `Changes subscription ID, one the API manages, by a JSON merge patch: the
keys given replace the subscription's, null removes one. Give the patch in
--file, or key by key with --set. Secrets are not set with --set: use
rotate-secret, which keeps the old one signing for a grace. A subscription
of the config file answers 409: change the file.`, stdout)
	file := fs.String("file", "", "a JSON merge patch (RFC 7396) as JSON or YAML (- for stdin): its keys replace the subscription's, null removes one")
	var sets []string
	fs.Func("set", "KEY=VALUE to change, repeatable; a dotted KEY reaches into an object (rate.per_second=50); VALUE is JSON when it parses as JSON (8, true, [\"a\",\"b\"], null removes the key), else a string", func(s string) error {
		sets = append(sets, s)
		return nil
	})
	id, ac, err := oneArg(name, "ID", fs, af, args, stderr)
	if err != nil {
		return err
	}
	patch := map[string]any{}
	if *file != "" {
		if patch, err = readDocument(*file); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	for _, s := range sets {
		if err := setPatch(patch, s); err != nil {
			return fmt.Errorf("%s: --set %s: %w", name, s, err)
		}
	}
	if len(patch) == 0 {
		return fmt.Errorf("%s: give --file PATCH or --set KEY=VALUE", name)
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	info, err := ac.UpdateSubscription(ctx, id, patch)
	if err != nil {
		return fmt.Errorf("%s: %w", name, explain(err))
	}
	if *af.json {
		return printJSON(stdout, info)
	}
	fmt.Fprintf(stdout, "updated %s: %s\n", info.Subscription, strings.Join(slices.Sorted(maps.Keys(patch)), ", "))
	return nil
}

// setPatch adds one --set KEY=VALUE to a merge patch. Secrets are not
// set this way: a patch replaces them at once, while rotate-secret keeps
// the old one signing for a grace (and a flag shows in the process list);
// a --file patch may still name them, deliberately.
func setPatch(patch map[string]any, kv string) error {
	key, raw, ok := strings.Cut(kv, "=")
	if !ok || key == "" {
		return errors.New("want KEY=VALUE")
	}
	path := strings.Split(key, ".")
	switch path[0] {
	case "secret", "secrets", "secret_file", "secret_env":
		return fmt.Errorf("%s: use 'sluice subscriptions rotate-secret ID' for a new secret (the old one keeps signing for --grace); a patch in --file replaces the secrets at once, if you mean that", path[0])
	}
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		v = raw // not JSON: the string as written
	}
	m := patch
	for i, p := range path {
		if p == "" {
			return fmt.Errorf("key %q has an empty part", key)
		}
		if i == len(path)-1 {
			if _, dup := m[p]; dup {
				return fmt.Errorf("%s is set twice", key)
			}
			m[p] = v
			return nil
		}
		next, exists := m[p]
		if !exists {
			n := map[string]any{}
			m[p], m = n, n
			continue
		}
		nm, isMap := next.(map[string]any)
		if !isMap {
			return fmt.Errorf("%s is set to a value already, so %s cannot reach into it", strings.Join(path[:i+1], "."), key)
		}
		m = nm
	}
	return nil
}

func subDelete(args []string, stdout, stderr io.Writer) error {
	const name = "subscriptions delete"
	fs, af := subFlags(name, `Deletes subscription ID, one the API manages: it takes no new events,
delivers the backlog it is still owed, then goes.`, stdout)
	id, ac, err := oneArg(name, "ID", fs, af, args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	info, err := ac.DeleteSubscription(ctx, id)
	if err != nil {
		return fmt.Errorf("%s: %w", name, explain(err))
	}
	if *af.json {
		return printJSON(stdout, info)
	}
	fmt.Fprintf(stdout, "deleted %s (%s): it takes no new events, delivers what it is still owed (backlog %d), then goes\n",
		info.Subscription, info.State, info.Backlog)
	return nil
}

func subRotate(args []string, stdout, stderr io.Writer) error {
	const name = "subscriptions rotate-secret"
	fs, af := subFlags(name, `Gives subscription ID a new generated secret, printed once; the old ones
keep signing beside it for --grace, so that receivers can move over. An
Ed25519 subscription gets a new whsk_ key, printed with its whpk_ public
key.`, stdout)
	grace := fs.String("grace", "", "how long the old secrets keep signing beside the new one, e.g. 24h; 0s retires them at once (default: the sidecar's, 24h)")
	id, ac, err := oneArg(name, "ID", fs, af, args, stderr)
	if err != nil {
		return err
	}
	g := time.Duration(-1) // the sidecar's default
	if *grace != "" {
		if g, err = time.ParseDuration(*grace); err != nil || g < 0 {
			return fmt.Errorf("%s: --grace: want a duration such as 24h or 0s, got %q", name, *grace)
		}
	}
	ctx, cancel := callCtx(cliCallTimeout)
	defer cancel()
	ans, err := ac.RotateSecret(ctx, id, g)
	if err != nil {
		if client.IsMaybeDone(err) {
			err = fmt.Errorf("%w (the secret may have been rotated: run rotate-secret again for one you know; the one lost stops signing after the grace)", err)
		}
		return fmt.Errorf("%s: %w", name, explain(err))
	}
	if *af.json {
		fmt.Fprintln(stderr, "sluice: the answer holds the new secret: "+onceNote)
		return printJSON(stdout, ans)
	}
	fmt.Fprintf(stdout, "new secret of %s: %s\n  %s\n", ans.Subscription, ans.Secret, onceNote)
	if ans.PublicKey != "" {
		fmt.Fprintf(stdout, "its public key, for receivers to verify v1a signatures: %s\n", ans.PublicKey)
	}
	if ans.OldUntil.IsZero() {
		fmt.Fprintln(stdout, "the old secrets no longer sign")
	} else {
		fmt.Fprintf(stdout, "the old secrets sign beside it until %s\n", stamp(ans.OldUntil, time.Now()))
	}
	return nil
}

func subRecover(args []string, stdout, stderr io.Writer) error {
	const name = "subscriptions recover"
	fs, af := subFlags(name, `Replays, once each, the dead letters of subscription ID whose events were
accepted from --since to --until: what to run once an endpoint that was
down is back. A dead letter a replay already delivered is counted, not
replayed again; one already replayed and not delivered, or with a retry
scheduled, is skipped ('sluice dlq replay --force' replays it again).`, stdout)
	sinceF := fs.String("since", "", "replay dead letters of events accepted from this time: RFC 3339 (2026-11-30T12:00:00Z) or a duration before now (24h)")
	untilF := fs.String("until", "", "... and before this time, the same forms (default: now)")
	id, ac, err := oneArg(name, "ID", fs, af, args, stderr)
	if err != nil {
		return err
	}
	now := time.Now()
	if *sinceF == "" {
		return fmt.Errorf("%s: --since is required", name)
	}
	since, err := parseWhen(*sinceF, now)
	if err != nil {
		return fmt.Errorf("%s: --since: %w", name, err)
	}
	var until time.Time
	if *untilF != "" {
		if until, err = parseWhen(*untilF, now); err != nil {
			return fmt.Errorf("%s: --until: %w", name, err)
		}
	}
	ctx, cancel := callCtx(cliReplayTimeout)
	defer cancel()
	ans, err := ac.Recover(ctx, id, since, until)
	if err != nil {
		return fmt.Errorf("%s: %w", name, explain(err))
	}
	if *af.json {
		return printJSON(stdout, ans)
	}
	fmt.Fprintln(stdout, recoverSummary(ans))
	return nil
}

// recoverSummary counts every dead letter in the range, so that a range
// whose letters were all delivered already does not read as an empty
// one.
func recoverSummary(ans *api.RecoverAnswer) string {
	s := fmt.Sprintf("%s: %s in range, %d replayed", ans.Subscription, plural(ans.Matched+ans.Delivered, "dead letter"), ans.Replayed)
	var why []string
	if ans.Delivered > 0 {
		why = append(why, fmt.Sprintf("%d already delivered", ans.Delivered))
	}
	if ans.Skipped > 0 {
		why = append(why, fmt.Sprintf("%d skipped: replayed before and not delivered yet, or a retry scheduled (sluice dlq replay --force replays one again)", ans.Skipped))
	}
	if len(why) > 0 {
		s += "; " + strings.Join(why, "; ")
	}
	return s
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// parseWhen reads a time as RFC 3339, or as a duration before now ("24h",
// "90m").
func parseWhen(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("want an RFC 3339 time (2026-11-30T12:00:00Z) or a duration before now (24h), got %q", s)
}

// readDocument reads one subscription document or patch: JSON (a .json
// file, or text starting with '{') or YAML, converted to what JSON would
// decode to. "-" reads stdin.
func readDocument(path string) (map[string]any, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, err
	}
	trimmed := bytes.TrimSpace(b)
	if strings.EqualFold(filepath.Ext(path), ".json") || bytes.HasPrefix(trimmed, []byte("{")) {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.UseNumber() // numbers go to the sidecar as written
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			return nil, fmt.Errorf("%s: not a JSON object: %w", path, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("%s: more than one JSON value", path)
		}
		if doc == nil { // null
			return nil, fmt.Errorf("%s: not a JSON object", path)
		}
		return doc, nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var v any
	if err := dec.Decode(&v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: empty", path)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: want one YAML document (one subscription)", path)
	}
	j, err := yamlToJSON(v, "")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	doc, ok := j.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: want a mapping of the config file's keys (id, url, ...), got %T", path, j)
	}
	return doc, nil
}

// yamlToJSON turns what yaml.v3 decodes into what encoding/json encodes
// as the same document: mappings with keys that are not strings (classify:
// {409: ack}) get their keys as written.
func yamlToJSON(v any, at string) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			c, err := yamlToJSON(e, at+"."+k)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			ks := fmt.Sprint(k)
			c, err := yamlToJSON(e, at+"."+ks)
			if err != nil {
				return nil, err
			}
			out[ks] = c
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, err := yamlToJSON(e, fmt.Sprintf("%s[%d]", at, i))
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case time.Time:
		// A bare YAML timestamp; the sidecar reads times as RFC 3339.
		return v.Format(time.RFC3339Nano), nil
	case nil, string, bool, int, int64, uint64, float64:
		return v, nil
	}
	return nil, fmt.Errorf("%s: a YAML value of type %T has no JSON form", strings.TrimPrefix(at, "."), v)
}

func splitComma(s string) []string {
	out := []string{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
