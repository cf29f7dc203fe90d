package policy

import "net/netip"

// Address ranges the SSRF guard refuses beyond what netip classifies itself.
// A webhook URL is chosen by a tenant; without this guard a tenant could
// make the sidecar POST signed requests into the pod network, the node or
// the cloud metadata service.
var forbiddenPrefixes = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "a \"this network\" address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (carrier-grade NAT) address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address"}, // holds the broadcast address too
	{netip.MustParsePrefix("64:ff9b::/96"), "a NAT64 address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a NAT64 address"},
	{netip.MustParsePrefix("2002::/16"), "a 6to4 address"},
	{netip.MustParsePrefix("100::/64"), "a discard address"},
}

// ForbiddenTarget says why a delivery to ip is refused when private targets
// are not allowed, or returns "" when ip is a public unicast address.
// Refused: loopback, private (RFC 1918, unique local), link-local (which
// holds the cloud metadata endpoint 169.254.169.254), unspecified,
// multicast, and the special-purpose ranges that tunnel or translate to any
// of those (NAT64, 6to4) or are not routable on the internet. IPv4-mapped
// IPv6 addresses are judged as the IPv4 address they carry.
func ForbiddenTarget(ip netip.Addr) string {
	ip = ip.Unmap()
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
	return ""
}
