package api

import "time"

// AttemptList answers GET /v1/subscriptions/{id}/attempts: the last
// attempts this node made for the subscription, newest first in the
// order they ended (at most 32, never null). In fleet mode Owner is the node delivering the lane;
// another node answers only what it made itself while it owned the lane.
type AttemptList struct {
	Subscription string        `json:"subscription"`
	Owner        string        `json:"owner,omitempty"`
	Attempts     []AttemptInfo `json:"attempts"`
}

// AttemptInfo is one delivery attempt: when it ended (the sidecar's
// clock), the event, the attempt number (1 for the first try), the HTTP
// status (0 without an answer), how long the exchange took, and what
// became of the delivery: Outcome "ack", "retry", "timeout" (retried
// after a timeout) or "dead_letter". Error is the transport failure's word
// ("timeout", "connection_refused"...; never a URL), Response the first
// 256 bytes of a failed answer (never kept for an ACK).
type AttemptInfo struct {
	At         time.Time `json:"at"`
	Seq        uint64    `json:"seq"`
	EventID    string    `json:"event_id"`
	Attempt    int       `json:"attempt"`
	Status     int       `json:"status"`
	DurationMS float64   `json:"duration_ms"`
	Outcome    string    `json:"outcome"`
	Error      string    `json:"error,omitempty"`
	Response   string    `json:"response,omitempty"`
}

// SeriesInfo answers GET /v1/subscriptions/{id}/series: the last 15
// minutes on this node in fixed buckets of StepSeconds (10), oldest first,
// the first starting at Start and the last still filling. Deliveries and
// Failures (retried, dead-lettered and timed-out attempts) are per second;
// P99MS is the P99 of one HTTP exchange in milliseconds (0: none in that
// bucket), estimated from a log-scale histogram to within 50%. Each slice
// has the same fixed length (90). Owner is as in AttemptList.
type SeriesInfo struct {
	Subscription string    `json:"subscription"`
	Owner        string    `json:"owner,omitempty"`
	StepSeconds  int       `json:"step_seconds"`
	Start        time.Time `json:"start"`
	Deliveries   []float64 `json:"deliveries"`
	Failures     []float64 `json:"failures"`
	P99MS        []float64 `json:"p99_ms"`
}
