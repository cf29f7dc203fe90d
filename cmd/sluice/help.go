package main

// Help: each command's -h prints its usage lines, a paragraph on what it
// does and its flags, to stdout with exit status 0; the top-level usage is
// built from the same usage lines, so the two cannot disagree.

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// synopses are the usage lines of every command, in the order the
// top-level usage lists them; a command with subcommands has one line per
// subcommand, named "group sub". The admin flags (--config, --admin,
// --token, --json) are left out of the admin commands' lines: they are
// the same for all, and the usage says so once (adminNote).
var synopses = []struct{ name, line string }{
	{"serve", "sluice serve [--config FILE] [--listen ADDR] [--admin-listen ADDR] [--data-dir DIR] [--accept-data-loss]"},
	{"demo", "sluice demo [--fleet] [--events 300] [--max 15s]"},
	{"testbed", `sluice testbed [--listen 127.0.0.1:9000] [--mode ok|fail|slow|blackhole|ratelimit|flaky] [--delay 200ms] [--retry-after 1] [--secret "whsec_... whsec_..."]`},
	{"healthcheck", "sluice healthcheck [--config FILE] [--admin URL] [--path /readyz|/healthz]"},
	{"status", "sluice status"},
	{"dlq list", "sluice dlq list [--subscription S] [--reason R] [--limit N] [--cursor C] [--all]"},
	{"dlq show", "sluice dlq show SUBSCRIPTION SEQ"},
	{"dlq replay", "sluice dlq replay (SUBSCRIPTION SEQ | [--subscription S] [--reason R] --all) [--force]"},
	{"events show", "sluice events show ID"},
	{"pause", "sluice pause ID [--reason TEXT]"},
	{"resume", "sluice resume ID"},
	{"subscriptions create", "sluice subscriptions create (--file FILE | --id ID --url URL) [--types a,b] [--tenant T] [--secret whsec_...|whsk_...]"},
	{"subscriptions list", "sluice subscriptions list [--tenant T]"},
	{"subscriptions get", "sluice subscriptions get ID"},
	{"subscriptions update", "sluice subscriptions update ID (--file PATCH | --set KEY=VALUE ...)"},
	{"subscriptions delete", "sluice subscriptions delete ID"},
	{"subscriptions rotate-secret", "sluice subscriptions rotate-secret ID [--grace 24h]"},
	{"subscriptions recover", "sluice subscriptions recover ID --since TIME [--until TIME]"},
	{"tenants token", "sluice tenants token TENANT"},
	{"tokens issue", "sluice tokens issue TENANT [--expires-in 720h]"},
	{"tokens list", "sluice tokens list [TENANT]"},
	{"tokens revoke", "sluice tokens revoke TENANT ID"},
	{"inject", "sluice inject [FILE|-] [--image IMG] [--config-map NAME] [--pvc NAME] [--secret NAME] [--grace 10s] [--ingest-port 8700] [--admin-port 8701] [--cpu-request 50m] [--memory-request 64Mi] [--cpu-limit Q] [--memory-limit 1Gi] [--jetstream-url URL]..."},
	{"injector", "sluice injector --tls-cert-file FILE --tls-key-file FILE [--listen 127.0.0.1:8443] [--admin-listen 127.0.0.1:8702] [--shutdown-delay 5s] [--max-in-flight 2] [--queue-wait 3s] [--scan-interval 1m] [--webhook-configuration NAME] [--kubeconfig FILE] [inject's flags]"},
	{"check-inject", "sluice check-inject [--namespace|-n NS] [POD] | --all-namespaces|-A [--webhook-configuration NAME] [--kubeconfig FILE] [--context NAME] [inject's flags]"},
	{"verify", "sluice verify --secret whsec_...|whpk_... [--id ID --timestamp TS --signature SIG | --headers FILE] [--tolerance 5m] < BODY"},
	{"version", "sluice version"},
}

// adminNote says what the admin commands share; the top-level usage and
// each admin command's help end with it.
const adminNote = `status, dlq, events, pause, resume, subscriptions, tenants and tokens call the
admin API found like healthcheck finds it (--config FILE, else
$SLUICE_CONFIG; --admin URL overrides the address; --token the token, which
otherwise comes from the config's admin.token or admin.token_file), and
retry for a few seconds while the sidecar restarts; each takes --json to
print the API's JSON. A secret or token the sidecar generates is printed
once: store it then.`

// usage is the top-level usage: `sluice`, `sluice help` and `sluice -h`.
func usage() string {
	var b strings.Builder
	b.WriteString("sluice — a webhook delivery sidecar\n\nUsage:\n")
	for _, s := range synopses {
		fmt.Fprintf(&b, "  %s\n", s.line)
	}
	b.WriteString("\n" + adminNote + "\n\nRun 'sluice COMMAND -h' (or 'sluice help COMMAND') for what a command does and its flags.\n")
	return b.String()
}

// synopsis is the usage lines of a command or, for a group such as
// "dlq", of each of its subcommands.
func synopsis(name string) string {
	var lines []string
	for _, s := range synopses {
		if s.name == name || strings.HasPrefix(s.name, name+" ") {
			lines = append(lines, "  "+s.line)
		}
	}
	return strings.Join(lines, "\n")
}

// newFlagSetHook, when set (by tests), sees every command's flag set as it
// is made, so that a test can hold each command's flags against its help
// and the docs without a second list of them.
var newFlagSetHook func(*flag.FlagSet)

// newFlagSet is a command's flag set. -h prints the command's help to
// stdout: asked-for help is output, and exit status 0. A bad flag prints
// nothing here: its error comes back from the parse, and run prints it
// with the command's name.
func newFlagSet(name, about string, stdout io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package writes a parse error to the output and then calls
	// Usage; -h calls Usage with nothing written. So what was written
	// tells the two apart.
	var failed flagFailure
	fs.SetOutput(&failed)
	fs.Usage = func() {
		if failed {
			failed = false
			return
		}
		writeHelp(stdout, fs, about)
	}
	if newFlagSetHook != nil {
		newFlagSetHook(fs)
	}
	return fs
}

// flagFailure records that the flag package reported a parse error.
type flagFailure bool

func (f *flagFailure) Write(p []byte) (int, error) { *f = true; return len(p), nil }

// writeHelp prints a command's usage lines, about and flags.
func writeHelp(w io.Writer, fs *flag.FlagSet, about string) {
	fmt.Fprintf(w, "usage:\n%s\n\n%s\n", synopsis(fs.Name()), strings.TrimSpace(about))
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	out := fs.Output()
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(out)
}

// groupHelp answers `sluice GROUP -h` for a command with subcommands.
func groupHelp(w io.Writer, group, about string) error {
	fmt.Fprintf(w, "usage:\n%s\n\n%s\n\nRun 'sluice %s SUBCOMMAND -h' for what each does and its flags.\n", synopsis(group), strings.TrimSpace(about), group)
	return flag.ErrHelp
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "help", "-h", "-help", "--help":
		return true
	}
	return false
}
