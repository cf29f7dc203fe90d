package tmpfs

import "syscall"

func mount(dir, size string) error { return syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size) }

func unmount(dir string) { syscall.Unmount(dir, syscall.MNT_DETACH) }
