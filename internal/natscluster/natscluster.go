// Package natscluster runs a NATS JetStream cluster inside the current
// process, on loopback, for tests and for `sluice demo --fleet`. It is never
// used in production: there the cluster is the NATS Helm chart with
// JetStream enabled and 3 replicas.
//
// What it owns: N nats-server instances (github.com/nats-io/nats-server/v2),
// each with JetStream enabled, its store under Options.Dir/node-<i>, a client
// port and a route port on 127.0.0.1, and routes to every other node. It
// owns no streams or buckets; callers create those with nats.go.
//
// What it guarantees:
//   - Start returns only once every node accepts connections, the JetStream
//     meta group has a leader that every node follows, and that leader can
//     place replicas on every node (an R<N> stream can be created), or an error
//     naming what did not come up within Options.StartTimeout. It never
//     sleeps blindly: it polls the servers' own readiness with a deadline.
//   - A node keeps its ports and its store directory for the cluster's life,
//     so Kill followed by Restart brings back the same member with its data.
//   - Close stops every node and waits for its goroutines to end; after it
//     returns the package has left nothing running.
//   - Logging is off unless Options.Logger is set.
//
// What it does not promise: that a stream's or KV bucket's own Raft group
// has a leader when Start or Restart returns (those are elected per stream,
// after the meta group), so a test publishes with Nats-Msg-Id and retries
// until its deadline, which is what the fleet backend does anyway; and a
// real crash: Kill is a hard in-process Shutdown (see Kill).
//
// A Cluster's methods are safe for concurrent use.
package natscluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultNodes is the cluster size when Options.Nodes is 0: three, the
// smallest cluster that keeps a quorum (and R3 streams) through the loss of
// one node, the replication fleet mode's streams are made with.
const DefaultNodes = 3

// DefaultStartTimeout bounds Start and Restart when Options.StartTimeout is
// 0. A fresh JetStream meta group elects its leader within a few seconds on
// loopback (the Raft election timeout is randomised in seconds), but nodes
// restarted on their stores while the whole test suite loads both cores
// took over 20 s to elect one (TestFleetNATSDownAtStart). It is a bound on
// an awaited condition, so a larger one costs nothing when all is well.
const DefaultStartTimeout = 60 * time.Second

// DefaultName is the cluster name when Options.Name is empty.
const DefaultName = "sluice"

// startAttempts bounds how often Start picks new ports after one of them was
// taken between being chosen and being bound.
const startAttempts = 5

// pollInterval is how often readiness is re-checked while waiting.
const pollInterval = 20 * time.Millisecond

// Options configure Start.
type Options struct {
	// Nodes is the number of servers: DefaultNodes when 0, 1 allowed. A
	// single node runs JetStream standalone (no routes, R1 only).
	Nodes int

	// Dir holds one store directory per node (Dir/node-0, Dir/node-1, …);
	// required. Tests pass t.TempDir(). The cluster never deletes it.
	Dir string

	// Name is the cluster name (DefaultName when empty).
	Name string

	// StartTimeout bounds Start, and each Restart (DefaultStartTimeout when 0).
	StartTimeout time.Duration

	// MaxPayloadBytes is the largest message a client may publish, headers
	// included (nats-server's max_payload). 0 keeps the server's default of
	// 1 MiB (server.MAX_PAYLOAD_SIZE), which is less than sluice's default
	// 1 MiB body plus its headers; the fleet backend must raise it.
	MaxPayloadBytes int32

	// Logger receives the servers' log lines, tagged with the node's name.
	// Nil means no logging.
	Logger *slog.Logger
}

// Cluster is a running in-process JetStream cluster. Create it with Start
// and release it with Close.
type Cluster struct {
	opts Options

	mu     sync.Mutex
	nodes  []*node
	closed bool
}

// node is one member. Its name, ports and directory never change; srv is
// nil while the node is killed.
type node struct {
	name       string
	dir        string
	clientPort int
	routePort  int
	srv        *server.Server
	log        *logAdapter
}

// Start runs opts.Nodes servers and waits until the cluster is usable (see
// the package doc). The caller must Close the returned Cluster. When a
// chosen port turns out to be taken, Start shuts the attempt down and tries
// again on fresh ports, within the same StartTimeout.
func Start(opts Options) (*Cluster, error) {
	if opts.Nodes == 0 {
		opts.Nodes = DefaultNodes
	}
	if opts.Nodes < 0 {
		return nil, fmt.Errorf("natscluster: nodes %d: must be at least 1", opts.Nodes)
	}
	if opts.Dir == "" {
		return nil, errors.New("natscluster: dir is required")
	}
	if opts.MaxPayloadBytes < 0 {
		return nil, fmt.Errorf("natscluster: max payload %d bytes: must not be negative", opts.MaxPayloadBytes)
	}
	if opts.Name == "" {
		opts.Name = DefaultName
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	deadline := time.Now().Add(opts.StartTimeout)

	c := &Cluster{opts: opts}
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		err = c.startAll(deadline)
		if err == nil {
			return c, nil
		}
		c.shutdownAll()
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			break
		}
	}
	return nil, err
}

// startAll picks ports, starts every node and waits for the cluster.
func (c *Cluster) startAll(deadline time.Time) error {
	n := c.opts.Nodes
	ports, err := pickPorts(2 * n)
	if err != nil {
		return err
	}
	nodes := make([]*node, n)
	for i := range nodes {
		nodes[i] = &node{
			name:       "node-" + strconv.Itoa(i),
			dir:        filepath.Join(c.opts.Dir, "node-"+strconv.Itoa(i)),
			clientPort: ports[2*i],
			routePort:  ports[2*i+1],
		}
		if n == 1 {
			nodes[i].routePort = 0
		}
	}
	c.mu.Lock()
	c.nodes = nodes
	c.mu.Unlock()

	for _, nd := range nodes {
		if err := c.startNode(nd); err != nil {
			return err
		}
	}
	return c.wait(nodes, deadline)
}

// startNode creates and starts nd's server; it does not wait for it.
func (c *Cluster) startNode(nd *node) error {
	if err := os.MkdirAll(nd.dir, 0o755); err != nil {
		return fmt.Errorf("natscluster: create store dir of %s: %w", nd.name, err)
	}
	sopts := &server.Options{
		ServerName:             nd.name,
		Host:                   "127.0.0.1",
		Port:                   nd.clientPort,
		JetStream:              true,
		StoreDir:               nd.dir,
		NoSigs:                 true, // the process's signals belong to sluice
		NoLog:                  true,
		DisableJetStreamBanner: true,
		MaxPayload:             c.opts.MaxPayloadBytes,
	}
	if c.opts.Nodes > 1 {
		sopts.Cluster = server.ClusterOpts{
			Name: c.opts.Name,
			Host: "127.0.0.1",
			Port: nd.routePort,
		}
		for _, other := range c.nodes {
			if other != nd {
				sopts.Routes = append(sopts.Routes, &url.URL{
					Scheme: "nats",
					Host:   net.JoinHostPort("127.0.0.1", strconv.Itoa(other.routePort)),
				})
			}
		}
	}
	srv, err := server.NewServer(sopts)
	if err != nil {
		return fmt.Errorf("natscluster: configure %s: %w", nd.name, err)
	}
	// A logger is always installed, even with logging off: the default one
	// exits the process on a fatal error (a port already bound), and this
	// one records that error so wait can report it, or Start retry.
	nd.log = newLogAdapter(c.opts.Logger, nd.name)
	srv.SetLogger(nd.log, nd.log.debug, false)
	srv.Start()

	c.mu.Lock()
	nd.srv = srv
	c.mu.Unlock()
	return nil
}

// wait polls nodes until each accepts client and route connections, its
// JetStream meta state is current under a leader it knows, and the leader
// can place replicas on it, or until deadline. It returns an error naming the first node, and the first part of
// it, that did not come up.
func (c *Cluster) wait(nodes []*node, deadline time.Time) error {
	clustered := c.opts.Nodes > 1
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		var pending string
		for _, nd := range nodes {
			c.mu.Lock()
			srv := nd.srv
			c.mu.Unlock()
			if srv == nil {
				return fmt.Errorf("natscluster: %s was killed while starting", nd.name)
			}
			if err := nd.log.fatal(); err != nil {
				return fmt.Errorf("natscluster: start %s: %w", nd.name, err)
			}
			switch {
			case srv.Addr() == nil:
				pending = nd.name + " client listener on port " + strconv.Itoa(nd.clientPort)
			case clustered && srv.ClusterAddr() == nil:
				pending = nd.name + " route listener on port " + strconv.Itoa(nd.routePort)
			case !srv.JetStreamEnabled():
				pending = nd.name + " JetStream"
			case clustered && metaLeader(srv) == "":
				pending = nd.name + " JetStream meta leader"
			case !srv.JetStreamIsCurrent():
				pending = nd.name + " JetStream meta state (not caught up with the leader)"
			}
			if pending != "" {
				break
			}
		}
		if pending == "" && clustered {
			pending = c.unplaceable(nodes)
		}
		if pending == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("natscluster: %s not up within %s", pending, c.opts.StartTimeout)
		}
		<-ticker.C
	}
}

// unplaceable returns what keeps the meta leader from placing replicas on
// nodes, or "" when nothing does. The leader places a stream only on peers
// it has had a statistics update (STATSZ) from; before that, creating an R3
// stream fails with "no suitable peers for placement, peer offline", even
// though every node is current. This is the check nats-server's own cluster
// tests wait on (JetStreamClusterPeers on the leader).
func (c *Cluster) unplaceable(nodes []*node) string {
	c.mu.Lock()
	var leader *server.Server
	for _, nd := range c.nodes {
		if nd.srv != nil && nd.srv.JetStreamIsLeader() {
			leader = nd.srv
		}
	}
	c.mu.Unlock()
	if leader == nil {
		return "JetStream meta leader"
	}
	peers := leader.JetStreamClusterPeers()
	for _, nd := range nodes {
		found := false
		for _, p := range peers {
			if p == nd.name {
				found = true
				break
			}
		}
		if !found {
			return nd.name + " as a placement peer of meta leader " + leader.Name()
		}
	}
	return ""
}

// metaLeader returns the name of the JetStream meta leader srv knows, or "".
// It is checked besides JetStreamIsCurrent because a Raft follower that
// knows no leader yet, with nothing left to apply from its recovered log
// (a restarted node), counts as current.
func metaLeader(srv *server.Server) string {
	jsi, err := srv.Jsz(&server.JSzOptions{})
	if err != nil || jsi.Meta == nil {
		return ""
	}
	return jsi.Meta.Leader
}

// URLs returns every node's client URL (nats://127.0.0.1:port), in node
// order, including nodes that are currently killed: a client given all of
// them reconnects to whichever is up.
func (c *Cluster) URLs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	urls := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		urls[i] = nd.url()
	}
	return urls
}

// URL returns node i's client URL. It panics if i is out of range.
func (c *Cluster) URL(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].url()
}

func (nd *node) url() string {
	return "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(nd.clientPort))
}

// Server returns node i's running server, or nil while it is killed, for
// tests that inspect a node's own state (Jsz, JetStreamIsStreamLeader …).
// The value is replaced by Restart. It panics if i is out of range.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].srv
}

// Kill stops node i at once and waits until it has stopped: its client and
// route connections close with no lame-duck period, the way the other nodes
// see a pod that was SIGKILLed. In-process it cannot be quite that abrupt:
// nats-server's Shutdown still hands off the Raft leaderships the node held
// and flushes its store, so data written before Kill is on disk (a real
// crash may lose what was not yet synced; the quorum still has it). Killing
// a killed node does nothing. It panics if i is out of range.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	srv := c.nodes[i].srv
	c.nodes[i].srv = nil
	c.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Restart starts killed node i again with the same name, ports and store
// directory, and waits, within Options.StartTimeout, until it accepts
// connections and, if a quorum of nodes is running, until its JetStream
// meta state is current again under a leader that can place replicas on it.
// With no quorum (say, the first of three killed nodes to come back) it
// waits only for the listeners, since nothing can become current yet. It
// does not wait for each stream's catch-up: a stream's own Raft group may
// still be electing a leader when it returns. Restart of a running node is
// an error; if its port is taken, it retries on the same port until the
// timeout and then returns an error that wraps syscall.EADDRINUSE. It
// panics if i is out of range.
func (c *Cluster) Restart(i int) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errors.New("natscluster: restart: cluster closed")
	}
	nd := c.nodes[i]
	if nd.srv != nil {
		c.mu.Unlock()
		return fmt.Errorf("natscluster: restart %s: it is running", nd.name)
	}
	running := 1
	for _, other := range c.nodes {
		if other.srv != nil {
			running++
		}
	}
	c.mu.Unlock()

	deadline := time.Now().Add(c.opts.StartTimeout)
	quorum := running > len(c.nodes)/2
	var inUse error // the last attempt's bind error, if any
	for {
		if err := c.startNode(nd); err != nil {
			return err
		}
		err := c.waitRestart(nd, deadline, quorum)
		if err == nil {
			return nil
		}
		c.Kill(i)
		if !errors.Is(err, syscall.EADDRINUSE) {
			if inUse != nil {
				// The deadline came before this attempt's bind error did.
				return fmt.Errorf("%w; earlier attempt: %w", err, inUse)
			}
			return err
		}
		inUse = err
		if time.Now().After(deadline) {
			return err
		}
		// The port was taken; wait a poll interval before binding again.
		t := time.NewTimer(pollInterval)
		<-t.C
	}
}

// waitRestart waits for a restarted node: listeners always, JetStream meta
// state only when a quorum runs.
func (c *Cluster) waitRestart(nd *node, deadline time.Time, quorum bool) error {
	if quorum {
		return c.wait([]*node{nd}, deadline)
	}
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		c.mu.Lock()
		srv := nd.srv
		c.mu.Unlock()
		if srv == nil {
			return fmt.Errorf("natscluster: %s was killed while starting", nd.name)
		}
		if err := nd.log.fatal(); err != nil {
			return fmt.Errorf("natscluster: restart %s: %w", nd.name, err)
		}
		if srv.Addr() != nil && (c.opts.Nodes == 1 || srv.ClusterAddr() != nil) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("natscluster: %s listeners not up within %s", nd.name, c.opts.StartTimeout)
		}
		<-ticker.C
	}
}

// Close stops every running node, in parallel, and waits until all of them
// have shut down. It is safe to call more than once; later calls do nothing.
// It always returns nil today; the error is there so Close fits io.Closer.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.shutdownAll()
	return nil
}

// shutdownAll kills every running node in parallel and waits.
func (c *Cluster) shutdownAll() {
	c.mu.Lock()
	n := len(c.nodes)
	c.mu.Unlock()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { c.Kill(i) })
	}
	wg.Wait()
}

// pickPorts is freePorts; a test replaces it to hand Start a taken port.
var pickPorts = freePorts

// freePorts returns n distinct TCP ports that were free on 127.0.0.1 a
// moment ago. It holds every listener until all are chosen, so the n ports
// differ; another process may still take one before a server binds it,
// which Start and Restart handle by retrying.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("natscluster: pick a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// logAdapter is a server.Logger. It forwards to an slog.Logger when one is
// set and always records the first fatal error, which nats-server reports
// only through its logger (and which its own logger answers with os.Exit).
type logAdapter struct {
	l     *slog.Logger // nil: discard
	debug bool

	mu       sync.Mutex
	fatalErr error
}

var _ server.Logger = (*logAdapter)(nil)

func newLogAdapter(l *slog.Logger, name string) *logAdapter {
	a := &logAdapter{}
	if l != nil {
		a.l = l.With("component", "nats-server", "node", name)
		a.debug = l.Enabled(context.Background(), slog.LevelDebug)
	}
	return a
}

// fatal returns the first fatal error the server reported, or nil.
func (a *logAdapter) fatal() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fatalErr
}

func (a *logAdapter) emit(level slog.Level, format string, v []any) {
	if a.l != nil {
		a.l.Log(context.Background(), level, strings.TrimSpace(fmt.Sprintf(format, v...)))
	}
}

func (a *logAdapter) Noticef(format string, v ...any) { a.emit(slog.LevelInfo, format, v) }
func (a *logAdapter) Warnf(format string, v ...any)   { a.emit(slog.LevelWarn, format, v) }
func (a *logAdapter) Errorf(format string, v ...any)  { a.emit(slog.LevelError, format, v) }
func (a *logAdapter) Debugf(format string, v ...any)  { a.emit(slog.LevelDebug, format, v) }
func (a *logAdapter) Tracef(format string, v ...any)  {}

// Fatalf records the error (wrapping the first error argument, so callers
// can test it with errors.Is, e.g. for syscall.EADDRINUSE) and logs it. It
// does not exit: the cluster reports the failure from Start or Restart.
func (a *logAdapter) Fatalf(format string, v ...any) {
	a.emit(slog.LevelError, format, v)
	msg := fmt.Sprintf(format, v...)
	var cause error
	for _, arg := range v {
		if err, ok := arg.(error); ok {
			cause = err
			break
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fatalErr != nil {
		return
	}
	if cause != nil {
		a.fatalErr = &fatalError{msg: msg, err: cause}
	} else {
		a.fatalErr = errors.New(msg)
	}
}

// fatalError is a fatal server error with its cause kept for errors.Is.
type fatalError struct {
	msg string
	err error
}

func (e *fatalError) Error() string { return e.msg }
func (e *fatalError) Unwrap() error { return e.err }
