package proxy_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/sluicehq/sluice/"

// roomImports are the packages of this module each room under proxy/ may
// import (a prefix names a tree: "internal/" is every internal package).
// Imports run one way: the wiring (proxy) imports its rooms, never the
// reverse, and a room imports no room above it. A new room gets a row
// here; a room without one fails the test.
var roomImports = map[string][]string{
	"proxy/admin": {"proxy/api", "proxy/delivery", "queue", "policy", "signing", "internal/"},
	"proxy/api":   {"queue"},
	// cloudevents reads and writes CloudEvents in plain bytes and strings:
	// ingest and the delivery engine call it, it calls nothing of theirs.
	"proxy/cloudevents": {"internal/"},
	"proxy/delivery":    {"proxy/api", "proxy/cloudevents", "proxy/egress", "queue", "policy", "signing", "internal/"},
	"proxy/egress":      {"policy", "internal/"},
	"proxy/ingest":      {"proxy/cloudevents", "queue", "policy", "internal/"},
}

// TestImportDirection: no package under proxy/ imports one it may not,
// tests aside (a room's tests may use what they like).
func TestImportDirection(t *testing.T) {
	rooms := 0
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() || path == "." || strings.Contains(path, "testdata") {
			return err
		}
		imports := packageImports(t, path)
		if imports == nil {
			return nil // no Go files: the dashboard's assets
		}
		room := "proxy/" + filepath.ToSlash(path)
		allowed, ok := roomImports[room]
		if !ok {
			t.Errorf("%s has no row in roomImports: say what it may import", room)
			return nil
		}
		rooms++
		for _, imp := range imports {
			rel, ours := strings.CutPrefix(imp, module)
			if !ours {
				continue
			}
			if !slices.ContainsFunc(allowed, func(a string) bool {
				return rel == a || strings.HasSuffix(a, "/") && strings.HasPrefix(rel, a)
			}) {
				t.Errorf("%s imports %s: not among %v (imports run one way: proxy wires its rooms, a room does not reach up)", room, rel, allowed)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if rooms < len(roomImports) {
		t.Errorf("found %d rooms, want the %d of roomImports: a room moved without its row", rooms, len(roomImports))
	}
}

// packageImports returns the imports of the non-test Go files in dir, nil
// when it has none.
func packageImports(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		if out == nil {
			out = []string{}
		}
		for _, imp := range file.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			out = append(out, p)
		}
	}
	return out
}
