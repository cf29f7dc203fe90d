package policy

// Owner picks the node that should deliver key's lane among nodes, by
// rendezvous (highest-random-weight) hashing: every node scores
// weight(key, node) and the highest score wins, ties going to the smaller
// node id. Fleet mode (one owner per lane across the fleet) calls it with a subscription id and the
// live set of node ids.
//
// Why rendezvous: when a node joins, it takes over only the keys it now
// scores highest on (about 1/N of them), and when one leaves only its own
// keys move, each to its runner-up; every other key keeps its owner. No
// ring, no virtual nodes, no state.
//
// Owner is deterministic and depends only on the set of nodes, not their
// order or repetitions; it returns "" when nodes is empty. The weight is
// FNV-1a (64-bit) over key, a 0xff separator (a byte no key or node id
// holds) and node, finished with the MurmurHash3 64-bit mixer so that keys
// and node ids differing in one character still score independently. The
// function is part of the fleet's protocol: every node of a fleet must
// compute the same owners, so it must never change (a change would move
// lanes between the nodes of a mixed-version fleet on every decision).
//
// It allocates nothing and costs O(len(nodes)).
func Owner(key string, nodes []string) string {
	var best string
	var bestW uint64
	found := false
	base := fnvString(fnvOffset64, key)
	base = (base ^ 0xff) * fnvPrime64
	for _, n := range nodes {
		w := mix64(fnvString(base, n))
		if !found || w > bestW || (w == bestW && n < best) {
			best, bestW, found = n, w, true
		}
	}
	return best
}

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// fnvString continues an FNV-1a hash h over s.
func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}

// mix64 is MurmurHash3's fmix64 finaliser: every input bit affects every
// output bit, which FNV-1a alone does not give for inputs that share a
// long prefix.
func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
