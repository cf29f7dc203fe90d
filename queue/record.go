package queue

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"
)

// Event is one accepted event. Body is shared by every lane that delivers
// it and must never be modified after Append.
type Event struct {
	Seq         uint64
	ID          string
	Type        string
	ContentType string
	AcceptedAt  time.Time
	Body        []byte
}

// Size is an estimate of the memory the event holds, for byte budgets.
func (e *Event) Size() int { return len(e.Body) + len(e.ID) + len(e.Type) + len(e.ContentType) + 64 }

// appendEvent encodes an event record:
//
//	version(1) | uvarint len + id | uvarint len + type | uvarint len + content type |
//	accepted-at unix nanos (8, big endian) | body (rest)
func appendEvent(dst []byte, e *Event) []byte {
	dst = append(dst, recordVersion)
	dst = appendString(dst, e.ID)
	dst = appendString(dst, e.Type)
	dst = appendString(dst, e.ContentType)
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.AcceptedAt.UnixNano()))
	return append(dst, e.Body...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// decodeEvent decodes an event record. Body aliases b: pass a buffer the
// caller owns (Badger's ValueCopy), never one Badger may reuse.
func decodeEvent(seq uint64, b []byte) (*Event, error) {
	e := &Event{Seq: seq}
	if len(b) == 0 || b[0] != recordVersion {
		return nil, fmt.Errorf("event %d: record version: %w", seq, ErrCorrupt)
	}
	b = b[1:]
	var err error
	if e.ID, b, err = readString(b); err != nil {
		return nil, fmt.Errorf("event %d: id: %w", seq, err)
	}
	if e.Type, b, err = readString(b); err != nil {
		return nil, fmt.Errorf("event %d: type: %w", seq, err)
	}
	if e.ContentType, b, err = readString(b); err != nil {
		return nil, fmt.Errorf("event %d: content type: %w", seq, err)
	}
	if len(b) < 8 {
		return nil, fmt.Errorf("event %d: accepted-at: %w", seq, ErrCorrupt)
	}
	e.AcceptedAt = time.Unix(0, int64(binary.BigEndian.Uint64(b)))
	e.Body = b[8:]
	return e, nil
}

// eventType reads only the type of an event record, without allocating the
// rest, so a lane can skip events of other types cheaply.
func eventType(b []byte) ([]byte, error) {
	if len(b) == 0 || b[0] != recordVersion {
		return nil, ErrCorrupt
	}
	b = b[1:]
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return nil, ErrCorrupt
	}
	b = b[k+int(n):]
	n, k = binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return nil, ErrCorrupt
	}
	return b[k : k+int(n)], nil
}

func readString(b []byte) (string, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return "", nil, ErrCorrupt
	}
	return string(b[k : k+int(n)]), b[k+int(n):], nil
}

// Membership records which events a subscription is entitled to
// (invariant 7): those with From <= seq, and seq <= Until once it has Left.
// Snapshot is the subscription's configuration as the proxy encoded it, so a
// subscription removed from the config can still drain what it was owed.
type Membership struct {
	Subscription string
	From         uint64
	Left         bool   // removed from the config; drains up to Until, then retires
	Until        uint64 // last entitled seq, when Left
	Paused       string // why deliveries are paused at run time (410 Gone, an operator); "" when not
	Cursor       uint64 // every entitled event <= Cursor is resolved
	Snapshot     []byte
}

// Active reports whether the subscription still receives new events.
func (m Membership) Active() bool { return !m.Left }

type memberRecord struct {
	V        int             `json:"v"`
	From     uint64          `json:"from"`
	Left     bool            `json:"left,omitempty"`
	Until    uint64          `json:"until,omitempty"`
	Paused   string          `json:"paused,omitempty"`
	Snapshot json.RawMessage `json:"snapshot,omitempty"`
}

// Retry is a scheduled redelivery of one event to one subscription.
type Retry struct {
	Subscription string
	Seq          uint64
	Due          time.Time
	Attempt      int // attempts already made
	FirstAttempt time.Time
	LastStatus   int    // 0 when the last attempt got no answer
	LastError    string // short classification, never a payload or secret
	Replay       bool   // a replayed dead letter: its ACK is recorded on the dead letter
}

type retryRecord struct {
	V            int    `json:"v"`
	Attempt      int    `json:"attempt"`
	FirstAttempt int64  `json:"first_attempt"`
	LastStatus   int    `json:"last_status,omitempty"`
	LastError    string `json:"last_error,omitempty"`
	Replay       bool   `json:"replay,omitempty"`
}

// DeadLetter is a delivery that will not be tried again on its own. It
// keeps a copy of the body so it outlives compaction of the log, and can be
// replayed.
type DeadLetter struct {
	Subscription string    `json:"subscription"`
	Seq          uint64    `json:"seq"`
	EventID      string    `json:"event_id"`
	Type         string    `json:"type"`
	ContentType  string    `json:"content_type,omitempty"`
	AcceptedAt   time.Time `json:"accepted_at"`
	Reason       string    `json:"reason"`
	Attempts     int       `json:"attempts"`
	LastStatus   int       `json:"last_status,omitempty"`
	LastError    string    `json:"last_error,omitempty"`
	Response     string    `json:"response,omitempty"` // bounded snippet of the last response body
	DeadAt       time.Time `json:"dead_at"`
	Replays      int       `json:"replays,omitempty"`
	ReplayedAt   time.Time `json:"replayed_at,omitzero"`
	DeliveredAt  time.Time `json:"delivered_at,omitzero"` // when a replay was acknowledged
	Body         []byte    `json:"-"`
}

// appendDeadLetter encodes version(1) | uvarint len + JSON header | body.
func appendDeadLetter(dst []byte, d *DeadLetter) ([]byte, error) {
	h, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	dst = append(dst, recordVersion)
	dst = binary.AppendUvarint(dst, uint64(len(h)))
	dst = append(dst, h...)
	return append(dst, d.Body...), nil
}

func decodeDeadLetter(b []byte) (*DeadLetter, error) {
	if len(b) == 0 || b[0] != recordVersion {
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

// appendIDValue encodes a dedup index entry: seq:8 | type.
func appendIDValue(dst []byte, seq uint64, typ string) []byte {
	dst = binary.BigEndian.AppendUint64(dst, seq)
	return append(dst, typ...)
}

// decodeIDValue reads an entry of either format (format 1: seq only).
func decodeIDValue(v []byte) (seq uint64, typ []byte, err error) {
	if len(v) < 8 {
		return 0, nil, ErrCorrupt
	}
	return binary.BigEndian.Uint64(v), v[8:], nil
}
