package delivery

import (
	"sync"
	"sync/atomic"
)

// slots is the process-wide in-flight limit (max_in_flight) and the pool
// of workers that run deliveries. Workers are started on demand up to the
// limit and then kept: a delivery never spawns a goroutine of its own, and
// the job channel never blocks, because jobs never outnumber slots. A lane
// that finds every slot taken is remembered (starved) and woken when one
// frees up.
type slots struct {
	max      int64
	inflight atomic.Int64
	workers  atomic.Int64
	jobs     chan *job
	freed    chan struct{} // signalled when inflight drops to zero
	quit     chan struct{} // closed at stop: workers exit
	feed     *feed         // wakes starved lanes from inside a pump
	run      func(j *job, w *workerState)

	mu      sync.Mutex
	starved map[*lane]struct{}
}

func newSlots(max int, f *feed, quit chan struct{}, run func(*job, *workerState)) *slots {
	return &slots{max: int64(max), jobs: make(chan *job, max), freed: make(chan struct{}, 1),
		quit: quit, feed: f, run: run, starved: map[*lane]struct{}{}}
}

// full reports whether every slot is taken.
func (s *slots) full() bool { return s.inflight.Load() >= s.max }

// acquire takes one slot. When none is free the lane is remembered, to be
// pumped when a slot frees up.
func (s *slots) acquire(l *lane) bool {
	for {
		n := s.inflight.Load()
		if n >= s.max {
			s.mu.Lock()
			s.starved[l] = struct{}{}
			s.mu.Unlock()
			return false
		}
		if s.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// giveBack returns a slot from inside a pump (a lane's mu held): starved
// lanes are handed to the kick loop rather than pumped here, which could
// be this very lane.
func (s *slots) giveBack() {
	s.freeOne()
	s.mu.Lock()
	var ls []*lane
	for l := range s.starved {
		ls = append(ls, l)
	}
	clear(s.starved)
	s.mu.Unlock()
	s.feed.wake(ls)
}

// release returns the slot of a finished delivery (no lane lock held) and
// pumps lanes that were waiting for a slot until one takes it: a lane
// woken may take nothing (paused or gone meanwhile), and stopping at it
// left the others waiting for a release that might never come (found with
// max_in_flight 1 and paused waiting lanes: the active one stalled).
func (s *slots) release() {
	s.freeOne()
	for !s.full() {
		var next *lane
		s.mu.Lock()
		for l := range s.starved {
			next = l
			delete(s.starved, l)
			break
		}
		s.mu.Unlock()
		if next == nil {
			return
		}
		next.pump()
	}
}

func (s *slots) freeOne() {
	if s.inflight.Add(-1) == 0 {
		select {
		case s.freed <- struct{}{}:
		default:
		}
	}
}

// submit hands a job, whose slot is taken, to a worker.
func (s *slots) submit(j *job) {
	for {
		w := s.workers.Load()
		if w >= s.inflight.Load() {
			break
		}
		if s.workers.CompareAndSwap(w, w+1) {
			go s.worker()
			break
		}
	}
	s.jobs <- j
}

func (s *slots) worker() {
	var w workerState
	for {
		select {
		case j := <-s.jobs:
			s.run(j, &w)
		case <-s.quit:
			return
		}
	}
}
