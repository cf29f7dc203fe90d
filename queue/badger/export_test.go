package badger

import (
	"testing"
	"time"
)

// AwaitIndexed waits until l's indexer has written the dedup entries of
// every event up to the head (dedup.go): after that, an idle log writes
// nothing more of its own, so a test may compare the data dir's files
// before and after something that must not touch them.
func AwaitIndexed(tb testing.TB, l *Log) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !IndexedAll(l) {
		if time.Now().After(deadline) {
			tb.Fatalf("the indexer is at %d of head %d after 30 s", l.indexed.Load(), l.head.Load())
		}
		time.Sleep(time.Millisecond) // polling an atomic: nothing signals it
	}
}

// IndexedAll reports whether the indexer has written every published
// event's id.
func IndexedAll(l *Log) bool { return l.indexed.Load() >= l.head.Load() }

// HoldIndex makes every indexer started after it wait an hour before it
// writes: a process killed meanwhile leaves its whole tail unindexed, as
// a crash within indexLinger of the last append does.
func HoldIndex() { indexLinger = time.Hour }
