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
func versionCmd(stdout io.Writer) error {
	_, err := fmt.Fprintf(stdout, "sluice %s (commit %s)\n", version, commit)
	return err
}
