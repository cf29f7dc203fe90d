package delivery

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/sluicehq/sluice/queue"
)

// ringSlots bounds the ring by count; its bytes come from the memory
// budget (proxy.SplitMemory). Either covers a few hundred milliseconds of a busy
// stream, so lanes that keep up never touch the disk.
const ringSlots = 16384

// feed is the one path from the log's committer to the lanes: the ring of
// recent events (the same body slices for every lane), the head, the last
// seq of each type a lane filters on, and the lanes parked until a commit
// (or a freed slot) wakes them. A lane for all types wakes on any commit,
// a filtered one only on a commit of one of its types, so 50,000 idle
// lanes cost nothing per event.
//
// Lock order: a lane's mu may be held while taking mu or typeMu, never the
// reverse.
type feed struct {
	store queue.Store
	ring  *ring
	head  atomic.Uint64 // last seq in the ring (or the log's head at start)

	mu     sync.Mutex
	hungry map[*lane]struct{} // lanes for all types with free slots, waiting for new events
	// hungryType holds filtered lanes waiting for an event of one of their
	// types; pendingTypes the types committed since the kick loop last ran.
	hungryType   map[string]map[*lane]struct{}
	pendingTypes map[string]struct{}
	committed    bool          // something was committed since the kick loop last ran
	kick         chan struct{} // wakes the kick loop

	typeMu   sync.RWMutex
	typeSeq  map[string]*atomic.Uint64 // last committed seq of each filtered-on type
	matchers map[string]queue.Match    // one filter per distinct type list and tenant, shared by lanes
	// shared holds, per tenant, the platform event types the operator
	// shares with it (Tenant.SharedTypes); set before any lane exists and
	// never changed, so read without a lock.
	shared map[string]func(typ []byte) bool
}

// defaultRingBytes is the ring of an engine made without a size (tests):
// the default memory budget's ring share (proxy.SplitMemory).
const defaultRingBytes = 4 << 20

// newFeed makes the feed of store with a ring of ringBytes; 0 takes
// defaultRingBytes.
func newFeed(store queue.Store, ringBytes int64) *feed {
	ringBytes = cmp.Or(ringBytes, defaultRingBytes)
	f := &feed{
		store:  store,
		ring:   newRing(ringSlots, int(ringBytes), store.Head()),
		hungry: map[*lane]struct{}{}, hungryType: map[string]map[*lane]struct{}{},
		pendingTypes: map[string]struct{}{},
		kick:         make(chan struct{}, 1),
		typeSeq:      map[string]*atomic.Uint64{},
		matchers:     map[string]queue.Match{},
		shared:       map[string]func(typ []byte) bool{},
	}
	f.head.Store(store.Head())
	return f
}

// onCommit runs on the log's committer goroutine: it must not block.
// Order matters: ring, then type seqs, then head, then the kick, so that a
// lane that reads the head also sees everything below it.
func (f *feed) onCommit(evs []*queue.Event) {
	f.ring.put(evs)
	f.typeMu.RLock()
	for _, ev := range evs {
		if v := f.typeSeq[ev.Type]; v != nil {
			v.Store(ev.Seq)
		}
	}
	f.typeMu.RUnlock()
	f.head.Store(evs[len(evs)-1].Seq)
	f.mu.Lock()
	f.committed = true
	for _, ev := range evs {
		if _, ok := f.hungryType[ev.Type]; ok {
			f.pendingTypes[ev.Type] = struct{}{}
		}
	}
	f.mu.Unlock()
	f.signal()
}

func (f *feed) signal() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// event returns one event, from memory if the ring still holds it.
func (f *feed) event(seq uint64) (*queue.Event, error) {
	if ev, ok := f.ring.get(seq); ok {
		return ev, nil
	}
	return f.store.Event(seq)
}

// markHungry parks a lane that has free slots and nothing to send until a
// commit of something it takes.
func (f *feed) markHungry(l *lane) {
	f.mu.Lock()
	if !l.sub.exactTypes() {
		f.hungry[l] = struct{}{}
	} else {
		for _, t := range l.sub.Types {
			set := f.hungryType[t]
			if set == nil {
				set = map[*lane]struct{}{}
				f.hungryType[t] = set
			}
			set[l] = struct{}{}
		}
	}
	f.mu.Unlock()
}

// wake has the kick loop pump ls soon, from outside any of their locks.
func (f *feed) wake(ls []*lane) {
	if len(ls) == 0 {
		return
	}
	f.mu.Lock()
	for _, l := range ls {
		f.hungry[l] = struct{}{}
	}
	f.committed = true // not a commit, but the kick loop must pump them
	f.mu.Unlock()
	f.signal()
}

// woken appends to buf the lanes the commits since the last call concern,
// and forgets them: each is pumped once and parks again if it still has
// nothing to send.
func (f *feed) woken(buf []*lane) []*lane {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.committed || len(f.pendingTypes) > 0 {
		for l := range f.hungry {
			buf = append(buf, l)
		}
		clear(f.hungry)
	}
	for t := range f.pendingTypes {
		for l := range f.hungryType[t] {
			buf = append(buf, l)
		}
		delete(f.hungryType, t)
	}
	clear(f.pendingTypes)
	f.committed = false
	return buf
}

// watchTypes starts tracking the last seq of each type sub filters on. A
// type starts at the head: events of it may already be in the log.
func (f *feed) watchTypes(sub *Subscription) {
	if slices.Contains(sub.Types, "*") || sub.typePatterns() {
		return // nothing to look up by exact type
	}
	f.typeMu.Lock()
	defer f.typeMu.Unlock()
	for _, t := range sub.Types {
		if f.typeSeq[t] == nil {
			v := new(atomic.Uint64)
			v.Store(f.head.Load())
			f.typeSeq[t] = v
		}
	}
}

// matcherFor returns what sub's lane selects from the log, its tenant's
// events and its types (entitlement), shared with every other lane of the
// same tenant that filters on the same list. Nil selects everything: an
// operator's lane for all types.
func (f *feed) matcherFor(sub *Subscription) queue.Match {
	key := strings.Join(sub.Types, "\x00") + "\x01" + sub.Tenant
	f.typeMu.Lock()
	defer f.typeMu.Unlock()
	m, ok := f.matchers[key]
	if !ok {
		m = entitlement(sub.Tenant, f.shared[sub.Tenant], sub.matcher())
		f.matchers[key] = m
	}
	return m
}

// entitlement is the tenant rule (docs/security.md) as a queue.Match: an operator's
// subscription (tenant "") takes every event of its types; a tenant's
// takes only the events of that tenant, plus the platform events (no
// tenant) of the types the operator shares with it, whatever its own types
// and filter say. Lanes apply it where they take events, from the ring
// (lane.wants) and from the log (Store.Events, CountEvents), so no route,
// replay or filter can get around it. types nil means all types.
func entitlement(tenant string, shared, types func(typ []byte) bool) queue.Match {
	if tenant == "" {
		if types == nil {
			return nil
		}
		return func(_, typ []byte) bool { return types(typ) }
	}
	return func(owner, typ []byte) bool {
		return tenantRule(tenant, shared, owner, typ) && (types == nil || types(typ))
	}
}

// tenantRule is the tenant rule alone, types aside: a subscription of
// tenant ("" for the operator) may receive an event of owner ("" for a
// platform event) and type typ. One definition for the lanes' matchers
// and for entitled.
func tenantRule(tenant string, shared func(typ []byte) bool, owner, typ []byte) bool {
	return tenant == "" || string(owner) == tenant || len(owner) == 0 && shared != nil && shared(typ)
}

// entitled is tenantRule for strings, allocating nothing: the lanes call
// it for every event they take from their buffer and for every retry.
// shared is read without a lock: it is set before any lane exists and
// never changes.
func (f *feed) entitled(tenant, evTenant, typ string) bool {
	return tenantRule(tenant, f.shared[tenant], unsafe.Slice(unsafe.StringData(evTenant), len(evTenant)), unsafe.Slice(unsafe.StringData(typ), len(typ)))
}

// seenSince reports whether an event of one of types may have been
// committed at or after seq.
func (f *feed) seenSince(types []string, seq uint64) bool {
	f.typeMu.RLock()
	defer f.typeMu.RUnlock()
	for _, t := range types {
		// A pattern has no seq of its own (nil): it may match anything.
		if v := f.typeSeq[t]; v == nil || v.Load() >= seq {
			return true
		}
	}
	return false
}
