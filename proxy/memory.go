package proxy

import (
	"github.com/sluicehq/sluice/queue/badger"
)

// The memory budget (memory_bytes): one figure from which every part
// sluice holds in memory by its own choice is sized. A sidecar runs beside
// every replica of a service, so its footprint is paid once per pod; the
// parts below used to be fixed sizes chosen for throughput (Badger's
// three 16 MiB memtables, 48 MiB of caches, a 64 MiB ring, a 64 MiB
// dedup filter), which made a sidecar at 1,000 events/s peak at 200 MiB.
const (
	// DefaultMemoryBytes is the budget of a sidecar that sets none and
	// runs without a container memory limit. 64 MiB, not less: at 32 MiB
	// (2 MiB memtables, a 2 MiB ring) saturated ingest fell by up to a
	// quarter against the fixed sizes before the budget (bench
	// ingest-fsync, interleaved rounds on a busy machine: 0.24× the no-op
	// server against 0.32×); at 64 MiB it held, and so did fan-out 10
	// (docs/benchmarks.md, "Sidecar footprint").
	DefaultMemoryBytes = 64 << 20
	// MinMemoryBytes is the smallest budget accepted: below it the
	// memtables are too small for the log's batches of 1 MiB events.
	MinMemoryBytes = 16 << 20
)

// MemoryShares is what each part gets of a budget.
type MemoryShares struct {
	Log badger.Memory
	// Ring bounds the bytes of recent events kept for lanes that keep up.
	Ring int64
	// Gate bounds the bodies of appends waiting on the group committer;
	// past it ingest answers 503 with Retry-After.
	Gate int64
}

// SplitMemory divides total bytes among the parts. The shares are
// bounds, not reservations: an idle sidecar uses a fraction of each.
//
//	memtable     1/16  (one written, one flushing: arenas of about 1.3× each, ~1/6)
//	ring         1/16
//	gate         1/8   (only under a burst)
//	id filter    1/32
//	block cache  1/32
//	index cache  1/64
//
// What a steady load keeps live of these (memtables, ring, filter,
// caches) is about a third of the budget, so that the collector's usual
// target of twice the live heap stays within it: with every share twice
// this, a sidecar at 1,000 events/s under a soft limit of its 32 MiB
// budget spent 838 µs of CPU per event collecting, against 307 µs without
// the limit. The rest is for what scales with the load rather than with a
// setting (connections' buffers, goroutine stacks, requests in flight,
// the lanes' own state: about 1 KiB per subscription), for Badger's
// table builders, which no option bounds, and for the runtime.
//
// Each share is clamped: a memtable of at least 1 MiB (a batch must fit
// in 15% of it, Badger's transaction limit); and no share above the
// fixed size it had before the budget existed (16 MiB memtables, 32 and
// 16 MiB caches, a 64 MiB ring, gate and filter), sizes chosen for
// throughput: a budget of gigabytes (85% of a generous container limit)
// buys nothing more there, and would only make the sidecar bigger.
func SplitMemory(total int64) MemoryShares {
	total = max(total, MinMemoryBytes)
	clamp := func(v, lo, hi int64) int64 { return min(max(v, lo), hi) }
	return MemoryShares{
		Log: badger.Memory{
			MemTable:   clamp(total/16, 1<<20, 16<<20),
			BlockCache: min(total/32, 32<<20),
			IndexCache: min(total/64, 16<<20),
			IDFilter:   clamp(total/32, 256<<10, 64<<20),
		},
		Ring: clamp(total/16, 1<<20, 64<<20),
		Gate: clamp(total/8, 1<<20, 64<<20),
	}
}
