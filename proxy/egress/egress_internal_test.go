package egress

import (
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"
)

// TestEgressRoutesSharedPerDistinctTransport: subscriptions that need
// only the defaults get no route (they share the engine's one client and
// its per-host cap, however many); those with the same proxy or the same
// TLS settings share one route; a host in no_proxy is direct; a route no
// lane uses any more is dropped after two sweeps.
func TestEgressRoutesSharedPerDistinctTransport(t *testing.T) {
	g := NewRoutes(Config{MaxConnsPerHost: 4, Now: time.Now, Logger: slog.New(slog.DiscardHandler)})
	mk := func(i int, url string, eg *Egress, tls *ClientTLS) Binding {
		return g.Attach(Settings{ID: fmt.Sprintf("s%d", i), URL: url, Egress: eg, TLS: tls}, Binding{})
	}
	for i := range 50_000 {
		if b := mk(i, "https://hooks.example.com/a", nil, nil); b != (Binding{}) {
			t.Fatalf("a default subscription got a route")
		}
	}
	if len(g.routes) != 0 {
		t.Fatalf("%d routes for default subscriptions", len(g.routes))
	}

	g.def = &Egress{Proxy: "http://proxy.internal:3128", NoProxy: []string{".corp", "10.0.0.0/8"}}
	var inUse []Binding
	var first *route
	for i := range 1000 {
		b := mk(i, fmt.Sprintf("https://t%d.example.com/hook", i), nil, nil)
		if first == nil {
			first = b.route
		}
		if b.route == nil || b.route != first {
			t.Fatalf("subscription %d through the proxy: route %p, want the shared %p", i, b.route, first)
		}
		inUse = append(inUse, b)
	}
	for _, u := range []string{"https://a.corp/x", "http://10.1.2.3/x"} {
		if b := mk(0, u, nil, nil); b.route != nil {
			t.Fatalf("%s is in no_proxy but got route %+v", u, b.route.key)
		}
	}
	if b := mk(0, "https://t.example.com", &Egress{}, nil); b.route != nil {
		t.Fatalf("a subscription's own direct egress got route %+v", b.route.key)
	}
	tlsA, tlsB := &ClientTLS{ServerName: "a"}, &ClientTLS{ServerName: "b"}
	a1, a2, b := mk(1, "https://x.example.com", nil, tlsA), mk(2, "https://y.example.com", nil, &ClientTLS{ServerName: "a"}), mk(3, "https://x.example.com", nil, tlsB)
	if a1.route != a2.route || a1.route == b.route || a1.route == first {
		t.Fatal("routes must be one per distinct proxy and TLS setting")
	}
	if len(g.routes) != 3 {
		t.Fatalf("%d routes, want 3 (the proxy, and the proxy with each TLS setting)", len(g.routes))
	}

	inUse = append(inUse, a1)
	g.sweep(slices.Values(inUse))
	g.sweep(slices.Values(inUse))
	if len(g.routes) != 2 || g.routes[first.key] != first || g.routes[a1.route.key] != a1.route {
		t.Fatalf("after two sweeps: %d routes, want the 2 lanes use", len(g.routes))
	}
}

// TestEgressBypass: no_proxy's forms.
func TestEgressBypass(t *testing.T) {
	e := &Egress{NoProxy: []string{"hooks.example.com", ".corp", "192.168.0.0/16", "10.1.2.3", "::1", "Mixed.Case"}}
	for host, want := range map[string]bool{
		"hooks.example.com": true, "a.hooks.example.com": true, "HOOKS.example.com.": true, "example.com": false, "xhooks.example.com": false,
		"a.corp": true, "corp": false, "192.168.4.5": true, "192.169.0.1": false, "10.1.2.3": true, "10.1.2.4": false,
		"::1": true, "mixed.case": true,
	} {
		if got := e.bypass(host); got != want {
			t.Errorf("bypass(%q) = %v, want %v", host, got, want)
		}
	}
	if !(&Egress{NoProxy: []string{"*"}}).bypass("anything") {
		t.Error(`"*" bypasses every host`)
	}
}
