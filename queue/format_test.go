package queue

import (
	"errors"
	"testing"

	badger "github.com/dgraph-io/badger/v4"
)

// TestNewerFormatIsRefused: a data dir written by a newer sluice is refused
// at open, never misread or rewritten.
func TestNewerFormatIsRefused(t *testing.T) {
	dir := t.TempDir()
	q, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set(keyFormat, u64(formatVersion+1)) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(Options{Dir: dir}); !errors.Is(err, ErrNewerFormat) {
		t.Fatalf("open of a newer data dir: %v, want ErrNewerFormat", err)
	}
}
