package inject

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxReviewBytes bounds an AdmissionReview body. The API server refuses
// objects over 3 MiB (its request limit), so a review of a pod it would
// create is smaller; a larger body is answered as Malformed, unread past
// the limit.
const MaxReviewBytes = 4 << 20

// Bounds on the reviews in flight (Limits). A review allocates up to about
// seven times its body, whatever the pod's shape (TestReviewMemory: 3 MiB
// of env vars took 21 MiB, one large annotation 9 MiB): 21 MiB for the
// 3 MiB the API server sends at most, 28 MiB for the 4 MiB read at most. With no bound, eight concurrent
// 3 MiB reviews took the injector to 245 MB against the shipped 128Mi
// limit: an OOM kill, and with failurePolicy Ignore, pods created without
// the sidecar meanwhile.
const (
	// DefaultMaxInFlight keeps two reviews of the largest body under
	// 50 MiB, well under the shipped 128Mi limit (of which the Go heap is
	// told to use 85%). A typical review takes ~0.15 ms, so two slots
	// answer thousands a second, more than pod creation asks of them.
	DefaultMaxInFlight = 2
	// DefaultQueueWait is how long a review waits for a slot: under the
	// shipped timeoutSeconds (5) less reviewReserve.
	DefaultQueueWait = 3 * time.Second
	// MaxMaxInFlight and MaxQueueWait bound the flags: 256 of the largest
	// reviews would need 6 GiB, and 30 s is the API server's largest
	// timeoutSeconds.
	MaxMaxInFlight = 256
	MaxQueueWait   = 30 * time.Second
	// reviewReserve is the part of the API server's timeout a review
	// does not spend waiting for a slot: reading and answering a 3 MiB
	// body took ~0.1 s.
	reviewReserve = time.Second
)

// Limits bound how many reviews a Webhook reads and answers at once, for
// its memory: a review past MaxInFlight waits up to QueueWait for a slot,
// and never past the API server's own deadline for it (less the time a
// review takes). One that gets no slot is answered 503, which the API
// server treats as a failed call: the webhook's failurePolicy decides
// (Ignore: the pod is created without the sidecar; Fail: it is refused),
// as when the injector is down. Allowing the pod without the sidecar, or
// refusing it, in an AdmissionReview would override the operator's
// failurePolicy.
type Limits struct {
	MaxInFlight int           // 1 to MaxMaxInFlight
	QueueWait   time.Duration // 0 (no wait) to MaxQueueWait
}

// DefaultLimits are the limits of `sluice injector`'s flags' defaults.
func DefaultLimits() Limits {
	return Limits{MaxInFlight: DefaultMaxInFlight, QueueWait: DefaultQueueWait}
}

// Validate checks l; its errors name `sluice injector`'s flags.
func (l Limits) Validate() error {
	switch {
	case l.MaxInFlight < 1 || l.MaxInFlight > MaxMaxInFlight:
		return fmt.Errorf("--max-in-flight %d is out of range (1 to %d)", l.MaxInFlight, MaxMaxInFlight)
	case l.QueueWait < 0 || l.QueueWait > MaxQueueWait:
		return fmt.Errorf("--queue-wait %s is out of range (0 to %s)", l.QueueWait, MaxQueueWait)
	}
	return nil
}

// Paths of the two webhooks (examples/kubernetes/injector/webhook.yaml).
// The namespace opt-in is a path segment, not a query: the API server
// refuses a query string in a webhook's service path (each segment must be
// a DNS-1123 subdomain).
const (
	PodPath       = "/mutate"                   // pods that opt in themselves
	NamespacePath = "/mutate/namespace-enabled" // every pod of an opted-in namespace
)

// Webhook is the http.Handler of the injector's PodPath and NamespacePath:
// it answers POSTed AdmissionReviews with Review, the namespace opt-in
// taken from the path, at most Limits.MaxInFlight at once. It logs no
// request body. It is safe for concurrent use.
type Webhook struct {
	// Limits bound the reviews in flight; NewWebhook sets DefaultLimits.
	// Set them before the first request: the slots are made then.
	Limits Limits

	defaults Options
	log      *slog.Logger
	reviews  map[Result]prometheus.Counter
	duration prometheus.Histogram
	inFlight prometheus.Gauge
	waiting  prometheus.Gauge
	shed     prometheus.Counter

	slotsOnce sync.Once
	slots     chan struct{} // one element per review in flight
	// acquired and released, when set, run once a review holds its slot
	// and just before it gives the slot back: tests count with them what
	// the slots bound.
	acquired, released func()
}

// NewWebhook returns the handler, its metrics registered on reg (nil: not
// registered): sluice_injector_reviews_total{result}, every result present
// from the start, and sluice_injector_review_duration_seconds, from the
// request's arrival to the answer written, waiting for a slot included;
// sluice_injector_reviews_in_flight and sluice_injector_reviews_waiting,
// the reviews holding a slot and waiting for one; and
// sluice_injector_reviews_shed_total, those answered 503 for want of a
// slot (not counted as reviews). defaults are the injector's flags. A nil
// log discards.
func NewWebhook(defaults Options, reg prometheus.Registerer, log *slog.Logger) *Webhook {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reviews := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_injector_reviews_total",
		Help: "Admission reviews answered, by result: injected, skipped, warned, denied, malformed.",
	}, []string{"result"})
	duration := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sluice_injector_review_duration_seconds",
		Help: "Time to answer one admission review: reading the body, the review, writing the answer.",
		// 50µs (a small pod on a fast core) to 5s (the webhook's timeoutSeconds).
		Buckets: prometheus.ExponentialBucketsRange(50e-6, 5, 16),
	})
	inFlight := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_injector_reviews_in_flight",
		Help: "Admission reviews being read and answered now; at most --max-in-flight.",
	})
	waiting := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_injector_reviews_waiting",
		Help: "Admission reviews waiting for one of the --max-in-flight slots.",
	})
	shed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_injector_reviews_shed_total",
		Help: "Admission reviews answered 503 because no slot freed within --queue-wait or the API server's timeout: the webhook's failurePolicy applied to their pods.",
	})
	w := &Webhook{Limits: DefaultLimits(), defaults: defaults, log: log, reviews: map[Result]prometheus.Counter{}, duration: duration,
		inFlight: inFlight, waiting: waiting, shed: shed}
	for _, r := range Results {
		w.reviews[r] = reviews.WithLabelValues(string(r))
	}
	if reg != nil {
		reg.MustRegister(reviews, duration, inFlight, waiting, shed)
	}
	return w
}

// ServeHTTP answers one review: 405 for a method other than POST, 503 when
// it gets no slot (Limits), else 200 with an AdmissionReview (Review's, or
// a Malformed one of its own when the body is over MaxReviewBytes or
// cannot be read).
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		rw.Header().Set("Allow", http.MethodPost)
		http.Error(rw, "use POST with an admission.k8s.io/v1 AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	start := time.Now()
	// The slot is taken before the body is read: reading it is where a
	// review's memory starts.
	if !w.acquire(r.Context(), w.queueWait(r)) {
		w.shed.Inc()
		w.log.Warn("admission review shed: no slot free in time; the API server applies the webhook's failurePolicy to the pod",
			"max_in_flight", w.Limits.MaxInFlight, "queue_wait", w.Limits.QueueWait)
		// No Retry-After: the API server's client would retry after it,
		// past the time this review has already waited.
		http.Error(rw, "too many admission reviews in flight", http.StatusServiceUnavailable)
		return
	}
	defer w.release()
	var (
		answer []byte
		result Result
		bad    *outcome // a review's, whose bad input is logged below
	)
	body, err := readBody(r)
	switch {
	case err != nil:
		w.log.Warn("admission review not read", "err", err)
		answer, result = encodeMalformed(requestUID(body), "the admission review could not be read")
	case len(body) > MaxReviewBytes:
		w.log.Warn("admission review over the size limit; admitted without the sidecar", "limit_bytes", MaxReviewBytes)
		answer, result = encodeMalformed(requestUID(body), "the admission review is over 4 MiB")
	default:
		o := reviewOutcome(body, w.defaults, r.URL.Path == NamespacePath)
		answer, result = o.answer, o.result
		bad = &o
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.Write(answer)
	w.reviews[result].Inc()
	w.duration.Observe(time.Since(start).Seconds())
	if bad != nil && (result == Warned || result == Denied || result == Malformed) {
		w.logBadInput(bad)
	}
}

// queueWait is how long r may wait for a slot: Limits.QueueWait, and no
// longer than the API server waits for the answer less reviewReserve. The
// API server says how long in the query (?timeout=5s, its webhook's
// timeoutSeconds); a client that does not has QueueWait.
func (w *Webhook) queueWait(r *http.Request) time.Duration {
	wait := w.Limits.QueueWait
	if t, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && t > 0 {
		wait = min(wait, t-reviewReserve)
	}
	return wait
}

// acquire takes a slot, waiting up to wait for one, or until ctx is done
// (the API server gave up); it reports whether it got one.
func (w *Webhook) acquire(ctx context.Context, wait time.Duration) bool {
	w.slotsOnce.Do(func() { w.slots = make(chan struct{}, max(w.Limits.MaxInFlight, 1)) })
	select {
	case w.slots <- struct{}{}:
	default:
		if wait <= 0 {
			return false
		}
		w.waiting.Inc()
		defer w.waiting.Dec()
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case w.slots <- struct{}{}:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	w.inFlight.Inc()
	if w.acquired != nil {
		w.acquired()
	}
	return true
}

// release gives back the slot acquire took.
func (w *Webhook) release() {
	if w.released != nil {
		w.released()
	}
	w.inFlight.Dec()
	<-w.slots
}

// logBadInput says which pod a review let through without the sidecar, or
// refused, and why: the warning goes to whoever created the pod (for a
// Deployment's pods, the ReplicaSet controller), so the operator would
// otherwise see only the count. It runs after the answer is written, and
// only for bad input; the reason names annotations and their values, which
// Review has already shortened and redacted, never the pod's spec.
func (w *Webhook) logBadInput(o *outcome) {
	msg := "admission review: bad input; the pod is admitted without the sidecar"
	if o.result == Denied {
		msg = "admission review: bad input; the pod is refused (sluice.io/required)"
	}
	w.log.Warn(msg, "result", string(o.result), "uid", string(o.uid), "namespace", o.namespace, "pod", o.pod, "reason", o.reason)
}

// readBody reads at most MaxReviewBytes+1 bytes of the body: more says it
// is over the limit.
func readBody(r *http.Request) ([]byte, error) {
	n := int64(bytes.MinRead)
	if r.ContentLength > 0 {
		n = min(r.ContentLength, MaxReviewBytes) + 1
	}
	buf := bytes.NewBuffer(make([]byte, 0, n))
	_, err := buf.ReadFrom(io.LimitReader(r.Body, MaxReviewBytes+1))
	return buf.Bytes(), err
}

// requestUID finds request.uid in a review body that may be cut short: the
// API server writes uid first in request, long before the object.
func requestUID(body []byte) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	if !member(dec, "request") || !member(dec, "uid") {
		return ""
	}
	t, _ := dec.Token()
	uid, _ := t.(string)
	return uid
}

// member reads an object's opening brace and its members up to key,
// skipping the others; it reports false if the object (or the body, cut
// short) ends first.
func member(dec *json.Decoder, key string) bool {
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return false
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return false
		}
		if k == key {
			return true
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return false
		}
	}
	return false
}
