package main

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/proxy"
)

// memLimitShare is the part of the container's memory limit the Go heap is
// told to stay under. Under a burst sluice's live memory is bounded (ingest
// admission, the ring, Badger's memtables), but with the default GOGC the
// heap may grow to twice the live set before a collection: measured, a
// 500-connection burst of 16 KiB events peaked at 880 MiB RSS with no limit
// and 420 MiB with GOMEMLIMIT=200MiB (docs/reliability.md). Without this, a
// sidecar with a Kubernetes memory limit is OOM-killed where a collection
// would have done. The rest is for goroutine stacks, mmapped files and the
// runtime's own overhead.
const memLimitShare = 0.85

// cgroupMemoryFiles hold the memory limit of the container: cgroup v2, then v1.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// setMemoryLimit sets the Go soft memory limit from the container's cgroup
// limit unless GOMEMLIMIT is set, and returns the limit set (0: none).
func setMemoryLimit(files []string) int64 {
	return softLimit(containerShare(files))
}

// containerShare is memLimitShare of the container's memory limit; 0
// without one.
func containerShare(files []string) int64 {
	return int64(float64(cgroupMemoryLimit(files)) * memLimitShare)
}

// softLimit sets the Go soft memory limit to n unless n is 0 or
// GOMEMLIMIT is set (the operator's word wins), and returns the limit set.
func softLimit(n int64) int64 {
	if n <= 0 || os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	debug.SetMemoryLimit(n)
	return n
}

// memoryBudget is the sidecar's memory budget (memory_bytes) and where it
// came from: the config, the container's limit, or the default.
type memoryBudget struct {
	bytes int64
	from  string // "memory_bytes", "container limit", "default"
	// goLimit is the Go soft memory limit set from it (0: none set).
	goLimit int64
}

// applyMemoryBudget resolves the budget and sets the Go soft memory limit
// to it, unless GOMEMLIMIT is set (the operator's word wins). With the
// default budget (no container limit, no memory_bytes) no Go limit is
// set: the parts are sized for 64 MiB, but a sidecar with 50,000
// subscriptions holds about that in lanes alone, and a soft limit
// below the live heap makes the collector run back to back (it may take
// up to half the CPU). With a container limit the kill is the worse fate;
// with memory_bytes the operator asked.
func applyMemoryBudget(configured int64, files []string) memoryBudget {
	b := memoryBudget{bytes: configured, from: "memory_bytes"}
	if b.bytes == 0 {
		if share := containerShare(files); share > 0 {
			b.bytes, b.from = max(share, proxy.MinMemoryBytes), "container limit"
		} else {
			return memoryBudget{bytes: proxy.DefaultMemoryBytes, from: "default"}
		}
	}
	b.goLimit = softLimit(b.bytes)
	return b
}

// cgroupMemoryLimit reads the first limit found; 0 when unlimited or unknown.
func cgroupMemoryLimit(files []string) int64 {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return 0
		}
		n, err := strconv.ParseInt(v, 10, 64)
		// cgroup v1 reports "no limit" as a number near 2^63.
		if err != nil || n <= 0 || n >= 1<<60 {
			return 0
		}
		return n
	}
	return 0
}
