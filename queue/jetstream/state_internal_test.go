package jetstream

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// Hooks for the state tests of package jetstream_test (state_test.go).

// RetentionFloor is s.retentionFloor.
func RetentionFloor(s *Store) (uint64, error) { return s.retentionFloor() }

// FenceWith makes s fence its state writes with fn instead of its leases
// (a stale revision: a node that lost its lease without knowing it yet).
func FenceWith(s *Store, fn func(sub string) (subject string, rev uint64, fenced bool, done func(), err error)) {
	s.st.fenceFn = fn
}

// LeaseSubject is the subject of sub's lease.
func LeaseSubject(s *Store, sub string) string { return s.statePfx + "lease." + sub }

// StateMsg reads key's last message in <S>_STATE, markers included.
func StateMsg(s *Store, key string) (*jetstream.RawStreamMsg, error) {
	return s.st.stream.GetLastMsgForSubject(context.Background(), s.statePfx+key)
}

// CutConnection closes s's connection to NATS behind its back, as a
// network failure would (the store stays open).
func CutConnection(s *Store) { s.nc.Close() }

// The schedule's sorted chunks against a sorted slice, through enough
// inserts and removes to split and empty chunks many times.
func TestChunks(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var cs chunks
	var want []slot
	has := map[slot]bool{}
	for i := range 20000 {
		k := slot{due: int64(r.IntN(300)), seq: uint64(r.IntN(3000))}
		if i%3 == 2 && len(want) > 0 {
			k = want[r.IntN(len(want))] // remove one that is there
		}
		if has[k] {
			cs.remove(k)
			delete(has, k)
			j, _ := slices.BinarySearchFunc(want, k, cmpSlot)
			want = slices.Delete(want, j, j+1)
		} else {
			cs.insert(k)
			has[k] = true
			j, _ := slices.BinarySearchFunc(want, k, cmpSlot)
			want = slices.Insert(want, j, k)
		}
		cs.remove(slot{due: -1}) // absent: no change
		if i%997 == 0 || i == 19999 {
			var got []slot
			cs.ascend(func(k slot) bool { got = append(got, k); return true })
			if !slices.Equal(got, want) {
				t.Fatalf("after %d operations: %d slots in order %v…, want %d", i+1, len(got), got[:min(5, len(got))], len(want))
			}
			for _, ch := range cs.c {
				if len(ch) == 0 || len(ch) > chunkMax {
					t.Fatalf("after %d operations: a chunk of %d slots", i+1, len(ch))
				}
			}
		}
	}
	// Drain it all.
	for _, k := range slices.Clone(want) {
		cs.remove(k)
	}
	if len(cs.c) != 0 {
		t.Fatalf("%d chunks left after removing every slot", len(cs.c))
	}
}

func cmpSlot(a, b slot) int {
	switch {
	case a.less(b):
		return -1
	case b.less(a):
		return 1
	}
	return 0
}

func TestSplitSeqKey(t *testing.T) {
	for _, tc := range []struct {
		key, sub string
		seq      uint64
		ok       bool
	}{
		{"retry.s.12", "s", 12, true},
		{"retry.s.1.8", "s.1", 8, true},
		{"retry.a-b_c.0", "a-b_c", 0, true},
		{"retry.s", "", 0, false},
		{"retry..5", "", 0, false},
		{"retry.s.x", "", 0, false},
		{"dead.s.5", "", 0, false},
	} {
		sub, seq, ok := splitSeqKey(keyRetry, tc.key)
		if sub != tc.sub || seq != tc.seq || ok != tc.ok {
			t.Errorf("splitSeqKey(%q) = %q %d %v, want %q %d %v", tc.key, sub, seq, ok, tc.sub, tc.seq, tc.ok)
		}
	}
}

func TestCheckSub(t *testing.T) {
	for _, sub := range []string{"a", "s.1", "a-b_c.d9", "x123456789012345678901234567890123456789012345678901234567890123"} {
		if err := checkSub(sub); err != nil {
			t.Errorf("checkSub(%q): %v", sub, err)
		}
	}
	for _, sub := range []string{"", "a..b", "a.", ".a", "A", "a b", "a*", "a>", "x1234567890123456789012345678901234567890123456789012345678901234"} {
		if err := checkSub(sub); err == nil {
			t.Errorf("checkSub(%q) accepted", sub)
		}
	}
}
