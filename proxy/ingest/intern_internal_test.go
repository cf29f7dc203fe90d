package ingest

import (
	"strconv"
	"sync"
	"testing"
	"unsafe"

	"github.com/oklog/ulid/v2"
)

// TestInternTable: equal bytes give the one string, distinct bytes their
// own; past maxInterned distinct values a new one still gets its right
// value (a fresh string), and what was interned stays so. Concurrent use
// is checked under -race.
func TestInternTable(t *testing.T) {
	var tab internTable
	a := tab.get([]byte("geofence.enter"))
	b := tab.get([]byte("geofence.enter"))
	if a != "geofence.enter" || unsafe.StringData(a) != unsafe.StringData(b) {
		t.Fatalf("got %q and %q (%p, %p), want one string", a, b, unsafe.StringData(a), unsafe.StringData(b))
	}
	if c := tab.get([]byte("geofence.exit")); c != "geofence.exit" {
		t.Fatalf("got %q", c)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2 * maxInterned {
				v := "t" + strconv.Itoa((i+g*37)%(2*maxInterned))
				if got := tab.get([]byte(v)); got != v {
					t.Errorf("get(%q) = %q", v, got)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := len(*tab.m.Load()); n != maxInterned {
		t.Errorf("%d values interned, want the bound %d", n, maxInterned)
	}
	if again := tab.get([]byte("geofence.enter")); unsafe.StringData(again) != unsafe.StringData(a) {
		t.Errorf("an interned value was made anew once the table filled")
	}
	if got := tab.get([]byte("never.seen")); got != "never.seen" {
		t.Errorf("past the bound: got %q", got)
	}
}

// TestInternTableLookupAllocatesNothing: the lookup of an interned value
// makes no string.
func TestInternTableLookupAllocatesNothing(t *testing.T) {
	var tab internTable
	tab.get([]byte("application/json"))
	b := []byte("application/json")
	if n := testing.AllocsPerRun(100, func() { tab.get(b) }); n != 0 {
		t.Errorf("%.0f allocations per lookup, want 0", n)
	}
}

// TestIngestIDSource: generated ids are valid ULIDs of the current time,
// distinct, and each costs one allocation, the string.
func TestIngestIDSource(t *testing.T) {
	var g idSource
	seen := map[string]bool{}
	before := ulid.Now()
	for range 10_000 {
		id := g.next()
		u, err := ulid.ParseStrict(id)
		if err != nil {
			t.Fatalf("%q: %v", id, err)
		}
		if u.Time() < before-1000 || u.Time() > ulid.Now()+1000 {
			t.Fatalf("%q: time %d, now %d", id, u.Time(), ulid.Now())
		}
		if seen[id] {
			t.Fatalf("%q generated twice", id)
		}
		seen[id] = true
	}
	var sink string
	if n := testing.AllocsPerRun(1000, func() { sink = g.next() }); n != 1 || sink == "" {
		t.Errorf("%.0f allocations per id, want 1 (the string)", n)
	}
}
