package badger

import (
	"fmt"

	"github.com/sluicehq/sluice/queue"
)

// dirError is an Open failure about the data dir as a whole. Its message
// names the dir and tells the operator what to do; errors.Is matches its
// kind (ErrLocked, ErrCorrupt, ErrNotDataDir) and its cause.
type dirError struct {
	dir   string
	kind  error
	cause error
}

func (e *dirError) Error() string {
	switch e.kind {
	case queue.ErrLocked:
		return fmt.Sprintf("data dir %s is in use by another process (is another sluice running?)", e.dir)
	case queue.ErrNotDataDir:
		return fmt.Sprintf("data dir %s is not a sluice data dir: %v; point data_dir at an empty or new directory", e.dir, e.cause)
	default:
		var accept string
		if _, ok := e.cause.(*logDamage); ok {
			accept = ", or accept the loss and open it as it is (Options.AcceptDataLoss; sluice serve --accept-data-loss)"
		}
		return fmt.Sprintf("data dir %s looks damaged: %v; restore it from a backup, or move it aside "+
			"and start with an empty data dir%s", e.dir, e.cause, accept)
	}
}

func (e *dirError) Unwrap() []error { return []error{e.kind, e.cause} }
