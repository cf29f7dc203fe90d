package badger_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

const crashDirEnv = "SLUICE_QUEUE_CRASH_DIR"

// crashChild runs in the re-executed test binary: it appends forever from
// several goroutines and prints "id seq" for every acknowledged append,
// until the parent kills it.
func crashChild() bool {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		return false
	}
	q, err := badger.Open(badger.Options{Dir: dir, Sync: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	round := os.Getenv("SLUICE_QUEUE_CRASH_ROUND")
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("r%s-w%d-%d", round, w, i)
				seq, _, err := q.Append(&queue.Event{ID: id, Type: "crash", AcceptedAt: time.Now(), Body: []byte(id)})
				if err != nil {
					fmt.Fprintln(os.Stderr, "append:", err)
					os.Exit(2)
				}
				mu.Lock()
				fmt.Fprintf(out, "%s %d\n", id, seq)
				out.Flush()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return true
}

// TestInvariant1_AcknowledgedAppendsSurviveSIGKILL kills a real appending
// process several times; every append it acknowledged must be in the log.
func TestInvariant1_AcknowledgedAppendsSurviveSIGKILL(t *testing.T) {
	dir := t.TempDir()
	acked := map[string]uint64{}
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, fmt.Sprintf("SLUICE_QUEUE_CRASH_ROUND=%d", round))
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		n := 0
		for sc.Scan() {
			var id string
			var seq uint64
			if _, err := fmt.Sscanf(sc.Text(), "%s %d", &id, &seq); err != nil {
				t.Fatalf("child said %q", sc.Text())
			}
			acked[id] = seq
			if n++; n == 300+round*137 {
				cmd.Process.Signal(syscall.SIGKILL)
				break
			}
		}
		// Lines written before the kill still count as acknowledged.
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 2 {
				var seq uint64
				fmt.Sscan(f[1], &seq)
				acked[f[0]] = seq
			}
		}
		cmd.Wait()
	}
	q := queuetest.MustOpen(t, dir, badger.Options{})
	for id, seq := range acked {
		ev, err := q.Event(seq)
		if err != nil {
			t.Fatalf("acknowledged %s (seq %d) lost: %v", id, seq, err)
		}
		if ev.ID != id || string(ev.Body) != id {
			t.Fatalf("seq %d holds %s, acknowledged as %s", seq, ev.ID, id)
		}
		if got, _, err := q.Lookup(id); err != nil || got != seq {
			t.Fatalf("dedup entry of %s = %d, %v", id, got, err)
		}
	}
	if len(acked) < 900 {
		t.Fatalf("only %d appends acknowledged", len(acked))
	}
	t.Logf("%d acknowledged appends across 3 SIGKILLs, none lost; head %d", len(acked), q.Head())
}
