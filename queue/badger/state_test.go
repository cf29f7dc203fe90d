package badger_test

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// deadLettered appends one event, joins sub and dead-letters the event for
// it, as a lane does after a permanent failure.
func deadLettered(t *testing.T, q *badger.Log, sub string) (uint64, *queue.DeadLetter) {
	t.Helper()
	if _, err := q.Join(sub, nil); err != nil {
		t.Fatal(err)
	}
	ev := queuetest.Event("ev-"+sub, "t", `{"x":1}`)
	seq, _ := queuetest.MustAppend(t, q, ev)
	dl := &queue.DeadLetter{Subscription: sub, Seq: seq, EventID: ev.ID, Type: ev.Type, ContentType: ev.ContentType,
		AcceptedAt: ev.AcceptedAt, Reason: "rejected", Attempts: 1, LastStatus: 400, DeadAt: time.Now(), Body: ev.Body}
	if err := q.Record(queue.Outcome{Kind: queue.DeadLettered, Subscription: sub, Seq: seq, DeadLetter: dl}); err != nil {
		t.Fatal(err)
	}
	return seq, dl
}

// TestRecordEachKind: every outcome writes what it says in one call, and
// Pause goes with it.
func TestRecordEachKind(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	if _, err := q.Join("s", nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		queuetest.MustAppend(t, q, queuetest.Event(id, "t", id))
	}
	t0 := time.Unix(1_700_000_000, 0)
	// A first attempt that is acked writes nothing at all.
	if err := q.Record(queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: 1}); err != nil {
		t.Fatal(err)
	}
	r1 := queue.Retry{Subscription: "s", Seq: 2, Due: t0, Attempt: 1, FirstAttempt: t0, LastStatus: 503, LastError: "http_5xx"}
	if err := q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 2, Retry: &r1}); err != nil {
		t.Fatal(err)
	}
	got, err := q.RetryOf("s", 2)
	if err != nil || got == nil || got.Attempt != 1 || got.LastStatus != 503 || got.LastError != "http_5xx" || !got.Due.Equal(t0) || !got.FirstAttempt.Equal(t0) {
		t.Fatalf("RetryOf after RetryScheduled = %+v, %v", got, err)
	}
	// The next attempt replaces the record it came from.
	r2 := r1
	r2.Due, r2.Attempt = t0.Add(time.Minute), 2
	if err := q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 2, From: &r1, Retry: &r2}); err != nil {
		t.Fatal(err)
	}
	if rs, _ := q.Retries("s", 10); len(rs) != 1 || rs[0].Attempt != 2 || !rs[0].Due.Equal(r2.Due) {
		t.Fatalf("after the second retry: %+v, want only attempt 2", rs)
	}
	// An ACK of the retry deletes it.
	if err := q.Record(queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: 2, From: &r2, At: t0}); err != nil {
		t.Fatal(err)
	}
	if rs, _ := q.Retries("s", 10); len(rs) != 0 {
		t.Fatalf("retry kept after its ACK: %+v", rs)
	}
	if r, err := q.RetryOf("s", 2); r != nil || err != nil {
		t.Fatalf("RetryOf after the ACK = %+v, %v", r, err)
	}
	// A retry dead-lettered with a pause: both, in one call.
	r3 := queue.Retry{Subscription: "s", Seq: 3, Due: t0, Attempt: 1, FirstAttempt: t0}
	if err := q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 3, Retry: &r3}); err != nil {
		t.Fatal(err)
	}
	dl := &queue.DeadLetter{Subscription: "s", Seq: 3, EventID: "c", Type: "t", Reason: "gone", Attempts: 2, LastStatus: 410, DeadAt: t0, Body: []byte("c")}
	if err := q.Record(queue.Outcome{Kind: queue.DeadLettered, Subscription: "s", Seq: 3, From: &r3, DeadLetter: dl, Pause: "endpoint answered 410 Gone"}); err != nil {
		t.Fatal(err)
	}
	if rs, _ := q.Retries("s", 10); len(rs) != 0 {
		t.Fatalf("retry kept after dead-lettering: %+v", rs)
	}
	d, err := q.DeadLetter("s", 3)
	if err != nil || d.Reason != "gone" || d.LastStatus != 410 || !bytes.Equal(d.Body, []byte("c")) {
		t.Fatalf("dead letter = %+v, %v", d, err)
	}
	ms, _ := q.Memberships()
	if len(ms) != 1 || ms[0].Paused != "endpoint answered 410 Gone" {
		t.Fatalf("membership after a Record with Pause: %+v", ms)
	}
	// Pause of a subscription the store does not know fails the whole
	// outcome: the retry is not written either.
	r4 := queue.Retry{Subscription: "nobody", Seq: 1, Due: t0}
	err = q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "nobody", Seq: 1, Retry: &r4, Pause: "x"})
	if !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Record with Pause of an unknown subscription: %v, want ErrNotFound", err)
	}
	if rs, _ := q.Retries("nobody", 10); len(rs) != 0 {
		t.Fatalf("a failed Record wrote its retry: %+v", rs)
	}
	if _, err := q.DeadLetter("s", 1); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("dead letter of an acked seq: %v, want ErrNotFound", err)
	}
}

// TestReplayOnce: many concurrent replays of one letter schedule exactly
// one retry (the check and the write were separate transactions, and
// racing replays each wrote one); a replayed letter answers ErrReplayed,
// force replays it again once the retry is resolved, and never while it
// is scheduled.
func TestReplayOnce(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	seq, _ := deadLettered(t, q, "s")
	due := time.Unix(1_700_000_000, 0)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		replayed int
		other    []error
	)
	for range 32 {
		wg.Go(func() {
			_, err := q.Replay("s", seq, due, false)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				replayed++
			case !errors.Is(err, queue.ErrReplayed):
				other = append(other, err)
			}
		})
	}
	wg.Wait()
	if replayed != 1 || len(other) != 0 {
		t.Fatalf("32 concurrent replays: %d succeeded, other errors %v; want 1 and none", replayed, other)
	}
	if rs, _ := q.Retries("s", 10); len(rs) != 1 || !rs[0].Replay || rs[0].Attempt != 0 || !rs[0].Due.Equal(due) {
		t.Fatalf("retries after concurrent replays: %+v, want one replay retry", rs)
	}
	d, err := q.Replay("s", seq, due, false)
	if !errors.Is(err, queue.ErrReplayed) || d == nil || d.Replays != 1 || !d.ReplayedAt.Equal(due) {
		t.Fatalf("replay without force: %+v, %v; want ErrReplayed with the letter", d, err)
	}
	// Forced replays that race while the replay is scheduled all refuse.
	for range 8 {
		wg.Go(func() {
			if _, err := q.Replay("s", seq, due, true); !errors.Is(err, queue.ErrRetryScheduled) {
				t.Errorf("forced replay with a retry scheduled: %v, want ErrRetryScheduled", err)
			}
		})
	}
	wg.Wait()
	r, err := q.RetryOf("s", seq)
	if err != nil || r == nil {
		t.Fatalf("RetryOf the replay = %v, %v", r, err)
	}
	at := due.Add(time.Second)
	if err := q.Record(queue.Outcome{Kind: queue.Acked, Subscription: "s", Seq: seq, From: r, At: at}); err != nil {
		t.Fatal(err)
	}
	if d, _ := q.DeadLetter("s", seq); !d.DeliveredAt.Equal(at) || d.Replays != 1 {
		t.Fatalf("letter after the replay's ACK: %+v", d)
	}
	// Forced, concurrently: one more retry, one more replay counted.
	replayed = 0
	for range 16 {
		wg.Go(func() {
			if _, err := q.Replay("s", seq, due, true); err == nil {
				mu.Lock()
				replayed++
				mu.Unlock()
			} else if !errors.Is(err, queue.ErrRetryScheduled) {
				t.Errorf("forced replay: %v", err)
			}
		})
	}
	wg.Wait()
	if rs, _ := q.Retries("s", 10); replayed != 1 || len(rs) != 1 {
		t.Fatalf("16 forced replays: %d succeeded, %d retries; want 1 and 1", replayed, len(rs))
	}
	if d, _ := q.DeadLetter("s", seq); d.Replays != 2 {
		t.Fatalf("replays = %d after a forced replay, want 2", d.Replays)
	}
	if _, err := q.Replay("s", seq+1, due, true); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("replay of no letter: %v, want ErrNotFound", err)
	}
}

// TestReplayHistoryKeptWhenDeadLetteredAgain: a replay that fails for good
// writes its dead letter over the replayed one; the replay count and time
// stay, and with them the once-only guard.
func TestReplayHistoryKeptWhenDeadLetteredAgain(t *testing.T) {
	q := queuetest.MustOpen(t, "", badger.Options{})
	seq, dl := deadLettered(t, q, "s")
	due := time.Unix(1_700_000_000, 0)
	if _, err := q.Replay("s", seq, due, false); err != nil {
		t.Fatal(err)
	}
	r, _ := q.RetryOf("s", seq)
	again := *dl
	again.Reason, again.Attempts, again.LastStatus, again.DeadAt = "rejected", 1, 422, due.Add(time.Minute)
	if err := q.Record(queue.Outcome{Kind: queue.DeadLettered, Subscription: "s", Seq: seq, From: r, DeadLetter: &again}); err != nil {
		t.Fatal(err)
	}
	d, err := q.DeadLetter("s", seq)
	if err != nil || d.Replays != 1 || !d.ReplayedAt.Equal(due) || d.LastStatus != 422 || !bytes.Equal(d.Body, dl.Body) {
		t.Fatalf("letter dead-lettered again: %+v, %v; want replays 1 at %v, status 422, the body", d, err, due)
	}
	if _, err := q.Replay("s", seq, due, false); !errors.Is(err, queue.ErrReplayed) {
		t.Fatalf("replay without force of a letter replayed once: %v, want ErrReplayed", err)
	}
	if again.Replays != 0 {
		t.Fatal("Record changed the caller's letter")
	}
}
