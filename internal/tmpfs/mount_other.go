//go:build !linux

package tmpfs

import "errors"

func mount(string, string) error { return errors.New("tmpfs mounts are Linux only") }

func unmount(string) {}
