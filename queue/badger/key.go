package badger

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// Key prefixes. One byte of prefix plus '/' keeps the layout readable in a
// Badger dump and lets each record family be scanned on its own.
var (
	prefixEvent      = []byte("e/") // e/<seq>                      → event record
	prefixID         = []byte("i/") // i/<event id>                 → seq | type (TTL = dedup window; dedup.go)
	prefixMember     = []byte("s/") // s/<subscription>             → membership record
	prefixCursor     = []byte("c/") // c/<subscription>             → cursor (8 bytes)
	prefixRetry      = []byte("r/") // r/<subscription>/<due><seq>  → retry record
	prefixDeadLetter = []byte("d/") // d/<subscription>/<seq>       → dead-letter record
	prefixRetryIndex = []byte("q/") // q/<subscription>/<seq>       → due of its retry record (8 bytes)
	prefixRecord     = []byte("a/") // a/<record key>               → the admin API's record (records.go)
	keyHead          = []byte("m/head")
	keyLow           = []byte("m/low")
	keyIndexed       = []byte("m/indexed")
	keyFormat        = []byte("m/format")
)

// formatVersion is written into a new data dir, and over an older one on
// open; a dir written by a newer sluice is refused rather than misread.
const formatVersion = 8

// Format history. A data dir of an older format is upgraded on open (its
// m/format rewritten), so an older sluice then refuses it instead of
// misreading it.
//
//	1  first release
//	2  i/<id> values carry the event type after the seq (seq:8 | type), so
//	   the completion ledger knows which type-filtered subscriptions an
//	   event was for after the log compacted it. Format-1 entries (seq
//	   only) stay readable until their dedup TTL ends.
//	3  q/<sub>/<seq> indexes each retry record by (subscription, seq), so
//	   RetryOf is a point lookup rather than a scan of the schedule. Open
//	   builds the index of an older dir from its r/ keys.
//	4  an e/<seq> record may be of version 2 (eventVersionExt), carrying
//	   the event's ordering key and trace context. Events
//	   without them are still written as version 1, so an older dir needs
//	   no rewrite; an older sluice must refuse the dir, as it would read a
//	   version-2 record as damage.
//	5  i/<id> entries are written after their events, by the indexer
//	   (dedup.go), and m/indexed says how far: the events past it have
//	   none yet, and Open writes them. A format-4 dir has every entry
//	   (m/indexed absent: the head); a format-4 sluice must refuse a
//	   format-5 dir, as it would not deduplicate the events past the mark.
//	6  e/<seq> may be a group record (eventVersionGroup): the events of
//	   one batch, consecutive, up to groupMaxBytes, under the key of the
//	   last, so that a batch costs Badger one entry rather than one per
//	   event. Readers seek to the first key at or after a seq. Compact
//	   deletes groups whole, rewrites the one that straddles its bound
//	   without the events below it, and copies the events retries hold out
//	   into records of their own. Older records are read as they are.
//	7  an e/<seq> record may be of version 4 (eventVersionTenant), carrying
//	   the tenant the event belongs to (the tenant rule, docs/security.md). Platform
//	   events are written as before, so an older dir needs no rewrite; an
//	   older sluice must refuse the dir, as it would read a version-4
//	   record as damage and, worse, deliver a tenant's event to everyone.
//	8  an e/<seq> record may be of version 5 (eventVersionCloudEvent),
//	   carrying the event's CloudEvents attributes after the version-4
//	   fields. Other events are written as before, so an older dir needs
//	   no rewrite; an older sluice must refuse the dir, as it would read a
//	   version-5 record as damage.

// recordVersion leads every value we encode so a record format can evolve.
const recordVersion = 1

// eventVersionExt leads an event record that carries an ordering key or
// trace context (encoding.go appendEvent; format 4).
const eventVersionExt = 2

// eventVersionGroup leads a group record: several events of one batch in
// one entry (encoding.go records; format 6).
const eventVersionGroup = 3

// eventVersionTenant leads an event record that belongs to a tenant
// (encoding.go appendEvent; format 7).
const eventVersionTenant = 4

// eventVersionCloudEvent leads an event record posted as a CloudEvent: the
// version-4 layout (tenant empty for a platform event) with its
// attributes after the trace context (encoding.go appendEvent; format 8).
const eventVersionCloudEvent = 5

func eventKey(seq uint64) []byte {
	k := make([]byte, 2+8)
	copy(k, prefixEvent)
	binary.BigEndian.PutUint64(k[2:], seq)
	return k
}

func seqFromEventKey(k []byte) uint64 { return binary.BigEndian.Uint64(k[2:]) }

func idKey(id string) []byte { return append(append([]byte(nil), prefixID...), id...) }

func memberKey(sub string) []byte { return append(append([]byte(nil), prefixMember...), sub...) }

func cursorKey(sub string) []byte { return append(append([]byte(nil), prefixCursor...), sub...) }

// retryPrefix is r/<sub>/ : subscription ids cannot contain '/', so one
// lane's retries form a contiguous range ordered by due time. A global
// r/<due>/<sub>/<seq> with one scanner was the other choice; keying by
// subscription first lets each lane read only its own due retries when it
// has free slots, so a black hole with a million scheduled retries never
// slows the scan of a healthy lane.
func retryPrefix(sub string) []byte {
	k := make([]byte, 0, 2+len(sub)+1)
	k = append(k, prefixRetry...)
	k = append(k, sub...)
	return append(k, '/')
}

func retryKey(sub string, due time.Time, seq uint64) []byte {
	return retryKeyAt(sub, dueNanos(due), seq)
}

// dueNanos is a due time as retry keys order it: unix nanos, never negative.
func dueNanos(due time.Time) uint64 { return uint64(max(due.UnixNano(), 0)) }

func retryKeyAt(sub string, due, seq uint64) []byte {
	k := retryPrefix(sub)
	k = binary.BigEndian.AppendUint64(k, due)
	return binary.BigEndian.AppendUint64(k, seq)
}

// retryIndexKey is q/<sub>/<seq>; its value is the due (dueNanos) of the
// retry record r/<sub>/<due><seq>. A lane has at most one retry of a seq
// in the schedule, so the pair names it.
func retryIndexKey(sub string, seq uint64) []byte {
	k := make([]byte, 0, 2+len(sub)+1+8)
	k = append(k, prefixRetryIndex...)
	k = append(k, sub...)
	k = append(k, '/')
	return binary.BigEndian.AppendUint64(k, seq)
}

func parseRetryKey(sub string, k []byte) (due time.Time, seq uint64, err error) {
	p := len(prefixRetry) + len(sub) + 1
	if len(k) != p+16 {
		return time.Time{}, 0, fmt.Errorf("retry key of %d bytes: %w", len(k), queue.ErrCorrupt)
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(k[p:]))), binary.BigEndian.Uint64(k[p+8:]), nil
}

func deadLetterPrefix(sub string) []byte {
	k := make([]byte, 0, 2+len(sub)+1)
	k = append(k, prefixDeadLetter...)
	k = append(k, sub...)
	return append(k, '/')
}

func deadLetterKey(sub string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(deadLetterPrefix(sub), seq)
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
