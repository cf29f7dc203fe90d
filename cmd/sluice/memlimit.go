package main

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"
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
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	limit := cgroupMemoryLimit(files)
	if limit <= 0 {
		return 0
	}
	soft := int64(float64(limit) * memLimitShare)
	debug.SetMemoryLimit(soft)
	return soft
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
