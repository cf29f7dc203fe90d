package queue

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// deadLetterVersion is the first byte of an encoded dead letter.
const deadLetterVersion = 1

// AppendDeadLetter encodes d as both backends store it, so a letter's
// bytes mean the same in a Badger data dir and a JetStream bucket:
// version(1) | uvarint length + JSON header | body copy. Fields added to
// DeadLetter later (the ordering key and trace context) are omitted from
// the header when empty, and a letter written before them decodes with
// them empty, so the version stays 1.
func AppendDeadLetter(dst []byte, d *DeadLetter) ([]byte, error) {
	h, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	dst = append(dst, deadLetterVersion)
	dst = binary.AppendUvarint(dst, uint64(len(h)))
	dst = append(dst, h...)
	return append(dst, d.Body...), nil
}

// DecodeDeadLetter reads what AppendDeadLetter wrote; the body aliases b.
// Damage is ErrCorrupt.
func DecodeDeadLetter(b []byte) (*DeadLetter, error) {
	if len(b) == 0 || b[0] != deadLetterVersion {
		return nil, fmt.Errorf("dead letter: record version: %w", ErrCorrupt)
	}
	n, k := binary.Uvarint(b[1:])
	if k <= 0 || uint64(len(b)-1-k) < n {
		return nil, fmt.Errorf("dead letter: header length: %w", ErrCorrupt)
	}
	d := &DeadLetter{}
	if err := json.Unmarshal(b[1+k:1+k+int(n)], d); err != nil {
		return nil, fmt.Errorf("dead letter: %v: %w", err, ErrCorrupt)
	}
	d.Body = b[1+k+int(n):]
	return d, nil
}
