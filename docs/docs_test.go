// Package docs holds the documentation pages beside README.md; its test
// keeps what they point at real: every test a page names as the proof of a
// claim exists, every relative link leads to a file of the repository,
// and every #anchor into a markdown page names one of its headings.
package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// pages are the documents checked: README.md and every page here.
func pages(t *testing.T) []string {
	t.Helper()
	md, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join("..", "README.md")}, md...)
}

var (
	testName = regexp.MustCompile("`(Test[A-Za-z0-9_]+)`")
	testFunc = regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	mdLink   = regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
)

// TestNamedTestsExist: a page that says "TestX proves it" names a test
// that exists, so a renamed or deleted test cannot leave a claim without
// its proof.
func TestNamedTestsExist(t *testing.T) {
	defined := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFunc.FindAllSubmatch(b, -1) {
			defined[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, page := range pages(t) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range testName.FindAllSubmatch(b, -1) {
			named++
			if !defined[string(m[1])] {
				t.Errorf("%s names %s, which no test file defines", page, m[1])
			}
		}
	}
	if named == 0 {
		t.Fatal("no page names a test: the pattern no longer matches how they are written")
	}
}

// TestRelativeLinksResolve: every relative link of a page leads to a file
// or folder of the repository (docs stand alone: nothing points outside).
func TestRelativeLinksResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range pages(t) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllSubmatch(b, -1) {
			target := string(m[1])
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, err := filepath.Abs(filepath.Join(filepath.Dir(page), target))
			if err != nil {
				t.Fatal(err)
			}
			if rel, err := filepath.Rel(root, path); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s links to %s, outside the repository", page, target)
				continue
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s: %v", page, target, err)
			}
		}
	}
}

// anyLink is a markdown link with its optional #anchor; the target may be
// empty (a link within the page).
var anyLink = regexp.MustCompile(`\]\(([^)#\s]*)(#[^)\s]*)?\)`)

// TestAnchorsResolve: every link with an #anchor into a markdown page of
// the repository (the page itself included) names a heading of that page,
// as GitHub slugs it, or an explicit <a id="...">: a heading renamed or
// moved to another page cannot leave a link landing at the top of a page.
func TestAnchorsResolve(t *testing.T) {
	cache := map[string]map[string]bool{}
	for _, page := range pages(t) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range anyLink.FindAllSubmatch(b, -1) {
			target, anchor := string(m[1]), strings.TrimPrefix(string(m[2]), "#")
			if anchor == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file := page
			if target != "" {
				file = filepath.Join(filepath.Dir(page), target)
			}
			if !strings.HasSuffix(file, ".md") {
				continue // an anchor into code or a folder: GitHub's, not ours
			}
			ids, ok := cache[file]
			if !ok {
				ids, err = anchors(file)
				if err != nil {
					t.Errorf("%s links to %s#%s: %v", page, target, anchor, err)
					continue
				}
				cache[file] = ids
			}
			if !ids[anchor] {
				t.Errorf("%s links to %s#%s: %s has no such heading or anchor", page, target, anchor, file)
			}
		}
	}
}

var (
	heading  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	htmlID   = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	textLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// anchors are the fragment ids of a markdown file: its headings, slugged
// as GitHub does (duplicates get -1, -2, ...), outside fenced code, and
// its explicit <a id="..."> and <a name="..."> anchors.
func anchors(file string) (map[string]bool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	ids, seen := map[string]bool{}, map[string]int{}
	fence := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if trim := strings.TrimLeft(line, " "); strings.HasPrefix(trim, "```") || strings.HasPrefix(trim, "~~~") {
			switch {
			case fence == "":
				fence = trim[:3]
			case strings.HasPrefix(trim, fence):
				fence = ""
			}
			continue
		}
		if fence != "" {
			continue
		}
		for _, m := range htmlID.FindAllStringSubmatch(line, -1) {
			ids[m[1]] = true
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			slug := slugify(m[1])
			if n := seen[slug]; n > 0 {
				ids[fmt.Sprintf("%s-%d", slug, n)] = true
			} else {
				ids[slug] = true
			}
			seen[slug]++
		}
	}
	return ids, sc.Err()
}

// slugify is GitHub's heading id: the heading's text (a link's text, not
// its target) in lower case, letters, digits, '-' and '_' kept, each space
// a '-', everything else dropped.
func slugify(text string) string {
	text = textLink.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r), unicode.IsNumber(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// TestSlugify pins the slugs the anchors are checked against to GitHub's.
func TestSlugify(t *testing.T) {
	for in, want := range map[string]string{
		"Egress, client certificates and OAuth2":                  "egress-client-certificates-and-oauth2",
		"Filter cost: `BenchmarkDeliveryFiltered`":                "filter-cost-benchmarkdeliveryfiltered",
		"Ingest (HTTP → log), 64 concurrent keep-alive producers": "ingest-http--log-64-concurrent-keep-alive-producers",
		"Corrupted, foreign or locked data dir":                   "corrupted-foreign-or-locked-data-dir",
		"See [the runbook](operations.md)":                        "see-the-runbook",
	} {
		if got := slugify(in); got != want {
			t.Errorf("slugify(%q) = %q, want %q", in, got, want)
		}
	}
}
