package queuetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// Run is the contract of queue.Store: each subtest opens stores of b at
// fresh places and checks one promise of the interface against them. The
// subtests run in parallel; the whole suite takes seconds, most of it the
// dedup window's expiry.
func Run(t *testing.T, b Backend) {
	for _, c := range []struct {
		name string
		test func(*testing.T, *env)
	}{
		{"AppendReadReopen", testAppendReadReopen},
		{"EventsFilterAndBounds", testEventsFilterAndBounds},
		{"OrderingKeyAndTraceContext", testEventContext},
		{"LookupKeepsTenant", testLookupTenant},
		{"TrimDeadLetters", testTrimDeadLetters},
		{"DedupWithinWindow", testDedupWithinWindow},
		{"DedupAfterWindow", testDedupAfterWindow},
		{"OnCommitBeforeAppendReturns", testOnCommit},
		{"ConcurrentAppends", testConcurrentAppends},
		{"AppendBatch", testAppendBatch},
		{"AppendBatchConcurrent", testAppendBatchConcurrent},
		{"MembershipCutoff", testMembershipCutoff},
		{"JoinCreateOnly", testJoinCreate},
		{"Pause", testPause},
		{"CursorsSurviveReopen", testCursors},
		{"RetrySchedule", testRetrySchedule},
		{"RetrySummaries", testRetrySummaries},
		{"RecordEachKind", testRecordEachKind},
		{"DeadLetters", testDeadLetters},
		{"ReplayOnce", testReplayOnce},
		{"ReplayHistoryKept", testReplayHistoryKept},
		{"CompactionKeepsWhatRetriesNeed", testCompaction},
		{"Recovery", testRecovery},
		{"AppendAfterClose", testAppendAfterClose},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.test(t, &env{b: b, place: b.NewPlace(t)})
		})
	}
	// The optional interfaces a store may add; each subtest skips when
	// it does not.
	t.Run("Records", func(t *testing.T) {
		t.Parallel()
		runRecords(t, b)
	})
}

// env is one subtest's place and the backend to open it with.
type env struct {
	b     Backend
	place string
}

func (e *env) open(t *testing.T, opts Options) queue.Store {
	t.Helper()
	return e.b.Open(t, e.place, opts)
}

// reopen closes s and opens its place again.
func (e *env) reopen(t *testing.T, s queue.Store, opts Options) queue.Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	return e.open(t, opts)
}

func appendN(t *testing.T, s queue.Store, prefix string, n int) {
	t.Helper()
	for i := range n {
		MustAppend(t, s, Event(fmt.Sprintf("%s-%d", prefix, i), "t", fmt.Sprint(i)))
	}
}

func join(t *testing.T, s queue.Store, sub string, snapshot []byte) queue.Membership {
	t.Helper()
	ms, err := s.JoinAll([]queue.JoinRequest{{Subscription: sub, Snapshot: snapshot}})
	if err != nil || len(ms) != 1 {
		t.Fatalf("join %s: %v %v", sub, ms, err)
	}
	return ms[0]
}

func membership(t *testing.T, s queue.Store, sub string) (queue.Membership, bool) {
	t.Helper()
	ms, err := s.Memberships()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Subscription == sub {
			return m, true
		}
	}
	return queue.Membership{}, false
}

func record(t *testing.T, s queue.Store, o queue.Outcome) {
	t.Helper()
	if err := s.Record(o); err != nil {
		t.Fatalf("record %v of %s/%d: %v", o.Kind, o.Subscription, o.Seq, err)
	}
}

func scheduled(t *testing.T, s queue.Store, r queue.Retry) {
	t.Helper()
	record(t, s, queue.Outcome{Kind: queue.RetryScheduled, Subscription: r.Subscription, Seq: r.Seq, Retry: &r})
}

func retries(t *testing.T, s queue.Store, sub string) []queue.Retry {
	t.Helper()
	rs, err := s.Retries(sub, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// deadLetter appends an event and dead-letters it for sub (a member), as a
// lane does after a permanent failure of a first attempt.
func deadLetter(t *testing.T, s queue.Store, sub string) *queue.DeadLetter {
	t.Helper()
	ev := Event("ev-"+sub, "card.shipped", `{"card":1}`)
	seq, _ := MustAppend(t, s, ev)
	d := &queue.DeadLetter{Subscription: sub, Seq: seq, EventID: ev.ID, Type: ev.Type, ContentType: ev.ContentType,
		AcceptedAt: ev.AcceptedAt, Reason: "rejected", Attempts: 1, LastStatus: 400, DeadAt: time.Now(), Body: ev.Body}
	record(t, s, queue.Outcome{Kind: queue.DeadLettered, Subscription: sub, Seq: seq, DeadLetter: d})
	return d
}

var t0 = time.Unix(1_700_000_000, 0)
