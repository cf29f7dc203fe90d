package main

// The _nats child as the harness drives it: the JetStream cluster the
// fleet scenarios of a run share.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ---------------------------------------------------------------- cluster

// natsCluster is the _nats child: the JetStream cluster every fleet
// scenario of a run shares, each on a stream (and buckets) of its own that
// it deletes when it is done.
type natsCluster struct {
	*child
	urls  []string
	pprof string // host:port of its net/http/pprof
	nc    *nats.Conn
	js    jetstream.JetStream
}

// natsRunning returns the run's cluster if it runs, else nil.
func (h *harness) natsRunning() *natsCluster {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.natsCl != nil && h.natsCl.running() {
		return h.natsCl
	}
	return nil
}

// startNATS starts the cluster the first time a fleet scenario asks for it.
func (h *harness) startNATS(ctx context.Context) (*natsCluster, error) {
	if c := h.natsRunning(); c != nil {
		return c, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	lw := newLineWriter()
	id := h.nextID("nats")
	c, err := h.startChild("nats", self, []string{"_nats", "-dir", filepath.Join(h.tmp, id),
		"-nodes", strconv.Itoa(fleetNodes), "-max-life", "3h"}, filepath.Join(h.tmp, id+".log"), lw)
	if err != nil {
		return nil, err
	}
	line, err := firstLine(c, lw, 90*time.Second)
	if err != nil {
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("nats cluster: %w: %s", err, tail(c.logf.Name(), 1000))
	}
	f := strings.Fields(line)
	if len(f) != 4 || f[0] != "nats" || f[2] != "pprof" {
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("nats cluster said %q", line)
	}
	n := &natsCluster{child: c, urls: strings.Split(f[1], ","), pprof: f[3]}
	if n.nc, err = nats.Connect(f[1], nats.MaxReconnects(-1)); err != nil {
		c.stop(5 * time.Second)
		return nil, fmt.Errorf("nats cluster: connect: %w", err)
	}
	if n.js, err = jetstream.New(n.nc); err != nil {
		n.nc.Close()
		c.stop(5 * time.Second)
		return nil, err
	}
	h.mu.Lock()
	h.natsCl = n
	h.mu.Unlock()
	h.logf("  nats cluster (%d nodes, one process) up in %s: %s", fleetNodes, time.Since(start).Round(time.Millisecond), f[1])
	return n, nil
}

// dropStream deletes stream and the KV buckets named after it.
func (n *natsCluster) dropStream(stream string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var names []string
	l := n.js.StreamNames(ctx)
	for s := range l.Name() {
		if s == stream || strings.HasPrefix(s, "KV_"+stream+"_") || strings.HasPrefix(s, "OBJ_"+stream+"_") {
			names = append(names, s)
		}
	}
	for _, s := range names {
		n.js.DeleteStream(ctx, s)
	}
}

// streamStats reads a stream's message count and bytes.
func (n *natsCluster) streamStats(stream string) (msgs, bytes uint64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := n.js.Stream(ctx, stream)
	if err != nil {
		return 0, 0, err
	}
	st := s.CachedInfo().State
	return st.Msgs, st.Bytes, nil
}

func (n *natsCluster) close() {
	if n.nc != nil {
		n.nc.Close()
	}
	n.stop(10 * time.Second)
}

// profile fetches a CPU profile of the cluster's process.
func (n *natsCluster) profile(path string, secs int) error {
	c := &http.Client{Timeout: time.Duration(secs)*time.Second + 30*time.Second}
	resp, err := c.Get("http://" + n.pprof + "/debug/pprof/profile?seconds=" + strconv.Itoa(secs))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("nats cpu profile: status %d", resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.ReadFrom(resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
