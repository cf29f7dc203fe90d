package badger

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"

	"github.com/dgraph-io/ristretto/v2/z"
)

// Damage inside Badger's logs.
//
// Badger replays each write-ahead log (*.mem) and the newest value log
// (*.vlog) on open up to the first entry it cannot read (a checksum that
// fails, a length past the end), and truncates the file there. That is the
// right repair for a write torn by a crash, which can only be the last
// one. It is the wrong one for a flipped byte in the middle: everything
// after it was acknowledged, and is cut off without a word (one flipped
// byte near the start of a WAL left 14 of 300 events, and the lost seqs
// were handed out again).
//
// Badger's replay offers no hook, and once it has truncated the file the
// evidence is gone, so the only place to tell the two apart is before it
// opens the dir: scanLog reads the file with Badger's documented entry
// layout (below) and, where Badger would stop, looks for an intact entry
// further on. A torn write leaves nothing readable after it; damage
// leaves the rest of the log readable. Comparing what Badger recovered
// against our own state records instead would not work: every record
// that names a seq (head, cursors, retries, dead letters) is written to
// the same WAL after the event, so it is lost with it.
//
// Entry layout (badger v4 memtable.go encodeEntry, value.go safeRead):
//
//	meta:1 userMeta:1 uvarint(klen) uvarint(vlen) uvarint(expiresAt) key value crc32:4
//
// The checksum is CRC-32C over header, key and value, big endian. The key
// ends in an 8-byte version. Entries of a transaction carry bitTxn and
// are followed by a bitFinTxn entry whose value is the commit version in
// decimal; Badger keeps a transaction only once it has seen that marker.

// Entry meta bits, as badger v4 value.go defines them.
const (
	metaValuePointer = 1 << 1
	metaTxn          = 1 << 6
	metaFinTxn       = 1 << 7
)

// zeroPage is the granularity of a page a crash may leave unwritten.
const zeroPage = 4096

// logDamage is damage found in one log file: an entry Badger would stop at
// with intact entries after it, which Badger would drop.
type logDamage struct {
	file string
	// offset is where the first unreadable entry starts; next where the
	// first intact entry after it starts.
	offset, next int
	// lost counts the intact entries after the damage; maxSeq is the
	// highest sequence number they name (an event key or m/head), 0 if
	// none.
	lost   int
	maxSeq uint64
}

func (d *logDamage) Error() string {
	s := fmt.Sprintf("%s: the entry at offset %d is unreadable, and %d intact entries follow it (from offset %d)",
		d.file, d.offset, d.lost, d.next)
	if d.maxSeq > 0 {
		s += fmt.Sprintf(", events up to seq %d among them", d.maxSeq)
	}
	return s + "; opening would drop them"
}

// logEntry is one decoded entry; key and value alias the file.
type logEntry struct {
	meta       byte
	key, value []byte
	size       int
}

// parseEntry decodes the entry at b[off:], or reports false where Badger's
// reader would stop: a short or malformed header, a key over 64 KiB (its
// own bound), an entry past the end, a checksum mismatch, or an empty key.
func parseEntry(b []byte, off int) (logEntry, bool) {
	if off+2 > len(b) {
		return logEntry{}, false
	}
	p := off + 2
	var lens [3]uint64
	for i := range lens {
		v, n := binary.Uvarint(b[p:])
		if n <= 0 {
			return logEntry{}, false
		}
		lens[i], p = v, p+n
	}
	// Badger keeps the lengths as uint32.
	klen, vlen := int(uint32(lens[0])), int(uint32(lens[1]))
	if klen == 0 || klen > 1<<16 || len(b)-p < klen+vlen+crc32.Size {
		return logEntry{}, false
	}
	end := p + klen + vlen
	if binary.BigEndian.Uint32(b[end:]) != crc32.Checksum(b[off:end], castagnoli) {
		return logEntry{}, false
	}
	return logEntry{meta: b[off], key: b[p : p+klen], value: b[p+klen : end], size: end + crc32.Size - off}, true
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// replayEnd is where Badger's replay of b stops reading: the offset of the
// first entry it cannot read, or of the first one that breaks a
// transaction (badger v4 logFile.iterate).
func replayEnd(b []byte) int {
	off := logHeaderSize
	var txn uint64
	for {
		e, ok := parseEntry(b, off)
		if !ok {
			return off
		}
		switch {
		case e.meta&metaTxn != 0:
			ts := version(e.key)
			if txn == 0 {
				txn = ts
			}
			if txn != ts {
				return off
			}
		case e.meta&metaFinTxn != 0:
			ts, err := strconv.ParseUint(string(e.value), 10, 64)
			if err != nil || ts != txn {
				return off
			}
			txn = 0
		default:
			if txn != 0 {
				return off
			}
		}
		off += e.size
	}
}

func version(key []byte) uint64 {
	if len(key) < 8 {
		return 0
	}
	return ^binary.BigEndian.Uint64(key[len(key)-8:]) // Badger stores MaxUint64-ts
}

// scanLog reports damage in the log file at path, nil for a file that
// Badger replays whole or that ends in a torn write.
func scanLog(path string) (*logDamage, error) {
	mf, err := z.OpenMmapFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer mf.Close(-1) // -1: unmap without truncating
	return findDamage(filepath.Base(path), mf.Data), nil
}

// findDamage is scanLog over the bytes of a file.
func findDamage(name string, b []byte) *logDamage {
	stop := replayEnd(b)
	next, e := nextEntry(b, stop+1)
	if next < 0 {
		return nil // a torn tail, or the log's end
	}
	// A crash during power loss can leave pages of the last, unsynced
	// writes unwritten (zeros: the files are preallocated sparse) while
	// later pages reached the disk. A whole zero page before the next
	// intact entry is that, not a flipped byte: everything acknowledged
	// was synced before it, so what follows was never acknowledged.
	for p := (stop + zeroPage - 1) / zeroPage * zeroPage; p+zeroPage <= next; p += zeroPage {
		if isZero(b[p : p+zeroPage]) {
			return nil
		}
	}
	d := &logDamage{file: name, offset: stop, next: next}
	for off := next; off >= 0; {
		d.lost++
		d.maxSeq = max(d.maxSeq, namedSeq(e))
		off += e.size
		if e2, ok := parseEntry(b, off); ok {
			e = e2
			continue
		}
		off, e = nextEntry(b, off+1)
	}
	return d
}

// nextEntry finds the first intact entry at or after from whose key is
// one sluice or Badger writes: -1 if there is none. Requiring a known key
// prefix besides the checksum keeps random bytes from passing for an
// entry (a checksum alone matches one position in 2^32).
func nextEntry(b []byte, from int) (int, logEntry) {
	for p := from; p+2 < len(b); p++ {
		if b[p+2] == 0 {
			continue // no key: the zeros after a log's end take this path
		}
		e, ok := parseEntry(b, p)
		if ok && len(e.key) > 8 && (ownKey(e.key[:len(e.key)-8]) || bytes.HasPrefix(e.key, badgerPrefix)) {
			return p, e
		}
	}
	return -1, logEntry{}
}

var badgerPrefix = []byte("!badger!")

// namedSeq is the sequence number an entry names that a new event must
// stay above: an event's key, or the head. Cursors, retries and dead
// letters name only seqs at or below the head written before them.
func namedSeq(e logEntry) uint64 {
	k := e.key[:len(e.key)-8]
	switch {
	case len(k) == len(prefixEvent)+8 && bytes.HasPrefix(k, prefixEvent):
		return binary.BigEndian.Uint64(k[len(prefixEvent):])
	case bytes.Equal(k, keyHead) && e.meta&metaValuePointer == 0 && len(e.value) == 8:
		return binary.BigEndian.Uint64(e.value)
	}
	return 0
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
