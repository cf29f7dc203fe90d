package badger

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/sluicehq/sluice/queue"
)

// TestJoinRecordMatchesMarshal: a joining member's record is the bytes
// json.Marshal gives for memberRecord whenever the snapshot is compact
// JSON as the proxy encodes it, reads back to the same membership, and an
// invalid snapshot is refused as json.Marshal refused it.
func TestJoinRecordMatchesMarshal(t *testing.T) {
	snap, err := json.Marshal(map[string]any{"url": "https://a.example/x?y=1", "types": []string{"t"}, "headers": map[string]string{"X": "<&>"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []queue.Membership{
		{From: 1, Snapshot: snap},
		{From: 1 << 60, Paused: `gone "410"` + "\n<br>", Snapshot: snap},
		{From: 7},
		{From: 0, Snapshot: []byte(`{}`)},
	} {
		got, err := joinRecord(m)
		if err != nil {
			t.Fatalf("%+v: %v", m, err)
		}
		want, err := json.Marshal(memberRecord{V: recordVersion, From: m.From, Paused: m.Paused, Snapshot: m.Snapshot})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("joinRecord\n got %s\nwant %s", got, want)
		}
		var rec memberRecord
		if err := json.Unmarshal(got, &rec); err != nil || rec.From != m.From || rec.Paused != m.Paused || !bytes.Equal(rec.Snapshot, m.Snapshot) {
			t.Errorf("%s reads back as %+v, %v", got, rec, err)
		}
	}
	for _, bad := range []string{`{`, `{"a":1}x`, `nope`} {
		if _, err := joinRecord(queue.Membership{Snapshot: []byte(bad)}); err == nil {
			t.Errorf("snapshot %q: no error", bad)
		}
	}
}
