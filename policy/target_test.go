package policy

import (
	"net/netip"
	"testing"
)

func TestForbiddenTarget(t *testing.T) {
	cases := []struct {
		addr      string
		forbidden bool
	}{
		{"127.0.0.1", true},
		{"127.8.9.10", true},
		{"::1", true},
		{"::ffff:127.0.0.1", true}, // IPv4-mapped loopback
		{"10.1.2.3", true},
		{"172.16.0.1", true},
		{"172.31.255.255", true},
		{"192.168.1.1", true},
		{"fd00:ec2::254", true}, // AWS metadata over IPv6 (unique local)
		{"169.254.169.254", true},
		{"fe80::1", true},
		{"0.0.0.0", true},
		{"0.1.2.3", true},
		{"::", true},
		{"224.0.0.1", true},
		{"ff02::1", true},
		{"100.64.0.1", true},
		{"198.18.0.1", true},
		{"240.0.0.1", true},
		{"255.255.255.255", true},
		{"64:ff9b::7f00:1", true}, // NAT64 of 127.0.0.1
		{"2002:7f00:1::", true},   // 6to4 of 127.0.0.1

		// IPv4 special-purpose ranges.
		{"0.255.255.255", true},
		{"10.0.0.0", true},
		{"100.127.255.255", true},
		{"127.255.255.254", true},
		{"169.254.0.1", true},
		{"172.16.0.0", true},
		{"192.0.0.8", true},
		{"192.0.2.1", true}, // TEST-NET-1
		{"192.168.255.255", true},
		{"198.19.255.255", true},
		{"198.51.100.7", true}, // TEST-NET-2
		{"203.0.113.9", true},  // TEST-NET-3
		{"239.255.255.250", true},
		{"250.1.2.3", true},

		// IPv6: each range of the guard, then the translation ranges judged
		// by the IPv4 address they carry.
		{"::2", true},                    // IPv4-compatible (::0.0.0.2)
		{"::808:808", true},              // IPv4-compatible ::8.8.8.8: deprecated, never dialled
		{"::ffff:0:808:808", true},       // IPv4-translated
		{"::ffff:10.0.0.1", true},        // IPv4-mapped private
		{"::ffff:169.254.169.254", true}, // IPv4-mapped metadata
		{"::ffff:0.0.0.0", true},
		{"64:ff9b::a9fe:a9fe", true}, // NAT64 of 169.254.169.254
		{"64:ff9b::a00:1", true},     // NAT64 of 10.0.0.1
		{"64:ff9b::c000:201", true},  // NAT64 of 192.0.2.1
		{"64:ff9b:1::808:808", true}, // local-use NAT64
		{"2002:a9fe:a9fe::1", true},  // 6to4 of 169.254.169.254
		{"2002:c0a8:101::", true},    // 6to4 of 192.168.1.1
		{"2002::", true},             // 6to4 of 0.0.0.0
		{"2001::1", true},            // Teredo
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", true},
		{"2001:2::1", true},   // benchmarking
		{"2001:db8::1", true}, // documentation
		{"2001:db8:ffff::", true},
		{"3fff::1", true}, // documentation (RFC 9637)
		{"3fff:fff:ffff::1", true},
		{"fec0::1", true}, // site-local
		{"feff::1", true},
		{"fc00::1", true}, // unique local
		{"fdff:ffff::1", true},
		{"fe80::1%eth0", true}, // link-local with a zone
		{"fe80::abcd", true},
		{"febf::1", true},
		{"fc00::1%eth0", true},
		{"2001:db8::1%eth0", true}, // a zone must not carry an address past the prefixes
		{"ff05::2", true},
		{"ff0e::1", true},
		{"100::1", true}, // discard
		{"::1%lo", true},

		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"172.32.0.1", false},
		{"100.128.0.1", false},
		{"93.184.215.14", false},
		{"2606:4700:4700::1111", false},
		{"::ffff:8.8.8.8", false},
		{"192.0.3.1", false},
		{"198.51.101.1", false},
		{"203.0.114.1", false},
		{"223.255.255.255", false},
		{"64:ff9b::808:808", false},     // NAT64 of 8.8.8.8 (DNS64 answers these on IPv6-only networks)
		{"64:ff9b::5db8:d70e", false},   // NAT64 of 93.184.215.14
		{"2002:808:808::1", false},      // 6to4 of 8.8.8.8
		{"2001:4860:4860::8888", false}, // outside Teredo's /32
		{"2001:db9::1", false},
		{"3fff:1000::1", false}, // past 3fff::/20
		{"2a00:1450:4001::1", false},
	}
	for _, c := range cases {
		got := ForbiddenTarget(netip.MustParseAddr(c.addr))
		if (got != "") != c.forbidden {
			t.Errorf("ForbiddenTarget(%s) = %q, want forbidden=%v", c.addr, got, c.forbidden)
		}
	}
	if ForbiddenTarget(netip.Addr{}) == "" {
		t.Error("the zero Addr must be refused")
	}
}

// TestForbiddenTargetNamesEmbeddedReason: an address judged by the IPv4
// address it carries says so, and why that address is refused.
func TestForbiddenTargetNamesEmbeddedReason(t *testing.T) {
	for addr, want := range map[string]string{
		"64:ff9b::7f00:1":   "a NAT64 address of a loopback address",
		"2002:a9fe:a9fe::1": "a 6to4 address of a link-local address (cloud metadata lives here)",
		"::ffff:10.0.0.1":   "a private address",
		"2001::1":           "a Teredo address",
		"::808:808":         "an IPv4-compatible address",
	} {
		if got := ForbiddenTarget(netip.MustParseAddr(addr)); got != want {
			t.Errorf("ForbiddenTarget(%s) = %q, want %q", addr, got, want)
		}
	}
}
