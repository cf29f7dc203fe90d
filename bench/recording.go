package main

import (
	"bytes"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/testbed"
)

// receiver is the webhook endpoint of every scenario: a testbed.Server in
// lean mode (answers without body or default headers, no webhook-ids kept:
// it takes millions of deliveries) that counts per path (/s<N>), and the
// harness's instruments on its Hook. While a latency window is open it
// records publish→receipt latency from the "sent_ns" the producer stamped
// into the body; a timeline counts requests in time buckets; an id tracker
// counts first deliveries and duplicates per (path, webhook-id).
//
// Each path /s<N> has a mode (setMode): it answers 200 (the default),
// 500, or is a black hole that accepts the request and never answers,
// holding it until the client gives up and closes the connection, the
// harness releases it (resetModes, close), or maxHold passes. Only 200
// answers count as deliveries (Totals().Accepted, perPath); every request,
// answered or not, is counted in Totals().Requests and, while one is set,
// in the timeline.
type receiver struct {
	tb    *testbed.Server
	addr  string
	rec   atomic.Pointer[latRecorder]
	tl    atomic.Pointer[timeline]
	track atomic.Pointer[idTracker]
	nodes atomic.Pointer[nodeWatch]
}

// maxHold bounds how long a black hole holds one request, whatever the
// client does.
const maxHold = 2 * time.Minute

func newReceiver() (*receiver, error) {
	r := &receiver{}
	r.tb = testbed.New(testbed.Options{Lean: true, MaxHold: maxHold, Hook: r.hook})
	if err := r.tb.Open("127.0.0.1:0"); err != nil {
		return nil, err
	}
	r.addr = r.tb.Addr()
	return r, nil
}

// hook feeds the instruments that are set; it never changes the answer.
// It allocates nothing: the hot path of every throughput scenario.
func (r *receiver) hook(req testbed.Request, status int) int {
	rec, tl, tr, nw := r.rec.Load(), r.tl.Load(), r.track.Load(), r.nodes.Load()
	if rec == nil && tl == nil && tr == nil && nw == nil {
		return status
	}
	now := req.Received()
	if tl != nil {
		tl.add(now, isRetry(req.Header("X-Attempt")), status == 200)
	}
	if status != 200 || (rec == nil && tr == nil && nw == nil) {
		return status
	}
	i, ok := pathIndex(req.Path())
	if !ok {
		i = -1
	}
	if nw != nil {
		nw.add(i, req.Header(nodeHeader), now)
	}
	if rec == nil && tr == nil {
		return status
	}
	sent, ok := sentNs(req.Body())
	if rec != nil && ok && sent >= rec.from && rec.wants(i) {
		at, ok := atNs(req.Body())
		if !ok {
			at = sent
		}
		rec.add(now.UnixNano()-sent, now.UnixNano()-at)
	}
	if tr != nil {
		tr.add(i, req.Header("webhook-id"), sent)
	}
	return status
}

// isRetry reports whether an X-Attempt header says this is not the first
// attempt (sluice and the naive deliverer number attempts from 1).
func isRetry(v []byte) bool {
	return len(v) > 0 && !(len(v) == 1 && v[0] == '1')
}

func pathName(i int) string { return "/s" + strconv.Itoa(i) }

// setMode sets the mode of paths /s<from> .. /s<from+n-1>; ModeOK is the
// default, which the paths then fall back to.
func (r *receiver) setMode(from, n int, mode testbed.Mode) {
	if mode == testbed.ModeOK {
		mode = ""
	}
	for i := from; i < from+n; i++ {
		r.tb.SetMode(pathName(i), mode)
	}
}

// resetModes makes every path answer 200 again and releases what the
// black holes hold.
func (r *receiver) resetModes() {
	r.tb.ResetModes()
	r.tb.Release()
}

func (r *receiver) close() { r.tb.Close() }

// url is the receiver's base URL.
func (r *receiver) url() string { return "http://" + r.addr }

// delivered is the number of 200 answers.
func (r *receiver) delivered() int64 { return r.tb.Totals().Accepted }

// snapshotPaths copies the delivery counts of paths /s0 .. /s<n-1>.
func (r *receiver) snapshotPaths(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = r.tb.Accepted(pathName(i))
	}
	return out
}

// startRecording opens a latency window for deliveries of events sent at or
// after from; capacity bounds the samples kept (the rest are counted as
// dropped). With only set, deliveries to /s<i> count only where only[i].
func (r *receiver) startRecording(from time.Time, capacity int, only []bool) *latRecorder {
	rec := &latRecorder{from: from.UnixNano(), v: make([]atomic.Int64, capacity), net: make([]atomic.Int64, capacity), only: only}
	r.rec.Store(rec)
	return rec
}

// stopRecording closes the window and returns its samples (nanoseconds).
func (r *receiver) stopRecording(rec *latRecorder) []int64 {
	r.rec.CompareAndSwap(rec, nil)
	return rec.samples()
}

// latRecorder keeps latency samples written by concurrent handlers.
type latRecorder struct {
	from    int64
	only    []bool // nil: every path
	n       atomic.Int64
	dropped atomic.Int64
	v       []atomic.Int64 // from the due time (sent_ns)
	net     []atomic.Int64 // the same deliveries from the actual send (at_ns)
}

// wants reports whether deliveries to path index i (-1: not /s<N>) count.
func (l *latRecorder) wants(i int) bool {
	return l.only == nil || i >= 0 && i < len(l.only) && l.only[i]
}

func (l *latRecorder) add(ns, netNs int64) {
	i := l.n.Add(1) - 1
	if i >= int64(len(l.v)) {
		l.dropped.Add(1)
		return
	}
	l.v[i].Store(ns)
	l.net[i].Store(netNs)
}

// netSamples are the latencies from the actual send.
func (l *latRecorder) netSamples() []int64 { return l.stored(l.net) }

func (l *latRecorder) samples() []int64 { return l.stored(l.v) }

// stored returns the samples of vs the handlers claimed and stored.
func (l *latRecorder) stored(vs []atomic.Int64) []int64 {
	n := min(l.n.Load(), int64(len(vs)))
	out := make([]int64, 0, n)
	for i := range n {
		// A handler may have claimed a slot and not stored yet: skip zeros.
		if v := vs[i].Load(); v != 0 {
			out = append(out, v)
		}
	}
	return out
}

// pathIndex parses "/s<N>".
func pathIndex(p []byte) (int, bool) {
	if len(p) < 3 || p[0] != '/' || p[1] != 's' || len(p) > 12 {
		return 0, false
	}
	n := 0
	for _, c := range p[2:] {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// Event bodies are JSON objects that start with the send time, so the
// receiver finds it with one bytes.Index and no JSON decoding:
//
//	{"sent_ns":1767225600123456789,"at_ns":1767225600123456789,"pad":"xxxx…"}
//
// sent_ns is when the event was due (an open loop's schedule; in a closed
// loop, when it was sent), at_ns when the producer actually sent it: the
// difference is the harness's own lateness, which publish→receipt from
// sent_ns counts and from at_ns does not.
var (
	sentKey = []byte(`"sent_ns":`)
	atKey   = []byte(`,"at_ns":`)
)

// sentDigits is the width of the send time: unix nanoseconds have 19
// digits from 2001 to 2286, so the field never needs a leading zero (which
// JSON forbids).
const sentDigits = 19

// newBody returns a body of size bytes (at least the fixed part) with a
// placeholder send time; stampBody fills it in.
func newBody(size int) []byte {
	stamp := "1" + string(bytes.Repeat([]byte("0"), sentDigits-1))
	head := `{"sent_ns":` + stamp + string(atKey) + stamp + `,"pad":"`
	tail := `"}`
	pad := max(0, size-len(head)-len(tail))
	b := make([]byte, 0, len(head)+pad+len(tail))
	b = append(b, head...)
	b = append(b, bytes.Repeat([]byte("x"), pad)...)
	return append(b, tail...)
}

// stampBody writes ns as the body's due and send time, in place.
func stampBody(b []byte, ns int64) { stampSent(b, ns, ns) }

// stampSent writes the body's due time and the time it is sent, in place.
func stampSent(b []byte, due, at int64) {
	off := 1 + len(sentKey)
	putDigits(b[off:off+sentDigits], due)
	off += sentDigits + len(atKey)
	putDigits(b[off:off+sentDigits], at)
}

func putDigits(b []byte, ns int64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte('0' + ns%10)
		ns /= 10
	}
}

// atNs reads the time a body made by newBody was actually sent.
func atNs(body []byte) (int64, bool) {
	i := bytes.Index(body, atKey)
	if i < 0 {
		return 0, false
	}
	return leadingNs(body[i+len(atKey):])
}

// sentNs reads the send time of a body made by newBody.
func sentNs(body []byte) (int64, bool) {
	i := bytes.Index(body, sentKey)
	if i < 0 {
		return 0, false
	}
	return leadingNs(body[i+len(sentKey):])
}

// leadingNs reads the unix nanoseconds b starts with.
func leadingNs(b []byte) (int64, bool) {
	var n int64
	digits := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int64(c-'0')
		digits++
	}
	return n, digits > 0 && n > 0
}

// timeline counts the requests reaching the receiver in buckets of width
// from start on: all of them, the retries among them (X-Attempt > 1) and
// those answered 200. Requests outside its span are not counted.
type timeline struct {
	start   time.Time
	width   time.Duration
	total   []atomic.Int64
	retries []atomic.Int64
	ok      []atomic.Int64
}

func newTimeline(start time.Time, width time.Duration, n int) *timeline {
	return &timeline{start: start, width: width, total: make([]atomic.Int64, n),
		retries: make([]atomic.Int64, n), ok: make([]atomic.Int64, n)}
}

func (t *timeline) add(now time.Time, retry, ok bool) {
	if now.Before(t.start) {
		return
	}
	k := int(now.Sub(t.start) / t.width)
	if k >= len(t.total) {
		return
	}
	t.total[k].Add(1)
	if retry {
		t.retries[k].Add(1)
	}
	if ok {
		t.ok[k].Add(1)
	}
}

// series returns the first n buckets of each count.
func (t *timeline) series(n int) (total, retries, ok []int64) {
	n = min(n, len(t.total))
	total, retries, ok = make([]int64, n), make([]int64, n), make([]int64, n)
	for i := range n {
		total[i], retries[i], ok[i] = t.total[i].Load(), t.retries[i].Load(), t.ok[i].Load()
	}
	return
}

// idTracker counts the 200 answers per (path, webhook-id): the first one
// of each pair is a delivery, any further one a duplicate. Deliveries of
// events sent (by their sent_ns) before cutoff are also counted apart.
type idTracker struct {
	cutoff int64 // unix ns; 0 = none

	mu           sync.Mutex
	seen         map[trackKey]int32
	unique       int64
	dups         int64
	noID         int64 // 200 answers without a webhook-id header
	uniqueBefore int64
	last         time.Time // of the last first delivery
}

type trackKey struct {
	path int
	id   string
}

func newIDTracker(cutoff time.Time) *idTracker {
	t := &idTracker{seen: map[trackKey]int32{}}
	if !cutoff.IsZero() {
		t.cutoff = cutoff.UnixNano()
	}
	return t
}

func (t *idTracker) add(path int, id []byte, sent int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(id) == 0 {
		t.noID++
		return
	}
	k := trackKey{path, string(id)}
	n := t.seen[k]
	t.seen[k] = n + 1
	if n > 0 {
		t.dups++
		return
	}
	t.unique++
	t.last = time.Now()
	if t.cutoff != 0 && sent > 0 && sent < t.cutoff {
		t.uniqueBefore++
	}
}

// trackStats is a consistent reading of an idTracker.
type trackStats struct {
	Unique       int64     `json:"unique_deliveries"`
	Duplicates   int64     `json:"duplicates"`
	NoID         int64     `json:"without_webhook_id,omitempty"`
	UniqueBefore int64     `json:"unique_deliveries_sent_before_cutoff"`
	Last         time.Time `json:"-"`
}

func (t *idTracker) stats() trackStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return trackStats{Unique: t.unique, Duplicates: t.dups, NoID: t.noID, UniqueBefore: t.uniqueBefore, Last: t.last}
}

// nodeWatch records, per path and sending node (the X-Node header a fleet
// node adds to its deliveries), how many 200s it saw and when the first
// and the last came, in all and since mark.
type nodeWatch struct {
	mu   sync.Mutex
	mark time.Time
	seen map[nodeKey]*nodeSeen
}

type nodeKey struct {
	path int
	node string
}

// nodeSeen is one (path, node) pair's record.
type nodeSeen struct {
	N              int64
	First          time.Time
	Last           time.Time
	AfterMark      int64
	FirstAfterMark time.Time
	LastBeforeMark time.Time
}

func newNodeWatch() *nodeWatch { return &nodeWatch{seen: map[nodeKey]*nodeSeen{}} }

func (w *nodeWatch) add(path int, node []byte, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.seen[nodeKey{path, string(node)}]
	if s == nil {
		s = &nodeSeen{First: now}
		w.seen[nodeKey{path, string(node)}] = s
	}
	s.N++
	s.Last = now
	if w.mark.IsZero() || now.Before(w.mark) {
		s.LastBeforeMark = now
		return
	}
	if s.AfterMark == 0 {
		s.FirstAfterMark = now
	}
	s.AfterMark++
}

// setMark starts counting deliveries "after" from t on.
func (w *nodeWatch) setMark(t time.Time) {
	w.mu.Lock()
	w.mark = t
	w.mu.Unlock()
}

// get returns a copy of path's record for each node that sent to it.
func (w *nodeWatch) get(path int) map[string]nodeSeen {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]nodeSeen{}
	for k, v := range w.seen {
		if k.path == path {
			out[k.node] = *v
		}
	}
	return out
}
