package main

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// commandFlags runs `sluice NAME -h` for every command and returns each
// one's flag set and help output, failing on a help that is not exit 0
// with nothing on stderr.
func commandFlags(t *testing.T) (sets map[string]*flag.FlagSet, helps map[string]string) {
	t.Helper()
	var made []*flag.FlagSet
	newFlagSetHook = func(fs *flag.FlagSet) { made = append(made, fs) }
	t.Cleanup(func() { newFlagSetHook = nil })
	sets, helps = map[string]*flag.FlagSet{}, map[string]string{}
	for _, s := range synopses {
		made = made[:0]
		var out, errb bytes.Buffer
		code := run(append(strings.Fields(s.name), "-h"), &out, &errb)
		if code != 0 || errb.Len() > 0 {
			t.Errorf("sluice %s -h: exit %d, stderr %q", s.name, code, errb.String())
			continue
		}
		if len(made) != 1 || made[0].Name() != s.name {
			t.Errorf("sluice %s -h made flag sets %v, want one named %q", s.name, names(made), s.name)
			continue
		}
		sets[s.name], helps[s.name] = made[0], out.String()
	}
	return sets, helps
}

func names(fss []*flag.FlagSet) []string {
	var n []string
	for _, fs := range fss {
		n = append(n, fs.Name())
	}
	return n
}

// adminFlagNames are the flags addAdminFlags gives every admin command.
func adminFlagNames() map[string]bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	addAdminFlags(fs)
	n := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { n[f.Name] = true })
	return n
}

// TestHelpOfEveryCommand: every command's -h answers exit 0 on stdout
// with its usage line, a paragraph on what it does and every one of its
// flags; the top-level usage names every flag a command has of its own;
// and each way of asking for help is understood.
// shortFor reports whether f is a one-letter flag standing for a long one
// of fs ("short for --namespace"): the long one is documented, and the
// short one is written beside it as kubectl writes it (-n).
func shortFor(fs *flag.FlagSet, f *flag.Flag) bool {
	long, ok := strings.CutPrefix(f.Usage, "short for --")
	return ok && len(f.Name) == 1 && fs.Lookup(long) != nil
}

// takesInjectFlags says command name takes inject's flags, which its
// usage line refers to rather than lists.
func takesInjectFlags(name string) bool { return name == "injector" || name == "check-inject" }

func TestHelpOfEveryCommand(t *testing.T) {
	sets, helps := commandFlags(t)
	admin := adminFlagNames()
	top := usage()
	for name, fs := range sets {
		help := helps[name]
		for _, s := range synopses {
			if s.name == name && !strings.Contains(help, s.line) {
				t.Errorf("sluice %s -h lacks its usage line %q:\n%s", name, s.line, help)
			}
		}
		if paras := strings.Split(help, "\n\n"); len(paras) < 2 || len(strings.Fields(paras[1])) < 12 {
			t.Errorf("sluice %s -h has no paragraph on what it does:\n%s", name, help)
		}
		fs.VisitAll(func(f *flag.Flag) {
			if !regexp.MustCompile(`(?m)^  -` + regexp.QuoteMeta(f.Name) + `\b`).MatchString(help) {
				t.Errorf("sluice %s -h does not list --%s:\n%s", name, f.Name, help)
			}
			// The admin flags are one set, told once in the usage;
			// the injector takes inject's flags, which its line refers to.
			if admin[f.Name] || takesInjectFlags(name) && sets["inject"].Lookup(f.Name) != nil {
				return
			}
			if shortFor(fs, f) {
				return
			}
			if !strings.Contains(synopsis(name), "--"+f.Name) {
				t.Errorf("the usage line of %s leaves out --%s", name, f.Name)
			}
		})
	}
	if !strings.Contains(top, "whsec_") {
		t.Error("the top-level usage does not say --secret takes whsec_ keys")
	}
	for _, args := range [][]string{{"-h"}, {"-help"}, {"--help"}, {"help"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 || out.String() != top || errb.Len() > 0 {
			t.Errorf("sluice %s: exit %d, stdout %q, stderr %q; want the usage on stdout, exit 0", args[0], code, out.String(), errb.String())
		}
	}
	for _, group := range []string{"dlq", "events", "subscriptions", "tenants", "tokens"} {
		for _, args := range [][]string{{group, "-h"}, {"help", group}} {
			var out, errb bytes.Buffer
			if code := run(args, &out, &errb); code != 0 || !strings.Contains(out.String(), "sluice "+group+" ") || errb.Len() > 0 {
				t.Errorf("sluice %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out.String(), errb.String())
			}
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"version", "-h"}, &out, &errb); code != 0 || strings.Contains(out.String(), "(commit ") {
		t.Errorf("sluice version -h: exit %d, printed the version rather than help:\n%s", code, out.String())
	}
}

// TestBadFlagNamesCommand: a flag a command does not have is an error
// naming the command and the flag, on stderr, with no help on stdout.
func TestBadFlagNamesCommand(t *testing.T) {
	for _, s := range synopses {
		var out, errb bytes.Buffer
		code := run(append(strings.Fields(s.name), "--no-such-flag"), &out, &errb)
		if code == 0 || out.Len() > 0 || !strings.Contains(errb.String(), s.name+": flag provided but not defined: -no-such-flag") {
			t.Errorf("sluice %s --no-such-flag: exit %d, stdout %q, stderr %q", s.name, code, out.String(), errb.String())
		}
	}
}

// docCorpus is README.md and every page of docs/, read as one text: pages
// move between them, and a flag documented in any of them is documented.
func docCorpus(t *testing.T) string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, p := range append([]string{filepath.Join("..", "..", "README.md")}, pages...) {
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(text)
		b.WriteString("\n\n")
	}
	return b.String()
}

// docBlocks splits markdown into the units a flag is read within: a
// paragraph, a list item, a table row, or a line of a code block (lines
// ending in \ joined).
func docBlocks(md string) []string {
	var blocks []string
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			blocks = append(blocks, cur.String())
			cur.Reset()
		}
	}
	code := false
	for _, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			flush()
			code = !code
			continue
		case code:
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			if !strings.HasSuffix(trimmed, "\\") {
				flush()
			}
			continue
		case trimmed == "", strings.HasPrefix(trimmed, "#"):
			flush()
			continue
		case strings.HasPrefix(trimmed, "|"), strings.HasPrefix(trimmed, "- "), strings.HasPrefix(trimmed, "* "), regexp.MustCompile(`^\d+\. `).MatchString(trimmed):
			flush()
		}
		cur.WriteString(trimmed + " ")
		if strings.HasPrefix(trimmed, "|") {
			flush()
		}
	}
	flush()
	return blocks
}

var (
	docMention = regexp.MustCompile(`\bsluice ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?`)
	docFlag    = regexp.MustCompile(`(?:^|[^\w-])--([a-z][a-z0-9-]*)`)

	adminCommands = regexp.MustCompile(`(?i)\badmin commands\b`)
)

// adminGroup is what docFlags files the flags under that the docs give
// "the admin commands" as a whole.
const adminGroup = "(admin commands)"

// docFlags reads which flags the docs give which command: a --flag
// belongs to the last `sluice COMMAND` named before it in its block. A
// group named without its subcommand ("sluice dlq") is kept as the group.
func docFlags(md string, known map[string]bool) map[string]map[string]bool {
	got := map[string]map[string]bool{}
	last := ""
	for _, block := range docBlocks(md) {
		type at struct {
			pos  int
			name string
		}
		var marks []at
		for _, m := range docMention.FindAllStringSubmatchIndex(block, -1) {
			name := block[m[2]:m[3]]
			if m[4] >= 0 && known[name+" "+block[m[4]:m[5]]] {
				name += " " + block[m[4]:m[5]]
			}
			if known[name] {
				marks = append(marks, at{m[0], name})
			}
		}
		// The flags all admin commands share are told once, for "the
		// admin commands".
		for _, m := range adminCommands.FindAllStringIndex(block, -1) {
			marks = append(marks, at{m[0], adminGroup})
		}
		slices.SortFunc(marks, func(a, b at) int { return a.pos - b.pos })
		// A row of a table of flags ("| `--image` | ...") names no
		// command: it is the one the text before the table shows.
		if len(marks) == 0 && strings.HasPrefix(block, "| `--") && last != "" {
			marks = append(marks, at{0, last})
		}
		if len(marks) > 0 {
			last = marks[len(marks)-1].name
		}
		for i, mk := range marks {
			end := len(block)
			if i+1 < len(marks) {
				end = marks[i+1].pos
			}
			for _, f := range docFlag.FindAllStringSubmatch(block[mk.pos:end], -1) {
				if got[mk.name] == nil {
					got[mk.name] = map[string]bool{}
				}
				got[mk.name][f[1]] = true
			}
		}
	}
	return got
}

// TestDocsAndFlagsAgree: every --flag README.md or docs/ gives a `sluice
// COMMAND` is a flag of that command, and every flag of every command is
// documented for it (the admin flags, which all admin commands share,
// for any of them).
func TestDocsAndFlagsAgree(t *testing.T) {
	sets, _ := commandFlags(t)
	known := map[string]bool{}
	for name := range sets {
		known[name] = true
		if group, _, ok := strings.Cut(name, " "); ok {
			known[group] = true
		}
	}
	documented := docFlags(docCorpus(t), known)
	if len(documented) == 0 {
		t.Fatal("the docs give no command a flag: the pattern no longer matches how they are written")
	}
	has := func(name, flagName string) bool {
		for n, fs := range sets {
			if (n == name || strings.HasPrefix(n, name+" ")) && fs.Lookup(flagName) != nil {
				return true
			}
		}
		return false
	}
	for _, name := range slices.Sorted(maps.Keys(documented)) {
		if name == adminGroup {
			continue // checked against the admin flags below
		}
		for _, f := range slices.Sorted(maps.Keys(documented[name])) {
			if !has(name, f) {
				t.Errorf("the docs give `sluice %s` the flag --%s, which it does not have", name, f)
			}
		}
	}
	admin := adminFlagNames()
	for f := range documented[adminGroup] {
		if !admin[f] {
			t.Errorf("the docs give the admin commands the flag --%s, which addAdminFlags does not add", f)
		}
	}
	adminDocumented := maps.Clone(documented[adminGroup])
	if adminDocumented == nil {
		adminDocumented = map[string]bool{}
	}
	for name, fs := range sets {
		if fs.Lookup("token") == nil {
			continue
		}
		for f := range documented[name] {
			adminDocumented[f] = true
		}
		if group, _, ok := strings.Cut(name, " "); ok {
			for f := range documented[group] {
				adminDocumented[f] = true
			}
		}
	}
	var missing []string
	adminMissing := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		sets[name].VisitAll(func(f *flag.Flag) {
			if documented[name][f.Name] || admin[f.Name] && adminDocumented[f.Name] || shortFor(sets[name], f) {
				return
			}
			// The injector takes inject's flags (its usage line says so),
			// and the docs describe them once, for inject.
			if takesInjectFlags(name) && sets["inject"].Lookup(f.Name) != nil && documented["inject"][f.Name] {
				return
			}
			if admin[f.Name] {
				if !adminMissing[f.Name] {
					adminMissing[f.Name] = true
					missing = append(missing, fmt.Sprintf("admin commands --%s: %s", f.Name, f.Usage))
				}
				return
			}
			missing = append(missing, fmt.Sprintf("sluice %s --%s: %s", name, f.Name, f.Usage))
		})
	}
	if len(missing) > 0 {
		t.Errorf("%d flag(s) that README.md and docs/*.md never give their command:\n  %s", len(missing), strings.Join(missing, "\n  "))
	}
}

// TestDocFlagsReadsCommands: how docFlags files a flag under a command,
// on markdown of the shapes README.md uses.
func TestDocFlagsReadsCommands(t *testing.T) {
	md := "Run `sluice dlq replay --all`, then `sluice status --json`.\n" +
		"It wraps:\n`--force` too, and the sluice sidecar --is not a command.\n\n" +
		"```\nsluice inject app.yaml [--image IMG] \\\n  [--pvc NAME]\n--stray\n```\n\n" +
		"| flag | effect |\n|---|---|\n| `--grace` | drain grace |\n\n" +
		"The admin commands take `--token`.\n"
	known := map[string]bool{"dlq": true, "dlq replay": true, "status": true, "inject": true}
	got := docFlags(md, known)
	want := map[string]map[string]bool{
		"dlq replay": {"all": true},
		"status":     {"json": true, "force": true, "is": true},
		"inject":     {"image": true, "pvc": true, "grace": true},
		adminGroup:   {"token": true},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("docFlags = %v, want %v", got, want)
	}
}
