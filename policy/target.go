package policy

import "net/netip"

// Address ranges the SSRF guard refuses beyond what netip classifies itself.
// A webhook URL is chosen by a tenant; without this guard a tenant could
// make the sidecar POST signed requests into the pod network, the node or
// the cloud metadata service. The IPv4 ranges are the IANA special-purpose
// registry's that are not globally reachable; the IPv6 ones add the
// transition ranges that carry an IPv4 address sluice cannot judge
// (IPv4-compatible, Teredo, whose embedded client address is obfuscated)
// and the deprecated site-local range, which some networks still route
// internally.
var forbiddenPrefixes = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "a \"this network\" address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (carrier-grade NAT) address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol address"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address"}, // holds the broadcast address too
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible address"},
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "an IPv4-translated address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a local-use NAT64 address"},
	{netip.MustParsePrefix("100::/64"), "a discard address"},
	{netip.MustParsePrefix("2001::/32"), "a Teredo address"},
	{netip.MustParsePrefix("2001:2::/48"), "a benchmarking address"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address"},
	{netip.MustParsePrefix("3fff::/20"), "a documentation address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
}

// The translation prefixes whose addresses carry an IPv4 address in known
// bits. They are judged by that address rather than refused whole: on an
// IPv6-only network a DNS64 resolver answers 64:ff9b::<public IPv4> for
// every IPv4-only receiver, and refusing those would refuse most of the
// internet; 64:ff9b::127.0.0.1 is loopback all the same.
var (
	nat64Prefix     = netip.MustParsePrefix("64:ff9b::/96") // RFC 6052: the IPv4 address is the last 32 bits
	sixToFourPrefix = netip.MustParsePrefix("2002::/16")    // RFC 3056: the IPv4 address is bits 16..47
)

// ForbiddenTarget says why a delivery to ip is refused when private targets
// are not allowed, or returns "" when ip is a public unicast address.
// Refused: loopback, private (RFC 1918, unique local), link-local (which
// holds the cloud metadata endpoint 169.254.169.254), unspecified,
// multicast, documentation, benchmarking and reserved ranges, and the
// transition ranges that hide the IPv4 address they reach (IPv4-compatible,
// Teredo). IPv4-mapped, NAT64 (64:ff9b::/96) and 6to4 addresses are judged
// as the IPv4 address they carry. A zone ("fe80::1%eth0") is ignored.
func ForbiddenTarget(ip netip.Addr) string {
	// netip.Prefix.Contains is false for any address with a zone, so a
	// zone would otherwise carry an address past every prefix below.
	ip = ip.WithZone("").Unmap()
	switch {
	case !ip.IsValid():
		return "not an IP address"
	case ip.IsLoopback():
		return "a loopback address"
	case ip.IsPrivate():
		return "a private address"
	case ip.IsLinkLocalUnicast():
		return "a link-local address (cloud metadata lives here)"
	case ip.IsUnspecified():
		return "the unspecified address"
	case ip.IsMulticast(): // link- and interface-local multicast included
		return "a multicast address"
	}
	for _, f := range forbiddenPrefixes {
		if f.prefix.Contains(ip) {
			return f.why
		}
	}
	b := ip.As16()
	switch {
	case nat64Prefix.Contains(ip):
		if why := ForbiddenTarget(netip.AddrFrom4([4]byte(b[12:16]))); why != "" {
			return "a NAT64 address of " + why
		}
	case sixToFourPrefix.Contains(ip):
		if why := ForbiddenTarget(netip.AddrFrom4([4]byte(b[2:6]))); why != "" {
			return "a 6to4 address of " + why
		}
	}
	return ""
}
