package proxy_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/natscluster"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/jetstream"
	"github.com/sluicehq/sluice/testbed"
)

// fleet is an embedded 3-node JetStream cluster and the sidecars of one
// test sharing it (fleet mode in-process; cmd/sluice tests the same with
// processes and kills).
type fleet struct {
	t       *testing.T
	cluster *natscluster.Cluster
	stream  string
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	c, err := natscluster.Start(natscluster.Options{Dir: t.TempDir(), MaxPayloadBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &fleet{t: t, cluster: c, stream: "FLEET"}
}

func (f *fleet) options(node string) jetstream.Options {
	return jetstream.Options{URLs: f.cluster.URLs(), Stream: f.stream, Replicas: 3, NodeID: node,
		LeaseTTL: 2 * time.Second, Logger: quietLogger()}
}

// node starts one sidecar of the fleet.
func (f *fleet) node(id string, subs ...*delivery.Subscription) *proxy.Server {
	f.t.Helper()
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		Subscriptions: subs, Logger: quietLogger(), CursorInterval: 10 * time.Millisecond,
		OpenStore: func(onCommit func([]*queue.Event), reg prometheus.Registerer) (queue.Store, error) {
			o := f.options(id)
			o.OnCommit, o.Registerer = onCommit, reg
			return jetstream.Open(o)
		}})
	if err := s.Open(); err != nil {
		f.t.Fatalf("open node %s: %v", id, err)
	}
	f.t.Cleanup(func() { closeServer(f.t, s, 5*time.Second) })
	return s
}

// observer is a store on the fleet's stream that owns nothing: it reads
// the shared state as any node would.
func (f *fleet) observer() *jetstream.Store {
	f.t.Helper()
	s, err := jetstream.Open(f.options("observer"))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { s.Close() })
	return s
}

// TestFleetCursorIsDurableWhileDelivering: in fleet mode the owner's
// cursor reaches the shared state as it delivers, whichever node ingested
// the events, so a new owner resumes where the old one stopped. (The
// fleet demo's ~300 resent events came from compaction holding back the
// cursor flusher: TestCursorsWrittenWhileCompactionWaits pins that.)
func TestFleetCursorIsDurableWhileDelivering(t *testing.T) {
	f := newFleet(t)
	tb := startTestbed(t, testbed.ModeOK)
	s1 := sub("s1", tb.URL()+"/s1", "*")
	a := f.node("a", s1)
	b := f.node("b", sub("s1", tb.URL()+"/s1", "*"))
	obs := f.observer()
	eventually(t, "one owner of s1", func() bool {
		return lane(a, "s1").Owner != "" && lane(a, "s1").Owner == lane(b, "s1").Owner
	})
	const n = 300
	for i := range n {
		srv := a
		if i%2 == 1 {
			srv = b
		}
		if code, ans := post(t, srv, "t", fmt.Sprintf("k-%d", i), `{}`); code != http.StatusAccepted {
			t.Fatalf("post %d: %d %s", i, code, ans.Error)
		}
		if i%50 == 0 {
			time.Sleep(20 * time.Millisecond) // spread over several cursor flushes and lease renewals
		}
	}
	eventually(t, "every event delivered", func() bool { return tb.Stats()["/s1"].Unique >= n })
	eventually(t, "the durable cursor at the head", func() bool {
		m, _, err := obs.Lane("s1")
		return err == nil && m.Cursor >= n
	})
	if d := tb.Stats()["/s1"].Duplicates; d != 0 {
		t.Errorf("%d duplicates without any kill", d)
	}
}

// TestFleetCommitsWhileTheStoreOpens: a node joining a busy fleet sees
// other nodes' events committed by its stream follower while its store is
// still opening, before its dispatcher exists. That crashed the node
// (fleet.sh, a rollout's new pod); now those commits move the head the
// lanes start from, so the new owner delivers them without any later event
// to wake it.
func TestFleetCommitsWhileTheStoreOpens(t *testing.T) {
	f := newFleet(t)
	tb := startTestbed(t, testbed.ModeOK)
	a := f.node("a", sub("s1", tb.URL()+"/s1", "*"))
	eventually(t, "a owns s1", func() bool { return lane(a, "s1").Owner == "a" })
	closeServer(t, a, 5*time.Second)
	obs := f.observer()

	const n = 20
	b := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0",
		Subscriptions: []*delivery.Subscription{sub("s1", tb.URL()+"/s1", "*")}, Logger: quietLogger(),
		CursorInterval: 10 * time.Millisecond,
		OpenStore: func(onCommit func([]*queue.Event), reg prometheus.Registerer) (queue.Store, error) {
			o := f.options("b")
			o.OnCommit, o.Registerer = onCommit, reg
			st, err := jetstream.Open(o)
			if err != nil {
				return nil, err
			}
			var last uint64
			for i := range n {
				seq, _, err := obs.Append(&queue.Event{ID: fmt.Sprintf("early-%d", i), Type: "t", Body: []byte(`{}`), AcceptedAt: time.Now()})
				if err != nil {
					st.Close()
					return nil, err
				}
				last = seq
			}
			// The follower hands them to onCommit before Open returns.
			for deadline := time.Now().Add(10 * time.Second); st.Head() < last; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					st.Close()
					return nil, fmt.Errorf("the follower did not commit seq %d (head %d)", last, st.Head())
				}
			}
			return st, nil
		}})
	if err := b.Open(); err != nil {
		t.Fatalf("open node b: %v", err)
	}
	t.Cleanup(func() { closeServer(t, b, 5*time.Second) })
	eventually(t, "b delivers the events committed while it opened", func() bool { return tb.Stats()["/s1"].Unique >= n })
}
