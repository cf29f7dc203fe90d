package main

import (
	"cmp"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/sluicehq/sluice/proxy"
)

func TestCgroupMemoryLimit(t *testing.T) {
	dir := t.TempDir()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		files []string
		want  int64
	}{
		{[]string{write("v2", "536870912\n")}, 512 << 20},
		{[]string{write("v2max", "max\n")}, 0},
		{[]string{filepath.Join(dir, "missing"), write("v1", "268435456\n")}, 256 << 20},
		{[]string{write("v1unlimited", "9223372036854771712\n")}, 0},
		{[]string{write("garbage", "lots\n")}, 0},
		{nil, 0},
	}
	for _, c := range cases {
		if got := cgroupMemoryLimit(c.files); got != c.want {
			t.Errorf("cgroupMemoryLimit(%v) = %d, want %d", c.files, got, c.want)
		}
	}
}

func TestSetMemoryLimitFromCgroup(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	f := filepath.Join(t.TempDir(), "memory.max")
	os.WriteFile(f, []byte("1073741824\n"), 0o600)

	t.Setenv("GOMEMLIMIT", "")
	os.Unsetenv("GOMEMLIMIT")
	gib := float64(1 << 30)
	if got := setMemoryLimit([]string{f}); got != int64(gib*memLimitShare) || debug.SetMemoryLimit(-1) != got {
		t.Fatalf("set %d (runtime has %d), want 85%% of 1 GiB", got, debug.SetMemoryLimit(-1))
	}
	// An operator's GOMEMLIMIT wins.
	debug.SetMemoryLimit(old)
	t.Setenv("GOMEMLIMIT", "300MiB")
	if got := setMemoryLimit([]string{f}); got != 0 || debug.SetMemoryLimit(-1) != old {
		t.Fatalf("with GOMEMLIMIT set: set %d", got)
	}
}

// TestApplyMemoryBudget: memory_bytes wins and becomes the Go soft limit;
// without it a container limit gives 85% of itself; with neither the
// default budget sizes the parts and no soft limit is set (a sidecar with
// many lanes may hold more than 32 MiB live); an operator's GOMEMLIMIT
// is never overridden.
func TestApplyMemoryBudget(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	f := filepath.Join(t.TempDir(), "memory.max")
	os.WriteFile(f, []byte("1073741824\n"), 0o600)
	missing := []string{filepath.Join(t.TempDir(), "none")}
	t.Setenv("GOMEMLIMIT", "")
	os.Unsetenv("GOMEMLIMIT")

	gib := float64(1 << 30)
	share := int64(gib * memLimitShare)
	for _, c := range []struct {
		name       string
		configured int64
		files      []string
		want       memoryBudget
	}{
		{"memory_bytes", 64 << 20, []string{f}, memoryBudget{64 << 20, "memory_bytes", 64 << 20}},
		{"container", 0, []string{f}, memoryBudget{share, "container limit", share}},
		{"default", 0, missing, memoryBudget{proxy.DefaultMemoryBytes, "default", 0}},
	} {
		debug.SetMemoryLimit(old)
		got := applyMemoryBudget(c.configured, c.files)
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		if want := cmp.Or(c.want.goLimit, old); debug.SetMemoryLimit(-1) != want {
			t.Errorf("%s: runtime limit %d, want %d", c.name, debug.SetMemoryLimit(-1), want)
		}
	}
	debug.SetMemoryLimit(old)
	t.Setenv("GOMEMLIMIT", "300MiB")
	if got := applyMemoryBudget(64<<20, []string{f}); got.goLimit != 0 || got.bytes != 64<<20 || debug.SetMemoryLimit(-1) != old {
		t.Fatalf("with GOMEMLIMIT set: %+v, runtime limit %d", got, debug.SetMemoryLimit(-1))
	}
}
