package badger_test

import (
	"bytes"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Badger's caches run goroutines that stop shortly after Close.
		goleak.IgnoreAnyFunction("github.com/dgraph-io/ristretto/v2.(*defaultPolicy[...]).processItems"),
		goleak.IgnoreAnyFunction("github.com/dgraph-io/ristretto/v2.(*Cache[...]).processItems"),
		goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

// backend runs the contract suite on Badger logs in temp dirs, with the
// disk guard on as in production.
var backend = queuetest.Backend{
	NewPlace: func(tb testing.TB) string { return tb.TempDir() },
	Open: func(tb testing.TB, dir string, o queuetest.Options) queue.Store {
		return queuetest.MustOpen(tb, dir, badger.Options{Sync: o.Sync, DedupWindow: o.DedupWindow, OnCommit: o.OnCommit})
	},
}

func TestContract(t *testing.T) { queuetest.Run(t, backend) }

// TestInvariant1_AcknowledgedAppendsSurviveSIGKILL kills a real appending
// process several times; every append it acknowledged must be in the log.
func TestInvariant1_AcknowledgedAppendsSurviveSIGKILL(t *testing.T) { queuetest.Crash(t, backend) }

// TestInvariant2_DuplicatesRecognisedAfterSIGKILL kills a real appending
// and compacting process; every id it acknowledged must still be a
// duplicate, its event compacted or not.
func TestInvariant2_DuplicatesRecognisedAfterSIGKILL(t *testing.T) {
	queuetest.CrashDedup(t, backend)
}

// BenchmarkAppend measures Append with 64 concurrent producers (32 per
// core on this 2-core machine; a sidecar's closed-loop producers), with
// and without fsync. cpu-ns/op is the process's user+system CPU per
// append (getrusage), Badger's flushes and compactions included: on a
// machine shared with other work it moves far less than ns/op, which is
// wall time and follows the disk.
func BenchmarkAppend(b *testing.B) {
	for _, mode := range []struct {
		name string
		sync bool
	}{{"fsync", true}, {"async", false}} {
		b.Run(mode.name, func(b *testing.B) {
			q := queuetest.MustOpen(b, "", badger.Options{Sync: mode.sync})
			body := bytes.Repeat([]byte("x"), 512)
			var n atomic.Int64
			b.SetParallelism(32) // many producers share each sync
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			cpu0 := cpuTime()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := "b-" + strconv.FormatInt(n.Add(1), 10)
					if _, _, err := q.Append(&queue.Event{ID: id, Type: "bench", AcceptedAt: time.Now(), Body: body}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkAppendBatch is BenchmarkAppend with fsync through AppendBatch:
// 16 producers (8 per core) of batches of 100 (ingest-batch's load); an
// op is one event, so ns/op and cpu-ns/op compare with BenchmarkAppend's.
// What a batch saves is the per-append hand-off and wake-up; Badger's own
// cost per byte (memtable, table builds, compaction, msync) stays.
func BenchmarkAppendBatch(b *testing.B) {
	q := queuetest.MustOpen(b, "", badger.Options{Sync: true})
	body := bytes.Repeat([]byte("x"), 512)
	var n atomic.Int64
	b.SetParallelism(8)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	cpu0 := cpuTime()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		evs := make([]*queue.Event, 0, 100)
		res := make([]queue.AppendResult, 100)
		flush := func() {
			q.AppendBatch(evs, res[:len(evs)])
			for _, r := range res[:len(evs)] {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
			evs = evs[:0]
		}
		for pb.Next() {
			id := "b-" + strconv.FormatInt(n.Add(1), 10)
			evs = append(evs, &queue.Event{ID: id, Type: "bench", AcceptedAt: time.Now(), Body: body})
			if len(evs) == cap(evs) {
				flush()
			}
		}
		if len(evs) > 0 {
			flush()
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}
