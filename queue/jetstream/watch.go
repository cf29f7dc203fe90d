package jetstream

// The fleet's watches of the live set (node.>), the subscriptions
// (member.>) and the leases (lease.>), each entry applied under mu, and
// the notices nodes send each other when a subscription's state changed.

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// startViews starts the watches of the live set, the subscriptions and the
// leases, and waits until each delivered what is there now.
func (s *Store) startViews() error {
	if err := s.startWatch("nodes", s.nodes, "node.>", s.onNode); err != nil {
		return err
	}
	if err := s.startWatch("members", s.state, "member.>", s.onMember, jetstream.MetaOnly()); err != nil {
		return err
	}
	return s.ensureLeaseView()
}

// ensureLeaseView starts the watch of lease.> unless it runs: Own needs
// it, and Owner answers from it on any node.
func (s *Store) ensureLeaseView() error {
	return s.startWatch("leases", s.state, "lease.>", s.onLease)
}

// startWatch watches keys of kv for the fleet's life, applying each entry
// under mu, and returns once the entries there now were applied. Starting
// a watch that runs waits for its initial values, no more.
func (s *Store) startWatch(name string, kv jetstream.KeyValue, keys string, apply func(jetstream.KeyValueEntry), opts ...jetstream.WatchOpt) error {
	fl := &s.fl
	wait := 2 * s.opts.RequestTimeout
	fl.mu.Lock()
	if fl.closed {
		fl.mu.Unlock()
		return queue.ErrClosed
	}
	if initial, ok := fl.watched[name]; ok {
		fl.mu.Unlock()
		return awaitInitial(initial, wait, keys)
	}
	initial := make(chan struct{})
	fl.watched[name] = initial
	fl.mu.Unlock()

	// The watch's context is the fleet's: a context with a deadline would
	// end the watch with it.
	w, err := kv.Watch(fl.ctx, keys, opts...)
	if err != nil {
		fl.mu.Lock()
		delete(fl.watched, name)
		fl.mu.Unlock()
		return fmt.Errorf("fleet: watch %s of %s: %w", keys, kv.Bucket(), err)
	}
	fl.mu.Lock()
	fl.watches = append(fl.watches, w)
	started := fl.spawn(func() {
		once := sync.Once{}
		var last uint64 // the revision of the last entry applied
		for cur := w; cur != nil; cur = s.rewatch(name, kv, keys, last, opts) {
			// Read until the channel closes, even after the fleet closed:
			// the library's callback blocks on it, and Stop must not leave
			// it so.
			for e := range cur.Updates() {
				if e == nil {
					once.Do(func() { close(initial) })
					fl.wake()
					continue
				}
				last = max(last, e.Revision())
				fl.mu.Lock()
				if !fl.closed {
					apply(e)
				}
				fl.mu.Unlock()
			}
		}
	})
	fl.mu.Unlock()
	if !started {
		w.Stop()
		return queue.ErrClosed
	}
	return awaitInitial(initial, wait, keys)
}

// rewatch starts the watch name again after its updates ended while the
// fleet runs (the library gives up on its consumer when recreating it
// fails with an error it does not retry), from the revision after last:
// every write since reaches apply, and so do the deletes whose markers
// still stand (markerTTL, nodesMarkerTTL). Without it the node would go on
// with what it last saw, for good: no subscription made since, no node
// joined or gone, no lease moved. It returns nil once the fleet closed or
// its connection did.
func (s *Store) rewatch(name string, kv jetstream.KeyValue, keys string, last uint64, opts []jetstream.WatchOpt) jetstream.KeyWatcher {
	fl := &s.fl
	if last > 0 {
		opts = append(slices.Clip(opts), jetstream.ResumeFromRevision(last+1))
	}
	fl.mu.Lock()
	closed := fl.closed
	fl.mu.Unlock()
	// A closed connection never comes back: the store is closing, or
	// crashed as the tests' Crash does.
	if closed || fl.ctx.Err() != nil || s.nc.IsClosed() {
		return nil
	}
	s.log.Error("fleet watch ended; watching again from where it stopped", "node", s.opts.NodeID, "watch", name, "keys", keys, "after_revision", last)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		w, err := kv.Watch(fl.ctx, keys, opts...)
		if err == nil {
			fl.mu.Lock()
			closed := fl.closed
			if !closed {
				fl.watches = append(fl.watches, w)
			}
			fl.mu.Unlock()
			if closed {
				w.Stop()
			}
			// Read as any watch is, to its end: a stopped one's channel
			// closes.
			return w
		}
		if fl.ctx.Err() != nil || s.nc.IsClosed() {
			return nil
		}
		s.log.Warn("fleet watch: cannot watch again yet", "node", s.opts.NodeID, "watch", name, "err", err, "retry_in", wait)
		select {
		case <-time.After(wait):
		case <-fl.ctx.Done():
			return nil
		}
	}
}

func awaitInitial(initial chan struct{}, wait time.Duration, keys string) error {
	select {
	case <-initial:
		return nil
	case <-time.After(wait):
		return fmt.Errorf("fleet: watch %s: no initial values within %s", keys, wait)
	}
}

// readyLocked reports whether the watch name delivered its initial
// values. mu is held.
func (fl *fleetSide) readyLocked(name string) bool {
	initial, ok := fl.watched[name]
	if !ok {
		return false
	}
	select {
	case <-initial:
		return true
	default:
		return false
	}
}

// onNode applies a heartbeat entry to the live set. mu is held.
func (s *Store) onNode(e jetstream.KeyValueEntry) {
	fl := &s.fl
	id := strings.TrimPrefix(e.Key(), "node.")
	alive := e.Operation() == jetstream.KeyValuePut
	if fl.live[id] == alive {
		return
	}
	if alive {
		fl.live[id] = true
	} else {
		delete(fl.live, id)
	}
	fl.m.nodesLive.Set(float64(len(fl.live)))
	if fl.readyLocked("nodes") {
		if alive {
			s.log.Info("fleet node joined", "node", s.opts.NodeID, "peer", id, "live", len(fl.live))
		} else {
			s.log.Info("fleet node left", "node", s.opts.NodeID, "peer", id, "live", len(fl.live))
		}
	}
	fl.wake()
}

// onMember applies a membership entry to the subscriptions to own. mu is
// held.
func (s *Store) onMember(e jetstream.KeyValueEntry) {
	fl := &s.fl
	sub := strings.TrimPrefix(e.Key(), "member.")
	if e.Operation() == jetstream.KeyValuePut {
		fl.members[sub] = true
	} else {
		delete(fl.members, sub)
	}
	fl.wake()
	if mw, ok := fl.h.(queue.MemberWatcher); ok {
		// After Own: the initial call listed everything before.
		fl.tellMembers(mw, []string{sub}, false)
	}
}

// tellMembers calls mw off the watch's goroutine, in order: calls never
// overlap, and a slow handler never holds up the watch. mu is held.
func (fl *fleetSide) tellMembers(mw queue.MemberWatcher, subs []string, initial bool) {
	fl.memberCalls = append(fl.memberCalls, memberCall{subs, initial})
	if fl.memberCalling {
		return
	}
	fl.memberCalling = true
	fl.spawn(func() {
		for {
			fl.mu.Lock()
			if len(fl.memberCalls) == 0 || fl.closed {
				fl.memberCalling = false
				fl.mu.Unlock()
				return
			}
			c := fl.memberCalls[0]
			fl.memberCalls = fl.memberCalls[1:]
			fl.mu.Unlock()
			mw.MembersChanged(c.subs, c.initial)
		}
	})
}

// memberCall is one MembersChanged call waiting to be made.
type memberCall struct {
	subs    []string
	initial bool
}

// onLease applies a lease entry to the view, and notices when a lease this
// node holds was taken or expired. mu is held.
func (s *Store) onLease(e jetstream.KeyValueEntry) {
	fl := &s.fl
	sub := strings.TrimPrefix(e.Key(), "lease.")
	v := leaseView{rev: e.Revision(), seen: time.Now()}
	if e.Operation() == jetstream.KeyValuePut {
		v.node = string(e.Value())
	}
	fl.view[sub] = v
	if l := fl.leases[sub]; l != nil && l.held && v.rev > l.rev && v.node != s.opts.NodeID {
		// A newer revision that is not a renewal of ours (whose answer may
		// still be on its way): someone took the lease, or it expired.
		why := "expired or deleted"
		if v.node != "" {
			why = "taken by node " + v.node
		}
		s.loseLocked(l, why)
	}
	if l := fl.leases[sub]; l != nil && !l.held && l.lastRev != 0 && v.rev > l.lastRev && v.node != s.opts.NodeID {
		l.lastRev = 0 // written since by someone else: a cursor write under it is refused
	}
	if v.node == "" {
		fl.wake()
	}
}

// onChanged: another node changed sub's state; tell the engine if this
// node owns it.
func (s *Store) onChanged(m *nats.Msg) {
	sub := string(m.Data)
	fl := &s.fl
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if l := fl.leases[sub]; l != nil && l.held {
		gen := l.gen
		fl.spawn(func() { s.tellChanged(l, gen) })
	}
}

// notifyChanged tells sub's owner, wherever it runs, that its state was
// changed by another node (Replay, SetPaused). It is a core NATS publish,
// at most once: an owner that misses it (disconnected at that moment)
// re-reads all its lanes when it reconnects (heartbeatLoop).
func (s *Store) notifyChanged(sub string) {
	if err := s.nc.Publish(s.opts.Stream+".changed", []byte(sub)); err != nil {
		s.log.Warn("cannot tell the owner that a subscription changed", "node", s.opts.NodeID, "subscription", sub, "err", err)
	}
}
