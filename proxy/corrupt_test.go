package proxy_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/synclog"
	"github.com/sluicehq/sluice/proxy/delivery"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
	"github.com/sluicehq/sluice/testbed"
)

// TestUnreadableEventsAreDeadLettered: after a clean stop the value log
// (bodies over 64 KiB) is cut in half, so some events can no longer be
// read back. Before, each lane stalled at the first of them for good,
// holding the intact events behind it, and logged the read error every
// second. Now each lane dead-letters the unreadable events (reason
// corrupt) and delivers everything else; the store logs each once and
// counts it in sluice_queue_corrupt_events_total.
func TestUnreadableEventsAreDeadLettered(t *testing.T) {
	dir := t.TempDir()
	q := queuetest.MustOpen(t, dir, badger.Options{Sync: true})
	for _, s := range []string{"all", "typed"} {
		if _, err := q.Join(s, nil); err != nil {
			t.Fatal(err)
		}
	}
	const n = 40
	for i := range n {
		body := fmt.Sprintf(`{"n":%d}`, i)
		if i%4 == 0 {
			body = fmt.Sprintf(`{"n":%d,"pad":"%s"}`, i, strings.Repeat("x", 70<<10)) // into the value log
		}
		queuetest.MustAppend(t, q, queuetest.Event(fmt.Sprintf("e-%d", i), []string{"t.a", "t.b"}[i%2], body))
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	vlog := filepath.Join(dir, "000001.vlog")
	fi, err := os.Stat(vlog)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(vlog, fi.Size()/2); err != nil {
		t.Fatal(err)
	}

	tb := startTestbed(t, testbed.ModeOK)
	var logs synclog.Buffer
	reg := prometheus.NewRegistry()
	s := proxy.New(proxy.Options{AllowPrivateTargets: true,
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: dir, Sync: true, Registry: reg,
		Subscriptions: []*delivery.Subscription{sub("all", tb.URL()+"/all"), sub("typed", tb.URL()+"/typed", "t.a")},
		Logger:        slog.New(slog.NewTextHandler(&logs, nil)), CursorInterval: 10 * time.Millisecond,
	})
	if err := s.Open(); err != nil {
		t.Fatalf("open server: %v", err)
	}
	t.Cleanup(func() { closeServer(t, s, 5*time.Second) })

	eventually(t, "both lanes past every event", func() bool {
		return lane(s, "all").Cursor == n && lane(s, "typed").Cursor == n
	})
	dls, err := s.DeadLetters("all", 100)
	if err != nil {
		t.Fatal(err)
	}
	cut := map[uint64]bool{}
	for _, dl := range dls {
		if dl.Reason != policy.ReasonCorrupt || (dl.Seq-1)%4 != 0 {
			t.Fatalf("dead letter %+v: want reason corrupt, for a large event", dl)
		}
		cut[dl.Seq] = true
	}
	if len(cut) == 0 || len(cut) == n/4 {
		t.Fatalf("%d of %d large events unreadable: the fixture should cut some, not all", len(cut), n/4)
	}
	if st := tb.Stats()["/all"]; st.Unique != int64(n-len(cut)) {
		t.Fatalf("/all received %d events, want the %d readable ones", st.Unique, n-len(cut))
	}
	// The typed lane cannot know an unreadable event's type: it
	// dead-letters it too, and delivers the readable t.a events.
	typed, err := s.DeadLetters("typed", 100)
	if err != nil || len(typed) != len(cut) {
		t.Fatalf("typed lane: %d dead letters, %v; want %d", len(typed), err, len(cut))
	}
	wantTyped := int64(0)
	for seq := uint64(1); seq <= n; seq++ {
		if (seq-1)%2 == 0 && !cut[seq] {
			wantTyped++
		}
	}
	if st := tb.Stats()["/typed"]; st.Unique != wantTyped {
		t.Fatalf("/typed received %d events, want %d", st.Unique, wantTyped)
	}
	if got := counter(t, reg, "sluice_queue_corrupt_events_total", "", ""); got != float64(len(cut)) {
		t.Fatalf("sluice_queue_corrupt_events_total = %v, want %d", got, len(cut))
	}
	if got := counter(t, reg, "sluice_lane_rejections_total", "reason", "corrupt"); got != float64(len(cut)) {
		t.Fatalf("sluice_lane_rejections_total{reason=corrupt} = %v for one lane, want %d", got, len(cut))
	}
	out := logs.String()
	if c := strings.Count(out, "event unreadable"); c != len(cut) {
		t.Errorf("%d 'event unreadable' lines for %d events, want one each:\n%s", c, len(cut), out)
	}
	if strings.Contains(out, "read log") || strings.Contains(out, "Unable to read") {
		t.Errorf("read errors logged:\n%s", out)
	}
}
