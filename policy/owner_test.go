package policy_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/policy"
)

func keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("sub-%d", i)
	}
	return ks
}

func owners(ks, nodes []string) map[string]string {
	m := make(map[string]string, len(ks))
	for _, k := range ks {
		m[k] = policy.Owner(k, nodes)
	}
	return m
}

// The owners are pinned: every node of a fleet must compute the same ones,
// whatever version it runs, so the hash must never change.
func TestOwnerGolden(t *testing.T) {
	nodes := []string{"pod-a", "pod-b", "pod-c"}
	for _, tc := range []struct{ key, want string }{
		{"billing", "pod-a"},
		{"orders", "pod-b"},
		{"search.v2", "pod-c"},
		{"a", "pod-c"},
		{"tenant-42", "pod-a"},
	} {
		if got := policy.Owner(tc.key, nodes); got != tc.want {
			t.Errorf("Owner(%q, %v) = %q, want %q", tc.key, nodes, got, tc.want)
		}
	}
}

func TestOwnerEdgeCases(t *testing.T) {
	if got := policy.Owner("billing", nil); got != "" {
		t.Errorf("Owner with no nodes = %q, want empty", got)
	}
	if got := policy.Owner("billing", []string{"only"}); got != "only" {
		t.Errorf("Owner with one node = %q, want only", got)
	}
	if got := policy.Owner("", []string{"x", "y"}); got == "" {
		t.Error("Owner of the empty key chose nobody")
	}
}

// The order of the nodes and repeated entries do not matter.
func TestOwnerDeterministic(t *testing.T) {
	ks := keys(2000)
	nodes := []string{"n1", "n2", "n3", "n4", "n5"}
	want := owners(ks, nodes)
	shuffled := []string{"n4", "n2", "n5", "n1", "n3", "n2", "n4"}
	for k, o := range owners(ks, shuffled) {
		if want[k] != o {
			t.Fatalf("Owner(%q) = %q with %v, %q with %v", k, o, shuffled, want[k], nodes)
		}
	}
}

func TestOwnerDistribution(t *testing.T) {
	ks := keys(20000)
	for _, nodes := range [][]string{
		{"a", "b"},
		{"a", "b", "c"},
		{"pod-0", "pod-1", "pod-2", "pod-3", "pod-4", "pod-5", "pod-6"},
		{"sluice-7f9c-1", "sluice-7f9c-2", "sluice-7f9c-3", "sluice-7f9c-4"}, // ids sharing a long prefix
	} {
		count := map[string]int{}
		for _, o := range owners(ks, nodes) {
			count[o]++
		}
		fair := len(ks) / len(nodes)
		for _, n := range nodes {
			// ±10% of the fair share: with 20,000 keys a fair hash stays
			// within about ±3% (several standard deviations).
			if c := count[n]; c < fair*9/10 || c > fair*11/10 {
				t.Errorf("nodes %v: %s owns %d of %d keys, fair share %d", nodes, n, c, len(ks), fair)
			}
		}
	}
}

// A leaving node's keys move, each to some survivor; no other key moves.
func TestOwnerRemovingNodeMovesOnlyItsKeys(t *testing.T) {
	ks := keys(10000)
	nodes := []string{"a", "b", "c", "d"}
	before := owners(ks, nodes)
	after := owners(ks, []string{"a", "b", "d"}) // c left
	moved := 0
	for _, k := range ks {
		if before[k] == "c" {
			moved++
			if after[k] == "c" || after[k] == "" {
				t.Fatalf("%s still on %q after c left", k, after[k])
			}
			continue
		}
		if after[k] != before[k] {
			t.Fatalf("%s moved from %s to %s although its owner stayed", k, before[k], after[k])
		}
	}
	if moved == 0 {
		t.Fatal("c owned nothing")
	}
}

// A joining node takes only keys it now wins, about 1/N of them.
func TestOwnerJoiningNodeTakesOnlyItsShare(t *testing.T) {
	ks := keys(10000)
	nodes := []string{"a", "b", "c"}
	before := owners(ks, nodes)
	after := owners(ks, append(slices.Clone(nodes), "d"))
	taken := 0
	for _, k := range ks {
		if after[k] != before[k] {
			if after[k] != "d" {
				t.Fatalf("%s moved from %s to %s, not to the new node", k, before[k], after[k])
			}
			taken++
		}
	}
	if fair := len(ks) / 4; taken < fair*9/10 || taken > fair*11/10 {
		t.Errorf("new node took %d of %d keys, fair share %d", taken, len(ks), fair)
	}
}

func BenchmarkOwner(b *testing.B) {
	nodes := []string{"pod-0", "pod-1", "pod-2", "pod-3", "pod-4"}
	for b.Loop() {
		policy.Owner("subscription-billing", nodes)
	}
}
