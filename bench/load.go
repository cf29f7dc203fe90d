package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// loadSpec describes one producer run: a warm-up, then one measurement
// window. Rate 0 is a closed loop (Conc producers, each waiting for its own
// answer); Rate > 0 is an open loop (event i is due at Start + i/Rate,
// whether or not earlier answers came back, and its latency counts from
// that due time, so queueing shows).
type loadSpec struct {
	Addr string // host:port
	// Addrs, when set, spreads the producers over several hosts (a fleet's
	// nodes): worker w posts to Addrs[w%len(Addrs)], as each replica of a
	// service posts to its own sidecar. Addr is ignored then.
	Addrs []string
	Paths []string // POSTed one after another per event; more than one is the naive fan-out
	Conc  int      // producers (closed) or workers and connections (open)
	Rate  float64  // events/s; 0 = closed loop
	Body  int      // bytes
	// Batch, when above 1, makes each request an NDJSON batch of Batch
	// events (to Paths[0], POST /v1/events), each with its own id and the
	// body; every count but the latency (one per request) is of events.
	Batch  int
	Status int    // the expected answer
	Keys   bool   // a unique Idempotency-Key per event
	KeyID  string // prefix of the keys, unique per run
	Start  time.Time
	Warmup time.Duration
	Dur    time.Duration
	// Grace is how long after the window an open loop may still send events
	// that came due inside it (they are late, and their latency says so);
	// what is still unsent then counts as missed.
	Grace time.Duration
	// Tick, when set, is called at the start (0) and the end (1) of the
	// window from its own goroutine; the scenario takes its snapshots there.
	Tick func(phase int)
	// Stop, when closed, ends the run early: no event is sent after it,
	// and the window ends there (Tick(1) is called then).
	Stop <-chan struct{}
}

// loadResult is what the producers saw. Win* count events whose answer came
// within the window (closed loop) or that were due within it (open loop).
type loadResult struct {
	Sent      int64      `json:"sent"`
	OK        int64      `json:"ok"`
	WinOK     int64      `json:"window_ok"`
	WinDue    int64      `json:"window_due,omitempty"`
	Errors    int64      `json:"transport_errors"`
	BadStatus int64      `json:"bad_status"`
	Status503 int64      `json:"status_503,omitempty"` // of BadStatus: a sidecar shedding load
	Missed    int64      `json:"missed,omitempty"`
	FirstErr  string     `json:"first_error,omitempty"`
	Seconds   float64    `json:"window_seconds"`
	PerSec    float64    `json:"ok_per_s"`
	Lat       latSummary `json:"latency"`
	// Slip is, in an open loop, how late events of the window were sent
	// after their due time: the pacer's own lateness plus waiting for a
	// free worker. When it is large the harness, not the sidecar, is the
	// bottleneck (or every worker was busy: the sidecar saturated).
	Slip *latSummary `json:"send_slip,omitempty"`
}

// maxEventsPerSecond bounds every closed loop in count as well as in time.
const maxEventsPerSecond = 500_000

func runLoad(ctx context.Context, s loadSpec) loadResult {
	if s.Start.IsZero() {
		s.Start = time.Now()
	}
	winStart := s.Start.Add(s.Warmup)
	// A closed loop's window lasts at least as long as its producers took
	// to get their first answers (startup): an event takes about that
	// long, and a window shorter than one event (the naive fan-out's ten
	// POSTs under the race detector on a busy machine) may end before any
	// answer comes. Until the tick goroutine has measured it the end is
	// open (endNs is MaxInt64); an open loop's end is fixed, its events
	// being counted by due time.
	var endNs atomic.Int64
	endNs.Store(math.MaxInt64)
	if s.Rate > 0 {
		endNs.Store(winStart.Add(s.Dur).UnixNano())
	}
	winEndBy := func(t time.Time) bool { return t.UnixNano() >= endNs.Load() }
	var (
		firstAnswers atomic.Int64
		allAnswered  = make(chan struct{})
		startup      atomic.Int64 // ns from Start to the last producer's first answer
	)
	if s.Conc <= 0 {
		close(allAnswered)
	}
	// firstAnswer notes a producer's first answer; the zero time, one
	// that ends without any (the run ended), which must not hold the
	// window open.
	firstAnswer := func(done time.Time) {
		for d := int64(done.Sub(s.Start)); !done.IsZero(); {
			old := startup.Load()
			if d <= old || startup.CompareAndSwap(old, d) {
				break
			}
		}
		if firstAnswers.Add(1) == int64(s.Conc) {
			close(allAnswered)
		}
	}
	addrs := s.Addrs
	if len(addrs) == 0 {
		addrs = []string{s.Addr}
	}
	hcs := make([]*fasthttp.HostClient, len(addrs))
	for i, a := range addrs {
		hcs[i] = &fasthttp.HostClient{
			Addr:                a,
			MaxConns:            (s.Conc + len(addrs) - 1) / len(addrs),
			ReadTimeout:         30 * time.Second,
			WriteTimeout:        30 * time.Second,
			MaxIdleConnDuration: time.Minute,
			MaxConnWaitTimeout:  30 * time.Second,
			MaxResponseBodySize: 1 << 20,
		}
		defer hcs[i].CloseIdleConnections()
	}

	var (
		res     loadResult
		mu      sync.Mutex
		lat     []int64
		slip    []int64
		next    atomic.Int64
		errOnce sync.Once
	)
	var total int64
	if s.Rate > 0 {
		total = int64(s.Rate * (s.Warmup + s.Dur).Seconds())
		res.WinDue = total - int64(s.Rate*s.Warmup.Seconds())
	} else {
		total = int64(maxEventsPerSecond * (s.Warmup + s.Dur).Seconds())
	}
	// The tick goroutine also notes when Stop ended the window early
	// (read after tickDone, so without a race).
	var stopAt time.Time
	tickDone := make(chan struct{})
	go func() {
		defer close(tickDone)
		if sleepUntilOr(ctx, winStart, s.Stop) && s.Tick != nil {
			s.Tick(0)
		}
		ended := sleepUntilOr(ctx, winStart.Add(s.Dur), s.Stop)
		if ended && s.Rate == 0 {
			// Every producer has answered once (or failed), or the run
			// was ended: the window then ends where it is.
			select {
			case <-allAnswered:
			case <-ctx.Done():
				ended = false
			case <-s.Stop:
				ended = false
			}
			end := winStart.Add(max(s.Dur, time.Duration(startup.Load())))
			if !ended {
				end = time.Now()
			}
			endNs.Store(end.UnixNano())
			ended = ended && sleepUntilOr(ctx, end, s.Stop)
		}
		if !ended {
			if now := time.Now().UnixNano(); now < endNs.Load() {
				endNs.Store(now)
			}
			if stopped(s.Stop) {
				stopAt = time.Now()
			}
		}
		if s.Tick != nil {
			s.Tick(1) // always, so the scenario gets its end snapshot
		}
	}()

	worker := func(w int) {
		var (
			sent, ok, winOK, errs, bad, shed, missed int64
			mine, mySlip                             []int64
		)
		body := newBody(s.Body)
		hc := hcs[w%len(hcs)]
		reqs := make([]*fasthttp.Request, len(s.Paths))
		for i, p := range s.Paths {
			r := fasthttp.AcquireRequest()
			r.SetRequestURI("http://" + hc.Addr + p)
			r.Header.SetMethod(fasthttp.MethodPost)
			r.Header.SetContentType("application/json")
			if s.Batch > 1 {
				r.Header.SetContentType("application/x-ndjson")
			}
			r.SetBodyRaw(body)
			reqs[i] = r
		}
		// per is how many events one request carries.
		per := int64(max(s.Batch, 1))
		var batch []byte
		resp := fasthttp.AcquireResponse()
		defer func() {
			for _, r := range reqs {
				fasthttp.ReleaseRequest(r)
			}
			fasthttp.ReleaseResponse(resp)
			mu.Lock()
			res.Sent += sent
			res.OK += ok
			res.WinOK += winOK
			res.Errors += errs
			res.BadStatus += bad
			res.Status503 += shed
			res.Missed += missed
			lat = append(lat, mine...)
			slip = append(slip, mySlip...)
			mu.Unlock()
		}()
		answered := false
		if s.Rate == 0 {
			defer func() {
				if !answered {
					firstAnswer(time.Time{})
				}
			}()
		}
		key := []byte(s.KeyID + "-" + strconv.Itoa(w) + "-")
		keyLen := len(key)
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for n := 0; ctx.Err() == nil; n++ {
			var t0, at time.Time
			if s.Rate > 0 {
				i := next.Add(1) - 1
				if i >= total {
					return
				}
				t0 = s.Start.Add(time.Duration(float64(i) * float64(time.Second) / s.Rate))
				if d := time.Until(t0); d > 0 {
					timer.Reset(d)
					select {
					case <-ctx.Done():
						return
					case <-s.Stop:
						return
					case <-timer.C:
					}
				}
				if stopped(s.Stop) {
					return
				}
				now := time.Now()
				if now.After(time.Unix(0, endNs.Load()).Add(s.Grace)) {
					missed++
					continue
				}
				if !t0.Before(winStart) {
					mySlip = append(mySlip, int64(now.Sub(t0)))
				}
				at = now
			} else {
				t0 = time.Now()
				if winEndBy(t0) || next.Add(1) > total || stopped(s.Stop) {
					return
				}
				at = t0
			}
			stampSent(body, t0.UnixNano(), at.UnixNano())
			if s.Keys {
				key = strconv.AppendInt(key[:keyLen], int64(n), 10)
			}
			if per > 1 {
				batch = appendBatch(batch[:0], key, body, s.Batch)
				reqs[0].SetBodyRaw(batch)
			}
			sent += per
			good := true
			for _, r := range reqs {
				if s.Keys && per == 1 {
					r.Header.SetBytesV("Idempotency-Key", key)
				}
				err := hc.Do(r, resp)
				if err == nil && resp.StatusCode() == s.Status {
					continue
				}
				good = false
				if err != nil {
					errs++
				} else {
					bad++
					if resp.StatusCode() == fasthttp.StatusServiceUnavailable {
						shed++
					}
				}
				errOnce.Do(func() {
					if err != nil {
						res.FirstErr = err.Error()
					} else {
						res.FirstErr = fmt.Sprintf("status %d: %.200s", resp.StatusCode(), resp.Body())
					}
				})
				// Do not spin on a refused connection.
				timer.Reset(time.Millisecond)
				select {
				case <-ctx.Done():
				case <-timer.C:
				}
				break
			}
			done := time.Now()
			if !answered && s.Rate == 0 {
				answered = true
				firstAnswer(done)
			}
			if !good {
				continue
			}
			ok += per
			inWindow := !done.Before(winStart) && !winEndBy(done)
			if s.Rate > 0 {
				inWindow = !t0.Before(winStart) && !winEndBy(t0)
			}
			if inWindow {
				winOK += per
				mine = append(mine, int64(done.Sub(t0)))
			}
		}
	}
	var wg sync.WaitGroup
	for w := range s.Conc {
		wg.Go(func() { worker(w) })
	}
	wg.Wait()
	<-tickDone
	end := time.Unix(0, endNs.Load())
	if !stopAt.IsZero() && stopAt.Before(end) {
		// Stopped early: the window ends at the stop, and only the events
		// due before it were due in it.
		end = stopAt
		if s.Rate > 0 {
			res.WinDue = max(0, int64(s.Rate*end.Sub(winStart).Seconds()))
		}
	}
	res.Seconds = max(end.Sub(winStart), time.Millisecond).Seconds()
	res.PerSec = float64(res.WinOK) / res.Seconds
	res.Lat = summarize(lat)
	if s.Rate > 0 {
		sl := summarize(slip)
		res.Slip = &sl
	}
	return res
}

// appendBatch appends an NDJSON batch of n events of benchType with ids
// key-0..key-(n-1), each with body, to b.
func appendBatch(b, key, body []byte, n int) []byte {
	for j := range n {
		b = append(b, `{"type":"`+benchType+`","id":"`...)
		b = append(b, key...)
		b = append(b, '-')
		b = strconv.AppendInt(b, int64(j), 10)
		b = append(b, `","body":`...)
		b = append(b, body...)
		b = append(b, "}\n"...)
	}
	return b
}

// stopped reports whether stop is closed (a nil channel never is).
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// sleepUntilOr waits for t or until stop is closed; false if ctx ended or
// stop was closed first. A nil stop never closes.
func sleepUntilOr(ctx context.Context, t time.Time, stop <-chan struct{}) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	case <-tm.C:
		return true
	}
}

// sleepUntil waits for t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool { return sleepUntilOr(ctx, t, nil) }

// latSummary is a latency distribution in milliseconds.
type latSummary struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

// summarize sorts ns (nanoseconds) in place.
func summarize(ns []int64) latSummary {
	if len(ns) == 0 {
		return latSummary{}
	}
	slices.Sort(ns)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(ns)))) - 1
		return ms(ns[min(max(i, 0), len(ns)-1)])
	}
	var sum float64
	for _, v := range ns {
		sum += float64(v)
	}
	return latSummary{
		N: len(ns), P50: q(0.50), P90: q(0.90), P99: q(0.99), P999: q(0.999),
		Max: ms(ns[len(ns)-1]), Mean: sum / float64(len(ns)) / 1e6,
	}
}

func ms(ns int64) float64 { return float64(ns) / 1e6 }

// waitFor polls cond every 5 ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}
