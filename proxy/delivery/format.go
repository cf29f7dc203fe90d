package delivery

import (
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/queue"
)

// Delivery formats: a subscription's Format says how the event travels.
// The default is Standard Webhooks alone (the body as stored, or its
// variant); the two CloudEvents formats carry the event's CloudEvents
// attributes too, in the HTTP binding's binary mode (ce- headers, the body
// as in the default) or structured mode (one JSON object of attributes and
// data, application/cloudevents+json). Every CloudEvents delivery is still
// signed with the Standard Webhooks headers, over the bytes sent, so a
// receiver may verify either way; webhook-id stays the log's event id.
//
// The attributes are the ones the producer posted (queue.Event.CloudEvent,
// whose id is the producer's, not the log's key) or, for an event posted
// plainly, derived from it: id the event id, type its type, source
// Config.CloudEventsSource, time its acceptance, so every attempt and
// replay carries the same ones.
//
// Rendered once per event, like body variants (variant.go), and kept on
// the event under a key of their own: the binary headers once per event
// (they do not depend on the body), the structured body once per event
// and body variant, so 10,000 structured subscriptions over 3 variants
// build 3 envelopes per event. A delivery then copies what is cached into
// its request, allocating nothing and encoding no JSON. The renderings are
// charged to the ring's byte budget as a variant's are. The lane renders
// before the gates of a first attempt or a retry (lane.unrenderable):
// attributes that cannot be rendered (a damaged record: ingest checked
// them) dead-letter the event for the subscription with reason
// variant_failed, without an attempt, the error naming the attribute.

// Delivery formats (Subscription.Format).
const (
	FormatStandardWebhooks      = "standard-webhooks" // the default ("" means it too)
	FormatCloudEventsBinary     = "cloudevents-binary"
	FormatCloudEventsStructured = "cloudevents-structured"
)

// Rendering keys of the CloudEvents renderings on an event. Variant keys
// are JSON objects, so none starts with "ce:".
const (
	ceBinaryKey     = "ce:binary"
	ceStructuredKey = "ce:structured:" // + the variant's key
)

// structuredKeys maps a variant's key to its structured rendering's key,
// so a delivery does not build the string each time. Distinct variants
// in use at once are bounded (policy.MaxVariants), but over a long run
// subscriptions come and go with variants of their own: past
// maxStructuredKeys the map takes no more, and a new variant's key is
// built per call instead (one small allocation), so no churn of the API
// can grow it.
var (
	structuredKeys  sync.Map // string → string
	structuredCount atomic.Int32
)

const maxStructuredKeys = 4 * policy.MaxVariants

func structuredKey(variant string) string {
	if k, ok := structuredKeys.Load(variant); ok {
		return k.(string)
	}
	if structuredCount.Load() >= maxStructuredKeys {
		return ceStructuredKey + variant
	}
	k, loaded := structuredKeys.LoadOrStore(variant, ceStructuredKey+variant)
	if !loaded {
		structuredCount.Add(1)
	}
	return k.(string)
}

// formatName is s's format: one of the CloudEvents formats, or "" for
// Standard Webhooks (config refuses any other value).
func (s *Subscription) formatName() string {
	switch s.Format {
	case FormatCloudEventsBinary, FormatCloudEventsStructured:
		return s.Format
	}
	return ""
}

// ceAttrs returns ev's CloudEvents attributes: as posted, or derived.
func (e *engine) ceAttrs(ev *queue.Event) []byte {
	if ev.CloudEvent != "" {
		return []byte(ev.CloudEvent)
	}
	return cloudevents.AppendDerived(make([]byte, 0, 128+len(ev.ID)+len(ev.Type)+len(e.ceSource)+len(ev.OrderingKey)),
		ev.ID, ev.Type, e.ceSource, ev.OrderingKey, ev.AcceptedAt)
}

// ceHeaders returns ev's binary-mode ce- headers, made once per event.
func (e *engine) ceHeaders(ev *queue.Event) (cloudevents.Headers, error) {
	b, err := ev.Rendering(ceBinaryKey).Do(func() ([]byte, error) {
		h, err := cloudevents.AppendHeaders(nil, e.ceAttrs(ev))
		e.charge(ev, h)
		return h, err
	})
	return cloudevents.Headers(b), err
}

// ceStructured returns ev's structured-mode body around data, the body
// of sub's variant (of content type contentType), made once per event
// and variant.
func (e *engine) ceStructured(sub *Subscription, ev *queue.Event, data []byte, contentType string) ([]byte, error) {
	return ev.Rendering(structuredKey(sub.Variant.Key())).Do(func() ([]byte, error) {
		attrs := e.ceAttrs(ev)
		b, err := cloudevents.AppendStructured(make([]byte, 0, len(attrs)+len(data)*4/3+len(contentType)+64), attrs, contentType, data)
		e.charge(ev, b)
		return b, err
	})
}

// charge counts a rendering cached on ev against the ring's budget.
func (e *engine) charge(ev *queue.Event, b []byte) {
	if e.feed != nil {
		e.feed.ring.charge(ev, cap(b)+renderingOverhead)
	}
}

// formatted returns what sub sends for ev whose body (the stored one, or
// its variant's) is body of content type contentType: the same, or the
// structured body and its content type, and the binary-mode headers.
func (e *engine) formatted(sub *Subscription, ev *queue.Event, body []byte, contentType string) ([]byte, string, cloudevents.Headers, error) {
	switch sub.formatName() {
	case FormatCloudEventsBinary:
		h, err := e.ceHeaders(ev)
		return body, contentType, h, err
	case FormatCloudEventsStructured:
		b, err := e.ceStructured(sub, ev, body, contentType)
		return b, cloudevents.ContentTypeStructured, nil, err
	}
	return body, contentType, nil, nil
}

// bodyContentType is the content type of sub's body for ev before any
// CloudEvents format: the stored one, or the variant's.
func bodyContentType(sub *Subscription, ev *queue.Event) string {
	if sub.Variant != nil {
		return policy.VariantContentType
	}
	return ev.ContentType
}
