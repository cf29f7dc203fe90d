package proxy_test

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
// file is twice the memtable size, so a 128 MiB budget shows as a 16 MiB
// .mem file (an 8 MiB memtable), the default (64 MiB) as 8 MiB.
func TestMemoryBudgetSizesTheLog(t *testing.T) {
	for _, total := range []int64{0, 128 << 20} {
		dir := t.TempDir()
		startServerWith(t, proxy.Options{DataDir: dir, MemoryBytes: total})
		want := 2 * proxy.SplitMemory(cmp.Or(total, proxy.DefaultMemoryBytes)).Log.MemTable
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

// TestMemoryDocTable: the table of shares in docs/operations.md ("What
// each part gets") is what SplitMemory gives: each row's share at
// 128 MiB (below every cap), its sizes at 32 and 64 MiB, and its cap.
func TestMemoryDocTable(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "| part | share |")
	if !ok {
		t.Fatal(`docs/operations.md has no "| part | share |" table`)
	}
	parts := func(s proxy.MemoryShares) []int64 {
		return []int64{s.Log.MemTable, s.Ring, s.Gate, s.Log.IDFilter, s.Log.BlockCache, s.Log.IndexCache}
	}
	size := func(cell string) int64 {
		cell = strings.TrimSpace(cell)
		cell, _, _ = strings.Cut(cell, " (")
		n, unit, _ := strings.Cut(cell, " ")
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			t.Fatalf("size %q: %v", cell, err)
		}
		return v << map[string]int{"KiB": 10, "MiB": 20}[unit]
	}
	at32, at64, at128, top := parts(proxy.SplitMemory(32<<20)), parts(proxy.SplitMemory(64<<20)), parts(proxy.SplitMemory(128<<20)), parts(proxy.SplitMemory(1<<40))
	rows := 0
	for line := range strings.Lines(table) {
		if !strings.HasPrefix(line, "| ") {
			if rows > 0 {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 5 || strings.HasPrefix(cells[1], "---") {
			continue
		}
		if rows == len(at32) {
			t.Fatalf("more rows than parts: %q", line)
		}
		var den int64
		if _, err := fmt.Sscanf(strings.TrimSpace(cells[1]), "1/%d", &den); err != nil {
			t.Fatalf("row %d share %q: %v", rows, cells[1], err)
		}
		if got, want := size(cells[2]), at32[rows]; got != want {
			t.Errorf("row %d (%s): %d at 32 MiB, SplitMemory gives %d", rows, cells[0][:20], got, want)
		}
		if got, want := size(cells[3]), at64[rows]; got != want {
			t.Errorf("row %d (%s): %d at 64 MiB, SplitMemory gives %d", rows, cells[0][:20], got, want)
		}
		if (128<<20)/den != at128[rows] {
			t.Errorf("row %d (%s): share 1/%d, SplitMemory gives %d of 128 MiB", rows, cells[0][:20], den, at128[rows])
		}
		if got, want := size(cells[4]), top[rows]; got != want {
			t.Errorf("row %d (%s): never more than %d, SplitMemory caps at %d", rows, cells[0][:20], got, want)
		}
		rows++
	}
	if rows != len(at32) {
		t.Fatalf("%d rows in the table, want %d", rows, len(at32))
	}
}
