package badger

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/queue"

	badgerdb "github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/ristretto/v2/z"
)

// Start-up checks of the data dir.
//
// Badger repairs on open what a crash leaves behind, and some of those
// repairs destroy data when the damage has another cause: with a MANIFEST
// that is missing or lost its tail it deletes every table file the
// MANIFEST does not list (all the events); a table file with a damaged
// footer or block makes it panic in a goroutine of its own, which no
// caller can recover; an empty log file it extends and then refuses. So
// Open first checks what Badger would trip over, under the directory lock,
// and refuses such a dir with ErrCorrupt before Badger touches it. The
// checks only read.
//
// Badger also ends a write-ahead log (*.mem) or the newest value log
// (*.vlog) at the first record whose checksum fails, as it must for a
// write torn by a crash, and cuts off whatever follows. The checks tell
// damage (intact records after the bad one) from a torn tail (logscan.go)
// and report it; Open refuses it unless Options.AcceptDataLoss says to
// let Badger cut. What they cannot see is damage that leaves nothing
// readable after it (a log cut short): that opens as a torn tail, and
// events whose value was cut off fail to decode when read (ErrCorrupt),
// never read back wrong.

// checkDataDir refuses a dir that is not a directory, is held by another
// process, holds someone else's files, or that Badger would wipe or crash
// on. A missing dir is fine: Badger creates it. It returns the damage
// found inside the logs Badger replays (logscan.go) for Open to judge.
func checkDataDir(dir string, bopts badgerdb.Options) (damage []*logDamage, err error) {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open queue %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return nil, &dirError{dir, queue.ErrNotDataDir, errors.New("it is not a directory")}
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open queue %s: %w", dir, err)
	}
	var (
		foreign, tables []string
		logs            []fs.DirEntry
		manifest        bool
		vlog            bool
	)
	for _, e := range ents {
		switch name := e.Name(); {
		case name == badgerdb.ManifestFilename:
			manifest = true
		case strings.HasSuffix(name, ".sst"):
			tables = append(tables, name)
		case strings.HasSuffix(name, ".vlog"):
			vlog = true
			logs = append(logs, e)
		case strings.HasSuffix(name, ".mem"):
			logs = append(logs, e)
		case slices.Contains(badgerFiles, name):
		case name == "lost+found", strings.HasPrefix(name, "."): // a fresh file system's root; .gitkeep and the like
		default:
			foreign = append(foreign, name)
		}
	}
	if !manifest && len(tables) == 0 && len(logs) == 0 {
		if len(foreign) > 0 {
			return nil, &dirError{dir, queue.ErrNotDataDir, fmt.Errorf("it holds %s and no Badger database", quoteFew(foreign))}
		}
		return damage, nil // empty: a fresh log
	}
	var newestVlog string
	for _, e := range logs {
		if err := checkLogHeader(filepath.Join(dir, e.Name())); err != nil {
			return nil, &dirError{dir, queue.ErrCorrupt, err}
		}
		if strings.HasSuffix(e.Name(), ".vlog") && vlogID(e.Name()) >= vlogID(newestVlog) {
			newestVlog = e.Name()
		}
	}
	// Badger replays (and truncates) every WAL and the newest value log
	// only; the older value logs it reads as they are.
	for _, e := range logs {
		if name := e.Name(); strings.HasSuffix(name, ".mem") || name == newestVlog {
			d, err := scanLog(filepath.Join(dir, name))
			if err != nil {
				return nil, fmt.Errorf("open queue %s: %w", dir, err)
			}
			if d != nil {
				damage = append(damage, d)
			}
		}
	}
	// Badger leaks goroutines when it fails on the key registry; it only
	// reads the file here.
	kr, err := badgerdb.OpenKeyRegistry(badgerdb.KeyRegistryOptions{
		Dir: dir, ReadOnly: true, EncryptionKey: bopts.EncryptionKey,
		EncryptionKeyRotationDuration: bopts.EncryptionKeyRotationDuration,
	})
	if err != nil {
		return nil, &dirError{dir, queue.ErrCorrupt, fmt.Errorf("KEYREGISTRY: %w", err)}
	}
	kr.Close()
	if !manifest {
		if len(tables) > 0 {
			return nil, &dirError{dir, queue.ErrCorrupt, fmt.Errorf("MANIFEST is missing, and opening without it would delete %s", quoteFew(tables))}
		}
		return damage, nil // a crash before the first table: Badger replays the logs
	}
	mf, torn, err := readManifest(dir, bopts)
	if err != nil {
		return nil, &dirError{dir, queue.ErrCorrupt, fmt.Errorf("MANIFEST: %w", err)}
	}
	if torn {
		// A crash tears a MANIFEST record only if it is cut off while
		// appending one; Badger then drops the torn record and deletes the
		// table files it no longer lists. That is right for a table a
		// flush or compaction was writing, and loses events if the
		// MANIFEST lost more than its last record: refuse rather than guess.
		var unlisted []string
		for _, name := range tables {
			if id, ok := table.ParseFileID(name); !ok || !listed(mf, id) {
				unlisted = append(unlisted, name)
			}
		}
		if len(unlisted) > 0 {
			return nil, &dirError{dir, queue.ErrCorrupt, fmt.Errorf("MANIFEST ends in a torn record, and opening would delete %s, which it does not list", quoteFew(unlisted))}
		}
	}
	if len(mf.Tables) > 0 && !vlog {
		return nil, &dirError{dir, queue.ErrCorrupt, errors.New("no value log (*.vlog) is present")}
	}
	ids := make([]uint64, 0, len(mf.Tables))
	for id := range mf.Tables {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if err := checkTable(table.NewFilename(id, dir), mf.Tables[id], bopts); err != nil {
			return nil, &dirError{dir, queue.ErrCorrupt, err}
		}
	}
	return damage, nil
}

// vlogID is the number of a value log's file name, -1 for none; Badger
// writes the file with the highest number.
func vlogID(name string) int64 {
	id, err := strconv.ParseInt(strings.TrimSuffix(name, ".vlog"), 10, 64)
	if err != nil {
		return -1
	}
	return id
}

// badgerFiles are the names Badger uses besides tables and logs.
var badgerFiles = []string{"KEYREGISTRY", "REWRITE-KEYREGISTRY", "MANIFEST-REWRITE", "DISCARD", "LOCK"}

func listed(mf badgerdb.Manifest, id uint64) bool {
	_, ok := mf.Tables[id]
	return ok
}

// readManifest replays the MANIFEST read-only; torn reports a partial
// record at its end (which Badger would cut off).
func readManifest(dir string, bopts badgerdb.Options) (badgerdb.Manifest, bool, error) {
	f, err := os.Open(filepath.Join(dir, badgerdb.ManifestFilename))
	if err != nil {
		return badgerdb.Manifest{}, false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return badgerdb.Manifest{}, false, err
	}
	mf, end, err := badgerdb.ReplayManifestFile(f, bopts.ExternalMagicVersion, bopts)
	if err != nil {
		return badgerdb.Manifest{}, false, err
	}
	return mf, end < fi.Size(), nil
}

// logHeaderSize is the header of a write-ahead or value log file: the
// encryption key id (8 bytes, 0 when not encrypted) and a nonce (12).
const logHeaderSize = 20

// checkLogHeader refuses a log file too short for its header, or whose
// header names an encryption key: sluice never encrypts, so that is
// damage, on which Badger fails only after replaying the other logs into
// new files.
func checkLogHeader(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var h [logHeaderSize]byte
	if n, err := f.ReadAt(h[:], 0); n < len(h) {
		return fmt.Errorf("%s is shorter than a log header (%d bytes): %v", filepath.Base(path), n, err)
	}
	if [8]byte(h[:8]) != [8]byte{} {
		return fmt.Errorf("%s: header names encryption key %x, and this data dir is not encrypted", filepath.Base(path), h[:8])
	}
	return nil
}

// checkTable opens a table the MANIFEST lists the way Badger will, and
// verifies every block's checksum. Badger opens tables in goroutines of
// its own, where a damaged footer or block is a panic that kills the
// process; here it is recovered and reported.
func checkTable(path string, tm badgerdb.TableManifest, bopts badgerdb.Options) (err error) {
	name := filepath.Base(path)
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("MANIFEST lists table %s: %w", name, err)
	}
	if tm.KeyID != 0 {
		return nil // encrypted: Badger checks it against the key registry
	}
	// A table ends in index length, checksum and checksum length.
	if fi.Size() < 16 {
		return fmt.Errorf("table %s: %d bytes, too short for a table", name, fi.Size())
	}
	mf, err := z.OpenMmapFile(path, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("table %s: %w", name, err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("table %s is unreadable (opening it panics)", name)
		}
		// OpenTable closes the file on some of its errors; closing twice
		// would unmap memory that may belong to another mapping by then.
		if _, serr := mf.Fd.Stat(); !errors.Is(serr, os.ErrClosed) {
			mf.Close(-1)
		}
	}()
	_, err = table.OpenTable(mf, table.Options{
		ReadOnly:    true,
		ChkMode:     options.OnTableRead,
		BlockSize:   bopts.BlockSize,
		Compression: tm.Compression,
	})
	if err != nil {
		return fmt.Errorf("table %s: %w", name, err)
	}
	return nil
}

// quoteFew names up to three files.
func quoteFew(names []string) string {
	slices.Sort(names)
	q := make([]string, 0, 3)
	for _, n := range names[:min(len(names), 3)] {
		q = append(q, fmt.Sprintf("%q", n))
	}
	s := strings.Join(q, ", ")
	if len(names) > 3 {
		s += fmt.Sprintf(" and %d more", len(names)-3)
	}
	return s
}

func firstLine(v any) string {
	s := strings.TrimSpace(fmt.Sprint(v))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// openError classifies an error of badgerdb.Open. Badger formats the errors
// it wraps into text (y.Wrap uses %+v), so only the text is left to match.
func openError(dir string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "Cannot acquire directory lock"):
		// Another process took the lock after lockDir let it go.
		return &dirError{dir, queue.ErrLocked, err}
	case strings.Contains(msg, "permission denied"), strings.Contains(msg, "read-only file system"),
		strings.Contains(msg, "no space left on device"), strings.Contains(msg, "too many open files"):
		return fmt.Errorf("open queue %s: %w", dir, err)
	}
	return &dirError{dir, queue.ErrCorrupt, err}
}

// checkOwned refuses a Badger database of another application: one with
// keys but without sluice's format key. (A sluice dir gets the format key
// in the same transaction as its first recovery, before any event.)
func checkOwned(db *badgerdb.DB, dir string) error {
	err := db.View(func(txn *badgerdb.Txn) error {
		if _, err := txn.Get(keyFormat); !errors.Is(err, badgerdb.ErrKeyNotFound) {
			return err
		}
		it := txn.NewIterator(badgerdb.IteratorOptions{})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k := it.Item().Key()
			if !ownKey(k) {
				return &dirError{dir, queue.ErrNotDataDir, fmt.Errorf("its Badger database holds keys of another application (%q) and no sluice format key", k[:min(len(k), 16)])}
			}
		}
		return nil
	})
	if _, ok := err.(*dirError); err != nil && !ok {
		return fmt.Errorf("open queue %s: %w", dir, err)
	}
	return err
}

func ownKey(k []byte) bool {
	for _, p := range [][]byte{prefixEvent, prefixID, prefixMember, prefixCursor, prefixRetry, prefixRetryIndex, prefixDeadLetter, prefixRecord, []byte("m/")} {
		if len(k) >= len(p) && string(k[:len(p)]) == string(p) {
			return true
		}
	}
	return false
}
