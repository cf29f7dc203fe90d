package policy

import (
	"go/ast"
	goparser "go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestDeadLetterReasonsListsEveryReason: a Reason constant added to
// policy.go without DeadLetterReasons would be a reason the CLI refuses
// in --reason and leaves out of its help.
func TestDeadLetterReasonsListsEveryReason(t *testing.T) {
	f, err := goparser.ParseFile(token.NewFileSet(), "policy.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var consts []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range vs.Names {
			if !strings.HasPrefix(name.Name, "Reason") || i >= len(vs.Values) {
				continue
			}
			lit, ok := vs.Values[i].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				continue
			}
			v, _ := strconv.Unquote(lit.Value)
			consts = append(consts, v)
		}
		return true
	})
	if len(consts) == 0 {
		t.Fatal("found no Reason constants in policy.go: the pattern no longer matches how they are written")
	}
	got := slices.Sorted(slices.Values(DeadLetterReasons))
	slices.Sort(consts)
	if !slices.Equal(got, consts) {
		t.Errorf("DeadLetterReasons = %q, the Reason constants are %q", got, consts)
	}
}
