package inject

// SetSlotHooks sets the functions w runs once a review holds its slot and
// just before it gives the slot back.
func SetSlotHooks(w *Webhook, acquired, released func()) { w.acquired, w.released = acquired, released }
