package main

// The admin-client subcommands (status, dlq, events, pause, resume) and
// verify. The admin commands speak the admin API over HTTP through
// go-retryablehttp, so that a command run while the sidecar restarts waits
// for it rather than failing.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/signing"
)

// stdin is where verify reads the body; tests replace it.
var stdin io.Reader = os.Stdin

// Retry schedule of the admin commands: connection errors and 5xx answers
// are tried again after 100ms, 200ms, 400ms, 800ms, 1.6s and 2s, 5.1s of
// waiting in all, which covers a sidecar restart (Badger reopens in well
// under a second) and stays under ten seconds when the sidecar is gone.
// 4xx answers are never retried: asking again cannot change them.
const (
	cliRetryMax     = 6
	cliRetryWaitMin = 100 * time.Millisecond
	cliRetryWaitMax = 2 * time.Second
	// cliAttemptTimeout bounds one attempt; cliCallTimeout one call with
	// its retries. A replay can touch many dead letters, so it has only
	// cliReplayTimeout for the whole call.
	cliAttemptTimeout = 5 * time.Second
	cliCallTimeout    = 15 * time.Second
	cliReplayTimeout  = 2 * time.Minute
	// cliMaxResponseBytes bounds what is read of an answer; a dead letter
	// with its body is the largest.
	cliMaxResponseBytes = 64 << 20
)

// adminClient finds the admin API the way serve finds its listener: from
// the config file (configPath, else $SLUICE_CONFIG via the caller's flag
// default) and the SLUICE_ environment. adminURL, when set, overrides the
// address; the token still comes from the config. A wildcard listen
// address is reached on 127.0.0.1, a unix:// socket through a dialer for
// it. The returned client has no timeout; callers set their own.
func adminClient(configPath, adminURL string) (base string, client *http.Client, token string, err error) {
	cfg, err := LoadConfig(configPath, os.Environ(), nil)
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
	config, admin *string
	json          *bool
}

func addAdminFlags(fs *flag.FlagSet) adminFlags {
	return adminFlags{
		config: fs.String("config", os.Getenv(envConfigFile), "the sidecar's config file, for admin.listen and the admin token (default: $SLUICE_CONFIG)"),
		admin:  fs.String("admin", "", "admin API base URL (default: from the config)"),
		json:   fs.Bool("json", false, "print the API's JSON instead of text"),
	}
}

func (f adminFlags) open(stderr io.Writer) (*adminAPI, error) {
	base, client, token, err := adminClient(*f.config, *f.admin)
	if err != nil {
		return nil, err
	}
	return newAdminAPI(base, client, token, stderr), nil
}

// adminAPI calls the admin API with retries. It is used by one command at
// a time (lastFailure is not synchronised).
type adminAPI struct {
	base, token string
	rc          *retryablehttp.Client
	stderr      io.Writer
	lastFailure string // why the previous attempt is being retried
}

func newAdminAPI(base string, client *http.Client, token string, stderr io.Writer) *adminAPI {
	a := &adminAPI{base: base, token: token, stderr: stderr}
	a.rc = &retryablehttp.Client{
		HTTPClient:   client,
		RetryWaitMin: cliRetryWaitMin,
		RetryWaitMax: cliRetryWaitMax,
		RetryMax:     cliRetryMax,
		CheckRetry:   a.checkRetry,
		Backoff:      cappedBackoff,
		// Tell the person waiting why nothing happens yet.
		RequestLogHook: func(_ retryablehttp.Logger, r *http.Request, retry int) {
			if retry > 0 {
				fmt.Fprintf(a.stderr, "sluice: admin API at %s: %s; retry %d of %d\n", a.base, a.lastFailure, retry, cliRetryMax)
			}
		},
		ErrorHandler: func(resp *http.Response, err error, tries int) (*http.Response, error) {
			if err != nil && tries > 1 {
				err = fmt.Errorf("gave up after %d attempts: %w", tries, err)
			}
			return resp, err
		},
	}
	return a
}

// noResendKey marks a request whose repetition is not harmless (a forced
// replay): it is tried again only when the connection was never made.
type noResendKey struct{}

// checkRetry retries connection errors and 5xx answers (but 501), never
// 4xx, and never after the context ends.
func (a *adminAPI) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	noResend, _ := ctx.Value(noResendKey{}).(bool)
	if err != nil {
		var op *net.OpError
		if noResend && !(errors.As(err, &op) && op.Op == "dial") {
			return false, nil
		}
		// The library's policy declines what cannot get better: bad
		// schemes, redirect loops, certificate errors.
		retry, _ := retryablehttp.DefaultRetryPolicy(ctx, resp, err)
		a.lastFailure = err.Error()
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			a.lastFailure = ue.Err.Error() // without the method and URL again
		}
		return retry, nil
	}
	if resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented && !noResend {
		a.lastFailure = "answered " + resp.Status
		return true, nil
	}
	return false, nil
}

// cappedBackoff is the library's exponential backoff, with a Retry-After
// held to max too: a command must not hang on a long Retry-After.
func cappedBackoff(lo, hi time.Duration, attempt int, resp *http.Response) time.Duration {
	return min(retryablehttp.DefaultBackoff(lo, hi, attempt, resp), hi)
}

// apiError is a non-2xx answer, carrying the API's {"error": ...} message.
type apiError struct {
	Status string
	Code   int
	Msg    string
}

func (e *apiError) Error() string {
	msg := e.Status
	if e.Msg != "" {
		msg += ": " + e.Msg
	}
	if e.Code == http.StatusUnauthorized {
		msg += " (the token comes from admin.token or admin.token_file in the config: give --config or set $SLUICE_CONFIG)"
	}
	return msg
}

// call sends one request, body encoded as JSON when not nil, and returns the
// answer's body. resend says whether repeating the request after a lost
// answer is harmless.
func (a *adminAPI) call(method, path string, body any, resend bool) (json.RawMessage, error) {
	// A replay can take longer than a read; only the call's deadline
	// bounds it.
	attempt, total := cliAttemptTimeout, cliCallTimeout
	if strings.HasSuffix(path, "/replay") {
		attempt, total = 0, cliReplayTimeout
	}
	a.rc.HTTPClient.Timeout = attempt
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	if !resend {
		ctx = context.WithValue(ctx, noResendKey{}, true)
	}
	var raw any
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		raw = b
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, method, a.base+path, raw)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.rc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API at %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, cliMaxResponseBytes))
	if err != nil {
		return nil, fmt.Errorf("admin API at %s: read answer: %w", a.base, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &apiError{Status: resp.Status, Code: resp.StatusCode}
		var m struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &m) == nil && m.Error != "" {
			e.Msg = m.Error
		} else {
			e.Msg = strings.TrimSpace(string(b[:min(len(b), 200)]))
		}
		return nil, e
	}
	return b, nil
}

func (a *adminAPI) get(path string, q url.Values) (json.RawMessage, error) {
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return a.call(http.MethodGet, path, nil, true)
}

// printJSON writes raw indented, ending with a newline.
func printJSON(w io.Writer, raw []byte) error {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return err
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

// parseArgs parses flags placed before, between or after the positional
// arguments, which it returns ("--" ends the flags).
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
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

func wantArgs(cmd string, pos []string, names ...string) error {
	if len(pos) != len(names) {
		if len(names) == 0 {
			return fmt.Errorf("%s: unexpected argument %q", cmd, pos[0])
		}
		return fmt.Errorf("%s: want %s, got %d argument(s)", cmd, strings.Join(names, " "), len(pos))
	}
	return nil
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 8, 2, ' ', 0) }

// ago describes t relative to now: "3m12s ago", "in 2s".
func ago(t, now time.Time) string {
	d := t.Sub(now)
	if d < 0 {
		return roundDuration(-d) + " ago"
	}
	return "in " + roundDuration(d)
}

func roundDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
}

func stamp(t, now time.Time) string {
	return t.Local().Format("2006-01-02 15:04:05 MST") + " (" + ago(t, now) + ")"
}

// statusCmd prints every lane and the shared retry budget.
func statusCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
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
	subs, err := api.get("/v1/subscriptions", nil)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	budget, err := api.get("/v1/retry-budget", nil)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if *af.json {
		out, err := json.Marshal(map[string]json.RawMessage{"subscriptions": subs, "retry_budget": budget})
		if err != nil {
			return err
		}
		return printJSON(stdout, out)
	}
	var s struct {
		Head          uint64             `json:"head"`
		Subscriptions []proxy.LaneStatus `json:"subscriptions"`
	}
	var b policy.BudgetStats
	if err := json.Unmarshal(subs, &s); err != nil {
		return fmt.Errorf("status: decode /v1/subscriptions: %w", err)
	}
	if err := json.Unmarshal(budget, &b); err != nil {
		return fmt.Errorf("status: decode /v1/retry-budget: %w", err)
	}
	writeStatus(stdout, s.Subscriptions, b)
	return nil
}

// saturated says whether a lane uses 80% or more of its cap, the level the
// runbook's alert fires at.
func saturated(inFlight, limit int) bool { return limit > 0 && inFlight*5 >= limit*4 }

func writeStatus(w io.Writer, lanes []proxy.LaneStatus, b policy.BudgetStats) {
	if len(lanes) == 0 {
		fmt.Fprintln(w, "no subscriptions")
	} else {
		tw := newTable(w)
		fmt.Fprintln(tw, "SUBSCRIPTION\tSTATE\tIN FLIGHT/CAP\tBACKLOG\tOLDEST\tRETRIES\tBREAKER\tDELIVERED\tRETRIED\tDEAD")
		for _, l := range lanes {
			fill := fmt.Sprintf("%d/%d", l.InFlight, l.Cap)
			if saturated(l.InFlight, l.Cap) {
				fill += " !"
			}
			oldest := "-"
			if l.OldestAge > 0 {
				oldest = (time.Duration(l.OldestAge * float64(time.Second))).Round(time.Second).String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%d\t%d\t%d\n", l.Subscription, l.State, fill, l.Backlog,
				oldest, l.Scheduled, l.Breaker, l.Delivered, l.Retried, l.DeadLettered)
		}
		tw.Flush()
		for _, l := range lanes {
			if l.PausedBy != "" {
				fmt.Fprintf(w, "%s is paused: %s\n", l.Subscription, l.PausedBy)
			}
		}
	}
	fmt.Fprintf(w, "\nretry budget: %.0f%% available (successes %d, retries %d, allowed %d)", b.Available*100, b.Successes, b.Retries, b.Allowed)
	if b.Available <= 0 {
		fmt.Fprint(w, "; empty: due retries wait until deliveries succeed again")
	}
	fmt.Fprintln(w)
}

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
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, "usage: sluice dlq list|show|replay ... (sluice dlq list -h for its flags)")
		return flag.ErrHelp
	}
	return fmt.Errorf("dlq: unknown subcommand %q: %s", args[0], sub)
}

// deadLetter is a dead letter as the admin API shows it.
type deadLetter struct {
	Subscription string    `json:"subscription"`
	Seq          uint64    `json:"seq"`
	EventID      string    `json:"event_id"`
	Type         string    `json:"type"`
	AcceptedAt   time.Time `json:"accepted_at"`
	Reason       string    `json:"reason"`
	Attempts     int       `json:"attempts"`
	LastStatus   int       `json:"last_status"`
	LastError    string    `json:"last_error"`
	Response     string    `json:"response"`
	DeadAt       time.Time `json:"dead_at"`
	Replays      int       `json:"replays"`
	ReplayedAt   time.Time `json:"replayed_at"`
	DeliveredAt  time.Time `json:"delivered_at"`
	BodyBytes    int       `json:"body_bytes"`
	ContentType  string    `json:"content_type"`
	Body         *string   `json:"body"`
	BodyBase64   string    `json:"body_base64"`
}

func dlqList(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dlq list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	af := addAdminFlags(fs)
	sub := fs.String("subscription", "", "only this subscription's dead letters")
	reason := fs.String("reason", "", "only dead letters with this reason (max_attempts, max_age, permanent, backlog_quota, ...)")
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
	api, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("dlq list: %w", err)
	}
	q := url.Values{}
	for k, v := range map[string]string{"subscription": *sub, "reason": *reason, "cursor": *cursor} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if *limit != 0 {
		q.Set("limit", strconv.Itoa(*limit))
	}
	var (
		raws []json.RawMessage
		next string
	)
	for {
		body, err := api.get("/v1/dead-letters", q)
		if err != nil {
			return fmt.Errorf("dlq list: %w", err)
		}
		var page struct {
			DeadLetters []json.RawMessage `json:"dead_letters"`
			Next        string            `json:"next"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return fmt.Errorf("dlq list: decode answer: %w", err)
		}
		raws, next = append(raws, page.DeadLetters...), page.Next
		if !*all || next == "" {
			break
		}
		q.Set("cursor", next)
	}
	if raws == nil {
		raws = []json.RawMessage{}
	}
	if *af.json {
		out, err := json.Marshal(map[string]any{"dead_letters": raws, "next": next})
		if err != nil {
			return err
		}
		return printJSON(stdout, out)
	}
	if len(raws) == 0 {
		fmt.Fprintln(stdout, "no dead letters")
		return nil
	}
	now := time.Now()
	tw := newTable(stdout)
	fmt.Fprintln(tw, "SUBSCRIPTION\tSEQ\tEVENT\tTYPE\tREASON\tATTEMPTS\tLAST\tDEAD\tREPLAYED")
	for _, r := range raws {
		var d deadLetter
		if err := json.Unmarshal(r, &d); err != nil {
			return fmt.Errorf("dlq list: decode answer: %w", err)
		}
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
	fmt.Fprintf(stdout, "%d dead letter(s)\n", len(raws))
	if next != "" {
		fmt.Fprintf(stdout, "more: add --cursor %s for the next page, or --all\n", next)
	}
	return nil
}

func parseSeq(cmd, s string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%s: SEQ must be a sequence number, got %q", cmd, s)
	}
	return n, nil
}

func dlqShow(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dlq show", flag.ContinueOnError)
	fs.SetOutput(stderr)
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
	api, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("dlq show: %w", err)
	}
	body, err := api.get("/v1/dead-letters/"+url.PathEscape(pos[0])+"/"+strconv.FormatUint(seq, 10), nil)
	if err != nil {
		return fmt.Errorf("dlq show: %w", err)
	}
	if *af.json {
		return printJSON(stdout, body)
	}
	var d deadLetter
	if err := json.Unmarshal(body, &d); err != nil {
		return fmt.Errorf("dlq show: decode answer: %w", err)
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
	fs := flag.NewFlagSet("dlq replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	af := addAdminFlags(fs)
	sub := fs.String("subscription", "", "with --all: replay this subscription's dead letters")
	reason := fs.String("reason", "", "with --all: replay only dead letters with this reason")
	all := fs.Bool("all", false, "replay every dead letter matching --subscription and --reason (all subscriptions without --subscription)")
	force := fs.Bool("force", false, "replay dead letters already replayed once")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	req := map[string]any{"force": *force}
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
		req["subscription"], req["seq"] = pos[0], seq
	case *all:
		req["filter"] = map[string]string{"subscription": *sub, "reason": *reason}
	default:
		return errors.New("dlq replay: give SUBSCRIPTION SEQ for one dead letter, or --all (with --subscription, --reason) for many")
	}
	api, err := af.open(stderr)
	if err != nil {
		return fmt.Errorf("dlq replay: %w", err)
	}
	// Replaying again without force is skipped by the sidecar, so only a
	// forced replay must not be sent twice.
	body, err := api.call(http.MethodPost, "/v1/dead-letters/replay", req, !*force)
	if err != nil {
		return fmt.Errorf("dlq replay: %w", err)
	}
	var res struct {
		Replayed int                  `json:"replayed"`
		Results  []proxy.ReplayResult `json:"results"`
	}
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("dlq replay: decode answer: %w", err)
	}
	if *af.json {
		if err := printJSON(stdout, body); err != nil {
			return err
		}
	} else {
		tw := newTable(stdout)
		for _, r := range res.Results {
			what := "replayed"
			if !r.Replayed {
				what = "skipped"
			}
			fmt.Fprintf(tw, "%s\t%s/%d\t%s\t%s\n", what, r.Subscription, r.Seq, r.EventID, r.Skipped)
		}
		tw.Flush()
		fmt.Fprintf(stdout, "replayed %d, skipped %d\n", res.Replayed, len(res.Results)-res.Replayed)
	}
	// One named dead letter that does not exist is an error; a skip
	// because it was replayed already is not (running a replay twice is
	// safe, and scripts may).
	if single && len(res.Results) == 1 && !res.Results[0].Replayed && strings.HasSuffix(res.Results[0].Skipped, proxy.ErrNotFound.Error()) {
		return fmt.Errorf("dlq replay: %s", res.Results[0].Skipped)
	}
	return nil
}

func eventsCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "show" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(stdout, "usage: sluice events show ID [--json]")
			return flag.ErrHelp
		}
		return errors.New("events: want 'events show ID'")
	}
	fs := flag.NewFlagSet("events show", flag.ContinueOnError)
	fs.SetOutput(stderr)
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
	body, err := api.get("/v1/events/"+url.PathEscape(pos[0]), nil)
	if err != nil {
		return fmt.Errorf("events show: %w", err)
	}
	if *af.json {
		return printJSON(stdout, body)
	}
	var ev proxy.EventStatus
	if err := json.Unmarshal(body, &ev); err != nil {
		return fmt.Errorf("events show: decode answer: %w", err)
	}
	writeLedger(stdout, &ev, time.Now())
	return nil
}

func writeLedger(w io.Writer, ev *proxy.EventStatus, now time.Time) {
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
	var body any
	if pause && *reason != "" {
		body = map[string]string{"reason": *reason}
	}
	out, err := api.call(http.MethodPost, "/v1/subscriptions/"+url.PathEscape(pos[0])+"/"+name, body, true)
	if err != nil {
		return fmt.Errorf("%s %s: %w", name, pos[0], err)
	}
	if *af.json {
		return printJSON(stdout, out)
	}
	if pause {
		fmt.Fprintf(stdout, "paused %s: its events are kept and wait until 'sluice resume %s'\n", pos[0], pos[0])
	} else {
		fmt.Fprintf(stdout, "resumed %s\n", pos[0])
	}
	return nil
}

// listFlag collects a repeated string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// verifyCmd checks a delivery's signature: the body on stdin, the headers
// from flags or a file of "Name: value" lines.
func verifyCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var secretArgs listFlag
	fs.Var(&secretArgs, "secret", "a whsec_ secret of the subscription; repeat it (or separate with spaces) while rotating")
	id := fs.String("id", "", "the webhook-id header")
	ts := fs.String("timestamp", "", "the webhook-timestamp header")
	sig := fs.String("signature", "", "the webhook-signature header")
	headers := fs.String("headers", "", "a file of raw 'Name: value' header lines (as curl -D writes them); --id, --timestamp and --signature override it")
	tolerance := fs.Duration("tolerance", signing.DefaultTolerance, "how far webhook-timestamp may be from now")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("verify", pos); err != nil {
		return err
	}
	var secrets []signing.Secret
	for _, a := range secretArgs {
		for _, s := range strings.Fields(a) {
			k, err := signing.ParseSecret(s)
			if err != nil {
				return fmt.Errorf("verify: --secret: %w", err)
			}
			secrets = append(secrets, k)
		}
	}
	if len(secrets) == 0 {
		return errors.New("verify: give the subscription's secret with --secret whsec_...")
	}
	h := map[string]string{}
	if *headers != "" {
		b, err := os.ReadFile(*headers)
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		h = parseHeaderLines(string(b))
	}
	for k, v := range map[string]string{signing.HeaderID: *id, signing.HeaderTimestamp: *ts, signing.HeaderSignature: *sig} {
		if v != "" {
			h[k] = v
		}
	}
	body, err := io.ReadAll(stdin)
	if err != nil {
		return fmt.Errorf("verify: read body from stdin: %w", err)
	}
	err = signing.Verify(secrets, h[signing.HeaderID], h[signing.HeaderTimestamp], h[signing.HeaderSignature], body, time.Now(), *tolerance)
	switch {
	case err == nil:
		fmt.Fprintln(stdout, "valid")
		return nil
	case errors.Is(err, signing.ErrMissingHeader):
		return fmt.Errorf("invalid: %w (give --id, --timestamp and --signature, or --headers FILE)", err)
	case errors.Is(err, signing.ErrTimestampTooOld), errors.Is(err, signing.ErrTimestampTooNew):
		return fmt.Errorf("invalid: %w (to check an older capture, raise --tolerance)", err)
	case errors.Is(err, signing.ErrSignatureMismatch):
		return fmt.Errorf("invalid: %w (the body on stdin must be the exact bytes received, %d here: a trailing newline added by echo or an editor breaks it)", err, len(body))
	}
	return fmt.Errorf("invalid: %w", err)
}

// parseHeaderLines reads the webhook headers from "Name: value" lines,
// skipping status and request lines. Names are matched without regard to
// case; several webhook-signature lines are joined, since the header is a
// space-separated list.
func parseHeaderLines(s string) map[string]string {
	h := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		name, value, ok := strings.Cut(strings.TrimRight(line, "\r"), ":")
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			continue
		}
		name, value = strings.ToLower(name), strings.TrimSpace(value)
		switch name {
		case signing.HeaderSignature:
			if h[name] != "" {
				value = h[name] + " " + value
			}
			h[name] = value
		case signing.HeaderID, signing.HeaderTimestamp:
			h[name] = value
		}
	}
	return h
}
