package jetstream_test

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/internal/natscluster"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/jetstream"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// cluster is the one 3-node JetStream cluster every test of this package
// shares; each test gets its own stream (and buckets) by name.
var cluster *natscluster.Cluster

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-js-")
	if err != nil {
		panic(err)
	}
	cluster, err = natscluster.Start(natscluster.Options{Dir: dir, MaxPayloadBytes: 8 << 20})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start cluster:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	cluster.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

var places atomic.Int64

// backend opens stores on the shared cluster; a place is a stream name.
func backend() queuetest.Backend {
	return queuetest.Backend{
		NewPlace: func(testing.TB) string { return fmt.Sprintf("T%d", places.Add(1)) },
		Open: func(tb testing.TB, place string, o queuetest.Options) queue.Store {
			tb.Helper()
			s, err := jetstream.Open(jetstream.Options{
				URLs: cluster.URLs(), Stream: place, Replicas: 3, NodeID: "test",
				DedupWindow: o.DedupWindow, OnCommit: o.OnCommit,
				CompactInterval: -1, // the suite's compactions follow each other at once
			})
			if err != nil {
				tb.Fatalf("open %s: %v", place, err)
			}
			tb.Cleanup(func() { s.Close() })
			return s
		},
	}
}

func TestContract(t *testing.T) { queuetest.Run(t, backend()) }
