package main

// `sluice inject` adds the sidecar to Kubernetes workloads in YAML files;
// the rewrite itself is package inject's, shared with `sluice injector`.

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/inject"
)

// injectFlags registers the flags that say what sidecar to add, shared by
// `sluice inject` and `sluice injector` (whose pods' annotations override
// them). The returned function, called after parsing, gives the options,
// checked.
func injectFlags(fs *flag.FlagSet) func() (inject.Options, error) {
	d := inject.Defaults()
	var o inject.Options
	fs.StringVar(&o.Image, "image", d.Image, "sidecar image")
	fs.StringVar(&o.ConfigMap, "config-map", d.ConfigMap, "ConfigMap holding sluice.yaml, mounted at "+inject.ConfigDir)
	fs.StringVar(&o.PVC, "pvc", d.PVC, "PersistentVolumeClaim for the data dir (default: an emptyDir)")
	fs.StringVar(&o.Secret, "secret", d.Secret, "Secret mounted read-only at "+inject.SecretsDir+" (for secret_file)")
	grace := fs.String("grace", d.Grace.String(), "drain grace after SIGTERM (shutdown_grace); terminationGracePeriodSeconds is raised to grace+5s")
	fs.IntVar(&o.IngestPort, "ingest-port", d.IngestPort, "ingest port on the pod's loopback")
	fs.IntVar(&o.AdminPort, "admin-port", d.AdminPort, "admin API port on the pod's loopback")
	fs.StringVar(&o.CPURequest, "cpu-request", d.CPURequest, "sidecar CPU request, a Kubernetes quantity (empty: none)")
	fs.StringVar(&o.MemoryRequest, "memory-request", d.MemoryRequest, "sidecar memory request (empty: none)")
	fs.StringVar(&o.CPULimit, "cpu-limit", d.CPULimit, "sidecar CPU limit (default: none)")
	fs.StringVar(&o.MemoryLimit, "memory-limit", d.MemoryLimit, "sidecar memory limit; sluice gives its Go heap 85% of it (empty: none)")
	fs.Func("jetstream-url", "fleet mode: a NATS server URL (nats://nats.nats.svc:4222); repeat it or give a comma-separated list", func(v string) error {
		for _, u := range strings.Split(v, ",") {
			o.JetStreamURLs = append(o.JetStreamURLs, strings.TrimSpace(u))
		}
		return nil
	})
	return func() (inject.Options, error) {
		var err error
		if o.Grace, err = time.ParseDuration(*grace); err != nil {
			return o, fmt.Errorf("--grace: %w", err)
		}
		return o, o.Validate()
	}
}

const injectAbout = `Reads Kubernetes YAML (FILE, or stdin for - or none) and writes it to stdout
with the sluice sidecar added to every Deployment, StatefulSet, DaemonSet, Job
and Pod. Other documents pass through. Running it again changes nothing.
With --jetstream-url the sidecars run in fleet mode: one shared log in NATS
JetStream, each pod's node id its name.`

func injectCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("inject", injectAbout, stdout)
	options := injectFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("inject: want at most one FILE, got %d arguments", len(pos))
	}
	o, err := options()
	if err != nil {
		return fmt.Errorf("inject: %w", err)
	}
	in, name := stdin, "stdin"
	if len(pos) == 1 && pos[0] != "-" {
		f, err := os.Open(pos[0])
		if err != nil {
			return fmt.Errorf("inject: %w", err)
		}
		defer f.Close()
		in, name = f, pos[0]
	}
	src, err := io.ReadAll(in)
	if err != nil {
		return fmt.Errorf("inject: read %s: %w", name, err)
	}
	out, err := inject.YAML(src, o)
	if err != nil {
		return fmt.Errorf("inject: %s: %w", name, err)
	}
	_, err = stdout.Write(out)
	return err
}
