package delivery

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/signing"
)

// snippetBytes is how much of a failed response a dead letter keeps.
const snippetBytes = 256

// workerState is scratch space owned by one worker goroutine, so a delivery
// allocates nothing for its headers.
type workerState struct {
	sig         []byte
	num         []byte
	traceParent []byte      // tracing.go: an attempt span's traceparent
	wait        *time.Timer // hostGate.enter's, made on the first wait and reused
}

// deliver makes one HTTP exchange. The body is the stored slice itself,
// or its variant's one rendering (payload), shared by every lane: it is
// set raw, never copied or re-encoded.
func (e *engine) deliver(j *job, w *workerState) result {
	sub, ev := j.sub, j.ev
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)

	// Body variants (variant.go) and formats (format.go): body is the
	// stored slice, or the subscription's variant or structured
	// CloudEvent, rendered once for every lane sending it; either way
	// shared, never copied, and what the signature covers.
	body, contentType, ce, verr := e.payload(j)
	if verr != nil {
		// Cannot happen: the lane rendered this event for this
		// subscription before it started j (lane.unrenderable). Were it
		// to, nothing is sent.
		var res result
		res.Failure, res.Outcome = policy.FailTransport, policy.Retry
		return res
	}

	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(sub.URL)
	now := e.now()
	ts := now.Unix()
	w.sig = signing.AppendSignature(w.sig[:0], sub.LiveSecrets(now), ev.ID, ts, body)
	w.num = strconv.AppendInt(w.num[:0], ts, 10)
	h := &req.Header
	h.Set(signing.HeaderID, ev.ID)
	h.SetBytesV(signing.HeaderTimestamp, w.num)
	h.SetBytesV(signing.HeaderSignature, w.sig)
	h.Set("Idempotency-Key", ev.ID)
	h.Set("X-Event-Type", ev.Type)
	w.num = strconv.AppendInt(w.num[:0], int64(j.attempt), 10)
	h.SetBytesV("X-Attempt", w.num)
	orderingHeaders(h, j) // Ordering-Key, X-Sluice-Replay (ordering.go)
	if contentType != "" {
		h.SetContentType(contentType)
	}
	for name, value := range ce.All() { // CloudEvents binary mode (format.go): rendered once per event
		h.SetCanonical(name, value)
	}
	for k, v := range sub.Headers {
		h.Set(k, v)
	}
	req.SetBodyRaw(body)

	timeout := sub.Timeout
	if e.fleet != nil {
		// A request must end before the lane's lease could pass to another
		// node, or the lane's cap would hold per node again: when this
		// node loses the lease it stops starting requests, but fasthttp
		// cannot cancel those in flight, so their deadline is bounded
		// from the start. With renewals every lease_ttl/3 this leaves a
		// request at least about 2/3 of lease_ttl.
		left := time.Until(e.fleet.LeaseExpiry(j.lane.id)) - leaseSafety
		if left <= 0 {
			var res result
			res.Failure, res.Outcome = policy.FailTimeout, policy.Retry
			return res // not sent; the outcome's write is fenced and the new owner sends it
		}
		timeout = min(timeout, left)
	}
	span := e.trace.attempt(j, w, &req.Header) // tracing.go: trace headers, the attempt's span
	var err error
	g := e.gates.of(sub, e.client)
	if g != nil {
		var waited time.Duration
		waited, err = g.enter(timeout, w)
		timeout -= waited
	}
	if err == nil {
		err = sub.binding.Do(e.client, req, resp, timeout) // the proxy, endpoint TLS and OAuth2 of sub
		if g != nil {
			g.leave() // fasthttp has put the connection back already
		}
	}
	var res result
	res.span = span
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		// The status line arrived; an oversized answer does not change it.
		err = nil
	}
	if err != nil {
		res.Failure = egress.Failure(err)
		if res.Failure == policy.FailTransport {
			// The word says nothing here; the log says what happened.
			e.log.Warn("delivery attempt failed", "subscription", sub.ID, "attempt", j.attempt,
				"error", egress.TransportCause(err, egress.URLHost(sub.URL)))
		}
	} else {
		res.Status = resp.StatusCode()
	}
	res.Outcome = policy.Classify(res.Status, err, sub.Classify)
	if res.Outcome == policy.Retry && res.Status != 0 {
		if v := resp.Header.Peek("Retry-After"); len(v) > 0 {
			res.RetryAfter, _ = policy.ParseRetryAfterAt(string(v), e.now(), string(resp.Header.Peek("Date")))
		}
	}
	if res.Status != 0 && announces(&resp.Header) {
		res.announced, res.announcedOK = policy.ParseAnnounced(func(k string) string { return string(resp.Header.Peek(k)) }, e.now())
	}
	if res.Outcome != policy.Ack && res.Status != 0 {
		res.snippet = snippet(resp.Body())
	}
	return res
}

// announces reports whether h carries an announced limit at all, so that
// the common response, which does not, costs three lookups and nothing
// allocated.
func announces(h *fasthttp.ResponseHeader) bool {
	return len(h.Peek("RateLimit")) > 0 || len(h.Peek("RateLimit-Remaining")) > 0 || len(h.Peek("X-RateLimit-Remaining")) > 0
}

// hostGates hold one hostGate per endpoint host of the shared client.
//
// A fan-out to one host runs more requests at once than the per-host cap
// (the lanes' caps add up: 10 lanes of 64 against 64 connections), and
// fasthttp queues a request that finds every connection busy in its own
// wait list: two allocations and a pooled timer per wait, the host's lock
// taken again to hand the connection over, and a goroutine woken through
// a closed channel. Waiting here instead, on a channel semaphore of the
// same size, parks the worker with nothing allocated; fasthttp then always
// finds a connection idle or may dial one, and its cap still holds behind
// this one. Measured: 2.5 -> 0.5 allocations per delivery
// (BenchmarkDeliverClient, body=512, conc=256) and 560 -> 410 B
// (BenchmarkDelivery, fanout=10); the CPU per delivery did not move
// beyond the noise, the park and wake-up being the same.
//
// Requests through an egress route use the route's own client and are not
// gated here. The zero value is ready.
type hostGates struct {
	byURL sync.Map // Subscription.URL → *hostGate: the hot lookup, no lock

	mu     sync.Mutex
	byHost map[string]*hostGate // scheme and host as fasthttp keys its host clients
	urls   int                  // entries stored in byURL
}

// maxGateURLs bounds byURL, which only caches: URLs of removed
// subscriptions would otherwise stay. Past it the cache starts again.
const maxGateURLs = 1 << 16

// of returns the gate of sub's endpoint host, or nil when its requests do
// not go through client (an egress route) or client has no per-host cap.
func (g *hostGates) of(sub *Subscription, client *fasthttp.Client) *hostGate {
	if sub.binding.Routed() || client.MaxConnsPerHost <= 0 {
		return nil
	}
	if v, ok := g.byURL.Load(sub.URL); ok {
		return v.(*hostGate)
	}
	var u fasthttp.URI
	if err := u.Parse(nil, []byte(sub.URL)); err != nil {
		return nil // fasthttp refuses it too, and says why
	}
	key := string(u.Scheme()) + "://" + string(u.Host())
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.byHost[key]
	if h == nil {
		if g.byHost == nil {
			g.byHost = map[string]*hostGate{}
		}
		h = &hostGate{slots: make(chan struct{}, client.MaxConnsPerHost), maxWait: client.MaxConnWaitTimeout}
		g.byHost[key] = h
	}
	if g.urls++; g.urls > maxGateURLs {
		g.byURL.Clear()
		g.urls = 1
	}
	g.byURL.Store(sub.URL, h)
	return h
}

// hostGate admits at most cap(slots) requests to one host at a time.
type hostGate struct {
	slots   chan struct{}
	maxWait time.Duration // the client's MaxConnWaitTimeout
}

// enter takes a slot, waiting at most min(timeout, maxWait) for one, and
// returns how long it waited. Past the wait it fails as fasthttp's own
// wait did: ErrTimeout when the request's timeout bounded it (a timeout,
// for the breaker and the retry), else ErrNoFreeConns.
func (h *hostGate) enter(timeout time.Duration, w *workerState) (time.Duration, error) {
	select {
	case h.slots <- struct{}{}:
		return 0, nil
	default:
	}
	limit, err := timeout, error(fasthttp.ErrTimeout)
	if h.maxWait > 0 && h.maxWait < timeout {
		limit, err = h.maxWait, fasthttp.ErrNoFreeConns
	}
	if w.wait == nil {
		w.wait = time.NewTimer(limit)
	} else {
		w.wait.Reset(limit)
	}
	start := time.Now()
	select {
	case h.slots <- struct{}{}:
		w.wait.Stop()
		return time.Since(start), nil
	case <-w.wait.C:
		return 0, err
	}
}

func (h *hostGate) leave() { <-h.slots }

func snippet(b []byte) string {
	if len(b) > snippetBytes {
		b = b[:snippetBytes]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

func sortStatuses(s []api.LaneStatus) {
	slices.SortFunc(s, func(a, b api.LaneStatus) int { return strings.Compare(a.Subscription, b.Subscription) })
}

// leaseSafety is how long before a lane's lease could pass elsewhere its
// requests must have ended (fleet mode): scheduling and the servers'
// clocks, which count the TTL, are not exact.
const leaseSafety = 250 * time.Millisecond
