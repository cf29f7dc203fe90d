package queue

import (
	"slices"
	"sync"
)

// Rendering is one rendering of an event's body (a body variant, issue
// 13), kept on the event so that every lane sending that variant shares
// it: the delivery engine renders each distinct variant once per event,
// however many lanes ask. No backend reads or stores it.
type Rendering struct {
	key  string
	once sync.Once
	body []byte
	err  error
}

// Rendering returns e's rendering under key, adding an empty one when there
// is none yet. It is lock-free: readers load the list and scan it (an event
// has a handful of variants at most); an adder swaps in a longer copy.
// Callers racing for one key get the same *Rendering.
func (e *Event) Rendering(key string) *Rendering {
	for {
		p := e.renderings.Load()
		var list []*Rendering
		if p != nil {
			list = *p
			for _, r := range list {
				if r.key == key {
					return r
				}
			}
		}
		r := &Rendering{key: key}
		next := append(slices.Clip(list), r) // a new array: readers keep the old one
		if e.renderings.CompareAndSwap(p, &next) {
			return r
		}
	}
}

// Do returns the rendered body, calling render for it the first time only;
// callers that come meanwhile wait for that call and get its result. The
// body must not be modified.
func (r *Rendering) Do(render func() ([]byte, error)) ([]byte, error) {
	r.once.Do(func() { r.body, r.err = render() })
	return r.body, r.err
}
