package queue_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/queue"
)

// TestVariantRenderingOncePerKey: lanes racing for an event's variants
// render each one once and all get its bytes.
func TestVariantRenderingOncePerKey(t *testing.T) {
	ev := &queue.Event{Body: []byte(`{}`)}
	var renders atomic.Int64
	keys := []string{"a", "b", "c"}
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			key := keys[i%len(keys)]
			got, err := ev.Rendering(key).Do(func() ([]byte, error) {
				renders.Add(1)
				return []byte(key), nil
			})
			if err != nil || string(got) != key {
				t.Errorf("rendering %s: %q %v", key, got, err)
			}
		})
	}
	wg.Wait()
	if n := renders.Load(); n != int64(len(keys)) {
		t.Fatalf("%d renders for %d keys", n, len(keys))
	}
	failed := ev.Rendering("bad")
	for range 2 {
		if _, err := failed.Do(func() ([]byte, error) { renders.Add(1); return nil, fmt.Errorf("no") }); err == nil {
			t.Fatal("a failed rendering returned no error")
		}
	}
	if n := renders.Load(); n != int64(len(keys))+1 {
		t.Fatalf("a failed rendering ran %d times", n-int64(len(keys)))
	}
}
