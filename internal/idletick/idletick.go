// Package idletick holds a ticker that sleeps while its loop has nothing
// to look at: the egress routes' file checks and the operational
// webhook's flush each use one, so an idle sidecar does not wake.
package idletick

import "time"

// Ticker is a time.Ticker its loop stops while it has nothing to look at,
// so an idle sidecar sleeps instead of waking every period; what gives it
// work wakes the loop, which starts the ticker again.
type Ticker struct {
	*time.Ticker
	d       time.Duration
	ticking bool
}

// New returns a running Ticker of period d.
func New(d time.Duration) *Ticker {
	return &Ticker{Ticker: time.NewTicker(d), d: d, ticking: true}
}

// RunIf runs the ticker when busy and stops it when not.
func (t *Ticker) RunIf(busy bool) {
	switch {
	case !busy && t.ticking:
		t.Stop()
		t.ticking = false
	case busy && !t.ticking:
		t.Reset(t.d)
		t.ticking = true
	}
}
