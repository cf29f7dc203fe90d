package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/proxy/delivery"
)

// BenchmarkStartupSubscriptions50k is the start-up work of the config for
// 50,000 subscriptions shaped as the lanes-50k bench writes them: Load of
// the file, YAML (flow mappings, one a line) or JSON (one line, as
// json.Encoder writes it), then the conversion to the proxy's
// subscriptions. It reports the heap the subscriptions keep (proxy values,
// their Specs) per subscription, and the bytes of Spec alone.
func BenchmarkStartupSubscriptions50k(b *testing.B) {
	const n = 50_000
	var yml bytes.Buffer
	yml.WriteString("allow_private_targets: true\nsubscriptions:\n")
	type sub struct {
		ID          string         `json:"id"`
		URL         string         `json:"url"`
		Secret      string         `json:"secret"`
		Types       []string       `json:"types"`
		Concurrency map[string]int `json:"concurrency"`
	}
	subs := make([]sub, 0, n)
	for i := range n {
		typ := "idle.type"
		if i%100 == 0 {
			typ = "bench.event"
		}
		fmt.Fprintf(&yml, "  - {id: s%d, url: \"http://127.0.0.1:40000/s%d\", secret: %q, types: [%q], concurrency: {max: 8}}\n", i, i, e2eSecret, typ)
		subs = append(subs, sub{ID: fmt.Sprintf("s%d", i), URL: fmt.Sprintf("http://127.0.0.1:40000/s%d", i), Secret: e2eSecret,
			Types: []string{typ}, Concurrency: map[string]int{"max": 8}})
	}
	var js bytes.Buffer
	if err := json.NewEncoder(&js).Encode(map[string]any{"allow_private_targets": true, "subscriptions": subs}); err != nil {
		b.Fatal(err)
	}
	for _, f := range []struct {
		name string
		doc  []byte
	}{{"yaml", yml.Bytes()}, {"json", js.Bytes()}} {
		b.Run(f.name, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "lanes."+f.name)
			if err := os.WriteFile(path, f.doc, 0o600); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			var subs []*delivery.Subscription
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
		})
	}
}

// fieldBytes returns the []byte field name of s, or nil when s has none
// (so the benchmark also builds on a tree from before Spec).
func fieldBytes(s *delivery.Subscription, name string) []byte {
	f := reflect.ValueOf(s).Elem().FieldByName(name)
	if !f.IsValid() {
		return nil
	}
	return f.Bytes()
}

// TestStartupLogCountsAPISubscriptions: the "sluice serving" line counts
// the API's subscriptions, read back from the log, beside the file's; a
// count of the file's alone made a restart look as if the API's were lost.
func TestStartupLogCountsAPISubscriptions(t *testing.T) {
	dir := t.TempDir()
	tb := startReceiver(t)
	sc := newDrainSidecar(t, dir, time.Second, subYAML("filed", tb.URL()+"/filed", `["*"]`))
	sc.startServing(t)
	if !strings.Contains(sc.log.String(), "subscriptions=1 file_subscriptions=1 api_subscriptions=0") {
		t.Fatalf("first start's serving line does not count the file's one subscription:\n%s", sc.log.String())
	}
	for _, id := range []string{"api-a", "api-b"} {
		mustRun(t, "subscriptions", "create", "--id", id, "--url", tb.URL()+"/"+id, "--config", sc.config)
	}
	sc.cmd.Process.Signal(syscall.SIGTERM)
	if err := sc.cmd.Wait(); err != nil {
		t.Fatalf("drain: %v\n%s", err, sc.log.String())
	}
	sc.startServing(t)
	if !strings.Contains(sc.log.String(), "subscriptions=3 file_subscriptions=1 api_subscriptions=2") {
		t.Fatalf("after a restart the serving line does not count the API's two subscriptions:\n%s", sc.log.String())
	}
}
