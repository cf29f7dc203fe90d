// Package policy holds sluice's delivery decisions as pure code: what an HTTP
// exchange with an endpoint means (Classify), whether and when a failed
// delivery is tried again (RetryPolicy, Backoff, ParseRetryAfter), and the
// dead-letter reasons recorded when it is not; the retry budget shared by
// every lane (Budget), the per-subscription circuit breaker (Breaker) and
// the Little's-law concurrency cap (AutoCap). Token buckets come from
// golang.org/x/time/rate, used directly by the lanes. Which events a
// subscription takes is decided here too: MatchTypes compiles its types
// (exact types and whole-segment wildcards) and ParseFilter its body
// filter, each once per subscription, into predicates that allocate
// nothing per event. So is what bytes it is sent: ParseVariant compiles
// its body variant, whose Render is a pure function of the
// event's type, accepted-at time and stored body, so that the engine can
// render it once per event for every lane and a replay sends the same
// bytes again.
//
// Guarantees:
//
//   - No I/O, no goroutines and no global state. Time is injected: pure
//     functions take "now" as an argument, and the stateful types (Budget,
//     Breaker, AutoCap) take a clock function (time.Now when nil), so
//     callers and tests control time and nothing here sleeps.
//   - The package imports only the standard library and nothing of sluice.
//     In particular it does not import net/http, so queue (which must not
//     depend on HTTP) may use the reason constants and Outcome.
//   - Filter, Variant and the matchers of MatchTypes are immutable and
//     safe for concurrent use.
//   - Functions and value types (Outcome, Backoff, RetryPolicy) are safe for
//     concurrent use as long as the caller does not mutate an overrides map
//     or a Backoff.Rand that is shared between goroutines. Budget, Breaker
//     and AutoCap lock internally and are safe for concurrent use.
//
// The delivery engine (proxy) calls Classify once per exchange, at the HTTP
// boundary, and RetryPolicy.Next for every retryable failure; it records the
// returned due time in the queue's retry schedule instead of sleeping.
package policy

// Dead-letter reasons. They are stored with each dead letter, shown by the
// admin API and used as the reason label of sluice_dead_letters_total and
// sluice_lane_rejections_total, so they are a closed, stable set: add new
// ones here, never rename.
const (
	// ReasonMaxAttempts means the delivery failed RetryPolicy.MaxAttempts
	// times.
	ReasonMaxAttempts = "max_attempts"

	// ReasonMaxAge means the next retry would be due later than
	// RetryPolicy.MaxAge after the first attempt.
	ReasonMaxAge = "max_age"

	// ReasonRejected means the endpoint answered with a response that Classify
	// maps to DeadLetter (by default a 3xx or a 4xx other than 408 and 429).
	ReasonRejected = "rejected"

	// ReasonBacklogQuota means the subscription's backlog quota was exceeded and
	// the oldest entries were moved to the dead-letter store, where they can be
	// replayed: the quota never drops an event silently.
	ReasonBacklogQuota = "backlog_quota"

	// ReasonGone means the endpoint answered 410 Gone: the delivery is
	// dead-lettered and the subscription paused (Standard Webhooks).
	ReasonGone = "gone"

	// ReasonVariantFailed means the subscription's body variant could not
	// be rendered from the event's body (it is not JSON): the event was
	// dead-lettered without an HTTP attempt, the error naming where the
	// body stops being JSON (Variant.Render).
	ReasonVariantFailed = "variant_failed"

	// ReasonCorrupt means the log could not read the event back (its copy
	// on disk is damaged): it was dead-lettered without an HTTP attempt,
	// so that the events after it flow. Its body and type are unknown; the
	// dead letter names its sequence number.
	ReasonCorrupt = "corrupt"

	// ReasonNotEntitled means a retry's event belongs to a tenant the
	// subscription may no longer receive (the operator moved the
	// subscription to another tenant since the first attempt): it was
	// dead-lettered without an HTTP attempt, readable by the operator
	// only, never sent to the new tenant's endpoint: a tenant's subscription
	// receives only that tenant's events.
	ReasonNotEntitled = "not_entitled"
)

// DeadLetterReasons is every dead-letter reason, for what lists or checks
// them (the CLI's --reason); a test keeps it equal to the constants above.
var DeadLetterReasons = []string{
	ReasonMaxAttempts, ReasonMaxAge, ReasonRejected, ReasonBacklogQuota,
	ReasonGone, ReasonVariantFailed, ReasonCorrupt, ReasonNotEntitled,
}
