package jetstream

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// Hooks for the fleet tests of package jetstream_test (fleet_test.go).

// OpenFleet opens a Store with its connection and its fleet side only, on
// the stream name o.Stream, making <S>_STATE with the settings the fleet
// needs of it (one revision per key, per-key TTLs with expiry markers).
// The log and the delivery state are not opened: ownership, leases and
// fencing need nothing of them. The store is closed at the end of the
// test (CloseFleet), unless the test closed it.
func OpenFleet(tb testing.TB, o Options) (*Store, error) {
	tb.Helper()
	o.withDefaults()
	if err := o.check(); err != nil {
		return nil, err
	}
	s := &Store{opts: o, log: o.Logger, quit: make(chan struct{})}
	s.evSubj = o.Stream + ".ev."
	s.statePfx = "$KV." + o.Stream + "_STATE."
	if err := s.connect(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*o.RequestTimeout)
	defer cancel()
	kv, err := s.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         o.Stream + "_STATE",
		History:        1,
		Replicas:       o.Replicas,
		LimitMarkerTTL: time.Second,
	})
	if err != nil {
		s.nc.Close()
		return nil, err
	}
	s.state = kv
	if err := s.setUpFleet(); err != nil {
		s.nc.Close()
		return nil, err
	}
	tb.Cleanup(func() { CloseFleet(s) })
	return s, nil
}

// CloseFleet is what Close does to a store OpenFleet opened.
func CloseFleet(s *Store) {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.closeFleet()
		close(s.quit)
		s.nc.Close()
	})
}

// Crash stops the store's fleet as a crash would: the connection closes
// first (nothing more reaches the servers: no renewal, no release), then
// the loops stop; the handler hears nothing.
func Crash(s *Store) {
	s.nc.Close()
	fl := &s.fl
	fl.mu.Lock()
	fl.closed = true
	fl.mu.Unlock()
	fl.cancel()
	fl.wg.Wait()
}

// Fence is s.fence.
func Fence(s *Store, sub string) (subject string, rev uint64, fenced bool, done func(), err error) {
	return s.fence(sub)
}

// StallLeases makes every lease s holds look as if its last successful
// write were older than a lease is trusted (a process paused, renewals
// unanswered) and has the watchdog look at once: it drops them, although
// they are still s's on the servers.
func StallLeases(s *Store) {
	fl := &s.fl
	fl.mu.Lock()
	defer fl.mu.Unlock()
	for _, l := range fl.leases {
		if l.held {
			l.okAt = l.okAt.Add(-s.opts.LeaseTTL)
		}
	}
	s.dropStaleLocked(validFor(s.opts.LeaseTTL))
}

// NotifyChanged is s.notifyChanged.
func NotifyChanged(s *Store, sub string) { s.notifyChanged(sub) }

func TestCheckStateBucket(t *testing.T) {
	for _, tc := range []struct {
		name    string
		history int64
		marker  time.Duration
		want    string // "" for no error
	}{
		{"one revision with markers", 1, time.Minute, ""},
		{"history with short markers", 5, time.Second, ""},
		{"no markers", 1, 0, "no limit markers"},
		{"history with long markers", 5, time.Minute, "stretch each lease"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := fakeStatus{bucket: "X_STATE", history: tc.history, marker: tc.marker}
			err := checkStateBucket(st, 2*time.Second)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("checkStateBucket: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "X_STATE") {
				t.Fatalf("checkStateBucket = %v, want an error naming X_STATE and %q", err, tc.want)
			}
		})
	}
}

// fakeStatus is a bucket's status with the fields checkStateBucket reads.
type fakeStatus struct {
	jetstream.KeyValueStatus
	bucket  string
	history int64
	marker  time.Duration
}

func (f fakeStatus) Bucket() string                { return f.bucket }
func (f fakeStatus) History() int64                { return f.history }
func (f fakeStatus) LimitMarkerTTL() time.Duration { return f.marker }

func TestIsWrongLastSeq(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, true},
		{&jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant}, true},
		{&jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamNotFound}, false},
		{jetstream.ErrKeyExists, true},
		{errors.New("nats: timeout"), false},
		{queue.ErrClosed, false},
	} {
		if got := isWrongLastSeq(tc.err); got != tc.want {
			t.Errorf("isWrongLastSeq(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// EndWatches ends every watch of s's fleet as the library ends one it
// gives up on while the fleet runs: its updates channel closes.
func EndWatches(s *Store) {
	fl := &s.fl
	fl.mu.Lock()
	watches := slices.Clone(fl.watches)
	fl.mu.Unlock()
	for _, w := range watches {
		w.Stop()
	}
}
