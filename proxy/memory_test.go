package proxy_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/queue/badger"
)

// TestSplitMemory: the default budget gives the log exactly the sizes the
// log takes by default; at every budget what a steady load keeps live
// (two memtable arenas of about 1.3× each, the ring, the id filter and
// the caches) is at most half of it, so the collector's target of twice
// the live heap fits; no share shrinks as the budget grows, none passes
// the size it had before the budget existed, and the memtable never goes
// below the 1 MiB the log's batches need.
func TestSplitMemory(t *testing.T) {
	if got := proxy.SplitMemory(proxy.DefaultMemoryBytes).Log; got != badger.DefaultMemory {
		t.Fatalf("SplitMemory(default).Log = %+v, badger.DefaultMemory = %+v", got, badger.DefaultMemory)
	}
	if below, min := proxy.SplitMemory(1<<20), proxy.SplitMemory(proxy.MinMemoryBytes); below != min {
		t.Fatalf("a budget below the minimum: %+v, want the minimum's %+v", below, min)
	}
	var prev proxy.MemoryShares
	for _, total := range []int64{16 << 20, 32 << 20, 48 << 20, 64 << 20, 128 << 20, 256 << 20, 870 << 20, 1 << 30, 8 << 30} {
		s := proxy.SplitMemory(total)
		l := s.Log
		live := 2*l.MemTable*13/10 + s.Ring + l.IDFilter + l.BlockCache + l.IndexCache
		if live > total/2 {
			t.Errorf("budget %d MiB: steady parts %d MiB, more than half", total>>20, live>>20)
		}
		if l.MemTable < 1<<20 || l.MemTable > 16<<20 || l.BlockCache > 32<<20 || l.IndexCache > 16<<20 ||
			l.IDFilter > 64<<20 || s.Ring > 64<<20 || s.Gate > 64<<20 {
			t.Errorf("budget %d MiB: a share out of its bounds: %+v", total>>20, s)
		}
		if total > 16<<20 && (l.MemTable < prev.Log.MemTable || s.Ring < prev.Ring || s.Gate < prev.Gate ||
			l.IDFilter < prev.Log.IDFilter || l.BlockCache < prev.Log.BlockCache || l.IndexCache < prev.Log.IndexCache) {
			t.Errorf("budget %d MiB: a share shrank: %+v after %+v", total>>20, s, prev)
		}
		prev = s
	}
}

// TestMemoryBudgetSizesTheLog: the budget reaches Badger. Its write-ahead
// file is twice the memtable size, so a 64 MiB budget shows as an 8 MiB
// .mem file (a 4 MiB memtable), the default as 4 MiB.
func TestMemoryBudgetSizesTheLog(t *testing.T) {
	for _, total := range []int64{0, 64 << 20} {
		dir := t.TempDir()
		startServerWith(t, proxy.Options{DataDir: dir, MemoryBytes: total})
		want := 2 * proxy.SplitMemory(max(total, proxy.DefaultMemoryBytes)).Log.MemTable
		mems, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
		if len(mems) == 0 {
			t.Fatalf("budget %d: no .mem file in %s", total, dir)
		}
		for _, m := range mems {
			fi, err := os.Stat(m)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() != want {
				t.Errorf("budget %d MiB: %s is %d bytes, want %d (twice the memtable)", total>>20, filepath.Base(m), fi.Size(), want)
			}
		}
	}
}
