package proxy_test

// Regression tests for defects found in a review of the engine (a Close
// after a failed Open, replays racing, replay history); each failed before
// its fix.

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy"
)

// TestCloseAfterFailedOpen: Close after an Open that failed closes what
// was opened and nothing else (it dereferenced the missing dispatcher).
func TestCloseAfterFailedOpen(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		opts proxy.Options
	}{
		{"ingest port taken", proxy.Options{Listen: busy.Addr().String(), AdminListen: "-", DataDir: t.TempDir()}},
		{"admin port taken", proxy.Options{Listen: "127.0.0.1:0", AdminListen: busy.Addr().String(), DataDir: t.TempDir()}},
		{"data dir is a file", proxy.Options{Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: file}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.opts.Logger = quietLogger()
			s := proxy.New(c.opts)
			if err := s.Open(); err == nil {
				t.Fatal("Open succeeded")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Close(ctx); err != nil {
				t.Fatalf("Close after a failed Open: %v", err)
			}
		})
	}
}

// rejectThenAccept is an endpoint that answers 404 until accept is set,
// then 200, counting the deliveries it accepted.
func rejectThenAccept(t *testing.T) (url string, accept *atomic.Bool, delivered *atomic.Int64) {
	accept, delivered = new(atomic.Bool), new(atomic.Int64)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !accept.Load() {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		delivered.Add(1)
	}))
	t.Cleanup(rcv.Close)
	return rcv.URL, accept, delivered
}

// TestConcurrentReplaysDeliverOnce: many replays of one dead letter at once,
// over HTTP, schedule it once and the endpoint gets it once. The check
// "already replayed" and the replay were separate transactions, so two
// concurrent calls could both pass the check and write two retry records.
func TestConcurrentReplaysDeliverOnce(t *testing.T) {
	url, accept, delivered := rejectThenAccept(t)
	s := startAdminServer(t, "", "", sub("a", url))
	const letters, callers = 20, 16
	publish(t, s, "t", "e", letters)
	eventually(t, "the dead letters", func() bool { return lane(s, "a").DeadLettered == letters })
	accept.Store(true)

	// Open the connections first, so the replays reach the server together
	// rather than one connection set-up apart.
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() { defer wg.Done(); adminCall(t, s, "GET", "/healthz", "", "") }()
	}
	wg.Wait()
	var replayed atomic.Int64
	for seq := 1; seq <= letters; seq++ {
		start := make(chan struct{})
		body := `{"subscription":"a","seq":` + strconv.Itoa(seq) + `}`
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				code, r := adminCall(t, s, "POST", "/v1/dead-letters/replay", body, "")
				if code != http.StatusOK {
					t.Errorf("replay: %d %v", code, r)
					return
				}
				replayed.Add(int64(r["replayed"].(float64)))
			}()
		}
		close(start)
		wg.Wait()
	}
	if n := replayed.Load(); n != letters {
		t.Fatalf("%d replays of %d letters (%d callers each) replayed; want exactly one each", n, letters, callers)
	}
	eventually(t, "every replay acknowledged and no retry left", func() bool {
		l := lane(s, "a")
		return l.Delivered == letters && l.Scheduled == 0 && l.InFlight == 0
	})
	if n := delivered.Load(); n != letters {
		t.Fatalf("endpoint got %d deliveries of %d replayed letters; want each once", n, letters)
	}
}

// TestReplayHistoryKeptWhenDeadLetteredAgain: a replayed letter that fails
// again keeps its replay count, so a second replay without force is still
// refused. Dead-lettering it again wrote a fresh record and reset the
// once-only guard.
func TestReplayHistoryKeptWhenDeadLetteredAgain(t *testing.T) {
	url, _, _ := rejectThenAccept(t)
	s := startAdminServer(t, "", "", sub("a", url))
	publish(t, s, "t", "e", 1)
	eventually(t, "the dead letter", func() bool { return lane(s, "a").DeadLettered == 1 })
	if code, r := adminCall(t, s, "POST", "/v1/dead-letters/replay", `{"subscription":"a","seq":1}`, ""); code != 200 || r["replayed"].(float64) != 1 {
		t.Fatalf("replay: %d %v", code, r)
	}
	// The endpoint still answers 404: the replay is dead-lettered again.
	eventually(t, "dead-lettered again", func() bool { return lane(s, "a").DeadLettered == 2 && lane(s, "a").Scheduled == 0 })
	_, d := adminCall(t, s, "GET", "/v1/dead-letters/a/1", "", "")
	if d["replays"] != float64(1) || d["replayed_at"] == nil {
		t.Fatalf("dead letter after a failed replay: replays %v, replayed_at %v; want the history kept", d["replays"], d["replayed_at"])
	}
	code, r := adminCall(t, s, "POST", "/v1/dead-letters/replay", `{"subscription":"a","seq":1}`, "")
	if code != 200 || r["replayed"].(float64) != 0 || !strings.Contains(r["results"].([]any)[0].(map[string]any)["skipped"].(string), "already replayed") {
		t.Fatalf("second replay without force: %d %v; want it refused", code, r)
	}
}
