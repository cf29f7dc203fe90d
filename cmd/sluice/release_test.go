package main

import (
	"bytes"
	"debug/buildinfo"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReleaseBuild runs .ci/build as the Dockerfile's build stage runs it,
// in the environment of the golang image (GOTOOLCHAIN=local) plus the
// stage's ENV and ARG lines, and checks what the image would ship: the Go
// toolchain .ci/build names (the docs promise it for its standard-library
// fixes), a static binary with its version stamped, and no embedded NATS
// server, with `demo --fleet` saying how to run it from source.
func TestReleaseBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the release binary")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stageEnv, run := buildStage(t, string(dockerfile))

	want := strings.TrimSpace(string(runOut(t, root, nil, "sh", ".ci/build", "--toolchain")))
	if !regexp.MustCompile(`^go1\.\d+\.\d+$`).MatchString(want) {
		t.Fatalf(".ci/build --toolchain = %q, want a released toolchain such as go1.27.3", want)
	}

	env := []string{"GOTOOLCHAIN=local"} // as the golang images set it
	for _, kv := range os.Environ() {
		// GOFLAGS: no -race or -tags of this test run leaks into the build.
		if !strings.HasPrefix(kv, "GOTOOLCHAIN=") && !strings.HasPrefix(kv, "GOFLAGS=") {
			env = append(env, kv)
		}
	}
	env = append(env, stageEnv...)
	// The go that runs this test may well be the promised one already, so
	// the binary's version alone would not catch a .ci/build that lets
	// GOTOOLCHAIN=local through: a go in front of it on PATH logs the
	// GOTOOLCHAIN each go command is given.
	realGo, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	goLog := filepath.Join(tmp, "go.log")
	wrapper := "#!/bin/sh\necho \"$GOTOOLCHAIN $1\" >>'" + goLog + "'\nexec '" + realGo + "' \"$@\"\n"
	if err := os.MkdirAll(filepath.Join(tmp, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "bin", "go"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	env = append(env, "PATH="+filepath.Join(tmp, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
	bin := filepath.Join(tmp, "sluice")
	// The stage's own command, with its output path swapped for ours: an
	// assignment in front of `sh .ci/build` there counts too.
	cmdline := strings.Replace(run, "/out/sluice", bin, 1)
	cmdline = strings.ReplaceAll(cmdline, `"${VERSION}"`, "ci")
	cmdline = strings.ReplaceAll(cmdline, `"${COMMIT}"`, "abc1234")
	cmdline, _, _ = strings.Cut(cmdline, "&&")
	runOut(t, root, env, "sh", "-c", cmdline)

	logged, err := os.ReadFile(goLog)
	if err != nil {
		t.Fatal(err)
	}
	builds := 0
	for _, line := range strings.Split(strings.TrimSpace(string(logged)), "\n") {
		toolchain, subcommand, _ := strings.Cut(line, " ")
		if subcommand == "build" {
			builds++
			if toolchain != want {
				t.Errorf("in the Dockerfile's environment .ci/build runs go build with GOTOOLCHAIN=%q, want %s", toolchain, want)
			}
		}
	}
	if builds != 1 {
		t.Fatalf(".ci/build ran go build %d times, want 1; go commands (GOTOOLCHAIN, subcommand):\n%s", builds, logged)
	}

	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if info.GoVersion != want {
		t.Errorf("the image's binary is built with %s, want %s (.ci/build --toolchain)", info.GoVersion, want)
	}
	for _, d := range info.Deps {
		if strings.HasPrefix(d.Path, "github.com/nats-io/nats-server") {
			t.Errorf("the release binary links %s %s, which only demo --fleet needs", d.Path, d.Version)
		}
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" {
		t.Errorf("CGO_ENABLED=%q, want 0: distroless/static has no libc", settings["CGO_ENABLED"])
	}

	if out := string(runOut(t, root, nil, bin, "version")); out != "sluice ci (commit abc1234)\n" {
		t.Errorf("version printed %q", out)
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, "demo", "--fleet")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err == nil || cmd.ProcessState.ExitCode() != 1 {
		t.Errorf("demo --fleet in the release build: %v, want exit status 1; output %s", err, out.String())
	}
	if !strings.Contains(out.String(), "go run ./cmd/sluice demo --fleet") {
		t.Errorf("demo --fleet in the release build does not say how to run it from source: %s", out.String())
	}
}

// buildStage returns the environment the Dockerfile's build stage gives
// its RUN lines (ENV, and ARG with a default) up to the one that runs
// .ci/build, and that RUN line's command.
func buildStage(t *testing.T, dockerfile string) (env []string, run string) {
	t.Helper()
	vars := map[string]string{}
	inStage := false
	for _, line := range dockerfileInstructions(dockerfile) {
		op, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(op) {
		case "FROM":
			if inStage {
				t.Fatal("Dockerfile: the build stage has no RUN of .ci/build")
			}
			inStage = strings.HasSuffix(strings.ToLower(rest), " as build")
		case "ENV", "ARG":
			if !inStage {
				continue
			}
			words := shellWords(rest)
			if strings.ToUpper(op) == "ENV" && len(words) == 2 && !strings.Contains(words[0], "=") {
				vars[words[0]] = os.Expand(words[1], func(k string) string { return vars[k] })
				continue
			}
			for _, w := range words {
				if k, v, ok := strings.Cut(w, "="); ok {
					vars[k] = os.Expand(v, func(k string) string { return vars[k] })
				}
			}
		case "RUN":
			if inStage && strings.Contains(rest, ".ci/build /") {
				for k, v := range vars {
					env = append(env, k+"="+v)
				}
				return env, rest
			}
		}
	}
	t.Fatal("Dockerfile: no build stage (FROM ... AS build) that runs .ci/build")
	return nil, ""
}

// dockerfileInstructions joins continued lines and drops comments.
func dockerfileInstructions(dockerfile string) []string {
	var out []string
	cur := ""
	for _, line := range strings.Split(dockerfile, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || (line == "" && cur == "") {
			continue
		}
		if more, ok := strings.CutSuffix(line, `\`); ok {
			cur += strings.TrimSpace(more) + " "
			continue
		}
		out = append(out, cur+line)
		cur = ""
	}
	return out
}

// shellWords splits on spaces outside double quotes and drops the quotes,
// which is all the Dockerfile's ENV and ARG lines use.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	quoted, inWord := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, w.String())
			}
			w.Reset()
			inWord = false
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

func runOut(t *testing.T, dir string, env []string, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}

// TestBuildStageEnv: the Dockerfile reading above takes what Docker would.
func TestBuildStageEnv(t *testing.T) {
	env, run := buildStage(t, `ARG BUILD_IMAGE=golang
FROM ${BUILD_IMAGE} AS build
ENV A=1 B="two words"
ENV C $A-x
ARG D=4
ARG E
# ENV F=6
RUN GOTOOLCHAIN=local \
  sh .ci/build /out/sluice "${VERSION}" && mkdir /x
FROM scratch
ENV G=7
`)
	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	want := map[string]string{"A": "1", "B": "two words", "C": "1-x", "D": "4"}
	if len(got) != len(want) {
		t.Errorf("env %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
	if run != `GOTOOLCHAIN=local sh .ci/build /out/sluice "${VERSION}" && mkdir /x` {
		t.Errorf("run %q", run)
	}
}
