// Package filestamp tells whether files changed since they were last
// looked at, for the code that re-reads certificates and keys when
// cert-manager or a Kubernetes Secret volume rotates them: the egress
// client certificates (proxy) and the injector's serving pair (inject).
// It reads no file's contents. For the project's own packages only.
package filestamp

import "os"

// Stamp is what a look sees of one file: what stat says of the file its
// symlinks lead to. A Kubernetes Secret's update swaps the volume's
// ..data symlink, which changes the inode seen even when the size and
// modification time happen to match.
type Stamp struct {
	info os.FileInfo // nil: missing or unreadable
}

// Take stamps each of paths, in order.
func Take(paths ...string) []Stamp {
	out := make([]Stamp, len(paths))
	for i, p := range paths {
		if info, err := os.Stat(p); err == nil {
			out[i].info = info
		}
	}
	return out
}

// Same reports whether two looks saw the same files: the same inode, size
// and modification time for each, or the same one missing.
func Same(a, b []Stamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i].info, b[i].info
		if x == nil || y == nil {
			if x != y {
				return false
			}
			continue
		}
		if !os.SameFile(x, y) || x.Size() != y.Size() || !x.ModTime().Equal(y.ModTime()) {
			return false
		}
	}
	return true
}
