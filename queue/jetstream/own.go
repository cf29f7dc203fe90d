package jetstream

// The fleet: this node's heartbeat, the live set, the subscriptions to own
// and the decisions which lanes this node claims or gives up. Each lane
// has one owner at a time, so its cap, rate limit, breaker and quota hold
// fleet-wide without a distributed token bucket; rendezvous hashing over
// the live set moves only a joining or leaving node's share. The leases themselves, and fencing, are in
// lease.go; lane snapshots in snapshot.go.
//
// The protocol, every step a JetStream write with compare-and-set:
//
//   - Heartbeat: node.<id> in <S>_NODES, create-only on joining, then
//     renewed by CAS on its revision every LeaseTTL/3 with a per-key TTL of
//     LeaseTTL. A watch of node.> is the live set; an expired heartbeat
//     leaves a marker, so the watch sees a crashed node go.
//   - Owner: policy.Owner(sub, live set), rendezvous hashing, computed by
//     every node from the same inputs; a node puts itself in its live set
//     only while its own heartbeat is current.
//   - Subscriptions: a watch of member.> in <S>_STATE (the keys only).
//   - Claim: a node that should own sub and sees lease.<sub> free creates
//     it (lease.go). A node that should own a lease held by another node
//     waits: the holder moves it on purpose (it sees the same live set), or
//     it expires when the holder died.
//   - Move: a holder that should no longer own sub (a node joined, the
//     subscription was retired) tells the engine to Release, then deletes
//     the lease by CAS so the new owner creates it at once.
//
// Duplicate node ids: joining creates node.<id> create-only. If it exists,
// either another live process uses the id (a misconfiguration that would
// make two nodes share leases) or this node crashed less than LeaseTTL ago
// and its heartbeat has not expired yet. Own waits, watching the key: if
// it is renewed the id is in use and Own fails, naming it; if it expires
// Own proceeds. A restart after a crash therefore waits at most LeaseTTL,
// which costs nothing: the crashed process's leases expire in the same
// time and are claimed like anyone else's (never adopted, since only this
// process's own writes are trusted as its own). A graceful restart deletes
// the heartbeat on Close and joins at once.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/queue"
)

const (
	// lanesTTL is how long a lane snapshot lives unless its owner
	// publishes it again: owners publish a few times a second, so a
	// snapshot a minute old belongs to a node that died.
	lanesTTL = time.Minute
	// nodesMarkerTTL is how long an expired or deleted heartbeat's marker
	// stays in <S>_NODES (watchers see it as it is written; it is kept a
	// while so a watcher that reconnects still sees the node went).
	nodesMarkerTTL = time.Minute
	// fleetMaxPending bounds the fleet's asynchronous publishes in flight
	// (renewals, snapshots, deletes on Close): enough for every lease of a
	// node owning 10,000 lanes in one round.
	fleetMaxPending = 1 << 15
	// acquireParallel bounds the lease creations in flight at once.
	acquireParallel = 64
)

// fleetSide is this node's place in the fleet: its heartbeat, the live set,
// the leases it holds and the handler it tells.
type fleetSide struct {
	js  jetstream.JetStream // the fleet's own context: its async window is not the log's
	ttl time.Duration       // LeaseTTL as sent to the servers: rounded up to whole seconds
	m   *fleetMetrics

	ctx    context.Context // the fleet's life: cancelled by closeFleet
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine of the fleet; Add only under mu while !closed

	kick    chan struct{} // wakes the claim loop (capacity 1)
	acquire chan struct{} // semaphore of lease creations

	mu      sync.Mutex
	closed  bool
	owning  bool               // Own was called: from then on writes are fenced
	h       queue.OwnerHandler // set once Own has joined
	hbRev   uint64             // revision of our heartbeat
	hbAt    time.Time          // when the write of hbRev was sent (monotonic)
	hbVal   []byte
	live    map[string]bool // node ids with a heartbeat (watched)
	members map[string]bool // subscriptions (watched)
	// memberCalls wait for the one goroutine that makes them
	// (tellMembers); memberCalling says it runs.
	memberCalls   []memberCall
	memberCalling bool
	view          map[string]leaseView     // lease.<sub> as watched
	leases        map[string]*lease        // every lease this process has held or tried
	watched       map[string]chan struct{} // watches started, by name; closed once their initial values were applied
	watches       []jetstream.KeyWatcher
	changed       *nats.Subscription
	lastRec       uint64 // the connection's reconnect count, seen by the heartbeat

	lanes lanesView // snapshot.go
}

// leaseView is lease.<sub> as the watch last saw it: the holder's node id
// ("" when deleted or expired) at revision rev.
type leaseView struct {
	node string
	rev  uint64
	seen time.Time // when this node saw it (monotonic)
}

// setUpFleet makes the <S>_NODES and <S>_LANES buckets, or checks existing
// ones, and checks that <S>_STATE can hold leases. It starts nothing: a
// store that never calls Own (a tool, the contract suite) costs the fleet
// nothing more.
func (s *Store) setUpFleet() error {
	o := s.opts
	fl := &s.fl
	if o.LeaseTTL < time.Second {
		return fmt.Errorf("jetstream.lease_ttl %s: must be at least 1s (NATS expires keys in whole seconds)", o.LeaseTTL)
	}
	// The servers truncate a TTL to whole seconds; rounding up keeps the
	// server's expiry at or after LeaseTTL, which the margins rely on.
	fl.ttl = (o.LeaseTTL + time.Second - 1).Truncate(time.Second)
	js, err := jetstream.New(s.nc,
		jetstream.WithPublishAsyncMaxPending(fleetMaxPending),
		jetstream.WithPublishAsyncTimeout(o.RequestTimeout))
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	fl.js = js
	ctx, cancel := context.WithTimeout(context.Background(), 2*o.RequestTimeout)
	defer cancel()

	if s.state == nil {
		return fmt.Errorf("fleet: KV bucket %s_STATE is not set up", o.Stream)
	}
	st, err := s.state.Status(ctx)
	if err != nil {
		return fmt.Errorf("fleet: read KV bucket %s_STATE: %w", o.Stream, err)
	}
	if err := checkStateBucket(st, o.LeaseTTL); err != nil {
		return err
	}
	nodes, err := s.ensureKV(ctx, jetstream.KeyValueConfig{
		Bucket:         o.Stream + "_NODES",
		Description:    "sluice fleet heartbeats (node.<id>, TTL lease_ttl)",
		History:        1,
		Replicas:       o.Replicas,
		Storage:        jetstream.MemoryStorage,
		LimitMarkerTTL: nodesMarkerTTL,
	})
	if err != nil {
		return err
	}
	lanes, err := s.ensureKV(ctx, jetstream.KeyValueConfig{
		Bucket:         o.Stream + "_LANES",
		Description:    "sluice lane snapshots published by the owners",
		History:        1,
		Replicas:       o.Replicas,
		Storage:        jetstream.MemoryStorage,
		TTL:            lanesTTL,
		LimitMarkerTTL: time.Second,
	})
	if err != nil {
		return err
	}
	s.nodes, s.lanes = nodes, lanes

	fl.m = newFleetMetrics(o.Registerer, s)
	fl.ctx, fl.cancel = context.WithCancel(context.Background())
	fl.kick = make(chan struct{}, 1)
	fl.acquire = make(chan struct{}, acquireParallel)
	fl.live = map[string]bool{}
	fl.members = map[string]bool{}
	fl.view = map[string]leaseView{}
	fl.leases = map[string]*lease{}
	fl.watched = map[string]chan struct{}{}
	return nil
}

// checkStateBucket: leases live in <S>_STATE (so the state's writes can be
// fenced on their subject) and need per-key TTLs whose expiry leaves a
// marker the watches see. With more than one revision per key the servers
// raise every TTL to the marker TTL, which would stretch the leases.
func checkStateBucket(st jetstream.KeyValueStatus, leaseTTL time.Duration) error {
	if st.LimitMarkerTTL() <= 0 {
		return fmt.Errorf("fleet: KV bucket %s has no limit markers (LimitMarkerTTL): leases need per-key TTLs whose expiry is seen", st.Bucket())
	}
	if st.History() != 1 && st.LimitMarkerTTL() > leaseTTL {
		return fmt.Errorf("fleet: KV bucket %s keeps %d revisions with a marker TTL of %s: the servers would stretch each lease to it (lease_ttl %s)",
			st.Bucket(), st.History(), st.LimitMarkerTTL(), leaseTTL)
	}
	return nil
}

// ensureKV creates a bucket, or opens an existing one whose settings the
// fleet can work with; one it cannot is refused with the setting named,
// never changed behind the operator's back.
func (s *Store) ensureKV(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := s.fl.js.CreateKeyValue(ctx, cfg)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketExists) {
		return nil, fmt.Errorf("fleet: create KV bucket %s (jetstream.replicas %d): %w", cfg.Bucket, cfg.Replicas, err)
	}
	kv, err = s.fl.js.KeyValue(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("fleet: open KV bucket %s: %w", cfg.Bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: read KV bucket %s: %w", cfg.Bucket, err)
	}
	info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
	refuse := func(setting string, have, want any) error {
		return fmt.Errorf("fleet: KV bucket %s exists with %s %v, sluice needs %v: delete the bucket (it holds only transient fleet state) or fix the setting",
			cfg.Bucket, setting, have, want)
	}
	switch {
	case info.Config.Replicas != cfg.Replicas:
		return nil, refuse("replicas", info.Config.Replicas, fmt.Sprintf("%d (jetstream.replicas)", cfg.Replicas))
	case st.History() != int64(cfg.History):
		return nil, refuse("history", st.History(), cfg.History)
	case st.TTL() != cfg.TTL:
		return nil, refuse("ttl", st.TTL(), cfg.TTL)
	case st.LimitMarkerTTL() <= 0:
		return nil, refuse("limit_marker_ttl", st.LimitMarkerTTL(), "a marker TTL (expiries must be seen)")
	}
	return kv, nil
}

// spawn runs fn as one of the fleet's goroutines unless the fleet closed.
// mu must be held.
func (fl *fleetSide) spawn(fn func()) bool {
	if fl.closed {
		return false
	}
	fl.wg.Add(1)
	go func() {
		defer fl.wg.Done()
		fn()
	}()
	return true
}

// wake asks the claim loop to look again.
func (fl *fleetSide) wake() {
	select {
	case fl.kick <- struct{}{}:
	default:
	}
}

// Own joins the fleet: it writes this node's heartbeat (failing if another
// live node uses the same node id), starts watching the live set, the
// subscriptions and the leases, and from then on claims the lanes
// rendezvous hashing gives this node and tells h as ownership changes.
// From Own on, writes about a subscription are fenced by its lease. Own is
// called once; the handler is told until Close.
//
// When a heartbeat with this node id is live, Own waits up to LeaseTTL +
// RequestTimeout for it to expire (this node restarting after a crash)
// and fails naming node_id if it is renewed meanwhile (another live node).
// Its metrics are registered here, not at Open.
func (s *Store) Own(h queue.OwnerHandler) error {
	if h == nil {
		return errors.New("fleet: Own needs a handler")
	}
	if s.closed.Load() {
		return queue.ErrClosed
	}
	fl := &s.fl
	fl.mu.Lock()
	if fl.owning {
		fl.mu.Unlock()
		return errors.New("fleet: Own called twice")
	}
	fl.owning = true
	fl.mu.Unlock()

	if err := fl.m.register(); err != nil {
		return err
	}
	if err := s.join(); err != nil {
		fl.m.unregister()
		return err
	}
	fail := func(err error) error {
		s.leave()
		fl.m.unregister()
		return err
	}
	if err := s.startViews(); err != nil {
		return fail(err)
	}
	sub, err := s.nc.Subscribe(s.opts.Stream+".changed", s.onChanged)
	if err != nil {
		return fail(fmt.Errorf("fleet: subscribe to %s.changed: %w", s.opts.Stream, err))
	}

	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.closed {
		sub.Unsubscribe()
		return queue.ErrClosed
	}
	fl.changed = sub
	fl.h = h
	if mw, ok := h.(queue.MemberWatcher); ok {
		all := make([]string, 0, len(fl.members))
		for m := range fl.members {
			all = append(all, m)
		}
		fl.tellMembers(mw, all, true)
	}
	fl.lastRec = s.nc.Stats().Reconnects
	fl.spawn(s.heartbeatLoop)
	fl.spawn(s.renewLoop)
	fl.spawn(s.watchdogLoop)
	fl.spawn(s.claimLoop)
	s.log.Info("joined the fleet", "node", s.opts.NodeID, "lease_ttl", s.opts.LeaseTTL)
	return nil
}

// liveLocked is the live set this node decides with: the watched
// heartbeats, with this node in it only while its own heartbeat is
// current (so a node cut off neither claims nor gives away lanes). mu is
// held.
func (fl *fleetSide) liveLocked(me string, valid time.Duration) (nodes []string, selfOK bool) {
	selfOK = !fl.hbAt.IsZero() && time.Since(fl.hbAt) < valid
	nodes = make([]string, 0, len(fl.live)+1)
	for id := range fl.live {
		if id != me {
			nodes = append(nodes, id)
		}
	}
	if selfOK {
		nodes = append(nodes, me)
	}
	slices.Sort(nodes)
	return nodes, selfOK
}

// claimLoop decides, whenever the live set, the subscriptions or a lease
// changed (and every LeaseTTL/3 regardless), which leases to create and
// which to give up.
func (s *Store) claimLoop() {
	fl := &s.fl
	t := time.NewTicker(s.opts.LeaseTTL / 3)
	defer t.Stop()
	for {
		s.claim()
		select {
		case <-fl.ctx.Done():
			return
		case <-fl.kick:
		case <-t.C:
		}
	}
}

// claim is one round of claimLoop.
func (s *Store) claim() {
	fl := &s.fl
	me := s.opts.NodeID
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.closed || !fl.readyLocked("nodes") || !fl.readyLocked("members") || !fl.readyLocked("leases") {
		return
	}
	live, selfOK := fl.liveLocked(me, validFor(s.opts.LeaseTTL))
	if !selfOK {
		return
	}
	for sub := range fl.members {
		l := fl.leases[sub]
		if l != nil && (l.held || l.busy) {
			continue
		}
		if policy.Owner(sub, live) != me {
			continue
		}
		switch v := fl.view[sub]; {
		case v.node == "":
			s.acquireLocked(sub, 0)
		case l != nil && ours(v, me, l) && !l.renewing:
			// Our own write (this node dropped the lease when it could not
			// renew in time, and nobody wrote it since): take it up again
			// by CAS on that revision.
			s.acquireLocked(sub, v.rev)
		case time.Since(v.seen) > s.opts.LeaseTTL+validFor(s.opts.LeaseTTL):
			// Not renewed for longer than a lease lives: it expired, and
			// this node's watch missed the marker (it reconnected after the
			// marker itself expired). Try anyway: the create is create-only.
			v.seen = time.Now()
			fl.view[sub] = v
			s.acquireLocked(sub, 0)
		}
		// Held by another node: it moves the lease when it sees the live
		// set this node sees, or the lease expires when that node died.
	}
	for sub, l := range fl.leases {
		if !l.held || l.busy {
			continue
		}
		to := ""
		if fl.members[sub] {
			if to = policy.Owner(sub, live); to == me {
				continue
			}
		}
		s.moveLocked(l, to)
	}
}

// closeFleet stops the fleet's loops and watches, then deletes this node's
// leases and heartbeat so other nodes take its lanes at once (the engine
// has finished its in-flight work and written its cursors before
// Store.Close). It never calls the handler and is bounded by
// RequestTimeout once the fleet's goroutines are done (each of those is
// bounded itself).
func (s *Store) closeFleet() {
	fl := &s.fl
	if fl.cancel == nil {
		return // setUpFleet did not run
	}
	fl.mu.Lock()
	if fl.closed {
		fl.mu.Unlock()
		return
	}
	fl.closed = true
	joined := fl.hbRev != 0
	watches, changed := fl.watches, fl.changed
	fl.mu.Unlock()
	fl.cancel()
	if changed != nil {
		changed.Unsubscribe()
	}
	for _, w := range watches {
		w.Stop()
	}
	fl.wg.Wait()
	if joined {
		s.leave()
	}
	fl.m.unregister()
}

// fleetMetrics are the fleet's series, one struct per component as every
// sluice metric set is (no global registry), registered on
// Options.Registerer when it is set.
type fleetMetrics struct {
	reg        prometheus.Registerer
	nodesLive  prometheus.Gauge
	leasesHeld prometheus.Gauge
	renewals   *prometheus.CounterVec
	takeovers  prometheus.Counter
	hbAge      prometheus.GaugeFunc
}

func newFleetMetrics(reg prometheus.Registerer, s *Store) *fleetMetrics {
	m := &fleetMetrics{
		reg: reg,
		nodesLive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_fleet_nodes_live",
			Help: "Nodes of the fleet with a live heartbeat, as this node sees them.",
		}),
		leasesHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_fleet_leases_held",
			Help: "Lane leases this node holds: the lanes it delivers.",
		}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_fleet_lease_renewals_total",
			Help: "Lease renewals by result: ok, lost (the lease changed: taken or expired), error (no answer; the lease is dropped when none succeeds within lease_ttl/2).",
		}, []string{"result"}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_fleet_lease_takeovers_total",
			Help: "Leases this node acquired: lanes that came to it (first owner, a node joined or left, a lease expired).",
		}),
	}
	m.hbAge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_fleet_heartbeat_age_seconds",
		Help: "Seconds since this node's heartbeat was last written successfully (0 before it joined); past lease_ttl the fleet considers it gone.",
	}, func() float64 {
		s.fl.mu.Lock()
		at := s.fl.hbAt
		s.fl.mu.Unlock()
		if at.IsZero() {
			return 0
		}
		return time.Since(at).Seconds()
	})
	for _, r := range []string{"ok", "lost", "error"} {
		m.renewals.WithLabelValues(r)
	}
	return m
}

// register puts the series on the registerer (Own does: a store that
// never joins the fleet, a tool's, exports none).
func (m *fleetMetrics) register() error {
	if err := queue.RegisterAll(m.reg, m.all()); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	return nil
}

// unregister takes the series off the registerer, so a store opened again
// on it can register its own.
func (m *fleetMetrics) unregister() {
	if m != nil {
		queue.UnregisterAll(m.reg, m.all())
	}
}

func (m *fleetMetrics) all() []prometheus.Collector {
	return []prometheus.Collector{m.nodesLive, m.leasesHeld, m.renewals, m.takeovers, m.hbAge}
}
