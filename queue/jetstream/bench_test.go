package jetstream_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/jetstream"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// BenchmarkAppend compares Store.Append (64 producers, 512 B bodies, each
// waiting for its PubAck and OnCommit) with a bare JetStream async-publish
// loop to the same cluster (one publisher, a window of
// DefaultPublishWindow), the ceiling fleet ingest is measured
// against (target >= 0.5x). The machine is shared and noisy, so the two run in
// alternating rounds of b.N/rounds events and the benchmark reports both
// rates and their ratio. producers=256 shows how the ratio grows with
// the appends in flight: 64 producers each waiting for their own PubAck
// keep at most 64 publishes in flight, the bare loop thousands.
// nodes=3 spreads the producers over three stores of one stream, as a
// fleet's nodes ingest: each store's OnCommit sees the others' events
// too; an Append whose seq follows another node's event the follower has
// not brought waits for it only past the publish window (or for a
// duplicate's original): commit-waits/append and commit-wait-µs/append
// (sluice_jetstream_append_commit_wait_seconds) say how often and how
// long, per append.
//
//	go test ./queue/jetstream -run '^$' -bench BenchmarkAppend -benchtime 40000x -count 3
func BenchmarkAppend(b *testing.B) {
	for _, producers := range []int{64, 256} {
		b.Run(fmt.Sprintf("producers=%d", producers), func(b *testing.B) { benchmarkAppend(b, producers, 1) })
	}
	b.Run("nodes=3/producers=64", func(b *testing.B) { benchmarkAppend(b, 64, 3) })
}

func benchmarkAppend(b *testing.B, producers, nodes int) {
	const rounds = 4
	body := bytes.Repeat([]byte("x"), 512)

	name := logStream()
	js := rawJS(b, cluster.URLs())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, natsjs.StreamConfig{
		Name: name, Subjects: []string{name + ".ev.>"}, Storage: natsjs.FileStorage, Replicas: 3,
		Duplicates: queue.DefaultDedupWindow, Discard: natsjs.DiscardNew, AllowDirect: true,
	}); err != nil {
		b.Fatal(err)
	}
	pjs, err := natsjs.New(js.Conn(), natsjs.WithPublishAsyncMaxPending(jetstream.DefaultPublishWindow))
	if err != nil {
		b.Fatal(err)
	}
	bare := func(from, to int) {
		for i := from; i < to; i++ {
			id := "b-" + strconv.Itoa(i)
			m := &nats.Msg{Subject: name + ".ev." + id, Data: body, Header: nats.Header{natsjs.MsgIDHeader: {id}}}
			if _, err := pjs.PublishMsgAsync(m, natsjs.WithStallWait(time.Minute)); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-pjs.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("the PubAcks did not all arrive")
		}
	}

	o := logOptions(logStream())
	o.OnCommit = func([]*queue.Event) {}
	var stores []*jetstream.Store
	var regs []*prometheus.Registry
	for n := range nodes {
		o.NodeID = fmt.Sprint("node-", n)
		reg := prometheus.NewRegistry()
		o.Registerer = reg
		regs = append(regs, reg)
		stores = append(stores, openLog(b, o, nil))
	}
	store := func(from, to int) {
		var next atomic.Int64
		next.Store(int64(from))
		var wg sync.WaitGroup
		for p := range producers {
			s := stores[p%nodes]
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= int64(to) {
						return
					}
					ev := &queue.Event{ID: "s-" + strconv.FormatInt(i, 10), Type: "bench", ContentType: "application/json", AcceptedAt: time.Now(), Body: body}
					if _, _, err := s.Append(ev); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}

	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	var tBare, tStore time.Duration
	for r := range rounds {
		from, to := r*b.N/rounds, (r+1)*b.N/rounds
		start := time.Now()
		bare(from, to)
		tBare += time.Since(start)
		start = time.Now()
		store(from, to)
		tStore += time.Since(start)
	}
	b.ReportMetric(float64(b.N)/tBare.Seconds(), "bare-events/s")
	b.ReportMetric(float64(b.N)/tStore.Seconds(), "store-events/s")
	b.ReportMetric(tBare.Seconds()/tStore.Seconds(), "ratio")
	var waits, waited float64
	for _, reg := range regs {
		h := gather(b, reg, "sluice_jetstream_append_commit_wait_seconds")[0].GetHistogram()
		waits += float64(h.GetSampleCount())
		waited += h.GetSampleSum()
	}
	b.ReportMetric(waits/float64(b.N), "commit-waits/append")
	b.ReportMetric(waited*1e6/float64(b.N), "commit-wait-µs/append")
}

// BenchmarkEvents compares the two ways of reading a range of the stream
// that read.go chooses between: a direct get batch (Store.Events) and a
// consumer made per call, for pages of 64 (what a lane reads) and 500
// events, and for counting one type in 5,000 (Store.CountEvents, whose
// consumer is headers-only, against its direct batches).
func BenchmarkEvents(b *testing.B) {
	const n, page = 5000, 500
	o := logOptions(logStream())
	s := openLog(b, o, nil)
	body := bytes.Repeat([]byte("x"), 512)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				queuetest.MustAppend(b, s, &queue.Event{ID: fmt.Sprint("e-", i), Type: fmt.Sprint("t", i%10), AcceptedAt: time.Now(), Body: body})
			}
		})
	}
	wg.Wait()
	js := rawJS(b, cluster.URLs())
	isT3 := func(_, typ []byte) bool { return string(typ) == "t3" }
	// consume reads count events from seq from on with a consumer made
	// for the call (what an ordered consumer is: ephemeral, R1, in
	// memory, no acks), then deletes it.
	consume := func(b *testing.B, from uint64, count int, headersOnly bool, fn func(natsjs.Msg)) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := js.CreateConsumer(ctx, o.Stream, natsjs.ConsumerConfig{
			DeliverPolicy: natsjs.DeliverByStartSequencePolicy, OptStartSeq: from, HeadersOnly: headersOnly,
			AckPolicy: natsjs.AckNonePolicy, MemoryStorage: true, Replicas: 1, InactiveThreshold: 10 * time.Second,
		})
		if err != nil {
			b.Fatal(err)
		}
		got := 0
		for got < count {
			batch, err := c.Fetch(count-got, natsjs.FetchMaxWait(5*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			for m := range batch.Messages() {
				fn(m)
				got++
			}
			// Right after the create, the consumer may not answer yet:
			// part of what a consumer per call costs.
			if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrNoResponders) {
				b.Fatal(err)
			}
		}
		if err := js.DeleteConsumer(ctx, o.Stream, c.CachedInfo().Name); err != nil {
			b.Fatal(err)
		}
	}
	for _, page := range []int{64, 500} {
		b.Run(fmt.Sprintf("page%d/direct", page), func(b *testing.B) {
			for i := range b.N {
				from := uint64(i*page%(n-page)) + 1
				evs, _, err := s.Events(from, from+uint64(page)-1, page, nil)
				if err != nil || len(evs) != page {
					b.Fatalf("read %d events: %v", len(evs), err)
				}
			}
		})
		b.Run(fmt.Sprintf("page%d/consumer", page), func(b *testing.B) {
			for i := range b.N {
				from := uint64(i*page%(n-page)) + 1
				var evs []*queue.Event
				consume(b, from, page, false, func(m natsjs.Msg) {
					evs = append(evs, &queue.Event{ID: m.Headers().Get(natsjs.MsgIDHeader), Body: m.Data()})
				})
				if len(evs) != page {
					b.Fatalf("read %d events", len(evs))
				}
			}
		})
	}
	b.Run("count/direct", func(b *testing.B) {
		for range b.N {
			if c, err := jetstream.CountEventsDirect(s, 1, n, isT3, n); err != nil || c != n/10 {
				b.Fatalf("counted %d: %v", c, err)
			}
		}
	})
	b.Run("count/consumer", func(b *testing.B) {
		for range b.N {
			if c, err := s.CountEvents(1, n, isT3, n); err != nil || c != n/10 {
				b.Fatalf("counted %d: %v", c, err)
			}
		}
	})
}
