package charts

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

var helpFlag = regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`)

// TestChartArgsParse: the injector's arguments, as the chart renders them
// for each case, are flags `sluice injector` defines, and it accepts
// their values: it gets as far as reading the certificate files (which
// do not exist here), past parsing its flags and validating the sidecar's
// defaults (a quantity, a duration, a port, a NATS URL).
func TestChartArgsParse(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	help, _ := exec.Command(bin, "injector", "--help").CombinedOutput()
	defined := map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(string(help), -1) {
		defined[m[1]] = true
	}
	if !defined["tls-cert-file"] || !defined["image"] {
		t.Fatalf("sluice injector --help lists no --tls-cert-file or --image flag:\n%s", help)
	}
	for _, c := range chartCases {
		t.Run(c.name, func(t *testing.T) {
			r := render(t, c)
			var args []string
			for _, a := range r.container(t).Args[1:] {
				name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if !defined[name] {
					t.Errorf("%s: sluice injector has no such flag", a)
				}
				args = append(args, a)
			}
			// Loopback listeners, should the certificate files exist here.
			args = append(args, "--listen=127.0.0.1:0", "--admin-listen=127.0.0.1:0")
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, append([]string{"injector"}, args...)...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), "--tls-cert-file, --tls-key-file: read certificate") {
				t.Errorf("sluice injector %q: %v\n%s\nwant it to refuse only the missing certificate files", args, err, out)
			}
		})
	}
}
