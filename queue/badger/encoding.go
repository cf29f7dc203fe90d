package badger

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// appendEvent encodes an event record, in one of three layouts:
//
//	version 1: version(1) | uvarint len + id | uvarint len + type | uvarint len + content type |
//	           accepted-at unix nanos (8, big endian) | body (rest)
//	version 2: version(2) | id | type | content type | ordering key | traceparent | tracestate |
//	           accepted-at | body (each string uvarint len + bytes, as above)
//	version 4: version(4) | id | type | tenant | content type | ordering key | traceparent |
//	           tracestate | accepted-at | body
//	version 5: version(5) | id | type | tenant | content type | ordering key | traceparent |
//	           tracestate | cloudevent | accepted-at | body
//
// An event with no ordering key, trace context or tenant (the common case)
// is written as version 1, byte for byte what format 3 wrote, so it costs
// nothing more; version 2 is written for one with an ordering key or trace
// context (format 4), version 4 for one with a tenant (format 7), version 5
// for one posted as a CloudEvent (format 8). All start with id and type,
// and versions 4 and 5 have the tenant next, so eventTenantType reads a
// lane's selection without decoding the rest. (Version 3 is the group
// record, eventVersionGroup.)
func appendEvent(dst []byte, e *queue.Event) []byte {
	ext := e.OrderingKey != "" || e.TraceParent != "" || e.TraceState != ""
	ce := e.CloudEvent != ""
	switch {
	case ce:
		dst = append(dst, eventVersionCloudEvent)
	case e.Tenant != "":
		dst = append(dst, eventVersionTenant)
	case ext:
		dst = append(dst, eventVersionExt)
	default:
		dst = append(dst, recordVersion)
	}
	dst = appendString(dst, e.ID)
	dst = appendString(dst, e.Type)
	if e.Tenant != "" || ce {
		dst = appendString(dst, e.Tenant)
		ext = true // versions 4 and 5 always carry the extension fields
	}
	dst = appendString(dst, e.ContentType)
	if ext {
		dst = appendString(dst, e.OrderingKey)
		dst = appendString(dst, e.TraceParent)
		dst = appendString(dst, e.TraceState)
	}
	if ce {
		dst = appendString(dst, e.CloudEvent)
	}
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.AcceptedAt.UnixNano()))
	return append(dst, e.Body...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// eventVersion reports whether v leads a single event record.
func eventVersion(v byte) bool {
	return v == recordVersion || v == eventVersionExt || v == eventVersionTenant || v == eventVersionCloudEvent
}

// withTenant reports whether an event record of version v has the tenant
// field after its type.
func withTenant(v byte) bool { return v == eventVersionTenant || v == eventVersionCloudEvent }

// decodeEvent decodes an event record of any version (an event written
// before format 4 decodes with no ordering key or trace context, one
// before format 7 with no tenant, one before format 8 with no CloudEvent
// attributes). Body aliases b: pass a buffer the
// caller owns (Badger's ValueCopy), never one Badger may reuse.
func decodeEvent(seq uint64, b []byte) (*queue.Event, error) {
	e := &queue.Event{Seq: seq}
	if len(b) == 0 || !eventVersion(b[0]) {
		return nil, fmt.Errorf("event %d: record version: %w", seq, queue.ErrCorrupt)
	}
	v := b[0]
	ext := v != recordVersion
	b = b[1:]
	var err error
	if e.ID, b, err = readString(b); err != nil {
		return nil, fmt.Errorf("event %d: id: %w", seq, err)
	}
	if e.Type, b, err = readString(b); err != nil {
		return nil, fmt.Errorf("event %d: type: %w", seq, err)
	}
	if withTenant(v) {
		if e.Tenant, b, err = readString(b); err != nil {
			return nil, fmt.Errorf("event %d: tenant: %w", seq, err)
		}
	}
	if e.ContentType, b, err = readString(b); err != nil {
		return nil, fmt.Errorf("event %d: content type: %w", seq, err)
	}
	if ext {
		if e.OrderingKey, b, err = readString(b); err != nil {
			return nil, fmt.Errorf("event %d: ordering key: %w", seq, err)
		}
		if e.TraceParent, b, err = readString(b); err != nil {
			return nil, fmt.Errorf("event %d: traceparent: %w", seq, err)
		}
		if e.TraceState, b, err = readString(b); err != nil {
			return nil, fmt.Errorf("event %d: tracestate: %w", seq, err)
		}
	}
	if v == eventVersionCloudEvent {
		if e.CloudEvent, b, err = readString(b); err != nil {
			return nil, fmt.Errorf("event %d: cloudevent attributes: %w", seq, err)
		}
	}
	if len(b) < 8 {
		return nil, fmt.Errorf("event %d: accepted-at: %w", seq, queue.ErrCorrupt)
	}
	e.AcceptedAt = time.Unix(0, int64(binary.BigEndian.Uint64(b)))
	e.Body = b[8:]
	return e, nil
}

// eventTenantType reads only the tenant ("" for a platform event) and the
// type of an event record (of any version), without allocating the rest,
// so a lane can skip events it is not entitled to cheaply. Both alias b.
func eventTenantType(b []byte) (tenant, typ []byte, err error) {
	if len(b) == 0 || !eventVersion(b[0]) {
		return nil, nil, queue.ErrCorrupt
	}
	v := b[0]
	b = b[1:]
	if _, b, err = viewString(b); err != nil { // the id
		return nil, nil, err
	}
	if typ, b, err = viewString(b); err != nil {
		return nil, nil, err
	}
	if withTenant(v) {
		if tenant, _, err = viewString(b); err != nil {
			return nil, nil, err
		}
	}
	return tenant, typ, nil
}

// viewString is readString without the copy: the string's bytes alias b.
func viewString(b []byte) ([]byte, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return nil, nil, queue.ErrCorrupt
	}
	return b[k : k+int(n)], b[k+int(n):], nil
}

// eventIDType reads the id, type and tenant of an event record (of any
// version), for Open's indexing of the log's tail.
func eventIDType(b []byte) (id, typ, tenant string, err error) {
	if len(b) == 0 || !eventVersion(b[0]) {
		return "", "", "", queue.ErrCorrupt
	}
	v := b[0]
	if id, b, err = readString(b[1:]); err != nil {
		return "", "", "", err
	}
	if typ, b, err = readString(b); err != nil {
		return "", "", "", err
	}
	if withTenant(v) {
		tenant, _, err = readString(b)
	}
	return id, typ, tenant, err
}

func readString(b []byte) (string, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return "", nil, queue.ErrCorrupt
	}
	return string(b[k : k+int(n)]), b[k+int(n):], nil
}

type memberRecord struct {
	V        int             `json:"v"`
	From     uint64          `json:"from"`
	Left     bool            `json:"left,omitempty"`
	Until    uint64          `json:"until,omitempty"`
	Paused   string          `json:"paused,omitempty"`
	Snapshot json.RawMessage `json:"snapshot,omitempty"`
}

type retryRecord struct {
	V            int    `json:"v"`
	Attempt      int    `json:"attempt"`
	FirstAttempt int64  `json:"first_attempt"`
	LastStatus   int    `json:"last_status,omitempty"`
	LastError    string `json:"last_error,omitempty"`
	Replay       bool   `json:"replay,omitempty"`
}

// Dead letters are encoded by queue.AppendDeadLetter, the same bytes in
// both backends.
var (
	appendDeadLetter = queue.AppendDeadLetter
	decodeDeadLetter = queue.DecodeDeadLetter
)

// appendIDValue encodes a dedup index entry: seq:8 | type, and for an
// event of a tenant (format 7) | 0x00 | tenant. Types never hold a NUL
// (ingest refuses it), so the separator is unambiguous.
func appendIDValue(dst []byte, seq uint64, typ, tenant string) []byte {
	dst = binary.BigEndian.AppendUint64(dst, seq)
	dst = append(dst, typ...)
	if tenant != "" {
		dst = append(append(dst, 0), tenant...)
	}
	return dst
}

// decodeIDValue reads an entry of any format (format 1: seq only; before
// format 7, no tenant).
func decodeIDValue(v []byte) (seq uint64, typ, tenant []byte, err error) {
	if len(v) < 8 {
		return 0, nil, nil, queue.ErrCorrupt
	}
	typ = v[8:]
	if i := bytes.IndexByte(typ, 0); i >= 0 {
		typ, tenant = typ[:i], typ[i+1:]
	}
	return binary.BigEndian.Uint64(v), typ, tenant, nil
}

// A group record (format 6) holds several events of one batch, with
// consecutive seqs, under the key of the last:
//
//	version(3) | count (2, big endian) | count × (uvarint len + event record)
//
// each event record as appendEvent writes it. An event alone in its batch
// part is written as its own record, as before.
const groupHeader = 3

// records walks the events of the record under key seq (a single event or
// a group), calling fn with each seq and event record in seq order; fn's
// record aliases v.
func records(seq uint64, v []byte, fn func(seq uint64, rec []byte) error) error {
	if len(v) == 0 || v[0] != eventVersionGroup {
		return fn(seq, v)
	}
	n, err := groupCount(seq, v)
	if err != nil {
		return err
	}
	b := v[groupHeader:]
	for s := seq - n + 1; s <= seq; s++ {
		l, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < l {
			return fmt.Errorf("event %d in group %d: %w", s, seq, queue.ErrCorrupt)
		}
		if err := fn(s, b[k:k+int(l)]); err != nil {
			return err
		}
		b = b[k+int(l):]
	}
	if len(b) != 0 {
		return fmt.Errorf("group %d: %d bytes past its events: %w", seq, len(b), queue.ErrCorrupt)
	}
	return nil
}

// firstSeq is the first seq of the record under key seq.
func firstSeq(seq uint64, v []byte) (uint64, error) {
	if len(v) == 0 || v[0] != eventVersionGroup {
		return seq, nil
	}
	n, err := groupCount(seq, v)
	return seq - n + 1, err
}

func groupCount(seq uint64, v []byte) (uint64, error) {
	if len(v) < groupHeader {
		return 0, fmt.Errorf("group %d: header: %w", seq, queue.ErrCorrupt)
	}
	n := uint64(binary.BigEndian.Uint16(v[1:]))
	if n < 2 || n > seq {
		return 0, fmt.Errorf("group %d of %d events: %w", seq, n, queue.ErrCorrupt)
	}
	return n, nil
}

// groupWriter builds a group record in place at the end of a buffer.
type groupWriter struct {
	start int    // offset of the group's header in the buffer
	n     int    // events in it
	only  [2]int // offsets of the first event's record, while it is alone
}

// begin starts a group at the end of dst.
func (g *groupWriter) begin(dst []byte) []byte {
	g.start, g.n = len(dst), 0
	return append(dst, eventVersionGroup, 0, 0)
}

// add appends ev as the group's next event.
func (g *groupWriter) add(dst []byte, ev *queue.Event) []byte {
	lenAt := len(dst)
	dst = appendEvent(append(dst, make([]byte, binary.MaxVarintLen32)...), ev)
	// The length goes before the record: write the record after room
	// for the longest uvarint, then close the gap.
	l := len(dst) - lenAt - binary.MaxVarintLen32
	var lb [binary.MaxVarintLen32]byte
	k := binary.PutUvarint(lb[:], uint64(l))
	copy(dst[lenAt+k:], dst[lenAt+binary.MaxVarintLen32:])
	dst = dst[:lenAt+k+l]
	copy(dst[lenAt:], lb[:k])
	if g.n == 0 {
		g.only = [2]int{lenAt + k, len(dst)}
	}
	g.n++
	return dst
}

// addRecord appends an event record as the group's next event.
func (g *groupWriter) addRecord(dst []byte, rec []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(rec)))
	if g.n == 0 {
		g.only = [2]int{len(dst), len(dst) + len(rec)}
	}
	g.n++
	return append(dst, rec...)
}

// value is the record to write: the group, or the one event's own record.
func (g *groupWriter) value(dst []byte) []byte {
	if g.n == 1 {
		return dst[g.only[0]:g.only[1]:g.only[1]]
	}
	binary.BigEndian.PutUint16(dst[g.start+1:], uint16(g.n))
	return dst[g.start:len(dst):len(dst)]
}
