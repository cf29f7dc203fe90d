package policy_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// A delivery engine's decision after one attempt: classify the exchange
// with the subscription's overrides, then ask the retry policy when to try
// again. The clock and the jitter are injected here so the output is fixed.
func Example() {
	overrides, err := policy.ParseClassify(map[string]string{"409": "ack"})
	if err != nil {
		fmt.Println(err)
		return
	}
	p := policy.DefaultRetryPolicy()
	p.Backoff.Rand = func() float64 { return 0.5 }

	first := time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)
	now := first.Add(3 * time.Second)

	for _, resp := range []struct {
		status     int
		retryAfter string
	}{
		{409, ""},
		{503, "120"},
		{500, ""},
		{404, ""},
	} {
		switch o := policy.Classify(resp.status, nil, overrides); o {
		case policy.Ack:
			fmt.Printf("%d: %s\n", resp.status, o)
		case policy.DeadLetter:
			fmt.Printf("%d: %s (%s)\n", resp.status, o, policy.ReasonRejected)
		case policy.Retry:
			ra, _ := policy.ParseRetryAfter(resp.retryAfter, now)
			due, reason, ok := p.Next(2, first, now, ra)
			if !ok {
				fmt.Printf("%d: dead_letter (%s)\n", resp.status, reason)
				continue
			}
			fmt.Printf("%d: %s in %v\n", resp.status, o, due.Sub(now))
		}
	}

	_, err = policy.ParseClassify(map[string]string{"4xx": "retry"})
	fmt.Println(err)
	// Output:
	// 409: ack
	// 503: retry in 2m0s
	// 500: retry in 1s
	// 404: dead_letter (rejected)
	// parse classify key "4xx": invalid status code (want an exact code 100-599)
}
