package natscluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/synclog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/natscluster"
)

// TestMain checks that a closed cluster (and the clients the tests close)
// leave no goroutine behind. No nats-server or nats.go goroutine needs to
// be ignored: Close waits for every server's shutdown, and nats.Conn.Close
// ends the client's.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start runs an n-node cluster in a temporary directory, closed at cleanup.
func start(t *testing.T, n int) *natscluster.Cluster {
	t.Helper()
	c, err := natscluster.Start(natscluster.Options{Nodes: n, Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// connect opens a client to exactly the given server URL: it neither learns
// the other nodes from the server nor reconnects, so every request it makes
// enters the cluster through that node.
func connect(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.IgnoreDiscoveredServers(), nats.NoReconnect())
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream on %s: %v", url, err)
	}
	return js
}

// testCtx is the bound of a whole test's waiting.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// retry calls f, each call bounded to 2 s, until it succeeds or ctx ends.
// It is for the windows where a Raft group is electing a leader (after a
// node was killed or restarted); every f here is idempotent (a publish
// carries its Nats-Msg-Id).
func retry(ctx context.Context, f func(context.Context) error) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := f(attempt)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

func createEvents(t *testing.T, ctx context.Context, js jetstream.JetStream, replicas int) jetstream.Stream {
	t.Helper()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       "EVENTS",
		Subjects:   []string{"events.>"},
		Replicas:   replicas,
		Duplicates: 2 * time.Minute,
		Storage:    jetstream.FileStorage,
	})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	return s
}

// publish sends one event with its id as Nats-Msg-Id, retrying until a
// PubAck arrives.
func publish(t *testing.T, ctx context.Context, js jetstream.JetStream, id string) *jetstream.PubAck {
	t.Helper()
	var ack *jetstream.PubAck
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		ack, err = js.Publish(ctx, "events.test", []byte("body of "+id), jetstream.WithMsgID(id))
		return err
	})
	if err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
	return ack
}

func TestStreamDedupAndQuorum(t *testing.T) {
	c := start(t, 3)
	ctx := testCtx(t)
	js := connect(t, c.URL(0)) // node 0 is never killed here
	stream := createEvents(t, ctx, js, 3)

	acked := map[uint64]string{} // stream seq → event id, for every PubAck
	ack := publish(t, ctx, js, "evt-1")
	if ack.Sequence != 1 || ack.Duplicate {
		t.Fatalf("first publish: seq %d duplicate %v, want seq 1 and not a duplicate", ack.Sequence, ack.Duplicate)
	}
	acked[ack.Sequence] = "evt-1"
	ack = publish(t, ctx, js, "evt-1")
	if ack.Sequence != 1 || !ack.Duplicate {
		t.Fatalf("same id again: seq %d duplicate %v, want seq 1 and a duplicate", ack.Sequence, ack.Duplicate)
	}

	// One node down: two of three are a quorum.
	c.Kill(2)
	ack = publish(t, ctx, js, "evt-2")
	acked[ack.Sequence] = "evt-2"

	// Two down: no quorum, so no PubAck. Whether the request times out or
	// finds no stream leader to answer depends on the Raft state; either
	// way it is an error, not a hang.
	c.Kill(1)
	noQuorum, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := js.Publish(noQuorum, "events.test", []byte("body of evt-3"), jetstream.WithMsgID("evt-3"))
	cancel()
	switch {
	case err == nil:
		t.Fatal("publish with two of three nodes down succeeded")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse):
		t.Logf("publish without quorum: %v", err)
	default:
		t.Fatalf("publish without quorum: unexpected error %v", err)
	}

	if err := c.Restart(1); err != nil {
		t.Fatalf("restart node 1: %v", err)
	}
	if err := c.Restart(2); err != nil {
		t.Fatalf("restart node 2: %v", err)
	}
	// evt-3 had no PubAck, so it is "unknown": the leader may have logged it
	// and committed it once the quorum came back. Publishing it again with
	// the same id is safe either way: a new seq, or a duplicate of the first.
	ack = publish(t, ctx, js, "evt-3")
	t.Logf("evt-3 after restart: seq %d duplicate %v", ack.Sequence, ack.Duplicate)
	acked[ack.Sequence] = "evt-3"
	ack = publish(t, ctx, js, "evt-4")
	acked[ack.Sequence] = "evt-4"

	// Every acknowledged message is in the stream, once.
	var info *jetstream.StreamInfo
	if err := retry(ctx, func(ctx context.Context) error {
		var err error
		info, err = stream.Info(ctx)
		return err
	}); err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.State.Msgs != uint64(len(acked)) {
		t.Errorf("stream has %d messages, want the %d acknowledged", info.State.Msgs, len(acked))
	}
	for seq, id := range acked {
		msg, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Errorf("get seq %d (%s): %v", seq, id, err)
			continue
		}
		if got := msg.Header.Get(jetstream.MsgIDHeader); got != id {
			t.Errorf("seq %d has id %q, want %q", seq, got, id)
		}
		if string(msg.Data) != "body of "+id {
			t.Errorf("seq %d has body %q", seq, msg.Data)
		}
	}
}

func TestRestartKeepsData(t *testing.T) {
	c := start(t, 3)
	ctx := testCtx(t)
	js := connect(t, c.URL(0))
	createEvents(t, ctx, js, 3)
	for i := 1; i <= 3; i++ {
		publish(t, ctx, js, fmt.Sprintf("evt-%d", i))
	}

	streamMsgs := func(node int) uint64 {
		t.Helper()
		js := connect(t, c.URL(node))
		var info *jetstream.StreamInfo
		if err := retry(ctx, func(ctx context.Context) error {
			s, err := js.Stream(ctx, "EVENTS")
			if err != nil {
				return err
			}
			info, err = s.Info(ctx)
			return err
		}); err != nil {
			t.Fatalf("stream info through node %d: %v", node, err)
		}
		return info.State.Msgs
	}

	// One node restarted: it still serves the stream.
	c.Kill(1)
	if err := c.Restart(1); err != nil {
		t.Fatalf("restart node 1: %v", err)
	}
	if got := streamMsgs(1); got != 3 {
		t.Fatalf("after restarting node 1, the stream has %d messages through it, want 3", got)
	}

	// Every node down and back: no copy survived anywhere but the stores.
	// The first restart has no quorum to catch up with; the second makes one.
	for i := range 3 {
		c.Kill(i)
	}
	for i := range 3 {
		if err := c.Restart(i); err != nil {
			t.Fatalf("restart node %d: %v", i, err)
		}
	}
	if got := streamMsgs(2); got != 3 {
		t.Fatalf("after restarting every node, the stream has %d messages, want 3", got)
	}
}

func TestSingleNodeRestartKeepsData(t *testing.T) {
	c := start(t, 1)
	ctx := testCtx(t)
	js := connect(t, c.URL(0))
	createEvents(t, ctx, js, 1)
	publish(t, ctx, js, "evt-1")
	publish(t, ctx, js, "evt-2")

	c.Kill(0)
	if err := c.Restart(0); err != nil {
		t.Fatalf("restart: %v", err)
	}
	js = connect(t, c.URL(0))
	s, err := js.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream info after restart: %v", err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("after restart the stream has %d messages, want 2", info.State.Msgs)
	}
	if ack := publish(t, ctx, js, "evt-2"); !ack.Duplicate || ack.Sequence != 2 {
		t.Fatalf("evt-2 again after restart: seq %d duplicate %v, want a duplicate of seq 2", ack.Sequence, ack.Duplicate)
	}
}

func TestKVCreateOnlyAndCompareAndSet(t *testing.T) {
	c := start(t, 3)
	ctx := testCtx(t)
	js0, js1 := connect(t, c.URL(0)), connect(t, c.URL(1))
	kv0, err := js0.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "memberships", Replicas: 3})
	if err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	kv1, err := js1.KeyValue(ctx, "memberships")
	if err != nil {
		t.Fatalf("bucket through node 1: %v", err)
	}

	const key = "billing.node-a"
	rev, err := kv0.Create(ctx, key, []byte("from=17"))
	if err != nil {
		t.Fatalf("create on node 0: %v", err)
	}
	if _, err := kv1.Create(ctx, key, []byte("from=99")); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("second create through node 1: %v, want ErrKeyExists", err)
	}
	// A KV read is a direct get, answered by the nearest replica, which may
	// not have applied the write yet: it may say "not found" for a moment,
	// but never anything but the first write.
	var entry jetstream.KeyValueEntry
	if err := retry(ctx, func(ctx context.Context) error {
		var err error
		entry, err = kv1.Get(ctx, key)
		return err
	}); err != nil {
		t.Fatalf("get through node 1: %v", err)
	}
	if string(entry.Value()) != "from=17" || entry.Revision() != rev {
		t.Fatalf("node 1 reads %q at rev %d, want the first write %q at rev %d", entry.Value(), entry.Revision(), "from=17", rev)
	}

	// Compare-and-set: the owner of rev wins once; the stale writer loses.
	newRev, err := kv1.Update(ctx, key, []byte("from=17 until=40"), rev)
	if err != nil {
		t.Fatalf("update at the current revision: %v", err)
	}
	if _, err := kv0.Update(ctx, key, []byte("from=17 until=41"), rev); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		t.Fatalf("update at stale revision %d (current %d): %v, want ErrKeyRevisionMismatch", rev, newRev, err)
	}
}

// TestStartErrors covers the option checks that need no server.
func TestStartErrors(t *testing.T) {
	if _, err := natscluster.Start(natscluster.Options{}); err == nil || !strings.Contains(err.Error(), "dir") {
		t.Errorf("no dir: %v", err)
	}
	if _, err := natscluster.Start(natscluster.Options{Nodes: -1, Dir: t.TempDir()}); err == nil {
		t.Error("negative nodes: no error")
	}
	// A store dir that cannot be created is named in the error.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := natscluster.Start(natscluster.Options{Nodes: 1, Dir: file}); err == nil || !strings.Contains(err.Error(), "node-0") {
		t.Errorf("dir is a file: %v", err)
	}
}

// TestMaxPayload shows the limit the fleet backend must raise: nats-server's
// max_payload (1 MiB by default) counts headers, so sluice's default maximum
// body (1 MiB) with its Nats-Msg-Id does not fit; the client refuses it
// before sending. With MaxPayloadBytes raised, the stream (whose own
// MaxMsgSize defaults to unlimited) takes it.
func TestMaxPayload(t *testing.T) {
	body := make([]byte, 1<<20)
	for _, tc := range []struct {
		name    string
		max     int32
		wantErr error
	}{
		{"default", 0, nats.ErrMaxPayload},
		{"raised", 2 << 20, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := natscluster.Start(natscluster.Options{Nodes: 1, Dir: t.TempDir(), MaxPayloadBytes: tc.max})
			if err != nil {
				t.Fatalf("start: %v", err)
			}
			t.Cleanup(func() { c.Close() })
			ctx := testCtx(t)
			js := connect(t, c.URL(0))
			createEvents(t, ctx, js, 1)
			_, err = js.Publish(ctx, "events.big", body, jetstream.WithMsgID("evt-big"))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("publish 1 MiB: %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// TestRestartPortTaken: a node whose port another process holds does not
// come back, and says why; once the port is free, Restart works.
func TestRestartPortTaken(t *testing.T) {
	c, err := natscluster.Start(natscluster.Options{Nodes: 1, Dir: t.TempDir(), StartTimeout: time.Second})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	addr := strings.TrimPrefix(c.URL(0), "nats://")
	c.Kill(0)

	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("take %s: %v", addr, err)
	}
	err = c.Restart(0)
	l.Close()
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "node-0") {
		t.Fatalf("restart on a taken port: %v, want EADDRINUSE naming node-0", err)
	}
	if c.Server(0) != nil {
		t.Fatal("a node that failed to restart is reported running")
	}
	if err := c.Restart(0); err != nil {
		t.Fatalf("restart once the port is free: %v", err)
	}
}

func TestLogger(t *testing.T) {
	var buf synclog.Buffer
	c, err := natscluster.Start(natscluster.Options{
		Nodes:  1,
		Dir:    t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(&buf, nil)),
	})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	c.Close()
	if out := buf.String(); !strings.Contains(out, "node=node-0") || !strings.Contains(out, "Server Exiting") {
		t.Errorf("log lacks the node's name or its shutdown:\n%s", out)
	}
}

// batchAck is nats-server's publish answer with the atomic batch fields,
// which nats.go's jetstream.PubAck (v1.55.0) does not decode.
type batchAck struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
	BatchID   string `json:"batch"`
	BatchSize uint64 `json:"count"`
	Error     *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// publishBatch publishes ids as one atomic batch: every message carries
// Nats-Batch-Id and Nats-Batch-Sequence (1…n), the last also
// Nats-Batch-Commit: 1 and is the only one sent as a request; its answer
// acknowledges the whole batch. nats.go v1.55.0 has no client for this,
// only StreamConfig.AllowAtomicPublish, so the headers are set by hand.
func publishBatch(t *testing.T, ctx context.Context, nc *nats.Conn, batchID string, ids []string) batchAck {
	t.Helper()
	for i, id := range ids {
		m := nats.NewMsg("events.batch")
		m.Data = []byte("body of " + id)
		m.Header.Set(jetstream.MsgIDHeader, id)
		m.Header.Set("Nats-Batch-Id", batchID)
		m.Header.Set("Nats-Batch-Sequence", fmt.Sprint(i+1))
		if i < len(ids)-1 {
			if err := nc.PublishMsg(m); err != nil {
				t.Fatalf("publish batch message %d: %v", i+1, err)
			}
			continue
		}
		m.Header.Set("Nats-Batch-Commit", "1")
		resp, err := nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			t.Fatalf("commit batch %s: %v", batchID, err)
		}
		var ack batchAck
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			t.Fatalf("decode batch ack %q: %v", resp.Data, err)
		}
		return ack
	}
	t.Fatal("empty batch")
	return batchAck{}
}

// TestAtomicBatchPublish records what the fleet backend can rely on: in
// nats-server v2.15 a stream created with AllowAtomicPublish takes a batch
// all or nothing on an R3 stream, and a batch holding an id already in the
// duplicate window fails whole (error 10201) instead of being acknowledged
// as duplicates.
func TestAtomicBatchPublish(t *testing.T) {
	c := start(t, 3)
	ctx := testCtx(t)
	js := connect(t, c.URL(0))
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:               "EVENTS",
		Subjects:           []string{"events.>"},
		Replicas:           3,
		Duplicates:         2 * time.Minute,
		AllowAtomicPublish: true,
	})
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}

	ack := publishBatch(t, ctx, js.Conn(), "b1", []string{"evt-1", "evt-2", "evt-3"})
	if ack.Error != nil || ack.Seq != 3 || ack.BatchID != "b1" || ack.BatchSize != 3 {
		t.Fatalf("batch b1: %+v (error %+v), want seq 3, batch b1, count 3", ack, ack.Error)
	}

	ack = publishBatch(t, ctx, js.Conn(), "b2", []string{"evt-3", "evt-4"})
	if ack.Error == nil || ack.Error.ErrCode != 10201 {
		t.Fatalf("batch b2 repeating evt-3: %+v, want error 10201 (batch contains duplicate message id)", ack)
	}
	t.Logf("batch with a known id: %d %s", ack.Error.ErrCode, ack.Error.Description)

	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("stream has %d messages, want 3 (nothing of the failed batch)", info.State.Msgs)
	}
}
