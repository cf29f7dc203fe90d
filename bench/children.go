package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/valyala/fasthttp"
)

// childMain runs a hidden subcommand: the harness re-executes its own
// binary for the processes it measures apart from itself.
//
//	_noop -listen ADDR       a fasthttp server answering 202 (or 200) at once
//	_appender -dir D ...     a bare Badger group-commit appender; prints JSON
//	_nats -dir D             an embedded 3-node JetStream cluster (fleet scenarios)
//	_jspub -urls U -like S   a bare JetStream async publisher; prints JSON
func childMain(args []string, stdout, stderr io.Writer) int {
	var err error
	switch args[0] {
	case "_noop":
		err = noopMain(args[1:], stdout, stderr)
	case "_appender":
		initClockTicks()
		err = appenderMain(args[1:], stdout, stderr)
	case "_nats":
		err = natsMain(args[1:], stdout, stderr)
	case "_jspub":
		initClockTicks()
		err = jspubMain(args[1:], stdout, stderr)
	default:
		err = fmt.Errorf("unknown child command %q", args[0])
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench", args[0]+":", err)
		return 1
	}
	return 0
}

// noopMain is the ceiling of ingest: the same fasthttp server settings a
// sidecar would want, doing nothing. POST /v1/events/... answers 202 with a
// small JSON body like the sidecar's; any other path answers 200 (the
// client→server loop). It prints "listening ADDR" once bound and exits on
// SIGTERM or after -max-life.
func noopMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("_noop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address")
	life := fs.Duration("max-life", 10*time.Minute, "exit after this long whatever happens")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	prefix := []byte("/v1/events/")
	reply := []byte(`{"id":"noop","seq":1}` + "\n")
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			p := ctx.Path()
			if len(p) >= len(prefix) && string(p[:len(prefix)]) == string(prefix) {
				ctx.SetStatusCode(fasthttp.StatusAccepted)
				ctx.SetContentType("application/json")
				ctx.SetBody(reply)
				return
			}
			ctx.SetStatusCode(fasthttp.StatusOK)
		},
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		ReadTimeout:           30 * time.Second,
		IdleTimeout:           2 * time.Minute,
	}
	fmt.Fprintf(stdout, "listening %s\n", ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	t := time.NewTimer(*life)
	defer t.Stop()
	select {
	case <-sigs:
	case <-t.C:
	case err := <-done:
		return err
	}
	return srv.Shutdown()
}

// appenderResult is what _appender prints.
type appenderResult struct {
	PerSec         float64    `json:"appends_per_s"`
	CPUPerAppendUs float64    `json:"cpu_us_per_append"`
	MeanBatch      float64    `json:"mean_batch"`
	BatchesPerSec  float64    `json:"batches_per_s"`
	Seconds        float64    `json:"seconds"`
	Latency        latSummary `json:"latency"`
}

// appenderMain is the durable-append ceiling: Badger v4 with SyncWrites off
// and one committer goroutine that takes every append waiting, writes them
// in one transaction and makes one db.Sync() for all of them; 64 writer
// goroutines append 512-byte values and wait for their own commit. With
// -sync=false the Sync is skipped (the ceiling of durability: async).
//
// Memtables (16 MiB) and value-log files (64 MiB) are small on purpose, as
// in the sidecar: Badger msyncs whole mappings, so the 1 GiB default value
// log makes every sync slow even when idle.
func appenderMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("_appender", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "data dir (created)")
	doSync := fs.Bool("sync", true, "db.Sync() after each batch")
	writers := fs.Int("writers", 64, "appending goroutines")
	size := fs.Int("size", 512, "value bytes")
	warmup := fs.Duration("warmup", time.Second, "unmeasured start")
	dur := fs.Duration("duration", 5*time.Second, "measured window")
	rate := fs.Float64("rate", 0, "appends/s in an open loop, each due at its time and timed from it (0: closed loop)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("-dir is required")
	}
	if *rate < 0 {
		return fmt.Errorf("-rate %v: want appends/s, or 0 for a closed loop", *rate)
	}
	opts := badger.DefaultOptions(*dir).
		WithSyncWrites(false).
		WithLogger(nil).
		WithNumVersionsToKeep(1).
		WithDetectConflicts(false).
		WithMemTableSize(16 << 20).
		WithValueLogFileSize(64 << 20).
		WithValueThreshold(64 << 10).
		WithMetricsEnabled(false)
	db, err := badger.Open(opts)
	if err != nil {
		return err
	}
	defer db.Close()

	type op struct {
		key, val []byte
		done     chan error
	}
	ops := make(chan *op, *writers)
	var batches, batched atomic.Int64
	stop := make(chan struct{})
	var cwg sync.WaitGroup
	cwg.Go(func() {
		batch := make([]*op, 0, *writers)
		for {
			select {
			case <-stop:
				return
			case o := <-ops:
				batch = append(batch[:0], o)
			}
		gather:
			for len(batch) < cap(batch) {
				select {
				case o := <-ops:
					batch = append(batch, o)
				default:
					break gather
				}
			}
			err := commit(db, func(yield func(k, v []byte) bool) {
				for _, o := range batch {
					if !yield(o.key, o.val) {
						return
					}
				}
			})
			if err == nil && *doSync {
				err = db.Sync()
			}
			batches.Add(1)
			batched.Add(int64(len(batch)))
			for _, o := range batch {
				o.done <- err
			}
		}
	})

	start := time.Now()
	winStart, winEnd := start.Add(*warmup), start.Add(*warmup+*dur)
	var (
		seq, winOK atomic.Int64
		mu         sync.Mutex
		lat        []int64
		firstErr   error
		cpu0, cpu1 time.Duration
		b0, b1     int64
		n0, n1     int64
		tickWG     sync.WaitGroup
		t0, t1     time.Time
		pid        = os.Getpid()
		maxAppends = int64(maxEventsPerSecond * (*warmup + *dur).Seconds())
	)
	tickWG.Go(func() {
		sleepUntil(context.Background(), winStart)
		t0, cpu0 = time.Now(), mustCPU(pid)
		b0, n0 = batches.Load(), batched.Load()
		sleepUntil(context.Background(), winEnd)
		t1, cpu1 = time.Now(), mustCPU(pid)
		b1, n1 = batches.Load(), batched.Load()
	})
	var wg sync.WaitGroup
	for range *writers {
		wg.Go(func() {
			o := &op{key: make([]byte, 8), val: make([]byte, *size), done: make(chan error, 1)}
			var mine []int64
			for {
				now := time.Now()
				i := seq.Add(1)
				if *rate > 0 {
					// Open loop: the append is due at its slot, and its
					// latency counts from then, as the sidecar's open
					// loops count publish→receipt from each event's due
					// time (a late writer counts against the disk).
					due := start.Add(time.Duration(float64(i-1) / *rate * float64(time.Second)))
					if !due.Before(winEnd) {
						break
					}
					sleepUntil(context.Background(), due)
					now = due
				}
				if !now.Before(winEnd) || i > maxAppends {
					break
				}
				binary.BigEndian.PutUint64(o.key, uint64(i))
				ops <- o
				if err := <-o.done; err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				done := time.Now()
				if !done.Before(winStart) && done.Before(winEnd) {
					winOK.Add(1)
					mine = append(mine, int64(done.Sub(now)))
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(stop)
	cwg.Wait()
	tickWG.Wait()
	if firstErr != nil {
		return firstErr
	}
	secs := t1.Sub(t0).Seconds()
	r := appenderResult{Seconds: secs, Latency: summarize(lat)}
	if n := winOK.Load(); n > 0 {
		r.PerSec = float64(n) / secs
		r.CPUPerAppendUs = float64(cpu1-cpu0) / 1e3 / float64(n)
	}
	if b1 > b0 {
		r.MeanBatch = float64(n1-n0) / float64(b1-b0)
		r.BatchesPerSec = float64(b1-b0) / secs
	}
	return json.NewEncoder(stdout).Encode(r)
}

// commit writes every (key, value) in as few transactions as Badger allows
// (one, unless it is too big).
func commit(db *badger.DB, entries func(yield func(k, v []byte) bool)) error {
	txn := db.NewTransaction(true)
	defer func() { txn.Discard() }()
	var err error
	entries(func(k, v []byte) bool {
		err = txn.Set(k, v)
		if errors.Is(err, badger.ErrTxnTooBig) {
			if err = txn.Commit(); err != nil {
				return false
			}
			txn = db.NewTransaction(true)
			err = txn.Set(k, v)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	return txn.Commit()
}

func mustCPU(pid int) time.Duration {
	d, _ := procCPU(pid)
	return d
}
