package jetstream

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// Retention. Compact removes events two ways: a purge of everything below
// the retention floor (one cluster-wide request), and, above the floor,
// one delete per event that no retry holds, up to the lowest cursor of the
// memberships: a retry scheduled far ahead must not keep every event after
// it. Both are cluster-wide Raft operations, and every node calls Compact
// (each node's dispatcher does, every second), so a node compacts at most
// once per Options.CompactInterval.
//
// The id index: JetStream's duplicate window keeps the ids of purged
// events in memory, but Lookup reads stored messages, so before an event
// still inside the dedup window is removed, compaction writes its id, seq,
// type and time to the KV bucket <S>_IDS (TTL: the dedup window), created
// on first use. One small write per compacted event is the price of
// answering GET /v1/events/{id} for the whole window, as Badger does.

// DefaultCompactInterval is how often a node compacts the stream at most.
const DefaultCompactInterval = 5 * time.Second

// retention is what Compact asks the delivery state (floor.go): the
// Store itself; a seam for the log side's tests.
type retention interface {
	// retentionFloor is the lowest seq any membership or retry still needs.
	retentionFloor() (uint64, error)
	// retentionHolds is the lowest seq a membership still needs
	// (MaxUint64 if none) and the seqs in [from, to) retries hold.
	retentionHolds(from, to uint64) (memberFloor uint64, held map[uint64]struct{}, err error)
}

// compactMax and deleteMax bound the events one Compact purges and
// deletes one by one (and indexes), so that a call returns within a
// second or so (the dispatcher's maintenance loop waits for it); a call
// that leaves work lets the next one start without CompactInterval.
const (
	compactMax = 1 << 14
	deleteMax  = 1 << 12
)

// Compact removes the events below `below` that no retry still needs and
// returns how many it removed: a purge below the lowest held seq, then a
// delete of each event above it, up to `below`, that no retry holds.
//
// Whose cursors bound it: a store that has not joined the fleet (before
// Own; a test, a tool, one sidecar) is the only writer, and its caller's
// `below` is the lowest cursor, as with Badger. A node of a fleet also
// keeps what the shared memberships still owe (their durable cursors):
// its own dispatcher does not know the cursors of lanes other nodes own.
func (s *Store) Compact(below uint64) (int, error) {
	if s.closed.Load() {
		return 0, queue.ErrClosed
	}
	lg := &s.lg
	lg.compactMu.Lock()
	defer lg.compactMu.Unlock()
	below = min(below, s.Head()+1)
	low := lg.low.Load()
	if below <= low && lg.state.Load().firstSeq >= low {
		return 0, nil // nothing new to remove, and nothing held below low
	}
	if iv := s.opts.CompactInterval; iv > 0 && time.Since(lg.lastCompact) < iv {
		return 0, nil
	}
	lg.lastCompact = time.Now()
	left := false // work left for the next call
	defer func() {
		if left {
			lg.lastCompact = time.Time{}
		}
	}()
	floor, err := lg.ret.retentionFloor()
	if err != nil {
		return 0, fmt.Errorf("compact: %w", err)
	}
	purgeTo, gapTo := below, below
	var held map[uint64]struct{}
	if floor < below {
		// Something below `below` is still needed: which seqs, and by whom.
		var memberFloor uint64
		if memberFloor, held, err = lg.ret.retentionHolds(floor, below); err != nil {
			return 0, fmt.Errorf("compact: %w", err)
		}
		if !s.inFleet() {
			memberFloor = math.MaxUint64 // the caller's below is the lowest cursor
		}
		gapTo = min(below, memberFloor)
		purgeTo = gapTo
		for seq := range held {
			purgeTo = min(purgeTo, seq)
		}
	}
	st, err := s.fetchState()
	if err != nil {
		return 0, s.readErr("compact", err)
	}
	lg.state.Store(&st)
	n := 0
	if end := min(purgeTo, st.firstSeq+compactMax); end > st.firstSeq {
		if err := s.indexIDs(st.firstSeq, end, nil); err != nil {
			return 0, fmt.Errorf("compact: %w", err)
		}
		if n, err = s.purgeBelow(end); err != nil {
			return 0, fmt.Errorf("compact: %w", err)
		}
		st.firstSeq = end
		lg.state.Store(&st)
		if end < purgeTo {
			lg.low.Store(max(low, end))
			left = true
			return n, nil
		}
	}
	from := max(purgeTo, low, st.firstSeq)
	to := min(gapTo, from+deleteMax)
	left = to < gapTo
	if from < to {
		skip := func(seq uint64) bool { _, ok := held[seq]; return ok }
		if err := s.indexIDs(from, to, skip); err != nil {
			return n, fmt.Errorf("compact: %w", err)
		}
		d, err := s.deleteRange(from, to, skip)
		n += d
		if err != nil {
			return n, fmt.Errorf("compact: %w", err)
		}
	}
	lg.low.Store(max(low, purgeTo, to))
	return n, nil
}

// inFleet reports whether this store has joined the fleet (Own): from
// then on its writes are fenced, and other nodes' lanes share the log.
func (s *Store) inFleet() bool {
	_, _, fenced, done, _ := s.fence("")
	done()
	return fenced
}

// purgeBelow removes every event below seq.
func (s *Store) purgeBelow(seq uint64) (int, error) {
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Success bool                `json:"success"`
		Purged  uint64              `json:"purged"`
	}
	req := strconv.AppendUint([]byte(`{"seq":`), seq, 10)
	req = append(req, '}')
	if err := s.apiJSON(s.lg.api+"STREAM.PURGE."+s.opts.Stream, req, &resp); err != nil {
		return 0, fmt.Errorf("purge below %d: %w", seq, err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("purge below %d: %w", seq, resp.Error)
	}
	return int(resp.Purged), nil
}

// deleteWorkers is how many deletes are in flight at once.
const deleteWorkers = 16

// deleteRange deletes the stored events in [from, to) that skip does not
// keep, and returns how many it deleted (one already gone is not counted).
func (s *Store) deleteRange(from, to uint64, skip func(uint64) bool) (int, error) {
	var (
		mu       sync.Mutex
		deleted  int
		firstErr error
		wg       sync.WaitGroup
		seqs     = make(chan uint64)
	)
	subj := s.lg.api + "STREAM.MSG.DELETE." + s.opts.Stream
	for range deleteWorkers {
		wg.Go(func() {
			for seq := range seqs {
				var resp struct {
					Error   *jetstream.APIError `json:"error"`
					Success bool                `json:"success"`
				}
				req := fmt.Appendf(nil, `{"seq":%d,"no_erase":true}`, seq)
				err := s.apiJSON(subj, req, &resp)
				mu.Lock()
				switch {
				case err != nil:
					firstErr = cmpErr(firstErr, fmt.Errorf("delete event %d: %w", seq, err))
				case resp.Error != nil && (resp.Error.ErrorCode == errCodeDeleteFailed || resp.Error.ErrorCode == errCodeNoMessage || resp.Error.ErrorCode == errCodeSeqNotFound):
					// Already gone: an earlier compaction, or another node.
				case resp.Error != nil:
					firstErr = cmpErr(firstErr, fmt.Errorf("delete event %d: %w", seq, resp.Error))
				case resp.Success:
					deleted++
				}
				mu.Unlock()
			}
		})
	}
	for seq := from; seq < to; seq++ {
		if skip != nil && skip(seq) {
			continue
		}
		seqs <- seq
	}
	close(seqs)
	wg.Wait()
	return deleted, firstErr
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// recentSize is how many recent events' headers the follower keeps for
// compaction's id index (about 3 MiB): compaction follows the cursors, so
// what it removes was mostly appended a few seconds before.
const recentSize = 1 << 16

type recentEntry struct {
	seq             uint64
	ts              int64
	id, typ, tenant string
}

// recentRing holds the headers of the last recentSize events, by seq.
type recentRing struct{ e []recentEntry }

func (r *recentRing) put(seq uint64, id, typ, tenant string, ts int64) {
	if r.e == nil {
		r.e = make([]recentEntry, recentSize)
	}
	r.e[seq%recentSize] = recentEntry{seq: seq, ts: ts, id: id, typ: typ, tenant: tenant}
}

// indexIDs writes the id index entries of the events in [from, to) that skip
// does not keep and that are still inside the dedup window, and returns
// once the bucket has them all.
func (s *Store) indexIDs(from, to uint64, skip func(uint64) bool) error {
	// An empty stream's first seq is 0, which no event has: a direct get
	// from it is refused (408 Empty Request), logged at every compaction.
	from = max(from, 1)
	if to <= from {
		return nil
	}
	horizon := time.Now().Add(-s.opts.DedupWindow - dedupSlack).UnixNano()
	var entries []recentEntry
	// The follower's recent headers, if they cover the range.
	f := &s.lg.fol
	f.mu.Lock()
	covered := f.recent.e != nil && to-from <= recentSize
	for seq := from; covered && seq < to; seq++ {
		if skip != nil && skip(seq) {
			continue
		}
		e := f.recent.e[seq%recentSize]
		if e.seq != seq {
			covered = false
			break
		}
		if e.ts >= horizon {
			entries = append(entries, e)
		}
	}
	f.mu.Unlock()
	if !covered {
		// Read the headers from the stream (bodies come along).
		entries = entries[:0]
		for next := from; next < to; {
			n, err := s.scanEvents(next, to-1, maxScan, func(g *getMsg) bool {
				if (skip == nil || !skip(g.seq)) && g.ts >= horizon {
					entries = append(entries, recentEntry{seq: g.seq, ts: g.ts, id: hval(g.hdr, jetstream.MsgIDHeader), typ: hval(g.hdr, hdrType), tenant: hval(g.hdr, hdrTenant)})
				}
				return true
			})
			if err != nil {
				return fmt.Errorf("read headers for the id index: %w", err)
			}
			if n == next {
				break
			}
			next = n
		}
	}
	if len(entries) == 0 {
		return nil
	}
	ix, err := s.openIDIndex(true)
	if err != nil {
		return err
	}
	return ix.put(s, entries)
}

// idIndex is the KV bucket <S>_IDS: key base64url(id), value
// "<seq> <stored at, unix nanos> <type>", and " <tenant>" after it for an
// event of a tenant (types and tenants hold no spaces).
type idIndex struct {
	bucket string
	stream string // KV_<bucket>
	pjs    jetstream.JetStream
}

// openIDIndex returns the index, creating the bucket when create.
func (s *Store) openIDIndex(create bool) (*idIndex, error) {
	if ix := s.lg.ids.Load(); ix != nil {
		return ix, nil
	}
	bucket := s.opts.Stream + "_IDS"
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RequestTimeout)
	defer cancel()
	var err error
	if create {
		_, err = s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "sluice: ids of compacted events, for Lookup within the dedup window",
			TTL:         s.opts.DedupWindow + dedupSlack,
			Replicas:    s.opts.Replicas,
			Storage:     jetstream.FileStorage,
			History:     1,
		})
	} else {
		_, err = s.js.KeyValue(ctx, bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("id index %s: %w", bucket, err)
	}
	pjs, err := jetstream.New(s.nc, jetstream.WithPublishAsyncMaxPending(256), jetstream.WithPublishAsyncTimeout(s.opts.RequestTimeout))
	if err != nil {
		return nil, err
	}
	ix := &idIndex{bucket: bucket, stream: "KV_" + bucket, pjs: pjs}
	if !s.lg.ids.CompareAndSwap(nil, ix) {
		return s.lg.ids.Load(), nil
	}
	return ix, nil
}

func (ix *idIndex) key(id string) string {
	return "$KV." + ix.bucket + "." + base64.RawURLEncoding.EncodeToString([]byte(id))
}

// put writes the entries and waits for every PubAck.
func (ix *idIndex) put(s *Store, entries []recentEntry) error {
	pafs := make([]jetstream.PubAckFuture, 0, len(entries))
	for _, e := range entries {
		v := strconv.AppendUint(nil, e.seq, 10)
		v = append(v, ' ')
		v = strconv.AppendInt(v, e.ts, 10)
		v = append(v, ' ')
		v = append(v, e.typ...)
		if e.tenant != "" {
			v = append(append(v, ' '), e.tenant...)
		}
		paf, err := ix.pjs.PublishMsgAsync(&nats.Msg{Subject: ix.key(e.id), Data: v}, jetstream.WithStallWait(s.opts.RequestTimeout))
		if err != nil {
			return fmt.Errorf("id index: %w", err)
		}
		pafs = append(pafs, paf)
	}
	t := time.NewTimer(s.opts.RequestTimeout)
	defer t.Stop()
	for _, paf := range pafs {
		t.Reset(s.opts.RequestTimeout) // while the acks keep coming
		select {
		case <-paf.Ok():
		case err := <-paf.Err():
			return fmt.Errorf("id index: %w", err)
		case <-t.C:
			return fmt.Errorf("id index: %w", errPubAckTimeout)
		case <-s.quit:
			return queue.ErrClosed
		}
	}
	return nil
}

// lookupIndex reads id's index entry: errNoMsg when there is none (or no
// index yet).
func (s *Store) lookupIndex(id string) (seq uint64, typ, tenant string, ts int64, err error) {
	ix, err := s.openIDIndex(false)
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, "", "", 0, errNoMsg
	}
	if err != nil {
		return 0, "", "", 0, err
	}
	subj := ix.key(id)
	g, err := s.directGet(ix.stream, 0, subj)
	if errors.Is(err, errNoMsg) {
		g, err = s.leaderGet(ix.stream, 0, false, subj)
	}
	if err != nil {
		return 0, "", "", 0, err
	}
	f := strings.SplitN(string(g.data), " ", 4)
	if len(f) < 3 {
		return 0, "", "", 0, fmt.Errorf("id index entry of %q: %w", id, queue.ErrCorrupt)
	}
	seq, err1 := strconv.ParseUint(f[0], 10, 64)
	ts, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, "", "", 0, fmt.Errorf("id index entry of %q: %w", id, queue.ErrCorrupt)
	}
	if len(f) == 4 {
		tenant = f[3]
	}
	return seq, f[2], tenant, ts, nil
}

// DiskUsage is the stream's size as of its last info (refreshed every
// second in the background, and by Compact): Used is the stream's bytes,
// Free what is left under its max_bytes (-1 when unlimited), Full while
// appends are refused for it.
func (s *Store) DiskUsage() queue.DiskUsage {
	u := queue.DiskUsage{Free: -1}
	st := s.lg.state.Load()
	if st == nil {
		return u
	}
	u.Used = int64(st.bytes)
	if st.maxBytes > 0 {
		u.Free = max(st.maxBytes-u.Used, 0)
	}
	if s.lg.diskFull.Load() || st.maxBytes > 0 && u.Used >= st.maxBytes {
		u.Full = true
		u.Reason = fmt.Sprintf("stream %s is at its max_bytes of %d (max_disk_bytes)", s.opts.Stream, st.maxBytes)
	}
	return u
}

// refreshInterval is how often the stream's info is read for DiskUsage.
const refreshInterval = time.Second

// refreshLoop keeps DiskUsage current without a request per call.
func (s *Store) refreshLoop() {
	defer s.lg.wg.Done()
	t := time.NewTicker(refreshInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.lg.stop:
			return
		}
		if st, err := s.fetchState(); err == nil {
			s.lg.state.Store(&st)
		}
	}
}
