package badger

import (
	"fmt"

	badgerdb "github.com/dgraph-io/badger/v4"
)

// Compact deletes the events below seq `below` that no retry still needs.
// The caller passes the smallest durable cursor+1 over every entitled lane.
// Events a retry holds stay until their last retry is resolved; a later
// Compact deletes them.
//
// The work goes in chunks of compactChunk seqs, each decided under refMu
// and deleted in a transaction of its own: every retry write takes refMu,
// and a range of 100,000 seqs decided at once held it for as long as the
// whole range took.
func (l *Log) Compact(below uint64) (int, error) {
	l.compactMu.Lock()
	defer l.compactMu.Unlock()
	below = min(below, l.head.Load()+1)
	// An event leaves the log only with its i/ entry written: after a
	// crash Open finds the ids of unindexed events in the log alone
	// (dedup.go). The head was read first, so every event below below
	// is queued for the index by now.
	if err := l.index(); err != nil {
		return 0, fmt.Errorf("compact: %w", err)
	}
	below = min(below, l.indexed.Load()+1)
	low := l.low.Load()
	l.refMu.Lock()
	released := l.released
	l.released = nil
	l.refMu.Unlock()
	n := 0
	// Deletes go in small transactions: Badger writes one request at a
	// time, and one request of thousands of deletes would hold appends
	// behind it for milliseconds.
	for i := 0; i < len(released); i += compactChunk {
		chunk := released[i:min(i+compactChunk, len(released))]
		if err := l.deleteEvents(chunk); err != nil {
			l.refMu.Lock()
			l.released = append(l.released, released[i:]...)
			l.refMu.Unlock()
			return n, fmt.Errorf("compact: %w", err)
		}
		n += len(chunk)
	}
	if below <= low {
		return n, nil
	}
	freed := make([]uint64, 0, compactChunk)
	for from := low; from < below; from += compactChunk {
		to := min(from+compactChunk, below)
		freed = freed[:0]
		l.refMu.Lock()
		for seq := from; seq < to; seq++ {
			if l.retryRefs[seq] > 0 {
				l.held[seq] = struct{}{}
			} else {
				freed = append(freed, seq)
			}
		}
		l.refMu.Unlock()
		if err := l.deleteEvents(freed); err != nil {
			return n, fmt.Errorf("compact: %w", err)
		}
		n += len(freed)
	}
	if err := l.update(func(txn *badgerdb.Txn) error { return txn.Set(keyLow, u64(below)) }); err != nil {
		return n, fmt.Errorf("compact: %w", err)
	}
	l.low.Store(below)
	return n, nil
}

func (l *Log) deleteEvents(seqs []uint64) error {
	if len(seqs) == 0 {
		return nil
	}
	err := l.update(func(txn *badgerdb.Txn) error {
		for _, seq := range seqs {
			if err := txn.Delete(eventKey(seq)); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		l.deleted.Add(uint64(len(seqs)))
	}
	return err
}

// compactChunk is how many deletes one compaction transaction carries.
const compactChunk = 256
