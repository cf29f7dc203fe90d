package badger_test

import (
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// BenchmarkJoinAll50k is the join at the first start with 50,000 file
// subscriptions (lanes-50k): every membership and cursor written in one
// batch and one sync, on a fresh log each time. The snapshots are the
// size of the proxy's for the bench's subscriptions.
func BenchmarkJoinAll50k(b *testing.B) {
	const n = 50_000
	reqs := make([]queue.JoinRequest, n)
	for i := range reqs {
		snap := fmt.Sprintf(`{"url":"http://127.0.0.1:40000/s%d","types":["idle.type"],"timeout":5000000000,"concurrency":64,"max_attempts":8,"max_age":86400000000000,"base":1000000000,"cap":3600000000000,"breaker":{"Window":30000000000,"MinRequests":20,"FailureRatio":0.5,"ConsecutiveTimeouts":5,"CoolDown":5000000000,"MaxCoolDown":300000000000},"secrets":["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]}`, i)
		reqs[i] = queue.JoinRequest{Subscription: fmt.Sprintf("s%d", i), Snapshot: []byte(snap)}
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		q := queuetest.MustOpen(b, "", badger.Options{Sync: true})
		b.StartTimer()
		if _, err := q.JoinAll(reqs); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		q.Close()
		b.StartTimer()
	}
}
