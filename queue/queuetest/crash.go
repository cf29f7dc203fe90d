package queuetest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// The child learns from its environment where to append, in which round,
// and which test of the binary is the crash test.
const (
	crashPlaceEnv = "SLUICE_QUEUETEST_CRASH_PLACE"
	crashRoundEnv = "SLUICE_QUEUETEST_CRASH_ROUND"
	crashTestEnv  = "SLUICE_QUEUETEST_CRASH_TEST"
)

// crashRounds and crashKillAfter: three kills, each after a few hundred
// acknowledged appends (a different number each round, so a kill lands at
// another point of the group commit).
const crashRounds = 3

func crashKillAfter(round int) int { return 300 + round*137 }

// crashBody is the body the child appends under id: the id itself, and in
// odd rounds (an id is "<prefix letter><round>-w...") the id padded to
// 1 KiB. Sixteen appenders of 1 KiB bodies make group commits past the
// Badger log's value threshold (8 KiB), which it writes to Badger's value
// log instead of its LSM tree: the kills land in both write paths, and
// the rounds after them append over what each left.
func crashBody(id string) []byte {
	if len(id) > 1 && (id[1]-'0')%2 == 1 {
		return []byte(id + strings.Repeat(".", 1024-len(id)))
	}
	return []byte(id)
}

// Crash proves against a real process that an acknowledged append is never
// lost: it runs the test binary
// again as a child that appends to a store of b with Sync from 16
// goroutines and prints every append acknowledged to it; it SIGKILLs the
// child mid-stream, three times over one place, then opens the place and
// requires every acknowledged id to be there (Lookup and Event) with its
// seq and body (crashBody: small, and 1 KiB in the middle round).
//
// Call it from a test of its own (or a subtest): the child reruns exactly
// the test that called Crash (-test.run built from t.Name()), and in the
// child Crash appends until it is killed. A TestMain that the child runs
// through must not exit early.
func Crash(t *testing.T, b Backend) {
	if os.Getenv(crashTestEnv) == t.Name() {
		crashChild(t, b, "r", nil)
		return
	}
	place, acked := crashRoundsAt(t, b)
	s := b.Open(t, place, Options{})
	for id, seq := range acked {
		ev, err := s.Event(seq)
		if err != nil {
			t.Fatalf("acknowledged %s (seq %d) lost: %v", id, seq, err)
		}
		if ev.ID != id || string(ev.Body) != string(crashBody(id)) {
			t.Fatalf("seq %d holds %s (a body of %d bytes), acknowledged as %s", seq, ev.ID, len(ev.Body), id)
		}
		if got, _, _, err := s.Lookup(id); err != nil || got != seq {
			t.Fatalf("dedup entry of %s = %d, %v; want %d", id, got, err, seq)
		}
	}
	if want := crashKillAfter(0) * crashRounds; len(acked) < want {
		t.Fatalf("only %d appends acknowledged, want at least %d", len(acked), want)
	}
	t.Logf("%d acknowledged appends across %d SIGKILLs, none lost; head %d", len(acked), crashRounds, s.Head())
}

// runPattern is a -test.run pattern matching exactly the test named name
// (subtest levels separated by '/').
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// crashRoundsAt runs crashRounds children over one new place of b and
// returns the place and every append acknowledged across them.
func crashRoundsAt(t *testing.T, b Backend) (string, map[string]uint64) {
	t.Helper()
	place := b.NewPlace(t)
	acked := map[string]uint64{}
	for round := range crashRounds {
		crashRound(t, place, round, acked)
	}
	return place, acked
}

// crashRound starts a child, reads its acknowledgements into acked, kills
// it after crashKillAfter(round) of them and waits for it.
func crashRound(t *testing.T, place string, round int, acked map[string]uint64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run="+runPattern(t.Name()))
	cmd.Env = append(os.Environ(), crashPlaceEnv+"="+place, fmt.Sprintf("%s=%d", crashRoundEnv, round), crashTestEnv+"="+t.Name())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
		}
		cmd.Wait()
	}()
	r := bufio.NewReader(stdout)
	n := 0
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			// EOF: the child is gone. A line without its newline is one
			// the child had not finished writing: not an acknowledgement.
			break
		}
		id, seq, ok := parseAck(line)
		if !ok {
			continue // the test framework's own output
		}
		acked[id] = seq
		if n++; n == crashKillAfter(round) {
			cmd.Process.Signal(syscall.SIGKILL)
			killed = true
			// Lines written before the kill are acknowledged too: read on
			// to the end of the pipe.
		}
	}
	if !killed {
		cmd.Wait()
		t.Fatalf("round %d: the child stopped after %d acknowledgements; stderr:\n%s", round, n, stderr.String())
	}
}

// parseAck reads a child's "acked <id> <seq>" line.
func parseAck(line string) (id string, seq uint64, ok bool) {
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "acked" {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(f[2], 10, 64)
	return f[1], seq, err == nil
}

// crashChild appends until killed, printing "acked <id> <seq>" for each
// acknowledged append; ids start with prefix. after, when not nil, runs
// on each append (i counts the goroutine's appends) before it is printed,
// and an error from it ends the child as an append's would. It bounds its
// own life in case the parent died without killing it.
func crashChild(t *testing.T, b Backend, prefix string, after func(s queue.Store, i int, seq uint64) error) {
	place, round := os.Getenv(crashPlaceEnv), os.Getenv(crashRoundEnv)
	s := b.Open(t, place, Options{Sync: true})
	var (
		mu  sync.Mutex
		out = bufio.NewWriter(os.Stdout)
		wg  sync.WaitGroup
	)
	stop := time.Now().Add(time.Minute)
	for w := range 16 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				id := fmt.Sprintf("%s%s-w%d-%d", prefix, round, w, i)
				seq, _, err := s.Append(&queue.Event{ID: id, Type: "crash", AcceptedAt: time.Now(), Body: crashBody(id)})
				if err == nil && after != nil {
					err = after(s, i, seq)
				}
				if err != nil {
					fmt.Fprintln(os.Stderr, "append:", err)
					os.Exit(2)
				}
				mu.Lock()
				// One write per line: a pipe write this short is atomic, so
				// a kill never leaves half a line that parses.
				fmt.Fprintf(out, "acked %s %d\n", id, seq)
				if err := out.Flush(); err != nil {
					os.Exit(3) // the parent is gone
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Fatal("crash child: not killed within a minute")
}

// CrashDedup proves against a real process that an acknowledged event id
// stays a duplicate (one id, at most one event) across crashes: like Crash, it
// SIGKILLs a child appending with Sync from 16 goroutines, three times
// over one place, but the child also compacts the log up to each eighth
// event it is acknowledged, before it prints it. Then every acknowledged
// id must still be a duplicate of its own seq (Lookup, and an Append of
// it again), whether the kill came right after its Append returned or
// after compaction had deleted its event; some must have been compacted,
// or the test proved nothing of that.
func CrashDedup(t *testing.T, b Backend) {
	if os.Getenv(crashTestEnv) == t.Name() {
		// Compact up to each eighth acknowledged event, before it is printed.
		crashChild(t, b, "d", func(s queue.Store, i int, seq uint64) error {
			if i%8 != 7 {
				return nil
			}
			_, err := s.Compact(seq + 1)
			return err
		})
		return
	}
	place, acked := crashRoundsAt(t, b)
	s := b.Open(t, place, Options{Sync: true})
	compacted := 0
	for id, seq := range acked {
		if _, err := s.Event(seq); errors.Is(err, queue.ErrNotFound) {
			compacted++
		} else if err != nil {
			t.Fatal(err)
		}
		if got, _, _, err := s.Lookup(id); err != nil || got != seq {
			t.Fatalf("dedup entry of %s = %d, %v; want %d", id, got, err, seq)
		}
		got, dup, err := s.Append(&queue.Event{ID: id, Type: "crash", AcceptedAt: time.Now(), Body: []byte("again")})
		if err != nil || !dup || got != seq {
			t.Fatalf("append of acknowledged %s again = seq %d dup %v, %v; want a duplicate of %d", id, got, dup, err, seq)
		}
	}
	if compacted == 0 {
		t.Fatal("no acknowledged event was compacted: the test proved nothing of compaction")
	}
	t.Logf("%d acknowledged appends across %d SIGKILLs, %d of them compacted, all still duplicates", len(acked), crashRounds, compacted)
}
