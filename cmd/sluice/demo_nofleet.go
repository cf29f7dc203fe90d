//go:build nofleetdemo

package main

import (
	"errors"
	"io"
	"time"
)

// errNoFleetDemo is what `demo --fleet` answers in the release build.
// The fleet demo starts its own 3-node JetStream cluster, which needs the
// whole NATS server linked in: 8.8 MB of the 38 MB release binary, and 3 MB
// of a serve's resident memory at rest, in every pod that runs the sidecar,
// for a tour no sidecar ever gives. Fleet mode itself (serve with
// log.backend: jetstream) is a NATS client and stays.
//
// The tests build without the tag (their files use the fleet demo's
// helpers); TestReleaseBuild builds with .ci/build and runs this.
var errNoFleetDemo = errors.New("demo --fleet: this is the release build of sluice, " +
	"which leaves out the embedded NATS server the fleet demo starts; " +
	"run the demo from source instead: in a checkout of github.com/sluicehq/sluice, " +
	"go run ./cmd/sluice demo --fleet")

func demoFleet(int, time.Duration, io.Writer) error { return errNoFleetDemo }
