// Package tmpfs mounts small real file systems for tests that must fill a
// disk: a full volume is only honest on a file system that can be full.
package tmpfs

import (
	"os"
	"testing"
)

// Mount mounts a tmpfs of the given size ("128m") on a temp dir and
// unmounts it when the test ends. Without permission to mount (not root,
// or a container without CAP_SYS_ADMIN) the test is skipped, unless CI is
// set: CI runs as root, where a skip would hide a test that should run.
func Mount(tb testing.TB, size string) string {
	tb.Helper()
	mnt := tb.TempDir()
	if err := mount(mnt, size); err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("cannot mount a tmpfs (%v, euid %d); CI runs as root and must be able to", err, os.Geteuid())
		}
		tb.Skipf("cannot mount a tmpfs here (%v, euid %d)", err, os.Geteuid())
	}
	tb.Cleanup(func() { unmount(mnt) })
	return mnt
}
