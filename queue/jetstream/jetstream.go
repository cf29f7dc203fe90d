// Package jetstream is sluice's shared log for fleet mode: a
// queue.Store and queue.Fleet over NATS JetStream, so that many sidecars
// share one replicated log, one delivery state and one registry of
// subscriptions, and each lane is delivered by one node at a time. It
// writes no replication or consensus of its own: streams, KV buckets, TTLs
// and compare-and-set do that.
//
// What lives where (Options.Stream is the name, SLUICE_EVENTS by default):
//
//	stream <S>                 the events: subject <S>.ev.<base64url(event id)>, one message
//	                           per event, Nats-Msg-Id = event id (the duplicate window is
//	                           the dedup window); the stream sequence is the event's seq.
//	                           Headers carry the type, content type and accepted-at.
//	KV <S>_STATE               the delivery state (keys below), AllowAtomicPublish, TTLs:
//	  member.<sub>             membership JSON (from, until, paused, snapshot), create-only
//	  cursor.<sub>             the durable cursor
//	  retry.<sub>.<seq>        a scheduled retry (JSON)
//	  dead.<sub>.<seq>         a dead letter with its body copy
//	  lease.<sub>              the node delivering sub's lane; TTL Options.LeaseTTL, renewed
//	  record.<key>             the admin API's records (queue.Records: tenant token hashes), unfenced
//	KV <S>_NODES               heartbeats: node.<id>, TTL, the live set
//	KV <S>_LANES               lane snapshots the owners publish (admin API, dashboard)
//	KV <S>_IDS                 id → seq, type of compacted events, for Lookup within the
//	                           dedup window (compact.go; made on first use, TTL the window)
//
// Fencing: every cursor, retry and dead-letter write about sub carries
// Nats-Expected-Last-Subject-Sequence of lease.<sub> at the revision this
// node holds, and writes of more than one key go as one atomic batch, so a
// node whose lease was taken writes nothing (queue.ErrFenced).
//
// Files: jetstream.go opens and closes; stream.go sets up the event stream;
// append.go, follower.go, read.go and rangeread.go are the log; state.go
// (with stateformat.go, stateread.go, statewrite.go), member.go, retry.go
// and deadletter.go the delivery state; records.go the admin API's
// records; own.go, heartbeat.go, watch.go and lease.go the fleet
// (heartbeats, rendezvous, leases); floor.go and compact.go the
// retention; snapshot.go the lanes' statistics every node's admin API reads.
package jetstream

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/queue"
)

// Defaults of Options.
const (
	DefaultStream         = "SLUICE_EVENTS"
	DefaultReplicas       = 3
	DefaultLeaseTTL       = 10 * time.Second
	DefaultConnectTimeout = 30 * time.Second
	// DefaultPublishWindow bounds the appends waiting for their PubAck at
	// once: the fleet's group commit (many requests share round trips).
	DefaultPublishWindow = 4096
	// DefaultRequestTimeout bounds one JetStream request (a publish's
	// PubAck, a KV write): long enough for a Raft leader election.
	DefaultRequestTimeout = 5 * time.Second
)

// TLS is the client side of TLS to the NATS servers.
type TLS struct {
	CAFile, CertFile, KeyFile string
}

// Options configure Open.
type Options struct {
	// URLs of the NATS servers (any of the cluster's); required.
	URLs []string
	// Stream names the event stream, and prefixes the KV buckets.
	Stream string
	// Replicas of the stream and buckets: 3 in production, 1 allowed for
	// development. A cluster with fewer servers refuses it at Open.
	Replicas int
	// LeaseTTL is how long a crashed node's lanes wait before another node
	// takes them over.
	LeaseTTL time.Duration
	// NodeID names this node in the fleet; required (cmd defaults it to
	// the host name).
	NodeID string
	// CredentialsFile is a NATS .creds file; TLS the client certificates.
	CredentialsFile string
	TLS             TLS
	// DedupWindow is the stream's duplicate window (queue.DefaultDedupWindow if 0).
	DedupWindow time.Duration
	// MaxBytes is the stream's max_bytes (0: unlimited); past it appends
	// fail with queue.ErrDiskFull.
	MaxBytes int64
	// ConnectTimeout bounds how long Open waits for servers that answer
	// without JetStream. Servers it cannot reach, or that cannot answer
	// yet (no quorum, no leader), it waits for as long as that takes,
	// retrying with backoff, until Cancel is closed.
	ConnectTimeout time.Duration
	// Cancel, when closed, makes an Open still waiting for the cluster
	// give up with an error wrapping queue.ErrClosed (a sidecar told to
	// stop while its NATS servers are away). Nil: Open waits on.
	Cancel <-chan struct{}
	// RequestTimeout bounds each request to JetStream.
	RequestTimeout time.Duration
	// PublishWindow bounds the appends in flight at once, and the
	// appended events held until OnCommit can have them (those after
	// another node's event the follower has not delivered yet): past it,
	// an append waits for OnCommit before it returns.
	PublishWindow int
	// CompactInterval is the least time between two compactions by this
	// node (DefaultCompactInterval if 0; negative: none, every Compact
	// call compacts): purges and deletes are cluster-wide operations and
	// every node's dispatcher calls Compact every second.
	CompactInterval time.Duration
	// OnCommit is called with each group of new events, in seq order,
	// whichever node appended them, each once; never concurrently. An
	// event this node appended is handed over before its Append returns
	// unless another node's event before it has not reached this node's
	// follower yet: then both are, in order, when it has. The follower
	// starts inside Open, so other nodes' events may be handed over
	// before Open returns (proxy.Open is ready for that:
	// TestFleetCommitsWhileTheStoreOpens).
	OnCommit func([]*queue.Event)
	// Logger gets connection events and errors; slog.Default() if nil.
	Logger *slog.Logger
	// Registerer receives the backend's metrics; none if nil.
	Registerer prometheus.Registerer

	// afterConnect, when set (by this package's tests), runs once Open
	// has connected, before the set-up: where an outage hurt most.
	afterConnect func()
}

func (o *Options) withDefaults() {
	if o.Stream == "" {
		o.Stream = DefaultStream
	}
	if o.Replicas == 0 {
		o.Replicas = DefaultReplicas
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.DedupWindow <= 0 {
		o.DedupWindow = queue.DefaultDedupWindow
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.PublishWindow <= 0 {
		o.PublishWindow = DefaultPublishWindow
	}
	if o.CompactInterval == 0 {
		o.CompactInterval = DefaultCompactInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Store is a queue.Store and queue.Fleet on JetStream. Its parts are kept
// apart by concern: logSide (append.go, follower.go, read.go,
// rangeread.go), stateSide (state.go and its state*.go, member.go,
// floor.go, retry.go, deadletter.go) and fleetSide (own.go, heartbeat.go,
// watch.go, lease.go).
type Store struct {
	opts Options
	log  *slog.Logger
	nc   *nats.Conn
	js   jetstream.JetStream

	stream jetstream.Stream
	state  jetstream.KeyValue // <S>_STATE
	nodes  jetstream.KeyValue // <S>_NODES
	lanes  jetstream.KeyValue // <S>_LANES

	evSubj    string // "<S>.ev.": an event's subject is this plus its base64url id
	statePfx  string // "$KV.<S>_STATE.": raw (fenced, batched) writes go here
	connected atomic.Bool

	lg logSide
	st stateSide
	fl fleetSide

	closeOnce sync.Once
	closed    atomic.Bool
	quit      chan struct{} // closed by Close
	wg        sync.WaitGroup
}

var (
	_ queue.Store = (*Store)(nil)
	_ queue.Fleet = (*Store)(nil)
)

// NodeID names this node.
func (s *Store) NodeID() string { return s.opts.NodeID }

// Open connects to the cluster, creates the stream and buckets or checks
// that existing ones are compatible, and starts following the stream. It
// retries with backoff while the cluster is away (Options.ConnectTimeout,
// Options.Cancel), and fails at once on what retrying cannot cure: refused
// credentials, an incompatible stream or bucket, too few servers.
func Open(opts Options) (*Store, error) {
	opts.withDefaults()
	if err := opts.check(); err != nil {
		return nil, err
	}
	s := &Store{opts: opts, log: opts.Logger, quit: make(chan struct{})}
	s.evSubj = opts.Stream + ".ev."
	s.statePfx = "$KV." + opts.Stream + "_STATE."
	if err := s.connect(); err != nil {
		return nil, err
	}
	if s.opts.afterConnect != nil {
		s.opts.afterConnect()
	}
	if err := s.setUp(); err != nil {
		s.nc.Close()
		return nil, err
	}
	if err := s.openLog(); err != nil {
		s.nc.Close()
		return nil, err
	}
	if err := s.openState(); err != nil {
		s.closeLog()
		s.nc.Close()
		return nil, err
	}
	return s, nil
}

// check names the first bad option.
func (o *Options) check() error {
	if len(o.URLs) == 0 {
		return errors.New("jetstream.urls: at least one NATS server URL is required")
	}
	if o.NodeID == "" {
		return errors.New("node_id: required in fleet mode")
	}
	if strings.ContainsAny(o.NodeID, ".*> \t") {
		return fmt.Errorf("node_id %q: must not contain '.', '*', '>' or spaces", o.NodeID)
	}
	if o.Replicas < 1 || o.Replicas > 5 {
		return fmt.Errorf("jetstream.replicas %d: must be 1 to 5", o.Replicas)
	}
	return nil
}

// connect dials the cluster, retrying with backoff until it answers or
// Options.Cancel: a sidecar may start before its NATS servers do, and in
// a fresh install they may take minutes.
func (s *Store) connect() error {
	o := s.opts
	nopts := []nats.Option{
		nats.Name("sluice " + o.NodeID),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1), // a publish while disconnected fails at once: the producer gets 503, not a silent buffer
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			s.connected.Store(false)
			s.failAll(nats.ErrDisconnected) // their PubAcks may never come
			if err == nil {
				// nats.go passes nil when the connection is closed on
				// purpose (Close at shutdown): nothing for an operator.
				s.log.Debug("disconnected from NATS: closed")
				return
			}
			s.log.Warn("disconnected from NATS", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			s.connected.Store(true)
			s.log.Info("reconnected to NATS", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ClosedHandler(func(*nats.Conn) { s.connected.Store(false) }),
	}
	if o.CredentialsFile != "" {
		if _, err := os.Stat(o.CredentialsFile); err != nil {
			return fmt.Errorf("jetstream.credentials_file: %w", err)
		}
		nopts = append(nopts, nats.UserCredentials(o.CredentialsFile))
	}
	if o.TLS != (TLS{}) {
		cfg, err := o.TLS.config()
		if err != nil {
			return err
		}
		nopts = append(nopts, nats.Secure(cfg))
	}
	wait := 100 * time.Millisecond
	for {
		nc, err := nats.Connect(strings.Join(o.URLs, ","), nopts...)
		if err == nil {
			s.nc = nc
			s.connected.Store(true)
			js, err := jetstream.New(nc)
			if err != nil {
				nc.Close()
				return err
			}
			s.js = js
			return nil
		}
		if isAuthError(err) {
			return fmt.Errorf("jetstream.urls: cannot reach NATS at %s: %w", strings.Join(o.URLs, ", "), err)
		}
		s.log.Warn("NATS not reachable yet; retrying", "urls", strings.Join(o.URLs, ","), "in", wait, "err", err)
		if !s.setUpPause(wait) {
			return fmt.Errorf("jetstream.urls: cannot reach NATS at %s: %w (last: %w)", strings.Join(o.URLs, ", "), queue.ErrClosed, err)
		}
		wait = min(wait*2, 5*time.Second)
	}
}

// isAuthError: retrying cannot help a refused credential.
func isAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) ||
		strings.Contains(err.Error(), "nkey") || strings.Contains(err.Error(), "credentials")
}

func (t TLS) config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("jetstream.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("jetstream.tls.ca_file %s: no PEM certificate in it", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("jetstream.tls: cert_file and key_file go together")
	}
	if t.CertFile != "" {
		c, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("jetstream.tls.cert_file/key_file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg, nil
}

// Ready is nil while connected.
func (s *Store) Ready() error {
	if s.closed.Load() {
		return queue.ErrClosed
	}
	if !s.connected.Load() {
		return fmt.Errorf("%w: not connected to NATS", queue.ErrUnavailable)
	}
	// Connected is not enough: a link that holds traffic without closing
	// (a stalled route, a partition) keeps the TCP connection up. A node
	// whose heartbeat has not been written for validFor has stopped
	// dispatching; it should not take traffic either.
	s.fl.mu.Lock()
	at := s.fl.hbAt
	s.fl.mu.Unlock()
	if !at.IsZero() {
		if age := time.Since(at); age > validFor(s.opts.LeaseTTL) {
			return fmt.Errorf("%w: no heartbeat written to NATS for %s", queue.ErrUnavailable, age.Round(time.Millisecond))
		}
	}
	return nil
}

// Close stops following the stream, gives up this node's leases and
// heartbeat (so other nodes take its lanes at once) and disconnects.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.closeFleet()
		close(s.quit)
		s.closeLog()
		s.closeState()
		s.wg.Wait()
		if s.nc != nil {
			s.nc.Close()
		}
	})
	return nil
}
