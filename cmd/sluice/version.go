package main

import (
	"fmt"
	"io"
)

// Set with -ldflags "-X main.version=... -X main.commit=..." (.ci/build).
var (
	version = "dev"
	commit  = "none"
)

// versionCmd prints the stamped version and commit.
func versionCmd(args []string, stdout io.Writer) error {
	fs := newFlagSet("version", `Prints the version and the commit this binary was built from ("dev" and
"none" for a build without them stamped in). 'sluice --version' does the same.`, stdout)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("version", pos); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "sluice %s (commit %s)\n", version, commit)
	return err
}
