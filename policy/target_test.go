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

		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"172.32.0.1", false},
		{"100.128.0.1", false},
		{"93.184.215.14", false},
		{"2606:4700:4700::1111", false},
		{"::ffff:8.8.8.8", false},
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
