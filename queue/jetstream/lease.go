package jetstream

// Leases: lease.<sub> in <S>_STATE, value = the holder's node id, TTL
// LeaseTTL (own.go says who claims which).
//
//   - Acquire: a create-only write with the key's TTL (KV Create, which also
//     takes a key whose last entry is a delete or expiry marker). The
//     revision it returns is this node's lease; the handler hears Gained.
//   - Renew: every LeaseTTL/3 each held lease is written again by CAS on
//     its revision with the TTL header, all of them pipelined (async
//     publishes, one round trip for the lot). The new revision replaces
//     the old. A fenced write holds its lease's rw shared from fence to
//     done and a renewal holds it exclusively, so a write never carries a
//     revision a renewal just replaced.
//   - Lose: a renewal refused by CAS (someone took the lease, or it
//     expired), a newer revision seen by the watch that is not ours, or no
//     successful write for longer than validFor (LeaseTTL/2): the lease is
//     dropped here first, so fence refuses from that instant, then the
//     engine hears Release with a context already done. A lease dropped
//     for want of renewal is often still this node's on the servers
//     (NATS was slow, not gone): while its last revision carries this
//     node's id and no other write came after this process acquired it,
//     the claim loop takes it up again by CAS on that revision and the
//     engine hears Gained anew, without waiting for it to expire. A
//     renewal refused because an earlier one landed unanswered is
//     recognised the same way and keeps the lease.
//   - Last cursor: a lease dropped for want of renewal keeps the revision
//     this node last wrote (lastRev) until something shows another write
//     of it. Cursor writes may still carry that fence (lastFence): the
//     servers refuse it once anyone else has written the lease, so it
//     cannot move a cursor another owner relies on, and without it
//     everything acknowledged while the renewal lagged (cursor writes wait
//     for a renewal in flight) would be sent again on the lane's next
//     gain, most often this node's own when it takes the lease up again.
//     Deliveries never use it: only validFor bounds when a node may still
//     send.
//   - Move: the engine hears Release with a context bounded by LeaseTTL
//     (it stops the lane and writes its cursor, fenced, while the lease is
//     still renewed), then the lease is dropped here and deleted by CAS so
//     the new owner, watching, creates it at once.
//   - Close: every held lease is deleted by CAS (pipelined), then the
//     heartbeat; the handler is not called.
//
// Deleting is a purge with CAS on the revision and a marker that expires
// (goneMarkerTTL), so nothing accumulates.
//
// Margins. validFor is LeaseTTL/2, measured on the monotonic clock from
// the moment the last successful write of the lease was *sent*. The
// servers stamp a write when they store it, after it was sent, and expire
// it at least the TTL later (the TTL sent is LeaseTTL rounded up to whole
// seconds, as the servers count), so at the instant this node stops, no
// other node can create the lease for at least another LeaseTTL/2 (5 s at
// the default 10 s). That half covers the engine's reaction to Release
// (cancelling what is in flight), the watchdog's tick (LeaseTTL/10), a
// pause of this process, and the servers' clocks running apart from each
// other (a leader change onto a server whose clock runs ahead shortens a
// lease by that skew). Renewing every LeaseTTL/3 leaves a healthy lease
// LeaseTTL/6 of slack for a renewal's round trip before it counts as
// stale; a failed round longer than that (a stream leader election)
// stops the lanes until NATS answers again, then they resume (see Lose),
// which is the price of never delivering on a lease that might have
// expired.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// validFor is how long after its last successful write this node trusts a
// lease (see the margins above).
func validFor(leaseTTL time.Duration) time.Duration { return leaseTTL / 2 }

// lost is the context Release gets for a lease that was lost, not given
// up: already done, its cause queue.ErrFenced.
var lost = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(queue.ErrFenced)
	return ctx
}()

// lease is this node's hold on lease.<sub>, kept across periods of holding
// it (gen tells them apart).
type lease struct {
	sub  string
	subj string // the subject of lease.<sub>: fenced writes name it

	// rw fences writes against renewals (see the file comment).
	rw sync.RWMutex

	// Guarded by fleetSide.mu.
	held     bool
	rev      uint64    // revision of the lease while held
	okAt     time.Time // when the write of rev was sent (monotonic)
	gen      uint64    // counts acquisitions
	since    uint64    // revision of this process's latest acquisition; 0 none
	busy     bool      // an acquisition or a move runs
	renewing bool      // a renewal is in flight
	// lastRev, while !held: the revision this node last wrote of a lease
	// dropped for want of renewal, as long as nothing seen says another
	// write followed; 0 otherwise (see Last cursor above).
	lastRev uint64

	// hmu serialises the handler's calls about sub (they must never
	// overlap); told, guarded by hmu, is the gen the handler heard Gained
	// for and no Release yet, 0 for none.
	hmu  sync.Mutex
	told uint64
}

// fence returns how to fence a write about sub: the lease subject and the
// revision this node holds (fenced true), or fenced false before Own (a
// store with one writer). It fails with queue.ErrFenced when this node
// does not hold sub's lease, or has not written it successfully within
// validFor. done must be called once the write has its answer: a renewal
// (which changes the revision) waits for it. done is never nil (a no-op
// with an error), and fenced tells whether Own was called, also with an
// error (fence("") asks just that).
func (s *Store) fence(sub string) (subject string, rev uint64, fenced bool, done func(), err error) {
	fl := &s.fl
	fl.mu.Lock()
	if !fl.owning {
		fl.mu.Unlock()
		return "", 0, false, func() {}, nil
	}
	l := fl.leases[sub]
	if l == nil || !l.held {
		fl.mu.Unlock()
		return "", 0, true, func() {}, s.fenceErr(sub)
	}
	fl.mu.Unlock()

	l.rw.RLock()
	fl.mu.Lock()
	ok := l.held && time.Since(l.okAt) <= validFor(s.opts.LeaseTTL)
	rev = l.rev
	fl.mu.Unlock()
	if !ok {
		l.rw.RUnlock()
		return "", 0, true, func() {}, s.fenceErr(sub)
	}
	var once sync.Once
	return l.subj, rev, true, func() { once.Do(l.rw.RUnlock) }, nil
}

// lastFence is fence for a cursor write about sub whose lease this node
// may have lost: the revision it holds, stale or not, or the one it last
// wrote of a lease it dropped for want of renewal (lastRev). ok is false
// when there is none. The servers refuse the write if the lease moved on
// since, so a write under it is worth trying but its failure is no error.
// Before Own it is never ok: fence decides then.
func (s *Store) lastFence(sub string) (subject string, rev uint64, done func(), ok bool) {
	fl := &s.fl
	fl.mu.Lock()
	l := fl.leases[sub]
	ok = fl.owning && l != nil && (l.held || l.lastRev != 0)
	fl.mu.Unlock()
	if !ok {
		return "", 0, func() {}, false
	}
	// A renewal in flight holds rw and may change the revision; its answer
	// is awaited, but not past Close (NATS may be out of reach, and Close
	// would wait for this write too).
	for !l.rw.TryRLock() {
		select {
		case <-fl.ctx.Done():
			return "", 0, func() {}, false
		case <-time.After(5 * time.Millisecond):
		}
	}
	fl.mu.Lock()
	rev = l.lastRev
	if l.held {
		rev = l.rev
	}
	fl.mu.Unlock()
	if rev == 0 {
		l.rw.RUnlock()
		return "", 0, func() {}, false
	}
	var once sync.Once
	return l.subj, rev, func() { once.Do(l.rw.RUnlock) }, true
}

func (s *Store) fenceErr(sub string) error {
	return fmt.Errorf("%w: node %s does not hold the lease of %s", queue.ErrFenced, s.opts.NodeID, sub)
}

// Owns reports whether this node holds sub's lease now.
func (s *Store) Owns(sub string) bool {
	fl := &s.fl
	fl.mu.Lock()
	defer fl.mu.Unlock()
	l := fl.leases[sub]
	return l != nil && l.held && time.Since(l.okAt) <= validFor(s.opts.LeaseTTL)
}

// LeaseExpiry is the earliest moment another node could take sub's lease:
// the server starts the TTL of a renewal when it stores it, after this
// node sent it (okAt, monotonic), so okAt + LeaseTTL is never late.
func (s *Store) LeaseExpiry(sub string) time.Time {
	fl := &s.fl
	fl.mu.Lock()
	defer fl.mu.Unlock()
	l := fl.leases[sub]
	if l == nil || !l.held {
		return time.Time{}
	}
	return l.okAt.Add(s.opts.LeaseTTL)
}

// Owner returns the node holding sub's lease as this node last saw it, ""
// when none does.
func (s *Store) Owner(sub string) string {
	if s.ensureLeaseView() != nil {
		return ""
	}
	s.fl.mu.Lock()
	defer s.fl.mu.Unlock()
	return s.fl.view[sub].node
}

// ours reports whether the watched lease v is a write of this process:
// its node id, at or after this process's latest acquisition. Nobody else
// writes this node's id (Own refuses a second live process with it), and a
// write after the acquisition chained its CAS from it.
func ours(v leaseView, me string, l *lease) bool {
	return v.node == me && l.since != 0 && v.rev >= l.since
}

// isWrongLastSeq: a CAS refused (the key is not at the expected revision).
// Replicated streams answer 10164, single-replica ones 10071.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// acquireLocked starts claiming sub's lease: created anew (adopt 0), or
// taken up again by CAS on adopt, a revision this process wrote. mu is
// held.
func (s *Store) acquireLocked(sub string, adopt uint64) {
	fl := &s.fl
	l := fl.leases[sub]
	if l == nil {
		l = &lease{sub: sub, subj: s.statePfx + "lease." + sub}
		fl.leases[sub] = l
	}
	l.busy = true
	if !fl.spawn(func() { s.acquire(l, adopt) }) {
		l.busy = false
	}
}

func (s *Store) acquire(l *lease, adopt uint64) {
	fl := &s.fl
	me := s.opts.NodeID
	select {
	case fl.acquire <- struct{}{}:
		defer func() { <-fl.acquire }()
	case <-fl.ctx.Done():
		fl.mu.Lock()
		l.busy = false
		fl.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(fl.ctx, s.opts.RequestTimeout)
	defer cancel()
	sent := time.Now()
	var rev uint64
	var err error
	if adopt != 0 {
		var ack *jetstream.PubAck
		ack, err = fl.js.PublishMsg(ctx, &nats.Msg{Subject: l.subj, Data: []byte(me)},
			jetstream.WithExpectLastSequencePerSubject(adopt), jetstream.WithMsgTTL(fl.ttl))
		if err == nil {
			rev = ack.Sequence
		}
	} else {
		rev, err = s.state.Create(ctx, "lease."+l.sub, []byte(me), jetstream.KeyTTL(fl.ttl))
	}

	fl.mu.Lock()
	defer fl.mu.Unlock()
	l.busy = false
	if err != nil {
		if !isWrongLastSeq(err) && fl.ctx.Err() == nil {
			s.log.Warn("cannot acquire lease", "node", me, "subscription", l.sub, "err", err)
		}
		// Taken meanwhile (the watch shows it soon), or NATS failed: the
		// watch or claim's next tick tries again, never a tight loop.
		return
	}
	l.held, l.rev, l.since, l.okAt, l.lastRev = true, rev, rev, sent, 0
	l.gen++
	gen := l.gen
	fl.m.leasesHeld.Inc()
	fl.m.takeovers.Inc()
	if adopt != 0 {
		s.log.Info("lease taken up again", "node", me, "subscription", l.sub)
	} else {
		s.log.Info("lease acquired", "node", me, "subscription", l.sub)
	}
	// Closing: closeFleet (waiting for this goroutine) deletes it again.
	fl.spawn(func() { s.tellGained(l, gen) })
}

// renewLoop renews every held lease every LeaseTTL/3.
func (s *Store) renewLoop() {
	fl := &s.fl
	t := time.NewTicker(s.opts.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-fl.ctx.Done():
			return
		case <-t.C:
		}
		s.renewRound()
	}
}

// renewal is one renewal in flight.
type renewal struct {
	l        *lease
	gen, rev uint64
	sent     time.Time
	f        jetstream.PubAckFuture
}

// renewRound publishes a renewal of every held lease (one not already
// being renewed) without waiting between them, then awaits the answers
// apart, so the next round starts on time.
func (s *Store) renewRound() {
	fl := &s.fl
	fl.mu.Lock()
	var due []*lease
	for _, l := range fl.leases {
		if l.held && !l.renewing {
			l.renewing = true
			due = append(due, l)
		}
	}
	fl.mu.Unlock()

	var batch []renewal
	for _, l := range due {
		if l.rw.TryLock() {
			if r, ok := s.sendRenewal(l); ok {
				batch = append(batch, r)
			}
			continue
		}
		// Fenced writes are in flight: wait for them apart, not holding up
		// the round.
		fl.mu.Lock()
		ok := fl.spawn(func() {
			l.rw.Lock()
			if r, ok := s.sendRenewal(l); ok {
				s.awaitRenewals([]renewal{r})
			}
		})
		if !ok {
			l.renewing = false
		}
		fl.mu.Unlock()
	}
	if len(batch) == 0 {
		return
	}
	fl.mu.Lock()
	ok := fl.spawn(func() { s.awaitRenewals(batch) })
	fl.mu.Unlock()
	if !ok {
		for _, r := range batch {
			s.renewed(r, nil, queue.ErrClosed)
		}
	}
}

// sendRenewal publishes one renewal; l.rw is held exclusively and stays so
// until renewed.
func (s *Store) sendRenewal(l *lease) (renewal, bool) {
	fl := &s.fl
	fl.mu.Lock()
	if !l.held {
		l.renewing = false
		fl.mu.Unlock()
		l.rw.Unlock()
		return renewal{}, false
	}
	r := renewal{l: l, gen: l.gen, rev: l.rev}
	fl.mu.Unlock()
	r.sent = time.Now()
	f, err := fl.js.PublishMsgAsync(&nats.Msg{Subject: l.subj, Data: []byte(s.opts.NodeID)},
		jetstream.WithExpectLastSequencePerSubject(r.rev), jetstream.WithMsgTTL(fl.ttl))
	if err != nil {
		s.renewed(r, nil, err)
		s.log.Debug("cannot send a lease renewal", "node", s.opts.NodeID, "subscription", l.sub, "err", err)
		return renewal{}, false
	}
	r.f = f
	return r, true
}

// awaitRenewals applies the answers of a round, in order. The fleet's
// context sets an async timeout of RequestTimeout; the timer here only
// guards against a future never answered.
func (s *Store) awaitRenewals(batch []renewal) {
	deadline := time.NewTimer(s.opts.RequestTimeout + time.Second)
	defer deadline.Stop()
	expired := false
	var failed int
	var first error
	for _, r := range batch {
		var ack *jetstream.PubAck
		var err error
		if expired {
			err = jetstream.ErrAsyncPublishTimeout
		} else {
			select {
			case ack = <-r.f.Ok():
			case err = <-r.f.Err():
			case <-deadline.C:
				expired = true
				err = jetstream.ErrAsyncPublishTimeout
			}
		}
		if err != nil && !isWrongLastSeq(err) {
			failed++
			if first == nil {
				first = err
			}
		}
		s.renewed(r, ack, err)
	}
	if failed > 0 {
		s.log.Warn("cannot renew leases", "node", s.opts.NodeID, "failed", failed, "of", len(batch), "err", first)
	}
}

// renewed applies one renewal's answer and lets fenced writes go on.
func (s *Store) renewed(r renewal, ack *jetstream.PubAck, err error) {
	fl := &s.fl
	l := r.l
	fl.mu.Lock()
	l.renewing = false
	current := l.held && l.gen == r.gen
	// Dropped by the watchdog while this renewal was in flight: its answer
	// still says which revision of ours the servers hold.
	dropped := !l.held && l.gen == r.gen && l.lastRev == r.rev
	switch {
	case err == nil:
		fl.m.renewals.WithLabelValues("ok").Inc()
		if current {
			l.rev, l.okAt = ack.Sequence, r.sent
		}
		if dropped {
			l.lastRev = ack.Sequence
		}
	case isWrongLastSeq(err) && current && ours(fl.view[l.sub], s.opts.NodeID, l) && fl.view[l.sub].rev > r.rev:
		// An earlier renewal of ours landed although its answer was lost:
		// the lease is still this node's, at that revision. okAt stays at
		// the last confirmed write (that one was sent later, so this is
		// conservative).
		fl.m.renewals.WithLabelValues("error").Inc()
		l.rev = fl.view[l.sub].rev
	case isWrongLastSeq(err):
		fl.m.renewals.WithLabelValues("lost").Inc()
		if current {
			s.loseLocked(l, "renewal refused: the lease is no longer at this node's revision")
		}
		if dropped {
			l.lastRev = 0
		}
	default:
		fl.m.renewals.WithLabelValues("error").Inc()
	}
	fl.mu.Unlock()
	l.rw.Unlock()
}

// watchdogLoop drops every lease not written successfully within validFor:
// a node that cannot renew stops dispatching before its lease can expire
// elsewhere. fence checks the same on every write; this makes the engine
// hear of it.
func (s *Store) watchdogLoop() {
	fl := &s.fl
	valid := validFor(s.opts.LeaseTTL)
	t := time.NewTicker(max(s.opts.LeaseTTL/10, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-fl.ctx.Done():
			return
		case <-t.C:
		}
		fl.mu.Lock()
		s.dropStaleLocked(valid)
		fl.mu.Unlock()
	}
}

// dropStaleLocked drops every held lease not written successfully within
// valid. mu is held.
func (s *Store) dropStaleLocked(valid time.Duration) {
	for _, l := range s.fl.leases {
		if l.held {
			if age := time.Since(l.okAt); age > valid {
				s.loseLocked(l, fmt.Sprintf("not renewed for %s (limit %s)", age.Round(time.Millisecond), valid))
				l.lastRev = l.rev
			}
		}
	}
}

// loseLocked drops a held lease at once (fence refuses from now on) and
// has the engine told. mu is held.
func (s *Store) loseLocked(l *lease, why string) {
	fl := &s.fl
	l.held = false
	l.lastRev = 0
	fl.m.leasesHeld.Dec()
	gen := l.gen
	s.log.Warn("lease lost", "node", s.opts.NodeID, "subscription", l.sub, "why", why)
	fl.spawn(func() { s.tellLost(l, gen) })
}

// moveLocked gives up a held lease on purpose (another live node should
// own the lane, or the subscription was retired). mu is held.
func (s *Store) moveLocked(l *lease, to string) {
	fl := &s.fl
	l.busy = true
	gen := l.gen
	if !fl.spawn(func() { s.move(l, gen, to) }) {
		l.busy = false
	}
}

func (s *Store) move(l *lease, gen uint64, to string) {
	fl := &s.fl
	l.hmu.Lock()
	defer l.hmu.Unlock()
	fl.mu.Lock()
	still := l.held && l.gen == gen
	h, closed := fl.h, fl.closed
	if !still {
		l.busy = false
	}
	fl.mu.Unlock()
	if !still {
		return // lost meanwhile; tellLost tells the engine
	}
	if to == "" {
		s.log.Info("giving up lease: subscription retired", "node", s.opts.NodeID, "subscription", l.sub)
	} else {
		s.log.Info("handing lease over", "node", s.opts.NodeID, "subscription", l.sub, "to", to)
	}
	if l.told == gen {
		l.told = 0
		if !closed {
			ctx, cancel := context.WithTimeout(fl.ctx, s.opts.LeaseTTL)
			h.Release(ctx, l.sub)
			cancel()
		}
	}
	// Wait for fenced writes in flight (the cursor the engine just wrote),
	// then drop the lease here and delete it there.
	l.rw.Lock()
	fl.mu.Lock()
	held := l.held && l.gen == gen
	rev := l.rev
	if held {
		l.held = false
		fl.m.leasesHeld.Dec()
	}
	l.busy = false
	fl.mu.Unlock()
	l.rw.Unlock()
	s.dropIndex(l.sub)
	if !held {
		return
	}
	// Not the fleet's context: on Close the lease must still be deleted.
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RequestTimeout)
	defer cancel()
	if err := s.state.Purge(ctx, "lease."+l.sub, jetstream.LastRevision(rev), jetstream.PurgeTTL(goneMarkerTTL)); err != nil {
		s.log.Warn("cannot delete a lease given up; it expires instead", "node", s.opts.NodeID, "subscription", l.sub, "err", err)
	}
	fl.mu.Lock()
	fl.wake()
	fl.mu.Unlock()
}

// tellGained tells the engine about one period of holding (gen), first
// ending an earlier one it was not yet told had ended.
func (s *Store) tellGained(l *lease, gen uint64) {
	fl := &s.fl
	l.hmu.Lock()
	defer l.hmu.Unlock()
	fl.mu.Lock()
	current := l.held && l.gen == gen
	h, closed := fl.h, fl.closed
	fl.mu.Unlock()
	if closed {
		return
	}
	if l.told != 0 && l.told != gen {
		l.told = 0
		s.dropIndex(l.sub)
		h.Release(lost, l.sub)
	}
	if !current || l.told == gen {
		return
	}
	s.dropIndex(l.sub)
	h.Gained(l.sub)
	l.told = gen
}

// tellLost tells the engine that the period gen ended without notice.
func (s *Store) tellLost(l *lease, gen uint64) {
	fl := &s.fl
	l.hmu.Lock()
	defer l.hmu.Unlock()
	s.dropIndex(l.sub)
	fl.mu.Lock()
	h, closed := fl.h, fl.closed
	fl.mu.Unlock()
	if l.told == gen {
		l.told = 0
		if !closed {
			h.Release(lost, l.sub)
		}
	}
}

// tellChanged tells the engine that another node changed sub's state.
func (s *Store) tellChanged(l *lease, gen uint64) {
	fl := &s.fl
	l.hmu.Lock()
	defer l.hmu.Unlock()
	fl.mu.Lock()
	current := l.held && l.gen == gen && !fl.closed
	h := fl.h
	fl.mu.Unlock()
	if current && l.told == gen {
		s.dropIndex(l.sub)
		h.Changed(l.sub)
	}
}

// goneMarkerTTL is how long the marker of a lease or heartbeat given up
// stays: watchers see it as it is written; then it leaves nothing (with
// one revision per key a plain delete marker would stay for ever, one per
// subscription ever owned). A watcher that missed it still finds the lease
// free (claim's fallback).
const goneMarkerTTL = time.Minute

// purgeMsg is what KV Purge with LastRevision(rev) and
// PurgeTTL(goneMarkerTTL) publishes, for the pipelined deletes of leave.
func purgeMsg(subj string, rev uint64) *nats.Msg {
	m := nats.NewMsg(subj)
	m.Header.Set("KV-Operation", "PURGE")
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Header.Set(jetstream.MsgTTLHeader, goneMarkerTTL.String())
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	return m
}

// leave deletes this node's leases (CAS, pipelined) and its heartbeat, so
// other nodes take the lanes at once. The loops have stopped; fenced
// writes in flight are waited for.
func (s *Store) leave() {
	fl := &s.fl
	fl.mu.Lock()
	var held []*lease
	for _, l := range fl.leases {
		if l.held {
			held = append(held, l)
		}
	}
	hbRev := fl.hbRev
	fl.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RequestTimeout)
	defer cancel()
	var futures []jetstream.PubAckFuture
	failed := 0
	for _, l := range held {
		l.rw.Lock()
		fl.mu.Lock()
		rev := l.rev
		l.held = false
		fl.m.leasesHeld.Dec()
		fl.mu.Unlock()
		l.rw.Unlock()
		f, err := fl.js.PublishMsgAsync(purgeMsg(l.subj, rev))
		if err != nil {
			failed++
			continue
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case <-f.Err():
			failed++
		case <-ctx.Done():
			failed++
		}
	}
	if hbRev != 0 {
		if err := s.nodes.Purge(ctx, "node."+s.opts.NodeID, jetstream.LastRevision(hbRev), jetstream.PurgeTTL(goneMarkerTTL)); err != nil {
			s.log.Warn("cannot delete the heartbeat; it expires instead", "node", s.opts.NodeID, "err", err)
		}
		fl.mu.Lock()
		fl.hbRev, fl.hbAt = 0, time.Time{}
		fl.mu.Unlock()
	}
	if failed > 0 {
		s.log.Warn("some leases could not be deleted; they expire instead", "node", s.opts.NodeID, "failed", failed, "of", len(held))
	}
	if hbRev != 0 || len(held) > 0 {
		s.log.Info("left the fleet", "node", s.opts.NodeID, "leases_released", len(held)-failed)
	}
}
