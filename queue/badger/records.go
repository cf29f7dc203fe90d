package badger

import (
	"errors"
	"fmt"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"

	"github.com/sluicehq/sluice/queue"
)

// The admin API's own records (queue.Records), under a/<key>. A record key
// has no '/' (queue.CheckRecordKey), so a/ is a family of its own beside
// the others of key.go, and a/<prefix> scans exactly the keys that start
// with prefix. No other code scans a/: recovery, compaction and the
// reclaim never read or drop it. A data dir of an older sluice takes the
// new family without a format change: an older sluice reads only the
// families it knows.

var _ queue.Records = (*Log)(nil)

func recordKey(key string) []byte { return append(append([]byte(nil), prefixRecord...), key...) }

// PutRecord stores value under key, replacing what was there. Like a
// membership, it is fsynced before PutRecord returns when the log syncs
// (Options.Sync): a token the API answered for survives power loss.
func (l *Log) PutRecord(key string, value []byte) error {
	if err := queue.CheckRecordKey(key); err != nil {
		return fmt.Errorf("put record: %w", err)
	}
	// Badger holds value only until the commit, which update waits for.
	if err := l.update(func(txn *badgerdb.Txn) error { return txn.Set(recordKey(key), value) }); err != nil {
		return fmt.Errorf("put record %s: %w", key, err)
	}
	return l.syncRecords("put record " + key)
}

// GetRecord reads one record; queue.ErrNotFound when there is none.
func (l *Log) GetRecord(key string) ([]byte, error) {
	if err := queue.CheckRecordKey(key); err != nil {
		return nil, fmt.Errorf("get record: %w", err)
	}
	v, err := l.get(recordKey(key))
	if errors.Is(err, badgerdb.ErrKeyNotFound) {
		return nil, fmt.Errorf("record %s: %w", key, queue.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get record %s: %w", key, err)
	}
	return v, nil
}

// ListRecords returns every record whose key starts with prefix ("" for
// all of them), in one scan.
func (l *Log) ListRecords(prefix string) (map[string][]byte, error) {
	if err := queue.CheckRecordPrefix(prefix); err != nil {
		return nil, fmt.Errorf("list records: %w", err)
	}
	out := map[string][]byte{}
	err := l.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: recordKey(prefix), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out[string(it.Item().Key()[len(prefixRecord):])] = v
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list records %q: %w", prefix, err)
	}
	return out, nil
}

// DeleteRecord removes a record; a missing one is no error. Synced as
// PutRecord is: a revoked token stays revoked after power loss.
func (l *Log) DeleteRecord(key string) error {
	if err := queue.CheckRecordKey(key); err != nil {
		return fmt.Errorf("delete record: %w", err)
	}
	if err := l.update(func(txn *badgerdb.Txn) error { return txn.Delete(recordKey(key)) }); err != nil {
		return fmt.Errorf("delete record %s: %w", key, err)
	}
	return l.syncRecords("delete record " + key)
}

// syncRecords fsyncs a record write when the log syncs (as JoinAll does).
func (l *Log) syncRecords(what string) error {
	if !l.opts.Sync {
		return nil
	}
	if err := l.sync(); err != nil {
		return fmt.Errorf("%s: sync: %w", what, err)
	}
	l.lastSync.Store(time.Now().UnixNano())
	return nil
}
