//go:build !unix

package badger

import "io/fs"

// freeBytes is unknown here: only max_disk_bytes applies.
func freeBytes(string) int64 { return -1 }

func allocated(fi fs.FileInfo) int64 { return fi.Size() }
