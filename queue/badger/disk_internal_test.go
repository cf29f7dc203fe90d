package badger

import (
	"strings"
	"testing"
)

const mb = 1 << 20

// TestFloorKeepsRoomToCompact: below the value threshold bodies stay in
// the tree, and the floor grows by the tree (compaction writes before it
// deletes); the quota is not affected.
func TestFloorKeepsRoomToCompact(t *testing.T) {
	g := &diskGuard{minFree: 64 * mb}
	for _, c := range []struct {
		free, pending, tree int64
		want                string
	}{
		{free: 65 * mb, want: ""},
		{free: 63 * mb, want: "below min_free_disk_bytes 64.0 MiB"},
		{free: 65 * mb, pending: 2 * mb, want: "below min_free_disk_bytes 64.0 MiB"},
		{free: 100 * mb, tree: 30 * mb, want: ""},
		{free: 100 * mb, tree: 40 * mb, want: "below min_free_disk_bytes 64.0 MiB plus the 40.0 MiB Badger may need to compact the log's tables"},
		{free: -1, tree: 40 * mb, want: ""}, // free space unknown: only a quota applies
	} {
		got := g.over(0, c.free, c.pending, c.tree)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("free %d MiB, pending %d, tree %d MiB: %q, want %q", c.free/mb, c.pending, c.tree/mb, got, c.want)
		}
	}
	q := &diskGuard{max: 100 * mb}
	if got := q.over(90*mb, 1, 0, 90*mb); got != "" {
		t.Errorf("a quota alone counts usage, not the tree: %q", got)
	}
	if got := q.over(90*mb, 1, 11*mb, 0); !strings.Contains(got, "max_disk_bytes 100.0 MiB") {
		t.Errorf("over the quota: %q", got)
	}
}

// TestGCScalesToTheRoom: the value-log file size and the periodic pass's
// threshold follow the room the log has, so a small volume is collected
// before it fills.
func TestGCScalesToTheRoom(t *testing.T) {
	for room, want := range map[int64]int64{1 << 40: 64 * mb, 512 * mb: 64 * mb, 192 * mb: 24 * mb, 64 * mb: 8 * mb, 4 * mb: 1 * mb, -5: 1 * mb} {
		if got := vlogFileSize(room); got != want {
			t.Errorf("vlogFileSize(%d MiB) = %d MiB, want %d MiB", room/mb, got/mb, want/mb)
		}
	}
	l := &Log{vlogSize: 24 * mb}
	if got := l.gcThreshold(); got != gcFlushAbove {
		t.Errorf("threshold without limits = %d MiB, want %d MiB", got/mb, gcFlushAbove/mb)
	}
	l.disk = &diskGuard{max: 100 * mb}
	if got := l.gcThreshold(); got != 25*mb {
		t.Errorf("threshold with a 100 MiB quota = %d MiB, want 25 MiB", got/mb)
	}
	l.disk = &diskGuard{minFree: 64 * mb}
	l.disk.used.Store(100 * mb)
	l.disk.free.Store(156 * mb) // a 256 MiB volume
	if got := l.gcThreshold(); got != 48*mb {
		t.Errorf("threshold on a 256 MiB volume = %d MiB, want 48 MiB", got/mb)
	}
	l.disk.free.Store(0)
	if got := l.gcThreshold(); got != 24*mb {
		t.Errorf("threshold on a full volume = %d MiB, want one file, 24 MiB", got/mb)
	}
}
