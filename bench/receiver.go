package main

import (
	"bytes"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// receiver is the webhook endpoint of every scenario: an in-process fasthttp
// server that answers 200 at once, counts per path (/s<N>), and, while a
// latency window is open, records publish→receipt latency from the
// "sent_ns" the producer stamped into the body.
type receiver struct {
	srv     *fasthttp.Server
	ln      net.Listener
	addr    string
	total   atomic.Int64
	other   atomic.Int64 // requests to paths that are not /s<N>
	perPath []atomic.Int64
	rec     atomic.Pointer[latRecorder]
	done    chan struct{}
}

func newReceiver(paths int) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{ln: ln, addr: ln.Addr().String(), perPath: make([]atomic.Int64, paths), done: make(chan struct{})}
	r.srv = &fasthttp.Server{
		Handler:               r.handle,
		Name:                  "bench-receiver",
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		ReadTimeout:           time.Minute,
		IdleTimeout:           time.Minute,
		MaxRequestBodySize:    4 << 20,
	}
	go func() {
		defer close(r.done)
		r.srv.Serve(ln)
	}()
	return r, nil
}

func (r *receiver) handle(ctx *fasthttp.RequestCtx) {
	if i, ok := pathIndex(ctx.Path()); ok && i < len(r.perPath) {
		r.perPath[i].Add(1)
	} else {
		r.other.Add(1)
	}
	if rec := r.rec.Load(); rec != nil {
		if sent, ok := sentNs(ctx.PostBody()); ok && sent >= rec.from {
			rec.add(time.Now().UnixNano() - sent)
		}
	}
	r.total.Add(1)
	ctx.SetStatusCode(fasthttp.StatusOK)
}

func (r *receiver) close() {
	r.srv.Shutdown()
	<-r.done
}

// url is the receiver's base URL.
func (r *receiver) url() string { return "http://" + r.addr }

// count returns the deliveries to paths /s<from> .. /s<from+n-1>.
func (r *receiver) count(from, n int) int64 {
	var s int64
	for i := from; i < from+n && i < len(r.perPath); i++ {
		s += r.perPath[i].Load()
	}
	return s
}

// snapshotPaths copies the per-path counters of the first n paths.
func (r *receiver) snapshotPaths(n int) []int64 {
	out := make([]int64, min(n, len(r.perPath)))
	for i := range out {
		out[i] = r.perPath[i].Load()
	}
	return out
}

// startRecording opens a latency window for deliveries of events sent at or
// after from; capacity bounds the samples kept (the rest are counted as
// dropped).
func (r *receiver) startRecording(from time.Time, capacity int) *latRecorder {
	rec := &latRecorder{from: from.UnixNano(), v: make([]atomic.Int64, capacity)}
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
	n       atomic.Int64
	dropped atomic.Int64
	v       []atomic.Int64
}

func (l *latRecorder) add(ns int64) {
	i := l.n.Add(1) - 1
	if i >= int64(len(l.v)) {
		l.dropped.Add(1)
		return
	}
	l.v[i].Store(ns)
}

func (l *latRecorder) samples() []int64 {
	n := min(l.n.Load(), int64(len(l.v)))
	out := make([]int64, 0, n)
	for i := range n {
		// A handler may have claimed a slot and not stored yet: skip zeros.
		if v := l.v[i].Load(); v != 0 {
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
//	{"sent_ns":1767225600123456789,"pad":"xxxx…"}
var sentKey = []byte(`"sent_ns":`)

// sentDigits is the width of the send time: unix nanoseconds have 19
// digits from 2001 to 2286, so the field never needs a leading zero (which
// JSON forbids).
const sentDigits = 19

// newBody returns a body of size bytes (at least the fixed part) with a
// placeholder send time; stampBody fills it in.
func newBody(size int) []byte {
	head := `{"sent_ns":1` + string(bytes.Repeat([]byte("0"), sentDigits-1)) + `,"pad":"`
	tail := `"}`
	pad := max(0, size-len(head)-len(tail))
	b := make([]byte, 0, len(head)+pad+len(tail))
	b = append(b, head...)
	b = append(b, bytes.Repeat([]byte("x"), pad)...)
	return append(b, tail...)
}

// stampBody writes ns as the body's send time, in place.
func stampBody(b []byte, ns int64) {
	off := 1 + len(sentKey)
	for i := off + sentDigits - 1; i >= off; i-- {
		b[i] = byte('0' + ns%10)
		ns /= 10
	}
}

// sentNs reads the send time of a body made by newBody.
func sentNs(body []byte) (int64, bool) {
	i := bytes.Index(body, sentKey)
	if i < 0 {
		return 0, false
	}
	var n int64
	digits := 0
	for _, c := range body[i+len(sentKey):] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int64(c-'0')
		digits++
	}
	return n, digits > 0 && n > 0
}
