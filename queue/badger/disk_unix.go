//go:build unix

package badger

import (
	"io/fs"
	"syscall"

	"golang.org/x/sys/unix"
)

// freeBytes is the space an unprivileged writer may still use on the file
// system holding dir, or -1 when it cannot be read.
func freeBytes(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return -1
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512
	}
	return fi.Size()
}
