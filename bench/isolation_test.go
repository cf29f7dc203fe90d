package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/testbed"
)

func testReceiver(t *testing.T) *receiver {
	t.Helper()
	r, err := newReceiver()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	return r
}

// post sends one delivery-like request to path and returns the status.
func post(c *fasthttp.Client, r *receiver, path, id, attempt string, timeout time.Duration) (int, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(r.url() + path)
	req.Header.SetMethod(fasthttp.MethodPost)
	if id != "" {
		req.Header.Set("webhook-id", id)
	}
	if attempt != "" {
		req.Header.Set("X-Attempt", attempt)
	}
	body := newBody(64)
	stampBody(body, time.Now().UnixNano())
	req.SetBodyRaw(body)
	err := c.DoTimeout(req, resp, timeout)
	return resp.StatusCode(), err
}

func TestReceiverModes(t *testing.T) {
	r := testReceiver(t)
	c := &fasthttp.Client{}
	start := time.Now()
	tl := newTimeline(start, time.Hour, 1)
	tr := newIDTracker(start.Add(time.Hour))
	r.tl.Store(tl)
	r.track.Store(tr)

	if code, err := post(c, r, "/s0", "a", "1", time.Second); err != nil || code != 200 {
		t.Fatalf("ok path: %d %v", code, err)
	}
	if code, err := post(c, r, "/s0", "a", "2", time.Second); err != nil || code != 200 {
		t.Fatalf("ok path again: %d %v", code, err)
	}
	r.setMode(1, 1, testbed.ModeFail)
	if code, err := post(c, r, "/s1", "b", "1", time.Second); err != nil || code != 500 {
		t.Fatalf("500 path: %d %v", code, err)
	}
	if got := r.tb.Totals().Accepted; got != 2 {
		t.Errorf("total = %d, want 2 (500s are not deliveries)", got)
	}
	if got := r.tb.Totals().Failed; got != 1 {
		t.Errorf("failed = %d, want 1", got)
	}
	total, retries, ok := tl.series(1)
	if total[0] != 3 || retries[0] != 1 || ok[0] != 2 {
		t.Errorf("timeline total %d retries %d ok %d, want 3 1 2", total[0], retries[0], ok[0])
	}
	st := tr.stats()
	if st.Unique != 1 || st.Duplicates != 1 || st.UniqueBefore != 1 {
		t.Errorf("tracker %+v, want 1 unique (sent before the cutoff), 1 duplicate", st)
	}

	// Black hole: the client gives up, the receiver lets go.
	r.setMode(2, 1, testbed.ModeBlackhole)
	_, err := post(c, r, "/s2", "c", "1", 200*time.Millisecond)
	if !errors.Is(err, fasthttp.ErrTimeout) {
		t.Fatalf("black hole: err %v, want a timeout", err)
	}
	if !waitFor(context.Background(), 5*time.Second, func() bool { return r.tb.Totals().Holding == 0 }) {
		t.Fatalf("black hole still holds %d after the client closed", r.tb.Totals().Holding)
	}
	if tot := r.tb.Totals(); tot.Held != 1 || tot.HangUps != 1 {
		t.Errorf("held %d, freed by the client %d; want 1, 1", tot.Held, tot.HangUps)
	}

	// Black hole released by the harness: the client sees the connection
	// close without an answer.
	done := make(chan error, 1)
	go func() {
		_, err := post(c, r, "/s2", "d", "1", time.Minute)
		done <- err
	}()
	if !waitFor(context.Background(), 5*time.Second, func() bool { return r.tb.Totals().Holding == 1 }) {
		t.Fatal("request not held")
	}
	r.resetModes()
	select {
	case err := <-done:
		if err == nil {
			t.Error("released request got an answer")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("release did not end the held request")
	}
	if code, err := post(c, r, "/s2", "e", "1", time.Second); err != nil || code != 200 {
		t.Errorf("after resetModes: %d %v", code, err)
	}
}

func TestNaiveRetry(t *testing.T) {
	r := testReceiver(t)
	ctx := context.Background()
	span := 50 * time.Millisecond // 10 events at 200/s

	r.setMode(0, isoSubs, testbed.ModeFail)
	res := naiveRetry(ctx, r.addr, "t1", time.Now(), span, time.Second)
	if res.events != 10 || res.attempts != 10*isoSubs*naiveAttempts || res.lostPairs != 10*isoSubs || res.lostEvents != 10 {
		t.Errorf("all 500: %+v", res)
	}
	if got := r.tb.Totals().Failed; got != res.attempts {
		t.Errorf("receiver saw %d failures, deliverer made %d attempts", got, res.attempts)
	}

	r.setMode(0, isoSubs, testbed.ModeOK)
	res = naiveRetry(ctx, r.addr, "t2", time.Now(), span, time.Second)
	if res.events != 10 || res.attempts != 10*isoSubs || res.lostPairs != 0 {
		t.Errorf("all 200: %+v", res)
	}
}

func TestOutageAnalyse(t *testing.T) {
	start := time.Now()
	tl := newTimeline(start, bucket, 20)
	add := func(k, n, retries int) {
		at := start.Add(time.Duration(k)*bucket + bucket/2)
		for i := range n {
			tl.add(at, i < retries, true)
		}
	}
	for k := range 8 { // 2 s of base: 500 per bucket
		add(k, 500, 0)
	}
	add(8, 900, 400) // outage: a burst of retries, then the base
	for k := 9; k < 12; k++ {
		add(k, 500, 0)
	}
	add(13, 1500, 100) // catch-up after recovery
	o := &outageRun{BasePerSec: 2000}
	o.analyse(tl, 2*time.Second, time.Second, 20)
	if o.PeakOutage != 3600 || o.PeakOutageRatio != 1.8 || o.RetriesOutage != 400 || o.AttemptsOutage != 2400 {
		t.Errorf("outage: %+v", o)
	}
	if o.PeakAfter != 6000 || o.PeakAfterAt != 0.25 || o.MeasuredBase != 2000 {
		t.Errorf("after: peak %v at %v, base %v", o.PeakAfter, o.PeakAfterAt, o.MeasuredBase)
	}
}

func TestYamlDur(t *testing.T) {
	for d, want := range map[time.Duration]string{5 * time.Second: "5s", 100 * time.Millisecond: "100ms", 2500 * time.Millisecond: "2500ms"} {
		if got := yamlDur(d); got != want {
			t.Errorf("yamlDur(%v) = %q, want %q", d, got, want)
		}
	}
}
