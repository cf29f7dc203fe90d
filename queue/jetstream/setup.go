package jetstream

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// setUp makes the stream and the buckets, or checks existing ones: an
// existing stream or bucket whose settings sluice cannot work with is
// refused with the setting named, never changed behind the operator's back.
//
// Every step is create-or-check, so the whole is retried on a transient
// error until Options.ConnectTimeout: the nodes of a new fleet start
// together and create the same R3 stream and buckets at once, and on a
// busy cluster one of those creations can outlast its request timeout (in
// the acceptance run, two of three nodes gave up after one).
func (s *Store) setUp() error {
	deadline := time.Now().Add(s.opts.ConnectTimeout)
	wait := 100 * time.Millisecond
	for {
		err := s.setUpOnce()
		if err == nil || !transientSetUp(err) || time.Now().Add(wait).After(deadline) {
			return err
		}
		s.log.Warn("JetStream set-up not done yet; retrying", "in", wait, "err", err)
		select {
		case <-time.After(wait):
		case <-s.quit:
			return queue.ErrClosed
		}
		wait = min(wait*2, 2*time.Second)
	}
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

// transientSetUp: errors that another attempt may not meet (a request that
// timed out, a stream or meta leader being elected).
func transientSetUp(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrDisconnected)
}
