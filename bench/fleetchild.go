package main

// The children of the fleet scenarios: the embedded JetStream cluster
// (_nats) and the bare JetStream publisher baseline (_jspub). Both run in
// processes of their own, so that /proc/<pid>/stat attributes the CPU of
// the NATS servers, of the sidecars and of the publisher each to its owner.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/internal/natscluster"
)

// natsMain runs an embedded JetStream cluster (internal/natscluster: N
// nats-server instances on loopback, one process) until SIGTERM or
// -max-life. Once the cluster is usable it prints one line,
//
//	nats URL,URL,URL pprof HOST:PORT
//
// the client URLs and a loopback listener serving net/http/pprof, so the
// harness can profile the servers' CPU the way it profiles a sidecar.
func natsMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("_nats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "store directory (one sub-directory per node); required")
	nodes := fs.Int("nodes", 3, "servers")
	life := fs.Duration("max-life", 30*time.Minute, "exit after this long whatever happens")
	payload := fs.Int("max-payload", 8<<20, "max_payload bytes (sluice needs more than the 1 MiB default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("-dir is required")
	}
	cl, err := natscluster.Start(natscluster.Options{Nodes: *nodes, Dir: *dir, MaxPayloadBytes: int32(*payload),
		StartTimeout: time.Minute})
	if err != nil {
		return err
	}
	defer cl.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Fprintf(stdout, "nats %s pprof %s\n", strings.Join(cl.URLs(), ","), ln.Addr())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	t := time.NewTimer(*life)
	defer t.Stop()
	select {
	case <-sigs:
	case <-t.C:
	}
	return nil
}

// jspubResult is what _jspub prints.
type jspubResult struct {
	Mode            string     `json:"mode"` // "publishers" or "window"
	Publishers      int        `json:"publishers,omitempty"`
	Window          int        `json:"window"`
	PerSec          float64    `json:"publishes_per_s"`
	CPUPerPubUs     float64    `json:"cpu_us_per_publish"`
	NATSCPUPerPubUs float64    `json:"nats_cpu_us_per_publish"`
	NATSCores       float64    `json:"nats_cpu_cores"`
	Seconds         float64    `json:"seconds"`
	Errors          int64      `json:"errors"`
	FirstErr        string     `json:"first_error,omitempty"`
	Latency         latSummary `json:"latency"`
	Stream          string     `json:"stream"`
	Headers         []string   `json:"headers"`
	Follow          bool       `json:"follow,omitempty"`
}

// jspubMain is the ceiling of fleet ingest: what a Go client gets from the
// same JetStream cluster with nothing in front of it. It makes stream
// -stream with the settings of the stream -like (sluice's, copied at run
// time: replicas, storage, duplicate window, limits) and subjects
// "<stream>.ev.>", then publishes 512-byte messages to
// "<stream>.ev.<base64url(id)>" with Nats-Msg-Id = id, the subject layout
// and dedup header of sluice's log, plus the headers in -headers.
//
// With -window 0, -publishers goroutines each publish asynchronously and
// wait for their own PubAck before the next: the closed loop of the
// producers in front of the sidecar. With -window N, one goroutine keeps up
// to N publishes in flight (PublishAsync with a max pending of N). CPU is
// this process's; -nats-pid names the cluster's process, whose CPU over the
// window is reported beside it. The stream is deleted at the end.
func jspubMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("_jspub", flag.ContinueOnError)
	fs.SetOutput(stderr)
	urls := fs.String("urls", "", "NATS URLs, comma-separated")
	like := fs.String("like", "", "copy the settings of this stream")
	stream := fs.String("stream", "BENCH_BASE", "stream to create (deleted first if it exists, and at the end)")
	publishers := fs.Int("publishers", 64, "closed-loop publishers (with -window 0)")
	window := fs.Int("window", 0, "one publisher with this many PublishAsync in flight (0: -publishers closed loops)")
	size := fs.Int("size", 512, "message bytes")
	hdrs := fs.String("headers", "", "extra headers, k=v;k=v (as the sidecar sets them)")
	keyID := fs.String("key-prefix", "jspub", "prefix of the message ids, unique per run")
	warmup := fs.Duration("warmup", time.Second, "unmeasured start")
	dur := fs.Duration("duration", 5*time.Second, "measured window")
	natsPid := fs.Int("nats-pid", 0, "the cluster's process, whose CPU is read at the window's edges")
	follow := fs.Bool("follow", false, "also read the stream with an ordered consumer (as a sidecar's follower) and wait, after each PubAck, until it has the message (with -window 0)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *urls == "" || *like == "" {
		return errors.New("-urls and -like are required")
	}
	nc, err := nats.Connect(*urls, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	pending := max(*window, *publishers)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(pending))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *warmup+*dur+2*time.Minute)
	defer cancel()
	src, err := js.Stream(ctx, *like)
	if err != nil {
		return fmt.Errorf("stream %s: %w", *like, err)
	}
	cfg := src.CachedInfo().Config
	cfg.Name, cfg.Subjects, cfg.Description = *stream, []string{*stream + ".ev.>"}, "sluice bench baseline (deleted after the run)"
	cfg.Sources, cfg.Mirror, cfg.SubjectTransform, cfg.RePublish = nil, nil, nil, nil
	_ = js.DeleteStream(ctx, *stream)
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		return fmt.Errorf("create stream %s like %s: %w", *stream, *like, err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer dcancel()
		js.DeleteStream(dctx, *stream)
	}()
	var extra [][2]string
	var names []string
	for kv := range strings.SplitSeq(*hdrs, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			extra = append(extra, [2]string{k, v})
			names = append(names, k)
		}
	}
	subjPfx := *stream + ".ev."
	mkMsg := func(id string, body []byte) *nats.Msg {
		m := &nats.Msg{Subject: subjPfx + base64.RawURLEncoding.EncodeToString([]byte(id)), Data: body, Header: nats.Header{}}
		for _, kv := range extra {
			m.Header.Set(kv[0], kv[1])
		}
		return m
	}
	// The stream's Raft group elects its leader after the create: wait for
	// a first PubAck before the clock starts.
	for i := 0; ; i++ {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.PublishMsg(pctx, mkMsg(fmt.Sprintf("%s-probe-%d", *keyID, i), newBody(*size)))
		pcancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || i > 200 {
			return fmt.Errorf("first publish to %s: %w", *stream, err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	var fol *follower
	if *follow {
		if fol, err = startFollower(ctx, js, *stream); err != nil {
			return err
		}
		defer fol.stop()
	}

	start := time.Now()
	winStart, winEnd := start.Add(*warmup), start.Add(*warmup+*dur)
	maxPubs := int64(maxEventsPerSecond * (*warmup + *dur).Seconds())
	var (
		seq, winOK, errs atomic.Int64
		mu               sync.Mutex
		lat              []int64
		firstErr         string
		cpu0, cpu1       time.Duration
		n0, n1           time.Duration
		t0, t1           time.Time
		tickWG           sync.WaitGroup
		pid              = os.Getpid()
	)
	noteErr := func(err error) {
		errs.Add(1)
		mu.Lock()
		if firstErr == "" {
			firstErr = err.Error()
		}
		mu.Unlock()
	}
	tickWG.Go(func() {
		sleepUntil(ctx, winStart)
		t0, cpu0 = time.Now(), mustCPU(pid)
		if *natsPid > 0 {
			n0 = mustCPU(*natsPid)
		}
		sleepUntil(ctx, winEnd)
		t1, cpu1 = time.Now(), mustCPU(pid)
		if *natsPid > 0 {
			n1 = mustCPU(*natsPid)
		}
	})
	record := func(sent, done time.Time, mine *[]int64) {
		if !done.Before(winStart) && done.Before(winEnd) {
			winOK.Add(1)
			*mine = append(*mine, int64(done.Sub(sent)))
		}
	}
	res := jspubResult{Stream: *stream, Headers: append([]string{jetstream.MsgIDHeader}, names...), Follow: *follow}
	if *window <= 0 {
		res.Mode, res.Publishers, res.Window = "publishers", *publishers, pending
		var wg sync.WaitGroup
		for w := range *publishers {
			wg.Go(func() {
				body := newBody(*size)
				var mine []int64
				for n := 0; ; n++ {
					now := time.Now()
					if !now.Before(winEnd) || seq.Add(1) > maxPubs || ctx.Err() != nil {
						break
					}
					stampBody(body, now.UnixNano())
					id := fmt.Sprintf("%s-%d-%d", *keyID, w, n)
					f, err := js.PublishMsgAsync(mkMsg(id, body), jetstream.WithMsgID(id))
					if err == nil {
						select {
						case ack := <-f.Ok():
							if fol != nil {
								err = fol.await(ack.Sequence, 5*time.Second)
							}
						case err = <-f.Err():
						case <-ctx.Done():
							err = ctx.Err()
						}
					}
					if err != nil {
						noteErr(err)
						time.Sleep(time.Millisecond)
						continue
					}
					record(now, time.Now(), &mine)
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
	} else {
		res.Mode, res.Window = "window", *window
		type inflight struct {
			f    jetstream.PubAckFuture
			sent time.Time
		}
		futures := make(chan inflight, *window)
		var wg sync.WaitGroup
		wg.Go(func() {
			for x := range futures {
				var err error
				select {
				case <-x.f.Ok():
				case err = <-x.f.Err():
				case <-ctx.Done():
					err = ctx.Err()
				}
				if err != nil {
					noteErr(err)
					continue
				}
				record(x.sent, time.Now(), &lat)
			}
		})
		body := newBody(*size)
		for n := 0; ; n++ {
			now := time.Now()
			if !now.Before(winEnd) || seq.Add(1) > maxPubs || ctx.Err() != nil {
				break
			}
			id := fmt.Sprintf("%s-w-%d", *keyID, n)
			// A body per message: the client keeps the message until its
			// PubAck, to resend it if the stream had no responder.
			stampBody(body, now.UnixNano())
			f, err := js.PublishMsgAsync(mkMsg(id, append([]byte(nil), body...)), jetstream.WithMsgID(id), jetstream.WithStallWait(30*time.Second))
			if err != nil {
				noteErr(err)
				time.Sleep(time.Millisecond)
				continue
			}
			futures <- inflight{f, now}
		}
		close(futures)
		wg.Wait()
	}
	tickWG.Wait()
	secs := t1.Sub(t0).Seconds()
	res.Seconds, res.Errors, res.FirstErr, res.Latency = secs, errs.Load(), firstErr, summarize(lat)
	if n := winOK.Load(); n > 0 && secs > 0 {
		res.PerSec = float64(n) / secs
		res.CPUPerPubUs = float64(cpu1-cpu0) / 1e3 / float64(n)
		res.NATSCPUPerPubUs = float64(n1-n0) / 1e3 / float64(n)
		res.NATSCores = (n1 - n0).Seconds() / secs
	}
	return json.NewEncoder(stdout).Encode(res)
}

// follower reads a stream with an ordered consumer, as a fleet node's
// stream follower does (the same pull limits), and lets publishers wait
// until it has seen their message: the bare form of an Append that returns
// only once OnCommit saw the event.
type follower struct {
	cc      jetstream.ConsumeContext
	mu      sync.Mutex
	seen    uint64
	waiters map[uint64]chan struct{}
}

func startFollower(ctx context.Context, js jetstream.JetStream, stream string) (*follower, error) {
	f := &follower{waiters: map[uint64]chan struct{}{}}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return nil, fmt.Errorf("follower: %w", err)
	}
	f.cc, err = cons.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			return
		}
		seq := md.Sequence.Stream
		f.mu.Lock()
		f.seen = max(f.seen, seq)
		if ch := f.waiters[seq]; ch != nil {
			close(ch)
			delete(f.waiters, seq)
		}
		f.mu.Unlock()
	}, jetstream.PullMaxBytes(32<<20), jetstream.PullExpiry(5*time.Second), jetstream.PullHeartbeat(time.Second))
	if err != nil {
		return nil, fmt.Errorf("follower: %w", err)
	}
	return f, nil
}

// await returns once the follower has seen seq, or an error after d.
func (f *follower) await(seq uint64, d time.Duration) error {
	f.mu.Lock()
	if f.seen >= seq {
		f.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	f.waiters[seq] = ch
	f.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		f.mu.Lock()
		delete(f.waiters, seq)
		f.mu.Unlock()
		return fmt.Errorf("follower did not see seq %d within %s", seq, d)
	}
}

func (f *follower) stop() { f.cc.Stop() }
