package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/proxy"
)

// BenchmarkStartupSubscriptions50k is the start-up work of the config for
// 50,000 subscriptions shaped as the lanes-50k bench writes them: Load of
// the YAML file, then the conversion to the proxy's subscriptions. It
// reports the heap the subscriptions keep (proxy values, their Specs) per
// subscription, and the bytes of Spec alone.
func BenchmarkStartupSubscriptions50k(b *testing.B) {
	const n = 50_000
	var buf bytes.Buffer
	buf.WriteString("allow_private_targets: true\nsubscriptions:\n")
	for i := range n {
		typ := "idle.type"
		if i%100 == 0 {
			typ = "bench.event"
		}
		fmt.Fprintf(&buf, "  - {id: s%d, url: \"http://127.0.0.1:40000/s%d\", secret: %q, types: [%q], concurrency: {max: 8}}\n", i, i, e2eSecret, typ)
	}
	path := filepath.Join(b.TempDir(), "lanes.yaml")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		b.Fatal(err)
	}
	var subs []*proxy.Subscription
	for b.Loop() {
		cfg, err := config.Load(path, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		subs = subscriptions(cfg)
	}
	b.StopTimer()
	specBytes := 0
	for _, s := range subs {
		specBytes += len(fieldBytes(s, "Spec"))
	}
	var with, without runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&with)
	runtime.KeepAlive(subs)
	subs = nil
	runtime.GC()
	runtime.ReadMemStats(&without)
	b.ReportMetric(float64(specBytes)/n, "spec-B/sub")
	b.ReportMetric(float64(int64(with.HeapAlloc)-int64(without.HeapAlloc))/n, "kept-B/sub")
}

// fieldBytes returns the []byte field name of s, or nil when s has none
// (so the benchmark also builds on a tree from before Spec).
func fieldBytes(s *proxy.Subscription, name string) []byte {
	f := reflect.ValueOf(s).Elem().FieldByName(name)
	if !f.IsValid() {
		return nil
	}
	return f.Bytes()
}
