package jetstream

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/queue"
)

// The admin API's own records (queue.Records) live in <S>_STATE beside the
// delivery state, so every node of the fleet reads the same ones:
//
//	record.<key>   the value as given; a record key's segments are subject
//	               tokens (queue.CheckRecordKey), so record.token.> names
//	               one kind
//
// They belong to no lane: their writes are not fenced by a lease and take
// no lane's write lock. A put is a plain publish (last writer wins; puts
// of one key are not ordered across nodes, and the API needs no more: a
// token's record is written once, then deleted). A delete is a purge
// marker that expires, as the delivery state's deletes are (state.go).
// Reads go to the stream leader (get, scanKeys), so a node reads a record
// another node wrote as soon as that write was answered.

const keyRecord = "record."

var (
	_ queue.Records           = (*Store)(nil)
	_ queue.DeadLetterTrimmer = (*Store)(nil)
)

func recordKey(key string) string { return keyRecord + key }

// PutRecord stores value under key, replacing what was there; it returns
// once a quorum of the bucket's replicas has it.
func (s *Store) PutRecord(key string, value []byte) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if err := queue.CheckRecordKey(key); err != nil {
		return fmt.Errorf("put record: %w", err)
	}
	if err := s.writeRecord(s.newPut(recordKey(key), value)); err != nil {
		return fmt.Errorf("put record %s: %w", key, s.stateErr(err))
	}
	return nil
}

// GetRecord reads one record from the stream leader; queue.ErrNotFound
// when there is none.
func (s *Store) GetRecord(key string) ([]byte, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := queue.CheckRecordKey(key); err != nil {
		return nil, fmt.Errorf("get record: %w", err)
	}
	e, err := s.get(s.st.ctx, recordKey(key))
	if err != nil {
		return nil, fmt.Errorf("get record %s: %w", key, s.stateErr(err))
	}
	if !e.exists() {
		return nil, fmt.Errorf("record %s: %w", key, queue.ErrNotFound)
	}
	return e.data, nil
}

// ListRecords returns every record whose key starts with prefix ("" for
// all of them): one scan of the keys under the prefix's complete segments
// (record.token.> for "token." or "token.ab"; record.> for "tok"), keeping
// those that start with prefix.
func (s *Store) ListRecords(prefix string) (map[string][]byte, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := queue.CheckRecordPrefix(prefix); err != nil {
		return nil, fmt.Errorf("list records: %w", err)
	}
	filter := keyRecord + ">"
	if i := strings.LastIndexByte(prefix, '.'); i > 0 {
		filter = keyRecord + prefix[:i] + ".>"
	}
	out := map[string][]byte{}
	err := s.scanKeys([]string{filter}, false, func(k string, _ uint64, v []byte, deleted bool) error {
		key, ok := strings.CutPrefix(k, keyRecord)
		if !ok || !strings.HasPrefix(key, prefix) {
			return nil
		}
		if deleted {
			delete(out, key)
		} else {
			out[key] = v
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list records %q: %w", prefix, s.stateErr(err))
	}
	return out, nil
}

// DeleteRecord removes a record by writing its purge marker; a missing
// record is no error (the marker is written all the same, and expires).
func (s *Store) DeleteRecord(key string) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if err := queue.CheckRecordKey(key); err != nil {
		return fmt.Errorf("delete record: %w", err)
	}
	if err := s.writeRecord(s.newPurge(recordKey(key))); err != nil {
		return fmt.Errorf("delete record %s: %w", key, s.stateErr(err))
	}
	return nil
}

// writeRecord publishes m, sending it again while the stream has no
// leader to answer (no responders: nothing was stored), for up to
// Options.RequestTimeout. Sending a put or a purge twice stores what once
// does.
func (s *Store) writeRecord(m *nats.Msg) error {
	ctx := s.st.ctx
	deadline := time.Now().Add(s.opts.RequestTimeout)
	for attempt := 0; ; attempt++ {
		err := s.commit(ctx, []write{{m: m}})
		if err == nil || !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
			return err
		}
		if err := s.pause(ctx, attempt); err != nil {
			return err
		}
	}
}
