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
	"errors"
	"fmt"
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

	floor floorFollower // floor.go
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
