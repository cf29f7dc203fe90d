package queuetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// The contract of queue.Log: appends, reads, dedup, group commit.

func testAppendReadReopen(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	if h := s.Head(); h != 0 {
		t.Fatalf("head of a new store = %d", h)
	}
	for i := range 10 {
		seq, dup := MustAppend(t, s, Event(fmt.Sprintf("ev-%d", i), "t.created", fmt.Sprintf(`{"n":%d}`, i)))
		if seq != uint64(i+1) || dup {
			t.Fatalf("append %d: seq %d dup %v, want seq %d", i, seq, dup, i+1)
		}
	}
	s = e.reopen(t, s, Options{})
	if h := s.Head(); h != 10 {
		t.Fatalf("head after reopen = %d, want 10", h)
	}
	evs, next, err := s.Events(1, s.Head(), 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 10 || next != 11 {
		t.Fatalf("read %d events, next %d; want 10, 11", len(evs), next)
	}
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) || ev.ID != fmt.Sprintf("ev-%d", i) || string(ev.Body) != fmt.Sprintf(`{"n":%d}`, i) || ev.Type != "t.created" || ev.ContentType != "application/json" || ev.AcceptedAt.IsZero() {
			t.Fatalf("event %d = %+v", i, ev)
		}
	}
	ev, err := s.Event(4)
	if err != nil || ev.ID != "ev-3" || string(ev.Body) != `{"n":3}` {
		t.Fatalf("Event(4) = %+v, %v", ev, err)
	}
	if _, err := s.Event(11); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Event past the head: %v, want ErrNotFound", err)
	}
}

func testEventsFilterAndBounds(t *testing.T, e *env) {
	s := e.open(t, Options{})
	for i := range 20 {
		typ := "a"
		if i%4 == 0 {
			typ = "b"
		}
		MustAppend(t, s, Event(fmt.Sprint(i), typ, "x"))
	}
	isB := func(_, typ []byte) bool { return string(typ) == "b" }
	evs, next, err := s.Events(1, 20, 3, isB)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 || evs[0].Seq != 1 || evs[1].Seq != 5 || evs[2].Seq != 9 || next != 10 {
		t.Fatalf("got %d events (next %d): %v", len(evs), next, evs)
	}
	// Bounded by `to`.
	evs, next, _ = s.Events(10, 16, 10, isB)
	if len(evs) != 1 || evs[0].Seq != 13 || next != 17 {
		t.Fatalf("to-bounded read: %d events, next %d", len(evs), next)
	}
	if n, err := s.CountEvents(1, 20, isB, 100); err != nil || n != 5 {
		t.Fatalf("CountEvents of type b = %d, %v; want 5", n, err)
	}
	if n, err := s.CountEvents(1, 20, nil, 100); err != nil || n != 20 {
		t.Fatalf("CountEvents of all = %d, %v; want 20", n, err)
	}
	// It stops once the count passes limit.
	if n, err := s.CountEvents(1, 20, nil, 3); err != nil || n <= 3 || n > 20 {
		t.Fatalf("CountEvents with limit 3 = %d, %v; want more than 3", n, err)
	}
}

func testDedupWithinWindow(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	seq, _ := MustAppend(t, s, Event("same", "t.a", "first"))
	seq2, dup := MustAppend(t, s, Event("same", "t.a", "second"))
	if !dup || seq2 != seq {
		t.Fatalf("second append: seq %d dup %v, want seq %d dup true", seq2, dup, seq)
	}
	// Concurrent appends of one id land in one batch or several; either way one seq.
	var wg sync.WaitGroup
	seqs := make([]uint64, 32)
	for i := range seqs {
		wg.Go(func() { seqs[i], _ = MustAppend(t, s, Event("burst", "t.b", "x")) })
	}
	wg.Wait()
	for _, q := range seqs {
		if q != seqs[0] {
			t.Fatalf("concurrent duplicates got different seqs: %v", seqs)
		}
	}
	if s.Head() != 2 {
		t.Fatalf("head = %d, want 2 (one event per id)", s.Head())
	}
	ev, err := s.Event(seq)
	if err != nil || string(ev.Body) != "first" {
		t.Fatalf("original body replaced: %v %v", ev, err)
	}
	if got, typ, _, err := s.Lookup("burst"); err != nil || got != seqs[0] || typ != "t.b" {
		t.Fatalf("lookup = %d %q, %v; want %d t.b", got, typ, err, seqs[0])
	}
	if _, _, _, err := s.Lookup("never"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("lookup of an unknown id: %v, want ErrNotFound", err)
	}
	// Remembered across a reopen.
	s = e.reopen(t, s, Options{})
	if seq3, dup := MustAppend(t, s, Event("same", "t.a", "third")); !dup || seq3 != seq {
		t.Fatalf("append after reopen: seq %d dup %v, want the original %d", seq3, dup, seq)
	}
}

func testDedupAfterWindow(t *testing.T, e *env) {
	// Badger's TTLs have one-second resolution; a JetStream window is at
	// least as coarse.
	s := e.open(t, Options{DedupWindow: time.Second})
	seq, _ := MustAppend(t, s, Event("k", "t", "x"))
	if _, _, _, err := s.Lookup("k"); err != nil {
		t.Fatalf("lookup within the window: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, _, _, err := s.Lookup("k"); errors.Is(err, queue.ErrNotFound) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the id was still remembered 10 s into a 1 s window")
		}
		time.Sleep(50 * time.Millisecond) // polls the backend's wall-clock expiry; nothing to await
	}
	seq2, dup := MustAppend(t, s, Event("k", "t", "y"))
	if dup || seq2 == seq {
		t.Fatalf("after the window: seq %d dup %v, want a new event", seq2, dup)
	}
	if ev, err := s.Event(seq); err != nil || string(ev.Body) != "x" {
		t.Fatalf("the first event after its id expired: %v, %v", ev, err)
	}
}

func testOnCommit(t *testing.T, e *env) {
	var (
		mu   sync.Mutex
		seen []uint64
	)
	s := e.open(t, Options{OnCommit: func(evs []*queue.Event) {
		mu.Lock()
		for _, ev := range evs {
			seen = append(seen, ev.Seq)
		}
		mu.Unlock()
	}})
	for i := range 5 {
		seq, _ := MustAppend(t, s, Event(fmt.Sprint(i), "t", "x"))
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n != int(seq) {
			t.Fatalf("after the append of seq %d OnCommit saw %d events", seq, n)
		}
	}
	MustAppend(t, s, Event("0", "t", "dup"))
	mu.Lock()
	defer mu.Unlock()
	for i, seq := range seen {
		if seq != uint64(i+1) {
			t.Fatalf("OnCommit saw %v, want 1..5 in order", seen)
		}
	}
	if len(seen) != 5 {
		t.Fatalf("a duplicate reached OnCommit: %v", seen)
	}
}

func testConcurrentAppends(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	const writers, each = 32, 40
	var (
		mu  sync.Mutex
		got = map[uint64]string{}
		wg  sync.WaitGroup
	)
	for w := range writers {
		wg.Go(func() {
			var last uint64
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				seq, _ := MustAppend(t, s, Event(id, "t", id))
				if seq <= last {
					t.Errorf("writer %d: seq %d after %d", w, seq, last)
				}
				last = seq
				mu.Lock()
				if prev, ok := got[seq]; ok {
					t.Errorf("seq %d given to %s and %s", seq, prev, id)
				}
				got[seq] = id
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for seq := uint64(1); seq <= writers*each; seq++ {
		id, ok := got[seq]
		if !ok {
			t.Fatalf("seq %d never assigned", seq)
		}
		ev, err := s.Event(seq)
		if err != nil || string(ev.Body) != id || ev.ID != id {
			t.Fatalf("event %d = %v, %v; want %s", seq, ev, err, id)
		}
	}
	if s.Head() != writers*each {
		t.Fatalf("head = %d, want %d", s.Head(), writers*each)
	}
}

// testAppendBatch: AppendBatch answers each event as Append would, in
// the order given: new events get increasing seqs in batch order, an id
// already stored or seen earlier in the batch is a duplicate of the
// first, a retry of the whole batch is all duplicates with the same seqs,
// and what it stored is durable, read back whole, also after a reopen.
func testAppendBatch(t *testing.T, e *env) {
	var (
		mu        sync.Mutex
		committed []uint64
	)
	s := e.open(t, Options{Sync: true, OnCommit: func(evs []*queue.Event) {
		mu.Lock()
		for _, ev := range evs {
			committed = append(committed, ev.Seq)
		}
		mu.Unlock()
	}})
	pre, _ := MustAppend(t, s, Event("pre", "t.a", "stored before"))
	s.AppendBatch(nil, nil) // nothing to do, and no panic
	keyed := Event("b", "t.b", `{"n":2}`)
	keyed.OrderingKey, keyed.Tenant = "vehicle-1", "acme"
	batch := []*queue.Event{
		Event("a", "t.a", `{"n":1}`),
		keyed,
		Event("pre", "t.a", "a retry of pre"),
		Event("c", "t.a", `{"n":3}`),
		Event("a", "t.a", "a again within the batch"),
	}
	res := make([]queue.AppendResult, len(batch))
	s.AppendBatch(batch, res)
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("event %d (%s): %v", i, batch[i].ID, r.Err)
		}
	}
	a, b, c := res[0], res[1], res[3]
	if a.Dup || b.Dup || c.Dup || !(pre < a.Seq && a.Seq < b.Seq && b.Seq < c.Seq) {
		t.Fatalf("new events of the batch: %+v %+v %+v, want increasing seqs past %d, none a duplicate", a, b, c, pre)
	}
	if r := res[2]; !r.Dup || r.Seq != pre {
		t.Fatalf("an id stored before the batch: %+v, want a duplicate of seq %d", r, pre)
	}
	if r := res[4]; !r.Dup || r.Seq != a.Seq {
		t.Fatalf("an id repeated within the batch: %+v, want a duplicate of seq %d", r, a.Seq)
	}
	if h := s.Head(); h != c.Seq {
		t.Fatalf("head = %d, want %d", h, c.Seq)
	}
	mu.Lock()
	if len(committed) != 4 || committed[3] != c.Seq {
		t.Fatalf("OnCommit saw %v, want the 4 new events, the last %d", committed, c.Seq)
	}
	mu.Unlock()
	check := func(when string) {
		t.Helper()
		for i, seq := range []uint64{a.Seq, b.Seq, c.Seq} {
			ev, err := s.Event(seq)
			want := batch[[]int{0, 1, 3}[i]]
			if err != nil || ev.ID != want.ID || string(ev.Body) != string(want.Body) || ev.Type != want.Type ||
				ev.OrderingKey != want.OrderingKey || ev.Tenant != want.Tenant {
				t.Fatalf("%s: Event(%d) = %+v, %v; want %+v", when, seq, ev, err, want)
			}
		}
		if ev, err := s.Event(pre); err != nil || string(ev.Body) != "stored before" {
			t.Fatalf("%s: the original of a duplicate = %+v, %v", when, ev, err)
		}
	}
	check("after the batch")
	// A retry of the whole batch (its answer lost to a timeout) stores
	// nothing again.
	again := make([]queue.AppendResult, len(batch))
	s.AppendBatch(batch, again)
	for i, r := range again {
		if r.Err != nil || !r.Dup || r.Seq != res[i].Seq {
			t.Fatalf("retried batch, event %d: %+v, want a duplicate of seq %d", i, r, res[i].Seq)
		}
	}
	if h := s.Head(); h != c.Seq {
		t.Fatalf("head after the retried batch = %d, want %d", h, c.Seq)
	}
	s = e.reopen(t, s, Options{})
	check("after reopen")
	if seq, dup := MustAppend(t, s, Event("b", "t.b", "x")); !dup || seq != b.Seq {
		t.Fatalf("append of a batch's id after reopen: seq %d dup %v, want a duplicate of %d", seq, dup, b.Seq)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	closed := make([]queue.AppendResult, 2)
	s.AppendBatch([]*queue.Event{Event("x", "t", "x"), Event("y", "t", "y")}, closed)
	for i, r := range closed {
		if !errors.Is(r.Err, queue.ErrClosed) {
			t.Fatalf("batch after close, event %d: %+v, want ErrClosed", i, r)
		}
	}
}

// testAppendBatchConcurrent: batches and single appends at once never
// share a seq, each batch's events keep its order, and every seq up to
// the head is one of them.
func testAppendBatchConcurrent(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	const writers, batches, size = 8, 5, 20
	var (
		mu  sync.Mutex
		got = map[uint64]string{}
		wg  sync.WaitGroup
	)
	note := func(seq uint64, id string) {
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := got[seq]; ok {
			t.Errorf("seq %d given to %s and %s", seq, prev, id)
		}
		got[seq] = id
	}
	for w := range writers {
		wg.Go(func() {
			for b := range batches {
				evs := make([]*queue.Event, size)
				for i := range evs {
					id := fmt.Sprintf("w%d-b%d-%d", w, b, i)
					evs[i] = Event(id, "t", id)
				}
				res := make([]queue.AppendResult, size)
				s.AppendBatch(evs, res)
				var last uint64
				for i, r := range res {
					if r.Err != nil || r.Dup || r.Seq <= last {
						t.Errorf("writer %d batch %d event %d: %+v after seq %d", w, b, i, r, last)
						return
					}
					last = r.Seq
					note(r.Seq, evs[i].ID)
				}
				id := fmt.Sprintf("w%d-single-%d", w, b)
				seq, _ := MustAppend(t, s, Event(id, "t", id))
				note(seq, id)
			}
		})
	}
	wg.Wait()
	const total = writers * batches * (size + 1)
	if h := s.Head(); h != total {
		t.Fatalf("head = %d, want %d", h, total)
	}
	for seq := uint64(1); seq <= total; seq++ {
		id, ok := got[seq]
		if !ok {
			t.Fatalf("seq %d never assigned", seq)
		}
		if ev, err := s.Event(seq); err != nil || ev.ID != id || string(ev.Body) != id {
			t.Fatalf("event %d = %v, %v; want %s", seq, ev, err, id)
		}
	}
}

func testAppendAfterClose(t *testing.T, e *env) {
	s := e.open(t, Options{})
	MustAppend(t, s, Event("x", "t", "x"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Append(Event("y", "t", "y")); !errors.Is(err, queue.ErrClosed) {
		t.Fatalf("append after close: %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// Trace context of the contract's events (W3C's own example).
const (
	testTraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	testTraceState  = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
	testCloudEvent  = `{"specversion":"1.0","id":"A234-1234-1234","source":"/mycontext","type":"t.a","comexampleextension1":"value","n":5,"subject":"vehicle 17 ✓ \"q\"\u0001"}`
)

// testEventContext: an event's ordering key, trace context and tenant
// survive the append, every read (Event, Events with and without a
// filter, OnCommit) and a reopen; an event without them reads with them
// empty; a Match sees each event's tenant ("" for a platform event); and a
// dead letter keeps them, with its owner, also across a reopen and a
// replay.
func testEventContext(t *testing.T, e *env) {
	var (
		mu        sync.Mutex
		committed []*queue.Event
	)
	onCommit := func(evs []*queue.Event) {
		mu.Lock()
		committed = append(committed, evs...)
		mu.Unlock()
	}
	s := e.open(t, Options{Sync: true, OnCommit: onCommit})
	full := Event("keyed", "t.a", `{"n":1}`)
	full.OrderingKey, full.TraceParent, full.TraceState = "vehicle-17", testTraceParent, testTraceState
	keyOnly := Event("key-only", "t.a", `{"n":2}`)
	keyOnly.OrderingKey = "vehicle-18"
	plain := Event("plain", "t.a", `{"n":3}`)
	traceOnly := Event("trace-only", "t.b", `{"n":4}`)
	traceOnly.TraceParent = testTraceParent
	tenanted := Event("acme-1", "t.a", `{"n":6}`)
	tenanted.Tenant = "acme"
	tenantKeyed := Event("acme-2", "t.b", `{"n":7}`)
	tenantKeyed.Tenant, tenantKeyed.OrderingKey, tenantKeyed.TraceParent = "acme", "vehicle-20", testTraceParent
	cloud := Event("ce-1", "t.a", `{"n":8}`)
	cloud.CloudEvent = testCloudEvent
	cloudTenant := Event("ce-2", "t.b", `{"n":9}`)
	cloudTenant.CloudEvent, cloudTenant.Tenant, cloudTenant.OrderingKey = testCloudEvent, "acme", "vehicle-21"
	want := []*queue.Event{full, keyOnly, plain, traceOnly, tenanted, tenantKeyed, cloud, cloudTenant}
	for _, ev := range want {
		MustAppend(t, s, ev)
	}
	check := func(how string, got []*queue.Event, want []*queue.Event) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d events, want %d", how, len(got), len(want))
		}
		for i, g := range got {
			w := want[i]
			if g.ID != w.ID || g.OrderingKey != w.OrderingKey || g.TraceParent != w.TraceParent || g.TraceState != w.TraceState ||
				g.Tenant != w.Tenant || g.CloudEvent != w.CloudEvent || g.Type != w.Type || g.ContentType != w.ContentType || string(g.Body) != string(w.Body) {
				t.Fatalf("%s: event %d = %+v\nwant %+v", how, i, g, w)
			}
		}
	}
	reads := func(s queue.Store, when string) {
		t.Helper()
		var one []*queue.Event
		for seq := uint64(1); seq <= uint64(len(want)); seq++ {
			ev, err := s.Event(seq)
			if err != nil {
				t.Fatalf("%s: Event(%d): %v", when, seq, err)
			}
			one = append(one, ev)
		}
		check(when+": Event", one, want)
		head := uint64(len(want))
		evs, _, err := s.Events(1, head, 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		check(when+": Events", evs, want)
		evs, _, err = s.Events(1, head, 10, func(_, typ []byte) bool { return string(typ) == "t.a" })
		if err != nil {
			t.Fatal(err)
		}
		check(when+": Events of a type", evs, []*queue.Event{full, keyOnly, plain, tenanted, cloud})
		ofAcme := func(tenant, _ []byte) bool { return string(tenant) == "acme" }
		evs, _, err = s.Events(1, head, 10, ofAcme)
		if err != nil {
			t.Fatal(err)
		}
		check(when+": Events of a tenant", evs, []*queue.Event{tenanted, tenantKeyed, cloudTenant})
		platform := func(tenant, _ []byte) bool { return len(tenant) == 0 }
		evs, _, err = s.Events(1, head, 10, platform)
		if err != nil {
			t.Fatal(err)
		}
		check(when+": platform Events", evs, []*queue.Event{full, keyOnly, plain, traceOnly, cloud})
		if n, err := s.CountEvents(1, head, ofAcme, 100); err != nil || n != 3 {
			t.Fatalf("%s: CountEvents of a tenant = %d, %v; want 3", when, n, err)
		}
	}
	reads(s, "after append")
	mu.Lock()
	check("OnCommit", committed, want)
	mu.Unlock()
	s = e.reopen(t, s, Options{})
	reads(s, "after reopen")

	// A dead letter keeps them.
	join(t, s, "partner", nil)
	ev := Event("dead", "t.a", `{"n":5}`)
	ev.OrderingKey, ev.TraceParent, ev.TraceState, ev.Tenant = "vehicle-19", testTraceParent, testTraceState, "acme"
	ev.CloudEvent = testCloudEvent
	seq, _ := MustAppend(t, s, ev)
	record(t, s, queue.Outcome{Kind: queue.DeadLettered, Subscription: "partner", Seq: seq, DeadLetter: &queue.DeadLetter{
		Subscription: "partner", Seq: seq, EventID: ev.ID, Type: ev.Type, ContentType: ev.ContentType, AcceptedAt: ev.AcceptedAt,
		OrderingKey: ev.OrderingKey, TraceParent: ev.TraceParent, TraceState: ev.TraceState, Tenant: ev.Tenant, Owner: "acme",
		CloudEvent: ev.CloudEvent, Reason: "rejected", Attempts: 1, LastStatus: 400, DeadAt: t0, Body: ev.Body,
	}})
	checkDL := func(how string, d *queue.DeadLetter, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		if d.EventID != "dead" || d.OrderingKey != "vehicle-19" || d.TraceParent != testTraceParent || d.TraceState != testTraceState || string(d.Body) != `{"n":5}` ||
			d.Tenant != "acme" || d.Owner != "acme" || d.CloudEvent != testCloudEvent {
			t.Fatalf("%s: dead letter = %+v", how, d)
		}
	}
	d, err := s.DeadLetter("partner", seq)
	checkDL("DeadLetter", d, err)
	s = e.reopen(t, s, Options{})
	d, err = s.DeadLetter("partner", seq)
	checkDL("DeadLetter after reopen", d, err)
	list, err := s.DeadLetters("partner", "", 0, 10)
	if err != nil || len(list) != 1 {
		t.Fatalf("DeadLetters: %v, %v", list, err)
	}
	checkDL("DeadLetters", list[0], nil)
	d, err = s.Replay("partner", seq, t0, false)
	checkDL("Replay", d, err)
	d, err = s.DeadLetter("partner", seq)
	checkDL("DeadLetter after its replay", d, err)
}

// testLookupTenant: Lookup answers an event's tenant ("" for a platform
// event) while the log holds it, once compaction removed it, and across a
// reopen: the ledger judges a tenant's view of an event by it.
func testLookupTenant(t *testing.T, e *env) {
	s := e.open(t, Options{Sync: true})
	platform := Event("p-1", "status.up", `{}`)
	mine := Event("acme-1", "order.created", `{}`)
	mine.Tenant = "acme"
	MustAppend(t, s, platform)
	MustAppend(t, s, mine)
	check := func(when string) {
		t.Helper()
		for _, w := range []struct{ id, typ, tenant string }{{"p-1", "status.up", ""}, {"acme-1", "order.created", "acme"}} {
			if _, typ, tenant, err := s.Lookup(w.id); err != nil || typ != w.typ || tenant != w.tenant {
				t.Fatalf("%s: Lookup(%s) = %q, %q, %v; want %q, %q", when, w.id, typ, tenant, err, w.typ, w.tenant)
			}
		}
	}
	check("after append")
	if _, err := s.Compact(s.Head() + 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Event(2); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Event(2) after compaction: %v, want ErrNotFound", err)
	}
	check("after compaction")
	s = e.reopen(t, s, Options{})
	check("after reopen")
}
