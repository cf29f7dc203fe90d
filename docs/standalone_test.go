package docs

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// outsideRef matches what only makes sense to a reader who has documents
// the repository does not hold: the team's design and style notes by file
// name, a tracker's issue by number (the word, an optional #, digits;
// singular or plural, any case), and the shared folder beside the checkout. The patterns are
// spelt in pieces so that this file does not match itself.
var outsideRef = regexp.MustCompile(`(?i)\b(?:` +
	`(?:DESIGN|STYLE)\.` + `md` +
	`|issues? #?[0-9]+` +
	`)\b|\.\./` + `shared\b`)

// standaloneExts are the kinds of file whose text a reader meets: code
// and its comments, pages, configuration and scripts. Files under .ci/
// are scripts whatever their names.
var standaloneExts = map[string]bool{
	".go": true, ".md": true, ".yaml": true, ".yml": true, ".sh": true, ".json": true,
}

// allowedOutsideRef reports the one kind of reference that is meant: CI
// runs the acceptance checks kept beside the checkout when they are there
// (.ci/run skips them when they are not).
func allowedOutsideRef(rel, line string) bool {
	return rel == filepath.Join(".ci", "run") && strings.Contains(line, "../"+"shared/acceptance/")
}

// TestDocsStandAlone: the repository's code, comments, pages, examples and
// scripts say what they mean themselves. A comment that gives its reason as
// a section of a design note, an issue number or a numbered rule sends the
// reader to something they may not have; the reason belongs in the text.
// It walks the whole repository (not .git, testdata or node_modules) and
// names every file and line that still points outside it.
func TestDocsStandAlone(t *testing.T) {
	root := ".."
	checked := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		inCI := strings.HasPrefix(rel, ".ci"+string(filepath.Separator))
		if !inCI && !standaloneExts[filepath.Ext(path)] {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		checked++
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			m := outsideRef.FindString(line)
			if m == "" || allowedOutsideRef(rel, line) {
				continue
			}
			t.Errorf("%s:%d points outside the repository (%q): say the reason itself", rel, n, m)
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files: is the walk rooted at the repository?", checked)
	}
}
