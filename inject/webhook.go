package inject

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxReviewBytes bounds an AdmissionReview body. The API server refuses
// objects over 3 MiB (its request limit), so a review of a pod it would
// create is smaller; a larger body is answered as Malformed, unread past
// the limit.
const MaxReviewBytes = 4 << 20

// GCPercent is the garbage collector's target `sluice injector` runs with
// when GOGC is not set. A review allocates ~100 KiB, so on the small heap
// an injector has, the default of 100 collected every ~40 reviews and the
// collections were the latency tail: P99 of a review over TLS 1.15 ms at
// 100, 0.58 ms at 400 (BenchmarkWebhookLatency, P50 0.15 and 0.12 ms). The
// heap stays a few MiB.
const GCPercent = 400

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
// taken from the path. It logs no request body. It is safe for concurrent
// use.
type Webhook struct {
	defaults Options
	log      *slog.Logger
	reviews  map[Result]prometheus.Counter
	duration prometheus.Histogram
}

// NewWebhook returns the handler, its metrics registered on reg (nil: not
// registered): sluice_injector_reviews_total{result}, every result present
// from the start, and sluice_injector_review_duration_seconds, from the
// request's arrival to the answer written. defaults are the injector's
// flags. A nil log discards.
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
	w := &Webhook{defaults: defaults, log: log, reviews: map[Result]prometheus.Counter{}, duration: duration}
	for _, r := range Results {
		w.reviews[r] = reviews.WithLabelValues(string(r))
	}
	if reg != nil {
		reg.MustRegister(reviews, duration)
	}
	return w
}

// ServeHTTP answers one review: 405 for a method other than POST, else 200
// with an AdmissionReview (Review's, or a Malformed one of its own when the
// body is over MaxReviewBytes or cannot be read).
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		rw.Header().Set("Allow", http.MethodPost)
		http.Error(rw, "use POST with an admission.k8s.io/v1 AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	start := time.Now()
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
