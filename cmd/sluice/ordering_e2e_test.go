package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// TestOrderingSurvivesSIGKILL: a real `sluice serve` with an `ordering:
// key` subscription, killed with SIGKILL twice while 4 keys of 30 events
// each go to an endpoint that fails about a third of the attempts (so
// retry records hold keys across the kills). The receiver checks every
// request as it arrives: an event's first request never comes before
// the event ahead of it in its key was acknowledged. After the last
// restart every event is acknowledged.
func TestOrderingSurvivesSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs a real sidecar")
	}
	type state struct {
		acked    int // highest index acknowledged in order; -1 before
		problems []string
	}
	var mu sync.Mutex
	keys := []string{"veh-1", "veh-2", "veh-3", "veh-4"}
	const n = 30
	st := map[string]*state{}
	for _, k := range keys {
		st[k] = &state{acked: -1}
	}
	tries := map[string]int{}
	k, _ := signing.ParseSecret(e2eSecret)
	tb := testbed.New(testbed.Options{Secrets: []signing.Secret{k}, Hook: func(req testbed.Request, status int) int {
		var b struct {
			K string `json:"k"`
			I int    `json:"i"`
		}
		if err := json.Unmarshal(req.Body(), &b); err != nil || status != http.StatusOK {
			return http.StatusBadRequest
		}
		mu.Lock()
		defer mu.Unlock()
		s := st[b.K]
		if s == nil || string(req.Header("Ordering-Key")) != b.K {
			return http.StatusBadRequest
		}
		if b.I > s.acked+1 && len(s.problems) < 5 {
			s.problems = append(s.problems, fmt.Sprintf("%s/%d (attempt %s) sent before %d was acknowledged", b.K, b.I, req.Header("X-Attempt"), b.I-1))
		}
		id := fmt.Sprintf("%s/%d", b.K, b.I)
		tries[id]++
		// About a third of the attempts fail; never the sixth.
		if tries[id] < 6 && fnv32(id+"/"+strconv.Itoa(tries[id]))%3 == 0 {
			return http.StatusServiceUnavailable
		}
		if b.I == s.acked+1 {
			s.acked = b.I
		}
		return http.StatusOK
	}})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.Close() })

	dir := t.TempDir()
	sc := newSidecar(t, dir, fmt.Sprintf(`  - id: ordered
    url: %s/ordered
    secret: %s
    ordering: key
    concurrency: {max: 8}
    retry: {base: 50ms, cap: 300ms, max_attempts: 100}
`, tb.URL(), e2eSecret))
	sc.start()

	// One producer per key, in order; a POST a kill cut short is sent
	// again with its Idempotency-Key until answered 2xx.
	var wg sync.WaitGroup
	for _, key := range keys {
		wg.Go(func() {
			for i := range n {
				body := fmt.Sprintf(`{"k":%q,"i":%d}`, key, i)
				for try := 0; ; try++ {
					req, _ := http.NewRequest(http.MethodPost, "http://sluice/v1/events/t", strings.NewReader(body))
					req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", key, i))
					req.Header.Set("Ordering-Key", key)
					resp, err := sc.client.Do(req)
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode/100 == 2 {
							break
						}
					}
					if try > 1000 {
						t.Errorf("POST %s: %v", body, err)
						return
					}
					time.Sleep(10 * time.Millisecond) // the sidecar is restarting
				}
				time.Sleep(3 * time.Millisecond) // a steady stream
			}
		})
	}
	for range 2 {
		time.Sleep(250 * time.Millisecond) // into the stream
		sc.kill()
		sc.start()
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		mu.Lock()
		done := true
		for _, s := range st {
			done = done && (s.acked == n-1 || len(s.problems) > 0) // out of order: it would only time out
		}
		mu.Unlock()
		if done {
			break
		}
		select {
		case <-ctx.Done():
			mu.Lock()
			for k, s := range st {
				t.Errorf("key %s: acknowledged in order up to %d of %d", k, s.acked, n-1)
			}
			mu.Unlock()
			t.FailNow()
		case <-time.After(10 * time.Millisecond): // polling the receiver
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for k, s := range st {
		for _, p := range s.problems {
			t.Error(p)
		}
		if s.acked != n-1 {
			t.Errorf("key %s: acknowledged in order up to %d of %d", k, s.acked, n-1)
		}
	}
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}
