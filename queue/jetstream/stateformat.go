package jetstream

// The delivery state's key names and the encodings of their values (the
// layout is in state.go's file comment).

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// Keys.

func memberKey(sub string) string { return keyMember + sub }
func cursorKey(sub string) string { return keyCursor + sub }
func retryKey(sub string, seq uint64) string {
	return keyRetry + sub + "." + strconv.FormatUint(seq, 10)
}
func deadKey(sub string, seq uint64) string {
	return keyDead + sub + "." + strconv.FormatUint(seq, 10)
}

// splitSeqKey splits <prefix><sub>.<seq>.
func splitSeqKey(prefix, key string) (sub string, seq uint64, ok bool) {
	if !strings.HasPrefix(key, prefix) {
		return "", 0, false
	}
	rest := key[len(prefix):]
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(rest[i+1:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return rest[:i], seq, true
}

// checkSub refuses a subscription id that cannot be a key: every part
// between dots must be non-empty (NATS subject tokens), and the config's
// pattern allows "a..b" and "a.".
func checkSub(sub string) error {
	if sub == "" || len(sub) > 64 || sub[0] == '.' || sub[len(sub)-1] == '.' || strings.Contains(sub, "..") {
		return fmt.Errorf("subscription id %q: fleet mode needs ids of 1 to 64 characters whose dots separate non-empty parts", sub)
	}
	for i := 0; i < len(sub); i++ {
		c := sub[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("subscription id %q: fleet mode allows a-z, 0-9, '.', '_' and '-'", sub)
		}
	}
	return nil
}

// Encodings.

type memberRecord struct {
	V        int             `json:"v"`
	From     uint64          `json:"from"`
	Left     bool            `json:"left,omitempty"`
	Until    uint64          `json:"until,omitempty"`
	Paused   string          `json:"paused,omitempty"`
	Snapshot json.RawMessage `json:"snapshot,omitempty"`
}

func encodeMember(m queue.Membership) ([]byte, error) {
	return json.Marshal(memberRecord{V: stateRecordVersion, From: m.From, Left: m.Left, Until: m.Until, Paused: m.Paused, Snapshot: m.Snapshot})
}

// decodeMember decodes a membership; its Cursor is From-1 (the caller
// reads the cursor key).
func decodeMember(sub string, v []byte) (queue.Membership, error) {
	var r memberRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return queue.Membership{}, fmt.Errorf("membership %s: %v: %w", sub, err, queue.ErrCorrupt)
	}
	m := queue.Membership{Subscription: sub, From: r.From, Left: r.Left, Until: r.Until, Paused: r.Paused, Snapshot: []byte(r.Snapshot)}
	if m.From > 0 {
		m.Cursor = m.From - 1
	}
	return m, nil
}

func encodeCursor(c uint64) []byte { return strconv.AppendUint(nil, c, 10) }

func decodeCursor(sub string, v []byte) (uint64, error) {
	c, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cursor %s: %q: %w", sub, v, queue.ErrCorrupt)
	}
	return c, nil
}

type retryRecord struct {
	V            int    `json:"v"`
	Due          int64  `json:"due"`
	Attempt      int    `json:"attempt"`
	FirstAttempt int64  `json:"first_attempt"`
	LastStatus   int    `json:"last_status,omitempty"`
	LastError    string `json:"last_error,omitempty"`
	Replay       bool   `json:"replay,omitempty"`
}

// dueNanos is a due time as the schedule orders it: unix nanos, never
// negative (as in the Badger backend).
func dueNanos(t time.Time) int64 { return max(t.UnixNano(), 0) }

func encodeRetry(r queue.Retry) ([]byte, error) {
	return json.Marshal(retryRecord{V: stateRecordVersion, Due: dueNanos(r.Due), Attempt: r.Attempt, FirstAttempt: r.FirstAttempt.UnixNano(),
		LastStatus: r.LastStatus, LastError: r.LastError, Replay: r.Replay})
}

func decodeRetry(sub string, seq uint64, v []byte) (queue.Retry, error) {
	var r retryRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return queue.Retry{}, fmt.Errorf("retry %s/%d: %v: %w", sub, seq, err, queue.ErrCorrupt)
	}
	return queue.Retry{Subscription: sub, Seq: seq, Due: time.Unix(0, r.Due), Attempt: r.Attempt, FirstAttempt: time.Unix(0, r.FirstAttempt),
		LastStatus: r.LastStatus, LastError: r.LastError, Replay: r.Replay}, nil
}

// encodeDeadLetter is queue.AppendDeadLetter into a buffer of its own:
// the same bytes as Badger's.
func encodeDeadLetter(d *queue.DeadLetter) ([]byte, error) {
	return queue.AppendDeadLetter(make([]byte, 0, 1+binary.MaxVarintLen64+256+len(d.Body)), d)
}

var decodeDeadLetter = queue.DecodeDeadLetter
