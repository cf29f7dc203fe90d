package delivery

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/queue"
)

// Body variants: a subscription with a Variant is sent a
// rendering of the stored body (policy.Variant) instead of its exact
// bytes. Bodies are still serialised once, per variant: each distinct variant is
// rendered once per event and the bytes are shared by every lane that
// sends it, so 10,000 subscriptions over 3 variants render 3 bodies per
// event, not 10,000.
//
// Where the renderings live: on the shared *queue.Event
// (queue.Event.Rendering), keyed by the variant's canonical Key, the way a
// filter's decoded body is kept (Subscription.passes). The ring hands one
// *Event to every lane that keeps up, so they share its renderings; the
// first lane to reach the event renders and the others racing it wait for
// that one rendering (sync.Once), which makes the count exact. A lane that
// fell behind reads its own copy of the event from the log, a page at a
// time, and renders its own: it already reads and copies the body per
// lane, and rendering is of the same order. Renderings die with their
// event, and the ring charges them to its byte bound (ring.charge): a ring
// of rendered events evicts sooner, rather than holding n+1 times its
// bound for n distinct variants. How many distinct variants there may be
// is bounded too, per tenant and in all (policy.MaxTenantVariants,
// policy.MaxVariants; the registry refuses one more), which bounds the
// renderings, and the CPU, each event costs.
//
// When: the lane renders before the gates (slot, rate, breaker, budget)
// of a first attempt or a retry, so that a body the variant cannot render
// is dead-lettered with reason variant_failed without an HTTP attempt,
// without a slot or a token, and without the breaker or the retry budget
// hearing of it; deliver then finds the rendering cached and signs and
// sends exactly those bytes.
//
// Replays: a dead letter keeps the stored body, the event's type and its
// accepted-at time, everything Render reads, so a replay renders the same
// bytes again (Render is deterministic). It renders with the
// subscription's variant at the time of the replay: when the variant
// changed since, the receiver now expects the new shape, and sending the
// old one would be sending it what it no longer asked for.

// variantMetrics count renderings. Labels are bounded: variants come from
// the API too, so their keys are not a label.
type variantMetrics struct {
	ok, failed prometheus.Counter
}

func newVariantMetrics(reg prometheus.Registerer) *variantMetrics {
	renders := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_body_renders_total",
		Help: "Event bodies rendered for a subscription's body variant, by result (ok, failed): once per event and distinct variant, however many subscriptions share it.",
	}, []string{"result"})
	if reg != nil {
		reg.MustRegister(renders)
	}
	return &variantMetrics{ok: renders.WithLabelValues("ok"), failed: renders.WithLabelValues("failed")}
}

// render returns the bytes sub is sent for ev: the stored body, or sub's
// variant of it, rendered once per event and variant and shared, in sub's
// delivery format (format.go), whose renderings it makes too.
func (e *engine) render(sub *Subscription, ev *queue.Event) ([]byte, error) {
	body, err := e.renderVariant(sub, ev)
	if err != nil {
		return nil, err
	}
	body, _, _, err = e.formatted(sub, ev, body, bodyContentType(sub, ev))
	return body, err
}

// renderVariant returns the stored body, or sub's variant of it,
// rendered once per event and variant and shared.
func (e *engine) renderVariant(sub *Subscription, ev *queue.Event) ([]byte, error) {
	v := sub.Variant
	if v == nil {
		return ev.Body, nil
	}
	return ev.Rendering(v.Key()).Do(func() ([]byte, error) {
		b, err := v.Render(ev.Type, ev.AcceptedAt, ev.Body)
		if m := e.m; m != nil && m.variants != nil {
			if err != nil {
				m.variants.failed.Inc()
			} else {
				m.variants.ok.Inc()
			}
		}
		e.charge(ev, b)
		return b, err
	})
}

// renderingOverhead is what a cached rendering holds besides its bytes
// (the queue.Rendering, its slot in the event's list, a failure's error),
// rounded up, so that even failed renderings of empty bodies are not free.
const renderingOverhead = 128

// payload returns the body j sends, its Content-Type and, in the
// CloudEvents binary format, its ce- headers: the stored body and
// Content-Type, or the variant's rendering and application/json, or the
// structured CloudEvent around either and application/cloudevents+json
// (each found cached: the lane rendered it before the job started).
func (e *engine) payload(j *job) (body []byte, contentType string, ce cloudevents.Headers, err error) {
	sub, ev := j.sub, j.ev
	if sub.Variant == nil && sub.formatName() == "" {
		return ev.Body, ev.ContentType, nil, nil
	}
	if body, err = e.renderVariant(sub, ev); err != nil {
		return nil, "", nil, err
	}
	return e.formatted(sub, ev, body, bodyContentType(sub, ev))
}

// maxVariantError bounds the error a variant_failed dead letter keeps.
const maxVariantError = 200

// unrenderable renders ev for the lane's subscription before a delivery
// of it starts (from is the retry record it comes from; nil for a first
// attempt). skip means ev is not to be sent: it was dead-lettered with
// reason variant_failed, or, when err is set too, the store refused that
// write and ev must wait (a wake-up is armed; a first attempt's caller
// puts ev back). l.mu is held.
func (l *lane) unrenderable(ev *queue.Event, from *queue.Retry, now time.Time) (skip bool, err error) {
	e := l.e
	_, rerr := e.render(l.sub, ev)
	if rerr == nil {
		return false, nil
	}
	attempts := 0
	if from != nil {
		attempts = from.Attempt
	}
	o := queue.Outcome{Kind: queue.DeadLettered, Subscription: l.id, Seq: ev.Seq, From: from, At: now,
		DeadLetter: newDeadLetter(l.id, l.sub.Tenant, ev, policy.ReasonVariantFailed, attempts, policy.Exchange{}, "", now)}
	msg := rerr.Error()
	if len(msg) > maxVariantError {
		msg = msg[:maxVariantError] + "…"
	}
	o.DeadLetter.LastError = msg
	if err := l.record(o); err != nil {
		if !fenced(err) {
			e.log.Error("dead-letter unrenderable body", "subscription", l.id, "seq", ev.Seq, "err", err)
		}
		at := now.Add(time.Second)
		if from != nil && (l.nextDue.IsZero() || l.nextDue.After(at)) {
			l.nextDue = at // the retry stays due: look again then
		}
		e.timers.add(l, at)
		return true, err
	}
	l.resolved(nil, o)
	e.m.rejections.WithLabelValues(l.id, policy.ReasonVariantFailed).Inc()
	return true, nil
}
