package jetstream

// Reads of <S>_STATE: gets from the stream leader, and scans that read on
// until they have seen what the leader had (state.go's file comment says
// why).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// Reads.

// entry is one key's last message in the stream, as its leader has it.
type entry struct {
	rev     uint64 // the key's last stream seq, a marker's too; 0 when the subject holds nothing
	data    []byte
	deleted bool // the last message is a delete marker (or there is none)
}

func (e entry) exists() bool { return !e.deleted }

// isMarker: a delete or purge marker (KV-Operation), or one the servers
// left for an expired key (Nats-Marker-Reason).
func isMarker(h nats.Header) bool {
	if len(h) == 0 {
		return false
	}
	switch h.Get("KV-Operation") {
	case "DEL", "PURGE":
		return true
	}
	return h.Get(jetstream.MarkerReasonHeader) != ""
}

// get reads key's last message from the stream leader.
func (s *Store) get(ctx context.Context, key string) (entry, error) {
	return s.getSubject(ctx, s.statePfx+key)
}

func (s *Store) getSubject(ctx context.Context, subj string) (entry, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	m, err := s.st.stream.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return entry{deleted: true}, nil
	}
	if err != nil {
		return entry{}, err
	}
	if isMarker(m.Header) {
		return entry{rev: m.Sequence, deleted: true}, nil
	}
	return entry{rev: m.Sequence, data: m.Data}, nil
}

// scanKeys calls fn with the last message of every key matching the
// filters, in stream order: one ordered consumer for all of them, rather
// than a get per key. fn sees deletes too (deleted true), and must apply
// what it gets in order, a later message of a key over an earlier one.
// metaOnly leaves the values out (a scan of keys).
//
// The consumer may be placed on a replica that lags the stream leader,
// so its initial values may miss a write already answered: the scan
// first asks the leader for the last message matching the filters, and
// goes on reading (the consumer delivers what its replica applies next)
// until it has seen that far. So a scan reflects every write answered
// before it started.
func (s *Store) scanKeys(filters []string, metaOnly bool, fn func(key string, rev uint64, value []byte, deleted bool) error) error {
	ctx, cancel := context.WithCancel(s.st.ctx)
	defer cancel()
	upTo, err := s.lastOf(ctx, filters)
	if err != nil {
		return err
	}
	var opts []jetstream.WatchOpt
	if metaOnly {
		opts = append(opts, jetstream.MetaOnly())
	}
	w, err := s.state.WatchFiltered(ctx, append([]string(nil), filters...), opts...) // WatchFiltered rewrites its slice
	if err != nil {
		return err
	}
	defer stopWatch(w)
	idle := time.NewTimer(s.opts.RequestTimeout)
	defer idle.Stop()
	initial, seen := true, uint64(0)
	for {
		select {
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return fmt.Errorf("%w: the scan of %s ended early", queue.ErrUnavailable, strings.Join(filters, ", "))
			case e == nil:
				initial = false
			default:
				seen = max(seen, e.Revision())
				if err := fn(e.Key(), e.Revision(), e.Value(), e.Operation() != jetstream.KeyValuePut); err != nil {
					return err
				}
			}
			if !initial && seen >= upTo {
				return nil
			}
			idle.Reset(s.opts.RequestTimeout)
		case <-idle.C:
			return fmt.Errorf("%w: the scan of %s stalled for %s", queue.ErrUnavailable, strings.Join(filters, ", "), s.opts.RequestTimeout)
		case <-s.st.ctx.Done():
			return queue.ErrClosed
		}
	}
}

// lastOf is the stream seq of the last message matching any of the
// filters, as the stream leader has it (0 if none).
func (s *Store) lastOf(ctx context.Context, filters []string) (uint64, error) {
	var last uint64
	for _, f := range filters {
		e, err := s.getSubject(ctx, s.statePfx+f)
		if err != nil {
			return 0, err
		}
		last = max(last, e.rev)
	}
	return last, nil
}

// stopWatch stops w and drains what it still delivers, so its callback,
// blocked on a full channel by updates that came after the scan's end,
// can finish and the subscription close.
func stopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	go func() {
		for range w.Updates() {
		}
	}()
}
