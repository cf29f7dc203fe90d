package testbed

// SetHolderLate sets holderLate for one test; the function returned unsets it.
func SetHolderLate(f func()) func() {
	holderLate.Store(&f)
	return func() { holderLate.Store(nil) }
}
