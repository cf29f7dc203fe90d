package jetstream

// This node's heartbeat, node.<id> in <S>_NODES: join writes it (own.go's
// file comment says what a duplicate node id does) and heartbeatLoop
// renews it.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// heartbeat is the value of node.<id>: who and since when, for operators
// reading the bucket.
type heartbeat struct {
	Node    string    `json:"node"`
	Started time.Time `json:"started"`
}

// join writes this node's heartbeat create-only (see the file comment on
// duplicate node ids).
func (s *Store) join() error {
	fl := &s.fl
	id := s.opts.NodeID
	key := "node." + id
	val, _ := json.Marshal(heartbeat{Node: id, Started: time.Now().UTC()})
	create := func() (bool, error) {
		ctx, cancel := context.WithTimeout(fl.ctx, s.opts.RequestTimeout)
		defer cancel()
		sent := time.Now()
		rev, err := s.nodes.Create(ctx, key, val, jetstream.KeyTTL(fl.ttl))
		if err == nil {
			fl.mu.Lock()
			fl.hbRev, fl.hbAt, fl.hbVal = rev, sent, val
			fl.mu.Unlock()
			return true, nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			return false, nil
		}
		return false, fmt.Errorf("fleet: write the heartbeat of node %s: %w", id, err)
	}
	if ok, err := create(); ok || err != nil {
		return err
	}

	wait := fl.ttl + s.opts.RequestTimeout
	s.log.Warn("a heartbeat with this node id is live; waiting for it to expire (a restart after a crash) before refusing the id (two live nodes)",
		"node", id, "up_to", wait)
	inUse := fmt.Errorf("node_id %q: another live sluice node uses this id (its heartbeat %s is being renewed); give every node its own node_id", id, key)
	ctx, cancel := context.WithTimeout(fl.ctx, wait)
	defer cancel()
	w, err := s.nodes.Watch(ctx, key)
	if err != nil {
		return fmt.Errorf("fleet: watch the heartbeat of node %s: %w", id, err)
	}
	defer w.Stop()
	var seen uint64
	for {
		select {
		case <-ctx.Done():
			if fl.ctx.Err() != nil {
				return queue.ErrClosed
			}
			return inUse
		case e, ok := <-w.Updates():
			if !ok {
				return inUse
			}
			if e == nil {
				continue
			}
			if e.Operation() == jetstream.KeyValuePut {
				if seen != 0 && e.Revision() != seen {
					return inUse
				}
				seen = e.Revision()
				continue
			}
			// Expired or deleted: the previous holder of the id is gone.
			if ok, err := create(); ok || err != nil {
				if ok {
					s.log.Info("the previous heartbeat of this node id expired; joining", "node", id)
				}
				return err
			}
		}
	}
}

// heartbeatLoop renews this node's heartbeat every LeaseTTL/3, and after a
// reconnect tells the engine to re-read every lane it owns (a change
// notice may have been missed meanwhile).
func (s *Store) heartbeatLoop() {
	fl := &s.fl
	t := time.NewTicker(s.opts.LeaseTTL / 3)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-fl.ctx.Done():
			return
		case <-t.C:
		}
		err := s.renewHeartbeat()
		if err != nil && !failing {
			s.log.Warn("cannot renew the heartbeat", "node", s.opts.NodeID, "err", err)
		} else if err == nil && failing {
			s.log.Info("heartbeat renewed again", "node", s.opts.NodeID)
		}
		failing = err != nil
		if rec := s.nc.Stats().Reconnects; err == nil {
			fl.mu.Lock()
			missed := rec != fl.lastRec
			fl.lastRec = rec
			if missed {
				for _, l := range fl.leases {
					if l.held {
						l, gen := l, l.gen
						fl.spawn(func() { s.tellChanged(l, gen) })
					}
				}
			}
			fl.mu.Unlock()
		}
	}
}

// renewHeartbeat writes node.<id> again by CAS on its revision. When the
// revision no longer matches, it reads the key: this node's own value (a
// renewal that landed although its answer was lost) is renewed at its
// revision; none (the heartbeat expired while this node was cut off) is
// created again; another value means another process took the id.
func (s *Store) renewHeartbeat() error {
	fl := &s.fl
	fl.mu.Lock()
	rev, val := fl.hbRev, fl.hbVal
	fl.mu.Unlock()
	ctx, cancel := context.WithTimeout(fl.ctx, s.opts.RequestTimeout)
	defer cancel()
	key := "node." + s.opts.NodeID
	sent := time.Now()
	renew := func(rev uint64) (uint64, error) {
		ack, err := fl.js.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + s.opts.Stream + "_NODES." + key, Data: val},
			jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(fl.ttl))
		if err != nil {
			return 0, err
		}
		return ack.Sequence, nil
	}
	nrev, err := renew(rev)
	if isWrongLastSeq(err) {
		e, gerr := s.nodes.Get(ctx, key)
		switch {
		case gerr == nil && bytes.Equal(e.Value(), val):
			nrev, err = renew(e.Revision())
		case errors.Is(gerr, jetstream.ErrKeyNotFound), errors.Is(gerr, jetstream.ErrKeyDeleted):
			nrev, err = s.nodes.Create(ctx, key, val, jetstream.KeyTTL(fl.ttl))
			if err == nil {
				s.log.Warn("the heartbeat had expired (this node was cut off); written again", "node", s.opts.NodeID)
			}
		case gerr == nil:
			err = jetstream.ErrKeyExists
		default:
			err = gerr
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("node_id %q: the heartbeat expired while this node was away and another process now uses the id", s.opts.NodeID)
		}
	}
	if err != nil {
		return err
	}
	fl.mu.Lock()
	fl.hbRev, fl.hbAt = nrev, sent
	fl.mu.Unlock()
	return nil
}
