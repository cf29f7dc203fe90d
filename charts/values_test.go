package charts

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
)

// TestChartRefusesBadValues: a value of the wrong kind, out of range, or
// under a key the chart does not know fails helm install and helm lint,
// with an error that names it.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		want         []string // in the error, each
	}{
		{"failurePolicy not an enum value", "webhook: {failurePolicy: Sometimes}", []string{"/webhook/failurePolicy", "Ignore", "Fail"}},
		{"unknown top-level key", "webhooks: {failurePolicy: Fail}", []string{"webhooks"}},
		{"unknown nested key", "webhook: {failurPolicy: Fail}", []string{"/webhook", "failurPolicy"}},
		{"key in the wrong case", "sidecar: {jetstreamUrl: nats://nats:4222}", []string{"/sidecar", "jetstreamUrl"}},
		{"timeout out of range", "webhook: {timeoutSeconds: 60}", []string{"/webhook/timeoutSeconds", "30"}},
		{"excluded namespace not a name", "webhook: {excludeNamespaces: [Team_A]}", []string{"/webhook/excludeNamespaces/0"}},
		{"grace not a duration", "sidecar: {grace: thirty}", []string{"/sidecar/grace"}},
		{"memory limit not a quantity", "sidecar: {resources: {limits: {memory: 1GB}}}", []string{"/sidecar/resources/limits/memory"}},
		{"port out of range", "sidecar: {ingestPort: 70000}", []string{"/sidecar/ingestPort"}},
		{"maxInFlight out of range", "injector: {maxInFlight: 0}", []string{"/injector/maxInFlight"}},
		{"replicas not a number", "injector: {replicas: two}", []string{"/injector/replicas"}},
		{"pullPolicy not an enum value", "image: {pullPolicy: Sometimes}", []string{"/image/pullPolicy"}},
		{"certManager.enabled not a boolean", "certManager: {enabled: yes please}", []string{"/certManager/enabled"}},
		{"minAvailable neither a number nor a percentage", "pdb: {minAvailable: half}", []string{"/pdb/minAvailable"}},
		{"metrics namespace not a name", "networkPolicy: {metricsNamespaces: [Monitoring]}", []string{"/networkPolicy/metricsNamespaces/0"}},
		{"scan interval not a duration", "scan: {interval: often}", []string{"/scan/interval"}},
		{"scan interval zero while enabled", "scan: {interval: 0m0s}", []string{"/scan/interval"}},
		{"unknown key in a toleration", "injector: {tolerations: [{key: a, operater: Exists}]}", []string{"/injector/tolerations/0", "operater"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals, err := common.ReadValues([]byte(tc.values))
			if err != nil {
				t.Fatal(err)
			}
			check := func(what string, err error) {
				if err == nil {
					t.Fatalf("%s: %s passed, want an error", what, tc.values)
				}
				t.Logf("%s: %v", what, err)
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: %v\nwant it to name %q", what, err, w)
					}
				}
			}
			_, err = install(t, "sluice", "sluice-system", vals)
			check("helm install", err)
			l := action.NewLint()
			l.Strict = true
			l.Namespace = "sluice-system"
			l.KubeVersion = parseKubeVersion(t)
			check("helm lint", errors.Join(l.Run([]string{chartDir}, vals).Errors...))
		})
	}
}

var valuesRow = regexp.MustCompile("^\\| `([A-Za-z.]+)` \\| ([^|]+) \\|")

// TestChartValuesDocumented: every value of values.yaml has a comment
// above it and a row in README.md's table (the row of a table, such as
// injector.resources, covers what is under it), each row names a value
// that exists, and a row's default is the one values.yaml gives.
func TestChartValuesDocumented(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(src, &vals); err != nil {
		t.Fatal(err)
	}
	leaves := map[string]any{} // every value, and every table, by dotted path
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			leaves[prefix+k] = v
			if sub, ok := v.(map[string]any); ok {
				walk(prefix+k+".", sub)
			}
		}
	}
	walk("", vals)

	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for line := range strings.Lines(string(readme)) {
		if m := valuesRow.FindStringSubmatch(line); m != nil {
			rows[m[1]] = strings.TrimSpace(m[2])
		}
	}
	if len(rows) < 10 {
		t.Fatalf("README.md: %d rows in the values table: the pattern no longer matches it", len(rows))
	}
	for path, def := range rows {
		v, ok := leaves[path]
		if !ok {
			t.Errorf("README.md documents %s, which values.yaml does not have", path)
			continue
		}
		if want, ok := shownDefault(v); ok && def != want {
			t.Errorf("README.md: %s defaults to %s, values.yaml to %s", path, def, want)
		}
	}
	for path, v := range leaves {
		if _, isTable := v.(map[string]any); isTable && len(v.(map[string]any)) > 0 && rows[path] == "" {
			continue // its values have rows of their own, or an ancestor's covers them
		}
		covered := false
		for p := path; p != ""; p = p[:max(strings.LastIndex(p, "."), 0)] {
			if _, ok := rows[p]; ok {
				covered = true
				break
			}
		}
		if !covered {
			t.Errorf("README.md's values table has no row for %s", path)
		}
	}

	// A comment above every key that has a row.
	var stack []string // the dotted path at each indentation level
	prev := ""
	for n, line := range strings.Split(string(src), "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "- ") {
			continue
		}
		if strings.HasPrefix(trimmed, "#") {
			prev = trimmed
			continue
		}
		key, _, ok := strings.Cut(trimmed, ":")
		if !ok {
			continue
		}
		depth := (len(line) - len(strings.TrimLeft(line, " "))) / 2
		stack = append(stack[:min(depth, len(stack))], key)
		path := strings.Join(stack, ".")
		if _, documented := rows[path]; documented && !strings.HasPrefix(prev, "#") {
			t.Errorf("values.yaml:%d: %s has no comment above it", n+1, path)
		}
		prev = trimmed
	}
}

// shownDefault is how README.md's table writes a default of values.yaml,
// for the kinds of value it can say it of.
func shownDefault(v any) (string, bool) {
	switch x := v.(type) {
	case nil:
		return "`null`", true
	case string:
		if x == "" {
			return "`\"\"`", true
		}
		return "`" + x + "`", true
	case bool, float64, int64, int:
		return fmt.Sprintf("`%v`", x), true
	case map[string]any:
		if len(x) == 0 {
			return "`{}`", true
		}
	case []any:
		var items []string
		for _, i := range x {
			items = append(items, fmt.Sprint(i))
		}
		return "`[" + strings.Join(items, ", ") + "]`", true
	}
	return "", false
}
