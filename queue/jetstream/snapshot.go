package jetstream

// Lane snapshots: each owner publishes its lanes' statistics (opaque JSON
// the proxy makes) into <S>_LANES, key <sub>, a few times a second; any
// node's admin API reads every lane's latest from a watch of the bucket.
// The bucket's TTL (lanesTTL) makes a dead owner's snapshots vanish.

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// lanesView is the watched content of <S>_LANES. Guarded by fleetSide.mu.
type lanesView struct {
	snaps map[string]queue.LaneSnapshot
}

// laneRecord is a snapshot as stored: who published it, when, and the
// proxy's JSON verbatim (readable with `nats kv get`).
type laneRecord struct {
	Node string          `json:"node"`
	At   time.Time       `json:"at"`
	Data json.RawMessage `json:"data"`
}

// PublishLanes stores snapshots of the lanes this node owns, pipelined,
// and returns once the servers have them all (or the first error). Once
// Own was called, a snapshot of a lane this node does not hold is skipped,
// so a node that just lost a lane cannot overwrite its new owner's
// snapshot. Each snapshot must be JSON.
func (s *Store) PublishLanes(snaps map[string][]byte) error {
	if s.closed.Load() {
		return queue.ErrClosed
	}
	fl := &s.fl
	fl.mu.Lock()
	fleet := fl.owning
	fl.mu.Unlock()
	now := time.Now().UTC()
	futures := make([]jetstream.PubAckFuture, 0, len(snaps))
	var first error
	for sub, data := range snaps {
		if fleet && !s.Owns(sub) {
			continue
		}
		if len(data) == 0 {
			data = []byte("null")
		}
		if !json.Valid(data) {
			if first == nil {
				first = fmt.Errorf("publish lane snapshot of %s: not JSON", sub)
			}
			continue
		}
		val, err := json.Marshal(laneRecord{Node: s.opts.NodeID, At: now, Data: data})
		if err != nil {
			return fmt.Errorf("publish lane snapshot of %s: %w", sub, err)
		}
		f, err := fl.js.PublishMsgAsync(&nats.Msg{Subject: "$KV." + s.opts.Stream + "_LANES." + sub, Data: val})
		if err != nil {
			if first == nil {
				first = fmt.Errorf("publish lane snapshot of %s: %w", sub, err)
			}
			continue
		}
		futures = append(futures, f)
	}
	deadline := time.NewTimer(s.opts.RequestTimeout + time.Second)
	defer deadline.Stop()
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if first == nil {
				first = fmt.Errorf("publish lane snapshots: %w", err)
			}
		case <-deadline.C:
			if first == nil {
				first = fmt.Errorf("publish lane snapshots: %w", jetstream.ErrAsyncPublishTimeout)
			}
			return first
		}
	}
	return first
}

// LaneSnapshots returns the latest snapshot of every lane, whichever node
// published it, from a watch of <S>_LANES started by the first call.
func (s *Store) LaneSnapshots() (map[string]queue.LaneSnapshot, error) {
	if s.closed.Load() {
		return nil, queue.ErrClosed
	}
	if err := s.startWatch("lanes", s.lanes, ">", s.onLane); err != nil {
		return nil, err
	}
	fl := &s.fl
	fl.mu.Lock()
	defer fl.mu.Unlock()
	out := make(map[string]queue.LaneSnapshot, len(fl.lanes.snaps))
	for sub, snap := range fl.lanes.snaps {
		out[sub] = snap
	}
	return out, nil
}

// onLane applies a snapshot entry. mu is held.
func (s *Store) onLane(e jetstream.KeyValueEntry) {
	fl := &s.fl
	if fl.lanes.snaps == nil {
		fl.lanes.snaps = map[string]queue.LaneSnapshot{}
	}
	sub := e.Key()
	if e.Operation() != jetstream.KeyValuePut {
		delete(fl.lanes.snaps, sub)
		return
	}
	var rec laneRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		s.log.Warn("skipping a lane snapshot that is not sluice's", "node", s.opts.NodeID, "subscription", sub, "err", err)
		return
	}
	fl.lanes.snaps[sub] = queue.LaneSnapshot{Node: rec.Node, At: rec.At, Data: []byte(rec.Data)}
}
