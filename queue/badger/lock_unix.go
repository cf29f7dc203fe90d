//go:build !windows && !plan9 && !js && !wasip1 && !aix

package badger

import (
	"errors"
	"fmt"
	"os"

	"github.com/sluicehq/sluice/queue"

	"golang.org/x/sys/unix"
)

// lockDir takes the lock Badger takes on dir (flock on the directory), so
// that Open can inspect the files before Badger opens them and tell a dir
// held by another process from a damaged one. The caller releases it
// before badgerdb.Open takes it again.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open queue %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &dirError{dir, queue.ErrLocked, err}
		}
		return nil, fmt.Errorf("open queue %s: lock: %w", dir, err)
	}
	return func() { f.Close() }, nil
}
