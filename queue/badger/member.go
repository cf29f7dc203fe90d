package badger

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

// Memberships returns every subscription the log knows, with its cursor.
// Two sequential scans (memberships, cursors) rather than a lookup per
// subscription: start-up reads 50,000 of them.
func (l *Log) Memberships() ([]queue.Membership, error) {
	var out []queue.Membership
	err := l.db.View(func(txn *badgerdb.Txn) error {
		cursors := map[string]uint64{}
		cit := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixCursor, PrefetchValues: true})
		for cit.Rewind(); cit.Valid(); cit.Next() {
			sub := string(cit.Item().Key()[len(prefixCursor):])
			if err := cit.Item().Value(func(v []byte) error {
				if len(v) != 8 {
					return fmt.Errorf("cursor %s: %w", sub, queue.ErrCorrupt)
				}
				cursors[sub] = binary.BigEndian.Uint64(v)
				return nil
			}); err != nil {
				cit.Close()
				return err
			}
		}
		cit.Close()
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixMember, PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			m := queue.Membership{Subscription: string(it.Item().Key()[len(prefixMember):])}
			var rec memberRecord
			if err := it.Item().Value(func(v []byte) error { return json.Unmarshal(v, &rec) }); err != nil {
				return fmt.Errorf("membership %s: %v: %w", m.Subscription, err, queue.ErrCorrupt)
			}
			c, ok := cursors[m.Subscription]
			if !ok {
				return fmt.Errorf("cursor %s: missing: %w", m.Subscription, queue.ErrCorrupt)
			}
			m.From, m.Left, m.Until, m.Paused, m.Snapshot, m.Cursor = rec.From, rec.Left, rec.Until, rec.Paused, []byte(rec.Snapshot), c
			out = append(out, m)
		}
		return nil
	})
	return out, err
}

func readMembership(txn *badgerdb.Txn, sub string) (queue.Membership, error) {
	m := queue.Membership{Subscription: sub}
	item, err := txn.Get(memberKey(sub))
	if err != nil {
		return m, err
	}
	var rec memberRecord
	if err := item.Value(func(v []byte) error { return json.Unmarshal(v, &rec) }); err != nil {
		return m, fmt.Errorf("membership %s: %v: %w", sub, err, queue.ErrCorrupt)
	}
	m.From, m.Left, m.Until, m.Paused, m.Snapshot = rec.From, rec.Left, rec.Until, rec.Paused, []byte(rec.Snapshot)
	item, err = txn.Get(cursorKey(sub))
	if err != nil {
		return m, fmt.Errorf("cursor %s: %w", sub, err)
	}
	return m, item.Value(func(v []byte) error {
		if len(v) != 8 {
			return fmt.Errorf("cursor %s: %w", sub, queue.ErrCorrupt)
		}
		m.Cursor = binary.BigEndian.Uint64(v)
		return nil
	})
}

func writeMembership(txn *badgerdb.Txn, m queue.Membership) error {
	v, err := json.Marshal(memberRecord{V: recordVersion, From: m.From, Left: m.Left, Until: m.Until, Paused: m.Paused, Snapshot: m.Snapshot})
	if err != nil {
		return err
	}
	return txn.Set(memberKey(m.Subscription), v)
}

// Join makes sub a member: a new subscription is entitled to every event
// appended from now on (From = head+1: the membership cut-off). For a known one it
// updates the snapshot; one that was leaving (not yet retired) becomes
// active again and is entitled to the events in between as well.
func (l *Log) Join(sub string, snapshot []byte) (queue.Membership, error) {
	ms, err := l.JoinAll([]queue.JoinRequest{{Subscription: sub, Snapshot: snapshot}})
	if err != nil {
		return queue.Membership{}, err
	}
	return ms[0], nil
}

// JoinAll is Join for many subscriptions in one batch and one sync, so a
// config with 50,000 subscriptions starts in a moment. Unchanged
// memberships are not rewritten.
func (l *Log) JoinAll(reqs []queue.JoinRequest) ([]queue.Membership, error) {
	l.seqMu.Lock()
	defer l.seqMu.Unlock()
	out := make([]queue.Membership, len(reqs))
	changed := make([]bool, len(reqs))
	isNew := make([]bool, len(reqs))
	head := l.assigned.Load()
	err := l.db.View(func(txn *badgerdb.Txn) error {
		for i, r := range reqs {
			var m queue.Membership
			var err error
			if r.Known != nil {
				m = *r.Known
			} else {
				m, err = readMembership(txn, r.Subscription)
			}
			switch {
			case errors.Is(err, badgerdb.ErrKeyNotFound):
				m = queue.Membership{Subscription: r.Subscription, From: head + 1, Cursor: head}
				changed[i], isNew[i] = true, true
			case err != nil:
				return err
			case r.Create:
				return fmt.Errorf("%s: %w", r.Subscription, queue.ErrExists)
			default:
				changed[i] = m.Left || !bytes.Equal(m.Snapshot, r.Snapshot)
			}
			m.Left, m.Until, m.Snapshot = false, 0, r.Snapshot
			out[i] = m
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	wb := l.db.NewWriteBatch()
	defer wb.Cancel()
	n := 0
	for i, m := range out {
		if !changed[i] {
			continue
		}
		v, err := joinRecord(m)
		if err != nil {
			return nil, fmt.Errorf("join %s: %w", m.Subscription, err)
		}
		if err := wb.Set(memberKey(m.Subscription), v); err != nil {
			return nil, fmt.Errorf("join %s: %w", m.Subscription, err)
		}
		// A known member's cursor belongs to its lane (the flusher may be
		// writing a newer one); only a new member starts one.
		if isNew[i] {
			if err := wb.Set(cursorKey(m.Subscription), u64(m.Cursor)); err != nil {
				return nil, fmt.Errorf("join %s: %w", m.Subscription, err)
			}
		}
		n++
	}
	if n == 0 {
		return out, nil
	}
	if err := wb.Flush(); err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	if l.opts.Sync {
		if err := l.sync(); err != nil {
			return nil, fmt.Errorf("join: sync: %w", err)
		}
	}
	return out, nil
}

// joinRecord encodes a joining member's record (memberRecord with From,
// Paused and Snapshot) as json.Marshal does, except that the snapshot is
// checked and copied as it is rather than compacted: json.Marshal of the
// record spent 60% of JoinAll's CPU re-encoding 50,000 snapshots (issue
// 14) that are the proxy's json.Marshal output already. Written as given,
// a snapshot also reads back equal to the one JoinAll compares it with.
func joinRecord(m queue.Membership) ([]byte, error) {
	if len(m.Snapshot) > 0 && !json.Valid(m.Snapshot) {
		return nil, errors.New("snapshot is not valid JSON")
	}
	b := make([]byte, 0, len(m.Snapshot)+64)
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, recordVersion, 10)
	b = append(b, `,"from":`...)
	b = strconv.AppendUint(b, m.From, 10)
	if m.Paused != "" {
		p, err := json.Marshal(m.Paused)
		if err != nil {
			return nil, err
		}
		b = append(append(b, `,"paused":`...), p...)
	}
	if len(m.Snapshot) > 0 {
		b = append(append(b, `,"snapshot":`...), m.Snapshot...)
	}
	return append(b, '}'), nil
}

// Leave ends sub's entitlement at the current head: it still receives every
// event it was entitled to (Until = head), then the caller retires it.
func (l *Log) Leave(sub string) (queue.Membership, error) {
	l.seqMu.Lock()
	defer l.seqMu.Unlock()
	var m queue.Membership
	err := l.update(func(txn *badgerdb.Txn) error {
		var err error
		if m, err = readMembership(txn, sub); err != nil {
			return err
		}
		if !m.Left {
			m.Left, m.Until = true, l.assigned.Load()
		}
		return writeMembership(txn, m)
	})
	if errors.Is(err, badgerdb.ErrKeyNotFound) {
		return m, fmt.Errorf("leave %s: %w", sub, queue.ErrNotFound)
	}
	if err != nil {
		return m, fmt.Errorf("leave %s: %w", sub, err)
	}
	return m, nil
}

// SetPaused records why sub's deliveries are paused at run time ("" to
// resume), so a pause (a 410 Gone, an operator) survives a restart.
func (l *Log) SetPaused(sub, reason string) error {
	l.seqMu.Lock()
	defer l.seqMu.Unlock()
	err := l.update(func(txn *badgerdb.Txn) error {
		m, err := readMembership(txn, sub)
		if err != nil {
			return err
		}
		m.Paused = reason
		return writeMembership(txn, m)
	})
	if errors.Is(err, badgerdb.ErrKeyNotFound) {
		return fmt.Errorf("pause %s: %w", sub, queue.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("pause %s: %w", sub, err)
	}
	return nil
}

// Retire forgets a subscription that has drained. Its dead letters stay.
func (l *Log) Retire(sub string) error {
	err := l.update(func(txn *badgerdb.Txn) error {
		if err := txn.Delete(memberKey(sub)); err != nil {
			return err
		}
		return txn.Delete(cursorKey(sub))
	})
	if err != nil {
		return fmt.Errorf("retire %s: %w", sub, err)
	}
	return nil
}

// cursorSyncInterval bounds how stale the on-disk cursors may be after a
// power loss when nothing else syncs (with Sync). Under load the appends'
// own syncs cover cursor writes (Badger's log is written in commit order),
// so SaveCursors adds no fsync of its own: one every flush interval stole
// the disk from appends and showed as ingest latency spikes.
const cursorSyncInterval = time.Second

// SaveCursors writes the given cursors in one transaction. Retry records
// and dead letters written before it become durable no later than the
// cursors (commit order). With Sync, the write is fsynced by the next
// append group, or by SaveCursors itself if none came within
// cursorSyncInterval. A lost cursor write means redelivery, never loss.
func (l *Log) SaveCursors(cursors map[string]uint64) error {
	if len(cursors) == 0 {
		return nil
	}
	l.writeMu.RLock()
	defer l.writeMu.RUnlock()
	wb := l.db.NewWriteBatch()
	defer wb.Cancel()
	for sub, c := range cursors {
		if err := wb.Set(cursorKey(sub), u64(c)); err != nil {
			return fmt.Errorf("save cursors: %w", err)
		}
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("save cursors: %w", err)
	}
	if l.opts.Sync && time.Since(time.Unix(0, l.lastSync.Load())) > cursorSyncInterval {
		if err := l.sync(); err != nil {
			return fmt.Errorf("save cursors: sync: %w", err)
		}
		l.lastSync.Store(time.Now().UnixNano())
	}
	return nil
}
