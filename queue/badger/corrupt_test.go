package badger_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/synclog"

	badgerdb "github.com/dgraph-io/badger/v4"
	"golang.org/x/sys/unix"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/badger"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// fixtureEvents is how many events a fixture data dir holds. Every 50th
// (from the 8th) has a body above the 64 KiB value threshold, so Badger
// keeps it in the value log rather than the LSM tree.
const fixtureEvents = 300

func fixtureEvent(i int) *queue.Event {
	body := []byte(fmt.Sprintf(`{"n":%d}`, i))
	if i%50 == 7 {
		body = bytes.Repeat([]byte{byte('a' + i%26)}, 70<<10)
	}
	return &queue.Event{ID: fmt.Sprintf("ev-%03d", i), Type: "t.created", AcceptedAt: time.Unix(1_700_000_000+int64(i), 0), Body: body}
}

func largeEvent(seq uint64) bool { return (seq-1)%50 == 7 }

func appendFixture(tb testing.TB, q *badger.Log) {
	tb.Helper()
	for i := range fixtureEvents {
		if seq, _ := queuetest.MustAppend(tb, q, fixtureEvent(i)); seq != uint64(i+1) {
			tb.Fatalf("append %d: seq %d", i, seq)
		}
	}
}

// closedFixture is a data dir after a clean shutdown: the events are in a
// table (*.sst) and the large bodies in the value log.
func closedFixture(t *testing.T) string {
	dir := t.TempDir()
	q := queuetest.MustOpen(t, dir, badger.Options{Sync: true})
	appendFixture(t, q)
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

const (
	corruptChildEnv = "SLUICE_QUEUE_CORRUPT_CHILD_DIR"
	// corruptSettleEnv makes the child wait until its indexer has written
	// every event's id before it says "ready", so that nothing writes to
	// the dir after that (the indexer lingers after the last append).
	// Without it the child holds its index back (HoldIndex), so that the
	// kill always leaves the log's tail unindexed, as a crash within the
	// linger does, and Open must index it from the damaged files.
	corruptSettleEnv = "SLUICE_QUEUE_CORRUPT_CHILD_SETTLE"
)

// The test binary doubles as a sluice that appends the fixture, says
// "ready" and waits to be killed (an init rather than a TestMain hook, so
// the other tests' TestMain stays as it is).
func init() {
	dir := os.Getenv(corruptChildEnv)
	if dir == "" {
		return
	}
	settle := os.Getenv(corruptSettleEnv) != ""
	if !settle {
		badger.HoldIndex()
	}
	q, err := badger.Open(badger.Options{Dir: dir, Sync: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	for i := range fixtureEvents {
		if _, _, err := q.Append(fixtureEvent(i)); err != nil {
			fmt.Fprintln(os.Stderr, "append:", err)
			os.Exit(2)
		}
	}
	for settle && !badger.IndexedAll(q) {
		time.Sleep(time.Millisecond) // polling an atomic: nothing signals it
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // until the parent kills us
	os.Exit(0)
}

// holder is a child process holding a data dir open, with every fixture
// event acknowledged (synced).
type holder struct {
	cmd   *exec.Cmd
	stdin io.Closer
}

func startHolder(t *testing.T, dir string, settle bool) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), corruptChildEnv+"="+dir)
	if settle {
		cmd.Env = append(cmd.Env, corruptSettleEnv+"=1")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: cmd, stdin: stdin}
	t.Cleanup(h.kill)
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		h.kill()
		t.Fatalf("holder said %q; stderr: %s", line, stderr.String())
	}
	return h
}

// kill SIGKILLs the holder: its write-ahead log (*.mem) is left as a
// crash leaves it, with every event in it and none in a table.
func (h *holder) kill() {
	if h.cmd.ProcessState != nil {
		return
	}
	h.cmd.Process.Signal(syscall.SIGKILL)
	h.cmd.Wait()
	h.stdin.Close()
}

// killedFixture is a data dir whose process was SIGKILLed after all its
// appends were acknowledged.
func killedFixture(t *testing.T) string {
	dir := t.TempDir()
	startHolder(t, dir, false).kill()
	return dir
}

// dirState maps each file under dir (but Badger's LOCK, a pid file it
// rewrites on every open) to its size and a hash of its content.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "LOCK" {
			return err
		}
		h := sha256.New()
		size, err := chunks(p, func(off int64, c []byte) error {
			fmt.Fprintf(h, "%d:", off) // all-zero chunks are skipped; offsets keep the hash exact
			h.Write(c)
			return nil
		})
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = fmt.Sprintf("%d bytes %x", size, h.Sum(nil))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// chunks calls f with each 1 MiB chunk (at a multiple of 1 MiB) of the
// file that is not all zeros, and returns the file's size. Badger
// preallocates its logs, so a killed dir is mostly holes: the walk seeks
// from data to data (SEEK_DATA) rather than reading them.
func chunks(path string, f func(off int64, c []byte) error) (int64, error) {
	const chunk = 1 << 20
	file, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	buf := make([]byte, chunk)
	for pos := int64(0); pos < size; pos += chunk {
		data, err := file.Seek(pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole left
		}
		if err != nil {
			data = pos // no SEEK_DATA here: read everything
		}
		pos = data &^ (chunk - 1)
		n, err := file.ReadAt(buf[:min(chunk, size-pos)], pos)
		if err != nil && err != io.EOF {
			return 0, err
		}
		if c := buf[:n]; !bytes.Equal(c, zeroChunk[:n]) {
			if err := f(pos, c); err != nil {
				return 0, err
			}
		}
	}
	return size, nil
}

var zeroChunk = make([]byte, 1<<20)

func assertUnchanged(t *testing.T, dir string, before map[string]string) {
	t.Helper()
	after := dirState(t, dir)
	for name, h := range before {
		if after[name] != h {
			t.Errorf("%s changed by a refused open: %s, was %s", name, after[name], h)
		}
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			t.Errorf("%s created by a refused open", name)
		}
	}
}

// copyDir copies a fixture, keeping Badger's preallocated files sparse.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		size, err := chunks(filepath.Join(src, e.Name()), func(off int64, c []byte) error {
			_, err := out.WriteAt(c, off)
			return err
		})
		if err == nil {
			err = out.Truncate(size)
		}
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// Corruptions. "Used" is the part of a file before its trailing zeros
// (Badger preallocates logs).
func truncateTo(frac float64) func(*testing.T, string) {
	return func(t *testing.T, p string) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, int64(float64(fi.Size())*frac)); err != nil {
			t.Fatal(err)
		}
	}
}

func dropLastByte(t *testing.T, p string) {
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, fi.Size()-1); err != nil {
		t.Fatal(err)
	}
}

func cutUsedHalf(t *testing.T, p string) {
	if err := os.Truncate(p, int64(used(t, p)/2)); err != nil {
		t.Fatal(err)
	}
}

// flipAt inverts 8 bytes at where(size, used).
func flipAt(where func(size, used int) int) func(*testing.T, string) {
	return func(t *testing.T, p string) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		off := int64(where(int(fi.Size()), used(t, p)))
		b := make([]byte, min(8, fi.Size()-off))
		if _, err := f.ReadAt(b, off); err != nil {
			t.Fatal(err)
		}
		for i := range b {
			b[i] ^= 0xff
		}
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

var (
	flipStart   = flipAt(func(int, int) int { return 0 })
	flipIV      = flipAt(func(int, int) int { return 10 }) // a log's nonce; a table's first block
	flipMid     = flipAt(func(size, _ int) int { return size / 2 })
	flipEnd     = flipAt(func(size, _ int) int { return size - 8 })
	flipUsedMid = flipAt(func(_, used int) int { return used / 2 })
)

// flipByte inverts the one byte at off.
func flipByte(off int64) func(*testing.T, string) {
	return func(t *testing.T, p string) {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, off); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0xff
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

func remove(t *testing.T, p string) {
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
}

func used(t *testing.T, p string) int {
	t.Helper()
	n := 0
	if _, err := chunks(p, func(off int64, c []byte) error {
		n = int(off) + len(bytes.TrimRight(c, "\x00"))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// outcome is what Open does with a damaged dir.
type outcome int

const (
	// refused: ErrCorrupt naming the dir, every file as it was.
	refused outcome = iota
	// intact: Open succeeds and every event reads back as appended.
	intact
	// walPrefix: Open succeeds with the events before the cut in the
	// write-ahead log; those after it are gone (ErrNotFound), as after a
	// write torn by a crash, which a log cut short cannot be told from.
	walPrefix
	// valuesCut: Open succeeds, Badger cut the value log at the damage:
	// some large events fail to decode (ErrCorrupt), everything else reads
	// back as appended.
	valuesCut
)

func (o outcome) String() string {
	return [...]string{"refused", "intact", "walPrefix", "valuesCut"}[o]
}

// TestCorruptDataDir damages each Badger file of a real data dir in the
// ways a disk or an operator does, and opens it: the result is a clear
// error that changes nothing, or the events; where Badger's crash repair
// loses acknowledged events it is asserted as the known gap it is.
func TestCorruptDataDir(t *testing.T) {
	fixtures := map[string]string{"closed": closedFixture(t), "killed": killedFixture(t)}
	// The fixtures are what the cases assume: the closed one's events in a
	// table and its value log, the killed one's in its write-ahead log.
	for name, want := range map[string][]string{
		"closed": {"000001.sst", "000001.vlog", "DISCARD", "KEYREGISTRY", "MANIFEST"},
		"killed": {"000001.vlog", "00001.mem", "DISCARD", "KEYREGISTRY", "LOCK", "MANIFEST"},
	} {
		var got []string
		ents, _ := os.ReadDir(fixtures[name])
		for _, e := range ents {
			got = append(got, e.Name())
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("%s fixture holds %v, want %v", name, got, want)
		}
	}
	cases := []struct {
		fixture, file, how string
		corrupt            func(*testing.T, string)
		want               outcome
	}{
		{"closed", "MANIFEST", "truncate to 0", truncateTo(0), refused},
		// Badger would cut the torn record and delete the table: all events.
		{"closed", "MANIFEST", "truncate to half", truncateTo(0.5), refused},
		{"closed", "MANIFEST", "flip record length", flipIV, refused},
		{"closed", "MANIFEST", "flip middle", flipMid, refused},
		{"closed", "MANIFEST", "flip end", flipEnd, refused},
		// Badger would start a new MANIFEST and delete the table.
		{"closed", "MANIFEST", "remove", remove, refused},
		{"closed", "000001.sst", "truncate to 0", truncateTo(0), refused},
		// Badger panics in a table-opening goroutine on these two.
		{"closed", "000001.sst", "truncate to half", truncateTo(0.5), refused},
		{"closed", "000001.sst", "drop last byte", dropLastByte, refused},
		// Badger opens these and reads garbage or panics on a read.
		{"closed", "000001.sst", "flip start", flipStart, refused},
		{"closed", "000001.sst", "flip first block", flipIV, refused},
		{"closed", "000001.sst", "flip middle", flipMid, refused},
		{"closed", "000001.sst", "flip end", flipEnd, refused},
		{"closed", "000001.sst", "remove", remove, refused},
		{"closed", "000001.vlog", "truncate to 0", truncateTo(0), refused},
		{"closed", "000001.vlog", "truncate to half", truncateTo(0.5), valuesCut},
		{"closed", "000001.vlog", "flip key id", flipStart, refused},
		{"closed", "000001.vlog", "flip nonce", flipIV, intact},
		// The newest value log is replayed and cut like a WAL: intact
		// values after the damage would be dropped (logscan.go).
		{"closed", "000001.vlog", "flip middle", flipMid, refused},
		{"closed", "000001.vlog", "flip end", flipEnd, valuesCut},
		{"closed", "000001.vlog", "remove", remove, refused},
		{"closed", "KEYREGISTRY", "truncate to 0", truncateTo(0), refused},
		{"closed", "KEYREGISTRY", "truncate to half", truncateTo(0.5), refused},
		{"closed", "KEYREGISTRY", "flip nonce", flipStart, intact},
		{"closed", "KEYREGISTRY", "flip middle", flipMid, refused},
		{"closed", "KEYREGISTRY", "remove", remove, intact},
		{"closed", "DISCARD", "truncate to 0", truncateTo(0), intact},
		{"closed", "DISCARD", "flip middle", flipMid, intact},
		{"killed", "00001.mem", "truncate to 0", truncateTo(0), refused},
		{"killed", "00001.mem", "flip key id", flipStart, refused},
		{"killed", "00001.mem", "truncate to half", truncateTo(0.5), intact}, // cuts preallocated zeros only
		{"killed", "00001.mem", "cut written part in half", cutUsedHalf, walPrefix},
		{"killed", "00001.mem", "flip middle of written part", flipUsedMid, refused},
		{"killed", "00001.mem", "flip one byte near the start", flipByte(60), refused},
		{"killed", "000001.vlog", "truncate to 0", truncateTo(0), refused},
		{"killed", "000001.vlog", "cut written part in half", cutUsedHalf, valuesCut},
		{"killed", "000001.vlog", "flip middle of written part", flipUsedMid, refused},
		{"killed", "MANIFEST", "truncate to half", truncateTo(0.5), intact}, // it lists no table yet
		{"killed", "MANIFEST", "truncate to 0", truncateTo(0), refused},
	}
	for _, c := range cases {
		t.Run(c.fixture+"/"+c.file+"/"+c.how, func(t *testing.T) {
			t.Parallel()
			dir := copyDir(t, fixtures[c.fixture])
			c.corrupt(t, filepath.Join(dir, c.file))
			before := dirState(t, dir)
			q, err := badger.Open(badger.Options{Dir: dir})
			if c.want == refused {
				if err == nil {
					q.Close()
					t.Fatal("open succeeded, want ErrCorrupt")
				}
				if !errors.Is(err, queue.ErrCorrupt) {
					t.Fatalf("open: %v, want ErrCorrupt", err)
				}
				for _, s := range []string{"data dir " + dir + " looks damaged", "restore it from a backup", "move it aside"} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not say %q", err, s)
					}
				}
				assertUnchanged(t, dir, before)
				return
			}
			if err != nil {
				t.Fatalf("open: %v, want %v", err, c.want)
			}
			defer func() {
				if err := q.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			}()
			checkEvents(t, q, c.want)
		})
	}
}

// TestWALDamageRefusedUnlessAccepted: one flipped byte near the start of
// the write-ahead log of a killed sidecar, whose 300 appends were all
// acknowledged (fsync). Badger alone kept the events before it and
// dropped the rest without a word, and the next appends took their seqs
// again. Open refuses, naming the file and the offset, and changes
// nothing; with AcceptDataLoss it opens, and new events take seqs above
// every one the dropped part named, across a second open too.
func TestWALDamageRefusedUnlessAccepted(t *testing.T) {
	dir := killedFixture(t)
	flipByte(60)(t, filepath.Join(dir, "00001.mem"))
	before := dirState(t, dir)
	q, err := badger.Open(badger.Options{Dir: dir})
	if err == nil {
		q.Close()
		t.Fatal("open succeeded, want ErrCorrupt")
	}
	if !errors.Is(err, queue.ErrCorrupt) {
		t.Fatalf("open: %v, want ErrCorrupt", err)
	}
	for _, s := range []string{"data dir " + dir + " looks damaged", "00001.mem: the entry at offset ", "intact entries follow it",
		"events up to seq 300", "--accept-data-loss"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	assertUnchanged(t, dir, before)
	t.Log(err)

	var logs synclog.Buffer
	q, err = badger.Open(badger.Options{Dir: dir, Sync: true, AcceptDataLoss: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("open with AcceptDataLoss: %v", err)
	}
	if !strings.Contains(logs.String(), "file=00001.mem") || !strings.Contains(logs.String(), "max_seq_dropped=300") {
		t.Errorf("the accepted loss is not logged with its file and seqs: %s", logs.String())
	}
	if q.Head() < fixtureEvents {
		t.Fatalf("head %d after the accepted loss, want at least %d: dropped seqs would be handed out again", q.Head(), fixtureEvents)
	}
	seq, _ := queuetest.MustAppend(t, q, &queue.Event{ID: "after-loss-1", Type: "t.created", Body: []byte("{}")})
	if seq <= fixtureEvents {
		t.Fatalf("first append after the accepted loss took seq %d, which a dropped event had", seq)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	// Badger cut the log: the next open sees no damage, and the head
	// stays where the accepted open put it.
	q = queuetest.MustOpen(t, dir, badger.Options{Sync: true})
	if seq2, _ := queuetest.MustAppend(t, q, &queue.Event{ID: "after-loss-2", Type: "t.created", Body: []byte("{}")}); seq2 != seq+1 {
		t.Fatalf("append after reopening took seq %d, want %d", seq2, seq+1)
	}
}

// TestNextSeqAboveNamedSeqs: a log that lost its events and head (here:
// every e/ key and m/head deleted, as a cut log leaves it) while a cursor,
// a retry record and a dead letter naming later seqs survived gives new
// events seqs above all of them.
func TestNextSeqAboveNamedSeqs(t *testing.T) {
	for _, c := range []struct {
		name   string
		record func(*badger.Log) error
	}{
		{"cursor", func(q *badger.Log) error { return q.SaveCursors(map[string]uint64{"s": 40}) }},
		{"retry", func(q *badger.Log) error {
			return q.Record(queue.Outcome{Kind: queue.RetryScheduled, Subscription: "s", Seq: 40, At: time.Now(),
				Retry: &queue.Retry{Subscription: "s", Seq: 40, Due: time.Now().Add(time.Hour), Attempt: 1, FirstAttempt: time.Now()}})
		}},
		{"dead letter", func(q *badger.Log) error {
			ev, err := q.Event(40)
			if err != nil {
				return err
			}
			return q.Record(queue.Outcome{Kind: queue.DeadLettered, Subscription: "s", Seq: 40, At: time.Now(),
				DeadLetter: &queue.DeadLetter{Subscription: "s", Seq: 40, EventID: ev.ID, Type: ev.Type, Reason: "rejected", DeadAt: time.Now(), Body: ev.Body}})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			q := queuetest.MustOpen(t, dir, badger.Options{Sync: true})
			if _, err := q.Join("s", nil); err != nil {
				t.Fatal(err)
			}
			for i := range 40 {
				queuetest.MustAppend(t, q, fixtureEvent(i))
			}
			if err := c.record(q); err != nil {
				t.Fatal(err)
			}
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			loseEvents(t, dir)
			q = queuetest.MustOpen(t, dir, badger.Options{Sync: true})
			if seq, _ := queuetest.MustAppend(t, q, fixtureEvent(99)); seq <= 40 {
				t.Fatalf("append took seq %d, which a surviving %s names", seq, c.name)
			}
		})
	}
}

// loseEvents deletes every event and the head of a closed data dir.
func loseEvents(t *testing.T, dir string) {
	t.Helper()
	db, err := badgerdb.Open(badgerdb.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.DropPrefix([]byte("e/")); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"m/head", "m/indexed", "m/low"} {
		if err := db.Update(func(txn *badgerdb.Txn) error { return txn.Delete([]byte(k)) }); err != nil {
			t.Fatal(err)
		}
	}
}

// checkEvents asserts what a successful open of a damaged dir kept.
func checkEvents(t *testing.T, q *badger.Log, want outcome) {
	t.Helper()
	var kept, gone, cut []uint64
	for i := range fixtureEvents {
		seq := uint64(i + 1)
		ev, err := q.Event(seq)
		switch {
		case err == nil:
			w := fixtureEvent(i)
			if ev.ID != w.ID || ev.Type != w.Type || !ev.AcceptedAt.Equal(w.AcceptedAt) || !bytes.Equal(ev.Body, w.Body) {
				t.Fatalf("event %d reads back as %s (%d bytes), appended as %s (%d bytes)", seq, ev.ID, len(ev.Body), w.ID, len(w.Body))
			}
			kept = append(kept, seq)
		case errors.Is(err, queue.ErrNotFound):
			gone = append(gone, seq)
		case errors.Is(err, queue.ErrCorrupt):
			cut = append(cut, seq)
		default:
			t.Fatalf("event %d: %v", seq, err)
		}
	}
	switch want {
	case intact:
		if len(kept) != fixtureEvents {
			t.Fatalf("kept %d events, lost %v, unreadable %v", len(kept), gone, cut)
		}
		evs, _, err := q.Events(1, fixtureEvents, fixtureEvents+1, nil)
		if err != nil || len(evs) != fixtureEvents {
			t.Fatalf("Events: %d events, %v", len(evs), err)
		}
	case walPrefix:
		k := uint64(len(kept))
		if len(cut) > 0 || k == 0 || k == fixtureEvents || kept[k-1] != k || q.Head() != k {
			t.Fatalf("kept %d events (last %v), unreadable %v, head %d: want events 1..k, head k, 0 < k < %d",
				k, kept[max(k, 1)-1:], cut, q.Head(), fixtureEvents)
		}
		t.Logf("KNOWN GAP: write-ahead log cut at event %d; events %d..%d acknowledged but lost", k+1, k+1, fixtureEvents)
	case valuesCut:
		if len(gone) > 0 || len(cut) == 0 || q.Head() != fixtureEvents {
			t.Fatalf("lost %v, unreadable %v, head %d: want only large events unreadable, head %d", gone, cut, q.Head(), fixtureEvents)
		}
		for _, seq := range cut {
			if !largeEvent(seq) {
				t.Fatalf("event %d, in the LSM tree, unreadable", seq)
			}
		}
		t.Logf("KNOWN GAP: value log cut; large events %v acknowledged but unreadable", cut)
	}
}

// TestLockedDataDir: a second Open of a dir in use fails with ErrLocked,
// and the first goes on appending and reading.
func TestLockedDataDir(t *testing.T) {
	dir := t.TempDir()
	q := queuetest.MustOpen(t, dir, badger.Options{Sync: true})
	queuetest.MustAppend(t, q, fixtureEvent(0))
	// The holder's own indexer writes after the append returns: the
	// files are compared once it is done, or its write looks like the
	// refused open's.
	badger.AwaitIndexed(t, q)
	before := dirState(t, dir)
	q2, err := badger.Open(badger.Options{Dir: dir})
	if err == nil {
		q2.Close()
		t.Fatal("second open of a dir in use succeeded")
	}
	if !errors.Is(err, queue.ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
	if want := "data dir " + dir + " is in use by another process (is another sluice running?)"; err.Error() != want {
		t.Fatalf("second open: %q, want %q", err, want)
	}
	assertUnchanged(t, dir, before)
	seq, _ := queuetest.MustAppend(t, q, fixtureEvent(1))
	for s := uint64(1); s <= seq; s++ {
		if ev, err := q.Event(s); err != nil || ev.ID != fixtureEvent(int(s-1)).ID {
			t.Fatalf("event %d after the refused open: %v, %v", s, ev, err)
		}
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	q = queuetest.MustOpen(t, dir, badger.Options{})
	if q.Head() != 2 {
		t.Fatalf("head %d after reopen, want 2", q.Head())
	}
}

// TestLockedByAnotherProcess: the lock holds across processes, and the
// holder's events are all there once it is gone.
func TestLockedByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	h := startHolder(t, dir, true)
	before := dirState(t, dir)
	if q, err := badger.Open(badger.Options{Dir: dir}); !errors.Is(err, queue.ErrLocked) {
		if q != nil {
			q.Close()
		}
		t.Fatalf("open of a dir another process holds: %v, want ErrLocked", err)
	}
	assertUnchanged(t, dir, before)
	h.kill()
	q := queuetest.MustOpen(t, dir, badger.Options{})
	checkEvents(t, q, intact)
}

// TestForeignDataDir: a data_dir that is a file, or holds someone else's
// files or Badger database, is refused and left as it is; an empty one
// is a fresh log.
func TestForeignDataDir(t *testing.T) {
	t.Run("regular file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "sluice.yaml")
		if err := os.WriteFile(path, []byte("listen: 127.0.0.1:8700\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := badger.Open(badger.Options{Dir: path})
		assertForeign(t, err, path, "it is not a directory")
		if b, _ := os.ReadFile(path); string(b) != "listen: 127.0.0.1:8700\n" {
			t.Fatalf("file now holds %q", b)
		}
	})
	t.Run("someone else's files", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o600)
		os.Mkdir(filepath.Join(dir, "photos"), 0o700)
		os.WriteFile(filepath.Join(dir, "photos", "a.jpg"), []byte{0xff, 0xd8}, 0o600)
		before := dirState(t, dir)
		_, err := badger.Open(badger.Options{Dir: dir})
		assertForeign(t, err, dir, `it holds "notes.txt", "photos" and no Badger database`)
		assertUnchanged(t, dir, before)
	})
	t.Run("another application's Badger database", func(t *testing.T) {
		dir := t.TempDir()
		db, err := badgerdb.Open(badgerdb.DefaultOptions(dir).WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(txn *badgerdb.Txn) error { return txn.Set([]byte("user/1"), []byte("ada")) }); err != nil {
			t.Fatal(err)
		}
		db.Close()
		_, err = badger.Open(badger.Options{Dir: dir})
		assertForeign(t, err, dir, `another application ("user/1")`)
		// Badger ran its own recovery, but nothing of sluice was written.
		db, err = badgerdb.Open(badgerdb.DefaultOptions(dir).WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		err = db.View(func(txn *badgerdb.Txn) error {
			if _, err := txn.Get([]byte("m/format")); !errors.Is(err, badgerdb.ErrKeyNotFound) {
				return fmt.Errorf("m/format: %v, want not found", err)
			}
			item, err := txn.Get([]byte("user/1"))
			if err != nil {
				return err
			}
			return item.Value(func(v []byte) error {
				if string(v) != "ada" {
					return fmt.Errorf("user/1 = %q", v)
				}
				return nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	for name, setup := range map[string]func(dir string) string{
		"empty dir":              func(dir string) string { return dir },
		"missing dir":            func(dir string) string { return filepath.Join(dir, "a", "b") },
		"fresh file system root": func(dir string) string { os.Mkdir(filepath.Join(dir, "lost+found"), 0o700); return dir },
		"dir with a dotfile":     func(dir string) string { os.WriteFile(filepath.Join(dir, ".gitkeep"), nil, 0o600); return dir },
	} {
		t.Run(name, func(t *testing.T) {
			dir := setup(t.TempDir())
			q := queuetest.MustOpen(t, dir, badger.Options{})
			if seq, _ := queuetest.MustAppend(t, q, fixtureEvent(0)); seq != 1 {
				t.Fatalf("first append: seq %d", seq)
			}
		})
	}
}

func assertForeign(t *testing.T, err error, dir, why string) {
	t.Helper()
	if !errors.Is(err, queue.ErrNotDataDir) {
		t.Fatalf("open: %v, want ErrNotDataDir", err)
	}
	for _, s := range []string{"data dir " + dir + " is not a sluice data dir", why, "point data_dir at an empty or new directory"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}
