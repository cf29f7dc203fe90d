package jetstream

// The delivery state of fleet mode: memberships, cursors, the retry
// schedule and the dead letters, as keys of the KV bucket <S>_STATE.
//
// Keys (a subscription id matches ^[a-z0-9][a-z0-9._-]{0,63}$ and may hold
// dots; a seq is the last token, in decimal, so a filter retry.<sub>.*
// names exactly one subscription's retries):
//
//	member.<sub>       JSON {"v":1,"from","left","until","paused","snapshot"}; created
//	                   create-only (From = the stream's last seq + 1), changed by CAS
//	cursor.<sub>       the durable cursor, decimal; absent until the lane writes one
//	                   (then From-1 holds)
//	retry.<sub>.<seq>  JSON {"v":1,"due","attempt","first_attempt",...}; due in unix ns
//	dead.<sub>.<seq>   version byte 1 | uvarint length | JSON header | body copy
//	                   (the Badger backend's encoding)
//	lease.<sub>        the fleet side's (lease.go)
//	record.<key>       the admin API's records, of no lane (records.go)
//
// Deleting a key (a resolved retry, a retired membership) writes a purge
// marker that expires (KV-Operation: PURGE, Nats-Rollup: sub, Nats-TTL
// markerTTL): with History 1 a plain delete marker would stay in the
// stream for ever, one per key ever deleted — a million retries over time
// leave a million markers that every scan of retry.> reads again. A marker
// that expires keeps what watchers need (they see the delete as it is
// written) and then leaves nothing; the servers allow Nats-TTL inside an
// atomic batch, so a delete still goes together with what it belongs to.
// A purge is used rather than a delete because the servers treat a purge
// marker as a marker: when it expires, no further "MaxAge" marker is left
// in its place.
//
// Reads see every write answered before them. Gets go to the stream
// leader: the bucket's stream has AllowDirect off, because a direct get
// may be answered by a replica that has not applied the latest write yet,
// and a read-modify-write (a CAS loop, a replay's check) or a read after
// one's own write must see it. Scans (an ordered consumer, which may sit
// on a lagging replica) read on until they have seen the last matching
// message the leader had when they started (scanKeys).
//
// This Store's writes about one lane go one at a time (laneState.wmu):
// each is fenced on the lane's lease subject, and the servers refuse a
// write with an expectation on a subject while another is in flight.
//
// Writes of more than one key go as one atomic batch (Nats-Batch-*
// headers by hand, nats.go v1.55 has no client for it): all of it is
// stored, or none.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

const (
	keyMember = "member."
	keyCursor = "cursor."
	keyRetry  = "retry."
	keyDead   = "dead."

	// markerTTL is how long a delete marker of <S>_STATE lives: ours (a
	// resolved retry, a retirement) and the servers' (an expired lease).
	// Long enough that a watcher cut off for a while still sees the
	// delete when it resumes; short enough that markers never pile up.
	markerTTL = 10 * time.Minute

	// stateRecordVersion leads every JSON record (and the dead letter's
	// framing), so a record format can evolve.
	stateRecordVersion = 1

	// minStateValueBytes is the least max value size an existing bucket
	// may have: a dead letter of a 1 MiB body with its header.
	minStateValueBytes = 1<<20 + 64<<10

	// stateMaxPending bounds this Store's asynchronous state writes in
	// flight (JoinAll, SaveCursors); stateWindow is how many one call
	// keeps in flight at once.
	stateMaxPending = 1 << 14
	stateWindow     = 1024

	// stateBatches bounds this Store's atomic batches open at once: the
	// servers allow 50 per stream, shared by every node.
	stateBatches = 16

	// joinScan: a JoinAll that has to read more unknown memberships than
	// this reads them all with one scan rather than one get each.
	joinScan = 32
)

// Server error codes the state side tells apart (nats-server
// jetstream_errors_generated.go).
const (
	codeWrongLastSeq   = jetstream.JSErrCodeStreamWrongLastSequence         // 10071: an expected last sequence did not match
	codeWrongLastConst = jetstream.JSErrCodeStreamWrongLastSequenceConstant // 10164: a write with an expectation on that subject is in flight
	codeBatchGone      = 10176                                              // atomic publish incomplete batch (also: too many in flight at its start)
	codeBatchInflight  = 10210                                              // atomic publish too many in flight
)

// stateSide is the delivery state's memory: the retry index of the lanes
// this node serves, the per-lane write serialisation, and the follower
// that keeps the retention floor.
type stateSide struct {
	js     jetstream.JetStream // the state's own context: its async window and timeouts are not the log's
	stream jetstream.Stream    // KV_<S>_STATE, bound with AllowDirect off
	bucket string              // <S>_STATE

	ctx    context.Context // cancelled by closeState
	cancel context.CancelFunc
	closed atomic.Bool
	wg     sync.WaitGroup

	batches chan struct{} // semaphore of open atomic batches

	// ownSeq is the stream seq of the last answered write of this Store
	// to a key the retention follower follows: retentionFloor waits until
	// the follower has seen it, so a Compact right after a Record on this
	// node sees that Record.
	ownSeq atomic.Uint64

	// fenceFn replaces fence in tests that fence on a stale lease.
	fenceFn func(sub string) (subject string, rev uint64, fenced bool, done func(), err error)

	mu    sync.Mutex
	lanes map[string]*laneState

	floor floorFollower // member.go
}

// laneState is what this Store keeps about one subscription.
type laneState struct {
	// wmu serialises this Store's writes about the lane (and loads of its
	// index): the servers refuse a write with an expectation on a subject
	// while another such write is in flight (10164), and every write
	// about a lane is fenced on one subject, its lease.
	wmu sync.Mutex

	mu  sync.Mutex  // guards idx and gen
	idx *retryIndex // nil: not loaded
	gen uint64      // counts dropIndex calls, so a load that raced one is not kept
}

func (st *stateSide) lane(sub string) *laneState {
	st.mu.Lock()
	defer st.mu.Unlock()
	l := st.lanes[sub]
	if l == nil {
		l = &laneState{}
		st.lanes[sub] = l
	}
	return l
}

// setUpBuckets makes the KV bucket <S>_STATE, or checks an existing one,
// and switches on what plain KV does not: atomic batches, reads from the
// leader only. While the servers cannot answer (just started, no leader,
// away) it tries again with backoff (Store.retry); an incompatible bucket
// is refused at once.
func (s *Store) setUpBuckets() error {
	return s.retry("jetstream: KV bucket "+s.opts.Stream+"_STATE", s.setUpState, func(err error) bool {
		return unreachable(err) || notYetKnown(err)
	})
}

// setUpState is one attempt of setUpBuckets.
func (s *Store) setUpState() error {
	o := s.opts
	bucket := o.Stream + "_STATE"
	name := "KV_" + bucket
	ctx, cancel := context.WithTimeout(context.Background(), 3*o.RequestTimeout)
	defer cancel()

	_, err := s.js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		// The bucket's stream is made as the KV layer would make it, but
		// with atomic batches on and direct gets off from the start: the
		// nodes of a new fleet set up at once, and a create followed by
		// an update from each of them made two of three time out in the
		// acceptance run. One create with the final settings is
		// idempotent: identical creates from other nodes succeed.
		_, err = s.js.CreateStream(ctx, jetstream.StreamConfig{
			Name:              name,
			Description:       "sluice delivery state: memberships, cursors, retries, dead letters, leases",
			Subjects:          []string{"$KV." + bucket + ".>"},
			MaxMsgsPerSubject: 1,
			MaxBytes:          -1,
			// No max value size of its own: the servers' max_payload bounds
			// a dead letter, as it bounds the event it copies.
			MaxMsgSize:             -1,
			Storage:                jetstream.FileStorage,
			Replicas:               o.Replicas,
			AllowRollup:            true,
			DenyDelete:             true,
			Duplicates:             2 * time.Minute,
			MaxMsgs:                -1,
			MaxConsumers:           -1,
			AllowDirect:            false,
			AllowAtomicPublish:     true,
			Discard:                jetstream.DiscardNew,
			AllowMsgTTL:            true,
			SubjectDeleteMarkerTTL: markerTTL,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil // another node made it first, differently: checked below
		}
	}
	if err != nil {
		return fmt.Errorf("jetstream: KV bucket %s (jetstream.replicas %d): %w", bucket, o.Replicas, err)
	}
	stream, err := s.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("jetstream: KV bucket %s: %w", bucket, err)
	}
	cfg := stream.CachedInfo().Config
	if err := checkStateStream(bucket, cfg, o.Replicas); err != nil {
		return err
	}
	if !cfg.AllowAtomicPublish || cfg.AllowDirect {
		cfg.AllowAtomicPublish = true
		cfg.AllowDirect = false
		if stream, err = s.js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("jetstream: KV bucket %s: enable atomic batches: %w", bucket, err)
		}
		if c := stream.CachedInfo().Config; !c.AllowAtomicPublish || c.AllowDirect {
			return fmt.Errorf("jetstream: KV bucket %s: the servers did not enable atomic batch publish (nats-server 2.12 or later is needed)", bucket)
		}
	}
	// Bound again, so the handles know reads go to the leader.
	kv, err := s.js.KeyValue(ctx, bucket)
	if err != nil {
		return fmt.Errorf("jetstream: KV bucket %s: %w", bucket, err)
	}
	s.state = kv
	s.st.stream = stream
	s.st.bucket = bucket
	return nil
}

// checkStateStream names every setting of an existing <S>_STATE that the
// delivery state cannot work with. Nothing is changed behind the
// operator's back except what sluice itself switches on (atomic batches,
// leader reads).
func checkStateStream(bucket string, c jetstream.StreamConfig, replicas int) error {
	var bad []string
	if c.MaxMsgsPerSubject != 1 {
		bad = append(bad, fmt.Sprintf("history %d (needs 1)", c.MaxMsgsPerSubject))
	}
	if c.Storage != jetstream.FileStorage {
		bad = append(bad, "memory storage (needs file)")
	}
	if c.Replicas != replicas {
		bad = append(bad, fmt.Sprintf("replicas %d (jetstream.replicas is %d)", c.Replicas, replicas))
	}
	if c.MaxAge != 0 {
		bad = append(bad, fmt.Sprintf("ttl %s (the delivery state must not expire)", c.MaxAge))
	}
	if !c.AllowMsgTTL || c.SubjectDeleteMarkerTTL <= 0 {
		bad = append(bad, "no per-key TTLs (needs limit_marker_ttl)")
	}
	if c.MaxMsgSize > 0 && c.MaxMsgSize < minStateValueBytes {
		bad = append(bad, fmt.Sprintf("max value size %d (a dead letter needs up to %d)", c.MaxMsgSize, minStateValueBytes))
	}
	if !c.AllowRollup || c.DenyPurge {
		bad = append(bad, "rollups or purges denied (deletes need them)")
	}
	if c.Sealed {
		bad = append(bad, "sealed")
	}
	if c.Mirror != nil || len(c.Sources) > 0 {
		bad = append(bad, "a mirror or sourced bucket (needs its own writes)")
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("jetstream: KV bucket %s exists with settings sluice cannot use: %s; fix them or delete the bucket (it holds the delivery state)",
		bucket, strings.Join(bad, "; "))
}

// openState readies the state side; setUpBuckets has run.
func (s *Store) openState() error {
	js, err := jetstream.New(s.nc,
		jetstream.WithPublishAsyncMaxPending(stateMaxPending),
		jetstream.WithPublishAsyncTimeout(s.opts.RequestTimeout))
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	st := &s.st
	st.js = js
	st.ctx, st.cancel = context.WithCancel(context.Background())
	st.batches = make(chan struct{}, stateBatches)
	st.lanes = map[string]*laneState{}
	return nil
}

// closeState stops the retention follower; the state's methods answer
// queue.ErrClosed from here on. It runs after the fleet gave up its
// leases (the engine writes cursors while it does).
func (s *Store) closeState() {
	st := &s.st
	if st.cancel == nil {
		return
	}
	st.closed.Store(true)
	st.cancel()
	s.stopFloor()
	st.wg.Wait()
}

// Keys.

func memberKey(sub string) string { return keyMember + sub }
func cursorKey(sub string) string { return keyCursor + sub }
func retryKey(sub string, seq uint64) string {
	return keyRetry + sub + "." + strconv.FormatUint(seq, 10)
}
func deadKey(sub string, seq uint64) string {
	return keyDead + sub + "." + strconv.FormatUint(seq, 10)
}

// splitSeqKey splits <prefix><sub>.<seq>.
func splitSeqKey(prefix, key string) (sub string, seq uint64, ok bool) {
	if !strings.HasPrefix(key, prefix) {
		return "", 0, false
	}
	rest := key[len(prefix):]
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(rest[i+1:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return rest[:i], seq, true
}

// checkSub refuses a subscription id that cannot be a key: every part
// between dots must be non-empty (NATS subject tokens), and the config's
// pattern allows "a..b" and "a.".
func checkSub(sub string) error {
	if sub == "" || len(sub) > 64 || sub[0] == '.' || sub[len(sub)-1] == '.' || strings.Contains(sub, "..") {
		return fmt.Errorf("subscription id %q: fleet mode needs ids of 1 to 64 characters whose dots separate non-empty parts", sub)
	}
	for i := 0; i < len(sub); i++ {
		c := sub[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("subscription id %q: fleet mode allows a-z, 0-9, '.', '_' and '-'", sub)
		}
	}
	return nil
}

// Encodings.

type memberRecord struct {
	V        int             `json:"v"`
	From     uint64          `json:"from"`
	Left     bool            `json:"left,omitempty"`
	Until    uint64          `json:"until,omitempty"`
	Paused   string          `json:"paused,omitempty"`
	Snapshot json.RawMessage `json:"snapshot,omitempty"`
}

func encodeMember(m queue.Membership) ([]byte, error) {
	return json.Marshal(memberRecord{V: stateRecordVersion, From: m.From, Left: m.Left, Until: m.Until, Paused: m.Paused, Snapshot: m.Snapshot})
}

// decodeMember decodes a membership; its Cursor is From-1 (the caller
// reads the cursor key).
func decodeMember(sub string, v []byte) (queue.Membership, error) {
	var r memberRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return queue.Membership{}, fmt.Errorf("membership %s: %v: %w", sub, err, queue.ErrCorrupt)
	}
	m := queue.Membership{Subscription: sub, From: r.From, Left: r.Left, Until: r.Until, Paused: r.Paused, Snapshot: []byte(r.Snapshot)}
	if m.From > 0 {
		m.Cursor = m.From - 1
	}
	return m, nil
}

func encodeCursor(c uint64) []byte { return strconv.AppendUint(nil, c, 10) }

func decodeCursor(sub string, v []byte) (uint64, error) {
	c, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cursor %s: %q: %w", sub, v, queue.ErrCorrupt)
	}
	return c, nil
}

type retryRecord struct {
	V            int    `json:"v"`
	Due          int64  `json:"due"`
	Attempt      int    `json:"attempt"`
	FirstAttempt int64  `json:"first_attempt"`
	LastStatus   int    `json:"last_status,omitempty"`
	LastError    string `json:"last_error,omitempty"`
	Replay       bool   `json:"replay,omitempty"`
}

// dueNanos is a due time as the schedule orders it: unix nanos, never
// negative (as in the Badger backend).
func dueNanos(t time.Time) int64 { return max(t.UnixNano(), 0) }

func encodeRetry(r queue.Retry) ([]byte, error) {
	return json.Marshal(retryRecord{V: stateRecordVersion, Due: dueNanos(r.Due), Attempt: r.Attempt, FirstAttempt: r.FirstAttempt.UnixNano(),
		LastStatus: r.LastStatus, LastError: r.LastError, Replay: r.Replay})
}

func decodeRetry(sub string, seq uint64, v []byte) (queue.Retry, error) {
	var r retryRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return queue.Retry{}, fmt.Errorf("retry %s/%d: %v: %w", sub, seq, err, queue.ErrCorrupt)
	}
	return queue.Retry{Subscription: sub, Seq: seq, Due: time.Unix(0, r.Due), Attempt: r.Attempt, FirstAttempt: time.Unix(0, r.FirstAttempt),
		LastStatus: r.LastStatus, LastError: r.LastError, Replay: r.Replay}, nil
}

// encodeDeadLetter is queue.AppendDeadLetter into a buffer of its own:
// the same bytes as Badger's.
func encodeDeadLetter(d *queue.DeadLetter) ([]byte, error) {
	return queue.AppendDeadLetter(make([]byte, 0, 1+binary.MaxVarintLen64+256+len(d.Body)), d)
}

var decodeDeadLetter = queue.DecodeDeadLetter

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

// Writes.

// newPut is a message writing value under key.
func (s *Store) newPut(key string, value []byte) *nats.Msg {
	return &nats.Msg{Subject: s.statePfx + key, Header: nats.Header{}, Data: value}
}

// newPurge is a message deleting key: a purge marker that expires (see
// the file comment).
func (s *Store) newPurge(key string) *nats.Msg {
	m := &nats.Msg{Subject: s.statePfx + key, Header: nats.Header{}}
	m.Header.Set("KV-Operation", "PURGE")
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Header.Set(jetstream.MsgTTLHeader, markerTTL.String())
	return m
}

// expectRev makes m a compare-and-set: stored only if its key's last
// message is rev (0: the subject holds nothing).
func expectRev(m *nats.Msg, rev uint64) {
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
}

// setFence makes m stored only while the lease subject is at rev.
func setFence(m *nats.Msg, subj string, rev uint64) {
	m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, subj)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
}

// write is one message of a state write; cas when it expects its own
// key's revision (it cannot carry the fence too: a message has one
// expectation).
type write struct {
	m   *nats.Msg
	cas bool
}

// commit stores ws: one message as a plain publish, more as one atomic
// batch. The error is the servers' (*jetstream.APIError) or the
// transport's.
func (s *Store) commit(ctx context.Context, ws []write) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	if len(ws) == 1 {
		ack, err := s.st.js.PublishMsg(ctx, ws[0].m)
		if err == nil {
			s.wrote(ws[0].m.Subject, ack.Sequence)
		}
		return err
	}
	select {
	case s.st.batches <- struct{}{}:
		defer func() { <-s.st.batches }()
	case <-ctx.Done():
		return ctx.Err()
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	for i, w := range ws {
		m := w.m
		m.Header.Set("Nats-Batch-Id", id)
		m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
		if i < len(ws)-1 {
			if err := s.nc.PublishMsg(m); err != nil {
				return err
			}
			continue
		}
		m.Header.Set("Nats-Batch-Commit", "1")
		resp, err := s.nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			return err
		}
		var ack struct {
			Error *jetstream.APIError `json:"error"`
			Seq   uint64              `json:"seq"`
			Count int                 `json:"count"`
		}
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			return fmt.Errorf("batch answer %q: %w", resp.Data, err)
		}
		if ack.Error != nil {
			return ack.Error
		}
		if ack.Count != len(ws) {
			return fmt.Errorf("batch of %d stored %d", len(ws), ack.Count)
		}
		// A batch is stored at consecutive seqs, in order.
		for i, w := range ws {
			s.wrote(w.m.Subject, ack.Seq-uint64(len(ws)-1-i))
		}
	}
	return nil
}

// wrote notes an answered write of subj at seq, for retentionFloor.
func (s *Store) wrote(subj string, seq uint64) {
	k := strings.TrimPrefix(subj, s.statePfx)
	if !strings.HasPrefix(k, keyMember) && !strings.HasPrefix(k, keyCursor) && !strings.HasPrefix(k, keyRetry) {
		return
	}
	for {
		cur := s.st.ownSeq.Load()
		if seq <= cur || s.st.ownSeq.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// laneFence is fence, or the test's stand-in.
func (s *Store) laneFence(sub string) (subject string, rev uint64, fenced bool, done func(), err error) {
	if f := s.st.fenceFn; f != nil {
		return f(sub)
	}
	return s.fence(sub)
}

func apiCode(err error) jetstream.ErrorCode {
	var e jetstream.JetStreamError
	if errors.As(err, &e) && e.APIError() != nil {
		return e.APIError().ErrorCode
	}
	return 0
}

// casRetryable: the write may succeed if sent again (another expectation on
// one of its subjects was in flight; the batch could not be opened).
func casRetryable(err error) bool {
	switch apiCode(err) {
	case codeWrongLastConst, codeBatchGone, codeBatchInflight:
		return true
	}
	return false
}

// writeLane writes about sub what build returns, fenced by this node's
// lease on sub, and retries on a conflict: build is called again (it
// reads what it writes over afresh). The caller holds sub's wmu.
//
// The fence rides on the first message without an expectation of its
// own; when every message has one, sub's cursor is written again as it
// is to carry it (cursorAsIs; before Own too, which costs a rewrite only
// there). A refused expectation (10071) of a write whose only one is the
// fence is queue.ErrFenced; with expectations of its own too, the lease is
// read to tell which failed (lease revisions only grow, so a lease still
// at rev passed its check). The fence is taken after build's reads, so a
// renewal of the lease waits only for the write itself.
func (s *Store) writeLane(sub string, build func(ctx context.Context) ([]write, error)) error {
	ctx := s.st.ctx
	deadline := time.Now().Add(s.opts.RequestTimeout)
	for attempt := 0; ; attempt++ {
		ws, err := build(ctx)
		if err != nil || len(ws) == 0 {
			return err
		}
		cas, carrier := false, -1
		for i, w := range ws {
			cas = cas || w.cas
			if !w.cas && carrier < 0 {
				carrier = i
			}
		}
		if carrier < 0 {
			c, err := s.cursorAsIs(ctx, sub)
			if err != nil {
				return err
			}
			ws, carrier = append(ws, c), len(ws)
		}
		ws[0], ws[carrier] = ws[carrier], ws[0]
		subj, rev, fenced, done, err := s.laneFence(sub)
		if err != nil {
			return err
		}
		if fenced {
			setFence(ws[0].m, subj, rev)
		}
		err = s.commit(ctx, ws)
		done()
		code := apiCode(err)
		switch {
		case err == nil:
			return nil
		case code == codeWrongLastSeq && fenced && !cas:
			return fmt.Errorf("%w: the lease of %s moved on from revision %d", queue.ErrFenced, sub, rev)
		case code == codeWrongLastSeq && fenced:
			e, gerr := s.getSubject(ctx, subj)
			if gerr != nil {
				return gerr
			}
			if e.rev != rev {
				return fmt.Errorf("%w: the lease of %s moved on from revision %d", queue.ErrFenced, sub, rev)
			}
		case code == codeWrongLastSeq, casRetryable(err), errors.Is(err, nats.ErrNoResponders):
			// No responders: nothing reached the stream (a leader election).
		default:
			return err
		}
		// A conflict: read again and write again, for a while.
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: state of %s: conflicting writes for %s: %w", queue.ErrUnavailable, sub, s.opts.RequestTimeout, err)
		}
		if code != codeWrongLastSeq {
			if err := s.pause(ctx, attempt); err != nil {
				return err
			}
		}
	}
}

// pause waits a little before a write is sent again (1 ms doubling to
// 32 ms), unless the store closes.
func (s *Store) pause(ctx context.Context, attempt int) error {
	t := time.NewTimer(time.Millisecond << min(attempt, 5))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return queue.ErrClosed
	}
}

// cursorAsIs is a carrier for the fence when every other message of a
// write has an expectation of its own: sub's cursor written again as it
// is. Only the lane's owner writes the cursor (fenced, one write at a
// time), so rewriting it changes nothing.
func (s *Store) cursorAsIs(ctx context.Context, sub string) (write, error) {
	e, err := s.get(ctx, cursorKey(sub))
	if err != nil {
		return write{}, err
	}
	if !e.exists() {
		return write{m: s.newPurge(cursorKey(sub))}, nil
	}
	return write{m: s.newPut(cursorKey(sub), e.data)}, nil
}

// pipe sends writes without waiting for each answer; one goroutine takes
// the answers in order and hands each to its callback, so a callback may
// release what the sender needs next.
type pipe struct {
	s  *Store
	q  chan pending
	wg sync.WaitGroup
}

type pending struct {
	f    jetstream.PubAckFuture
	subj string
	done func(error)
}

func (s *Store) newPipe() *pipe {
	p := &pipe{s: s, q: make(chan pending, stateWindow)}
	p.wg.Add(1)
	go p.collect()
	return p
}

func (p *pipe) send(m *nats.Msg, done func(error)) {
	f, err := p.s.st.js.PublishMsgAsync(m)
	if err != nil {
		done(err)
		return
	}
	p.q <- pending{f, m.Subject, done}
}

// collect: every future resolves, the context times out unanswered ones
// (WithPublishAsyncTimeout).
func (p *pipe) collect() {
	defer p.wg.Done()
	for w := range p.q {
		select {
		case ack := <-w.f.Ok():
			p.s.wrote(w.subj, ack.Sequence)
			w.done(nil)
		case err := <-w.f.Err():
			w.done(err)
		}
	}
}

// wait returns once every write sent has its answer.
func (p *pipe) wait() {
	close(p.q)
	p.wg.Wait()
}

// stateErr classifies an error of the state side: queue.ErrClosed once
// closed, queue.ErrUnavailable (with the cause) while the servers cannot
// answer.
func (s *Store) stateErr(err error) error {
	switch {
	case err == nil, errors.Is(err, queue.ErrClosed), errors.Is(err, queue.ErrUnavailable),
		errors.Is(err, queue.ErrFenced), errors.Is(err, queue.ErrNotFound), errors.Is(err, queue.ErrCorrupt):
		return err
	case s.st.closed.Load(), errors.Is(err, nats.ErrConnectionClosed) && s.closed.Load():
		return fmt.Errorf("%w: %w", queue.ErrClosed, err)
	case unreachable(err):
		return fmt.Errorf("%w: %w", queue.ErrUnavailable, err)
	}
	return err
}

// unreachable: the servers did not answer, or answered that they cannot
// now (no quorum, no leader).
func unreachable(err error) bool {
	var e jetstream.JetStreamError
	if errors.As(err, &e) && e.APIError() != nil {
		return e.APIError().Code >= 500 || casRetryable(err)
	}
	return brokerAway(err) || errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}

// checkOpen refuses a call after Close.
func (s *Store) checkOpen() error {
	if s.st.closed.Load() {
		return queue.ErrClosed
	}
	return nil
}

// eventsLastSeq reads the event stream's last seq from its leader, not
// from this node's head: the cut-off of a membership must be the same
// whichever node writes it.
func (s *Store) eventsLastSeq(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	info, err := s.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the last seq of stream %s: %w", s.opts.Stream, err)
	}
	return info.State.LastSeq, nil
}
