package proxy

import (
	"net/netip"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// SetEgressTestHooks lets the tests of package proxy_test see the egress
// work with the SSRF guard on although all they reach is loopback: the
// guard of o's egress proxy refuses what policy.ForbiddenTarget refuses
// except allow (a second loopback address the test's endpoints listen
// on), and the egress files are checked every check instead of
// DefaultEgressCheckInterval. The direct dialer keeps the real guard.
func SetEgressTestHooks(o *Options, allow netip.Addr, check time.Duration) {
	o.forbiddenTarget = func(ip netip.Addr) string {
		if ip.Unmap() == allow {
			return ""
		}
		return policy.ForbiddenTarget(ip)
	}
	o.egressCheckInterval = check
}
