// Package docs holds the documentation pages beside README.md; its test
// keeps what they point at real: every test a page names as the proof of a
// claim exists, and every relative link leads to a file of the
// repository.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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
