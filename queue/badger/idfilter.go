package badger

import (
	"errors"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	badgerdb "github.com/dgraph-io/badger/v4"
)

// idFilter spares a new id the appender's LSM lookup (dedup.go): a Bloom
// filter of every id written within the dedup window. It answers "not
// written" only for an id it has never been given, so an append it
// clears cannot be a duplicate of anything but what the committer wrote
// after the check, which recent holds. Anything else ("perhaps") goes to
// the LSM lookup as before: a duplicate, a false positive (about 1 in
// 100), every append while Open's scan of the i/ keys has not finished,
// and every append once the filter is over its memory bound.
//
// Why a filter and not a set of the ids: the window is 24 h by default;
// at 10,000 events/s that is 864 million ids, 1 GB even for this filter.
// So the filter grows to its bound (Memory.IDFilter) and then stops growing: its
// newest part takes every id past its capacity, answering "perhaps" more
// and more often, never wrongly "not written", until the parts expire.
//
// The filter is in parts, each a blocked Bloom filter (one 64-byte block
// per id, 8 bits set in it: one cache line to read) sized for twice the
// ids alive when it began. A part is dropped once the part after it began
// a window ago: every id in it was written before that.
type idFilter struct {
	seed     maphash.Seed
	window   int64 // nanoseconds
	maxBytes int64 // Memory.IDFilter
	ready    atomic.Bool
	parts    atomic.Pointer[[]*filterPart] // oldest first; replaced, never changed
	mu       sync.Mutex                    // held to replace parts
}

type filterPart struct {
	blocks []filterBlock
	shift  uint  // 64 - log2(len(blocks))
	start  int64 // unix nanos when it began taking ids
	cap    int64
	n      atomic.Int64
	// capped: it was full and the bound allowed no new part; it takes
	// every id until expiry frees room.
	capped atomic.Bool
}

type filterBlock [8]atomic.Uint64

// filterBitsPerID sizes a part: 10 bits of filter per id it is built for
// gives a blocked filter with 8 bits per id about 1% false positives.
const (
	filterBitsPerID = 10
	filterMinIDs    = 1 << 16
)

// newIDFilter makes a filter of ids written within window whose parts
// together stay within maxBytes.
func newIDFilter(window time.Duration, now time.Time, maxBytes int64) *idFilter {
	f := &idFilter{seed: maphash.MakeSeed(), window: int64(window), maxBytes: maxBytes}
	parts := []*filterPart{newFilterPart(filterMinIDs, now.UnixNano())}
	f.parts.Store(&parts)
	return f
}

func newFilterPart(ids int64, start int64) *filterPart {
	log := filterLog(ids)
	return &filterPart{blocks: make([]filterBlock, 1<<log), shift: uint(64 - log), start: start, cap: ids}
}

// filterLog is log2 of the blocks of a part for ids: a power of two.
func filterLog(ids int64) int { return bits.Len64(uint64(max(1, ids*filterBitsPerID/512) - 1)) }

func filterBytes(ids int64) int64 { return 64 << filterLog(ids) }

func (p *filterPart) bytes() int64 { return int64(len(p.blocks)) * 64 }

func (f *idFilter) hash(id string) uint64 { return maphash.String(f.seed, id) }

// block and mask: the block from the hash's top bits, the 8 bits from a
// second mix of it (six bits each, one per word of the block).
func (p *filterPart) block(h uint64) *filterBlock {
	if p.shift == 64 {
		return &p.blocks[0]
	}
	return &p.blocks[h>>p.shift]
}

func bitOf(h2 uint64, i int) uint64 { return 1 << ((h2 >> (6 * i)) & 63) }

const mix = 0x9e3779b97f4a7c15

// mayContain reports whether h may have been added: false only for a hash
// never added since the parts in use began, while the filter is ready.
func (f *idFilter) mayContain(h uint64) bool {
	if !f.ready.Load() {
		return true
	}
	h2 := h * mix
	for _, p := range *f.parts.Load() {
		b, hit := p.block(h), true
		for i := range b {
			if b[i].Load()&bitOf(h2, i) == 0 {
				hit = false
				break
			}
		}
		if hit {
			return true
		}
	}
	return false
}

// add puts h in the newest part, starting a larger one first if it is
// full and the bound allows.
func (f *idFilter) add(h uint64, now int64) {
	parts := *f.parts.Load()
	p := parts[len(parts)-1]
	if p.n.Load() >= p.cap && !p.capped.Load() {
		p = f.grow(now)
	}
	h2 := h * mix
	b := p.block(h)
	for i := range b {
		if bit := bitOf(h2, i); b[i].Load()&bit == 0 {
			b[i].Or(bit)
		}
	}
	p.n.Add(1)
}

// grow drops the parts that have expired and starts a new one when the
// newest is full, sized for twice the ids alive, within maxBytes.
// It returns the newest part.
func (f *idFilter) grow(now int64) *filterPart {
	f.mu.Lock()
	defer f.mu.Unlock()
	parts := *f.parts.Load()
	next := parts
	for len(next) > 1 && next[1].start <= now-f.window {
		next = next[1:]
	}
	newest := next[len(next)-1]
	if newest.n.Load() >= newest.cap {
		var alive, size int64
		for _, p := range next {
			alive += p.n.Load()
			size += p.bytes()
		}
		if ids := max(2*alive, filterMinIDs); size+filterBytes(ids) <= f.maxBytes {
			next = append(next[:len(next):len(next)], newFilterPart(ids, now))
		} else {
			newest.capped.Store(true)
		}
	}
	if len(next) != len(parts) || &next[0] != &parts[0] {
		next = append([]*filterPart(nil), next...)
		f.parts.Store(&next)
	}
	return next[len(next)-1]
}

// expire drops expired parts; the committer calls it once per batch.
func (f *idFilter) expire(now int64) {
	parts := *f.parts.Load()
	if len(parts) > 1 && parts[1].start <= now-f.window {
		f.grow(now)
	}
}

// fill adds the id of every live i/ entry, then makes the filter ready:
// Open starts it after the log's tail is indexed, and ids the committer
// writes meanwhile are added as they are written. It gives up, leaving
// the filter unready (every append looks up the LSM), when stop closes or
// the scan fails.
func (l *Log) fillFilter(stop <-chan struct{}) {
	f := l.filter
	err := l.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: prefixID})
		defer it.Close()
		n, now := 0, time.Now().UnixNano()
		for it.Rewind(); it.Valid(); it.Next() {
			if n++; n%4096 == 0 {
				select {
				case <-stop:
					return errStopped
				default:
				}
				now = time.Now().UnixNano()
			}
			k := it.Item().Key()
			f.add(maphash.Bytes(f.seed, k[len(prefixID):]), now)
		}
		return nil
	})
	if err != nil {
		if err != errStopped {
			l.log.Warn("queue: dedup filter not built; every append looks its id up", "err", err)
		}
		return
	}
	f.ready.Store(true)
}

// errStopped ends a walk early: fillFilter's when Close stops it, and the
// record walks of Events and Count once they have what they need.
var errStopped = errors.New("stopped")
