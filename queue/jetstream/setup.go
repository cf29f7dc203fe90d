package jetstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// maxSetUpWait caps the backoff between two set-up attempts: once the
// cluster is back, a node should not wait long to notice.
const maxSetUpWait = 2 * time.Second

// setUp makes the stream and the buckets, or checks existing ones: an
// existing stream or bucket whose settings sluice cannot work with is
// refused with the setting named, never changed behind the operator's back.
//
// Every step is create-or-check, so the whole is retried on a transient
// error: the nodes of a new fleet start together and create the same R3
// stream and buckets at once, and on a busy cluster one of those
// creations can outlast its request timeout (in the acceptance run, two of
// three nodes gave up after one).
func (s *Store) setUp() error {
	return s.retry("JetStream set-up", s.setUpOnce, transientSetUp)
}

func (s *Store) setUpOnce() error {
	if err := s.setUpStream(); err != nil {
		return err
	}
	if err := s.setUpBuckets(); err != nil {
		return err
	}
	// The id index is made here, with everything else, not at the first
	// compaction: the nodes of a fleet compact within milliseconds of
	// each other, and their concurrent creations of the same R3 bucket
	// timed out there (2-15 times a bench run), outside any retry.
	if _, err := s.openIDIndex(true); err != nil {
		return err
	}
	return s.setUpFleet()
}

// retry calls step until it succeeds or fails with an error retryable
// says waiting cannot cure, backing off up to maxSetUpWait.
//
// While the cluster is away (unreachable, restarting, without a quorum or
// a leader) it waits as long as that takes: a sidecar whose NATS servers
// all went down while it started must come up when they return, not exit
// (every node of a fleet exited in a fault-injection run, each on a
// publish refused while reconnecting). Only servers that answer but have
// no JetStream are given up on after Options.ConnectTimeout, since that is
// a misconfiguration once they have finished starting. Close and
// Options.Cancel end the wait with queue.ErrClosed.
func (s *Store) retry(what string, step func() error, retryable func(error) bool) error {
	start := time.Now()
	wait := 50 * time.Millisecond
	for {
		err := step()
		if err == nil || !retryable(err) {
			return err
		}
		if notEnabled(err) && time.Since(start) > s.opts.ConnectTimeout {
			return fmt.Errorf("%s: not set up within %s: %w", what, s.opts.ConnectTimeout, err)
		}
		s.log.Warn("JetStream set-up not done yet; retrying", "what", what, "in", wait, "err", err)
		if !s.setUpPause(wait) {
			return fmt.Errorf("%s: %w (last: %w)", what, queue.ErrClosed, err)
		}
		wait = min(wait*2, maxSetUpWait)
	}
}

// setUpPause waits for d, or reports false when Open is to give up.
func (s *Store) setUpPause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.quit:
	case <-s.opts.Cancel:
	}
	return false
}

// transientSetUp: errors that another attempt may not meet (a request that
// timed out, a stream or meta leader being elected, the servers away).
func transientSetUp(err error) bool {
	return brokerAway(err) || notYetKnown(err) || errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}

// notYetKnown: a stream or bucket that was just made (by this node, or by
// another that answered "exists") looked up on a server still catching up
// with the cluster's meta state, as servers restarting together are.
// Another attempt creates it if it really is missing.
func notYetKnown(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound)
}

// brokerAway: the request did not reach a server that could answer it,
// or no answer came back. Publishes fail with nats.ErrReconnectBufExceeded
// while reconnecting, since connect sets no reconnect buffer.
func brokerAway(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrNoServers)
}

// notEnabled: servers that answer without JetStream; right after they
// start that passes, later it is their configuration.
func notEnabled(err error) bool {
	if errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
		return true
	}
	ae := apiError(err)
	return ae != nil && (ae.ErrorCode == errCodeNotEnabled || ae.ErrorCode == errCodeNotEnabledAcct)
}
