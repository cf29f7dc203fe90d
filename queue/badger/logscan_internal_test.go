package badger

import (
	"encoding/binary"
	"hash/crc32"
	"testing"
)

// logBytes is a log file of entries with the given user keys, each with
// an 8-byte version and a small value, as Badger writes them outside a
// transaction; offs are where they start.
func logBytes(keys ...string) (b []byte, offs []int) {
	b = make([]byte, logHeaderSize)
	for i, k := range keys {
		offs = append(offs, len(b))
		key := binary.BigEndian.AppendUint64([]byte(k), ^uint64(i+1))
		val := []byte("value")
		start := len(b)
		b = append(b, 0, 0)
		b = binary.AppendUvarint(b, uint64(len(key)))
		b = binary.AppendUvarint(b, uint64(len(val)))
		b = binary.AppendUvarint(b, 0)
		b = append(append(b, key...), val...)
		b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
	}
	return append(b, make([]byte, 64)...), offs // preallocated zeros
}

func TestFindDamage(t *testing.T) {
	seqKey := func(seq uint64) string { return string(binary.BigEndian.AppendUint64([]byte("e/"), seq)) }
	keys := []string{seqKey(1), seqKey(2), "c/sub", seqKey(3)}

	b, _ := logBytes(keys...)
	if d := findDamage("00001.mem", b); d != nil {
		t.Fatalf("intact log: %v", d)
	}
	b, offs := logBytes(keys...)
	torn := append(b[:offs[3]+5:offs[3]+5], make([]byte, 64)...)
	if d := findDamage("00001.mem", torn); d != nil {
		t.Fatalf("torn last entry: %v", d)
	}
	b, offs = logBytes(keys...)
	b[offs[1]+6] ^= 1 // in the key of the second entry
	d := findDamage("00001.mem", b)
	if d == nil || d.offset != offs[1] || d.next != offs[2] || d.lost != 2 || d.maxSeq != 3 {
		t.Fatalf("flipped byte: %+v, want offset %d, next %d, 2 lost, max seq 3", d, offs[1], offs[2])
	}
	b, offs = logBytes(keys...)
	b[offs[1]+2] = 0x7f // the key length: the next entry is found by searching
	if d := findDamage("00001.mem", b); d == nil || d.offset != offs[1] || d.next != offs[2] {
		t.Fatalf("flipped length: %+v, want offset %d, next %d", d, offs[1], offs[2])
	}
	// A page of zeros after the last good entry, intact ones after it: the
	// trace of unsynced pages after a power loss, not damage.
	b, offs = logBytes(keys...)
	gap := append(append(b[:offs[2]:offs[2]], make([]byte, 2*zeroPage)...), b[offs[2]:]...)
	if d := findDamage("00001.mem", gap); d != nil {
		t.Fatalf("zero page before intact entries: %v", d)
	}
}
