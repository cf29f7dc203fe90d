// Package cloudevents is sluice's side of CloudEvents 1.0 over HTTP: it
// reads a CloudEvent posted in binary mode (ce-* headers, the body is the
// data), in structured mode (application/cloudevents+json) or in a batch
// (application/cloudevents-batch+json) into what the log keeps of it
// (parse.go), and writes an event back out in either mode for a delivery
// (render.go). What the log keeps is queue.Event.CloudEvent: the context
// attributes as a compact JSON object, without data, data_base64 and
// datacontenttype (the event's Body and ContentType).
//
// It knows nothing of HTTP servers, subscriptions or the log: ingest and
// the delivery engine call it.
package cloudevents

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strconv"
)

// SpecVersion is the one CloudEvents version sluice reads and writes.
const SpecVersion = "1.0"

// Event is a CloudEvent as ingest reads it.
type Event struct {
	// ID, Source and Type are the required attributes; Type routes the
	// event as an event type.
	ID, Source, Type string
	// Attrs is every context attribute but datacontenttype, as the log
	// keeps it (queue.Event.CloudEvent).
	Attrs string
	// ContentType is the datacontenttype attribute, "" when absent.
	ContentType string
	// Data is the event's data: in structured mode a JSON value's own
	// bytes, a JSON string's text when the content type is not JSON, or
	// data_base64 decoded; in binary mode the body.
	Data []byte
	// PartitionKey is the partitioning extension's partitionkey, "" when
	// absent: sluice takes it as the event's ordering key.
	PartitionKey string
}

// AttrError is a CloudEvent that cannot be accepted, naming the attribute
// at fault.
type AttrError struct {
	Attr    string // the attribute's name (for binary mode, as its ce- header)
	Problem string
}

func (e *AttrError) Error() string { return "CloudEvent attribute " + e.Attr + ": " + e.Problem }

// BatchError is a batch that cannot be accepted, naming the event at
// fault by its index (from 0) in the batch.
type BatchError struct {
	Index int
	Err   error
}

func (e *BatchError) Error() string { return fmt.Sprintf("event %d of the batch: %v", e.Index, e.Err) }
func (e *BatchError) Unwrap() error { return e.Err }

// Key is the log's id of the CloudEvent with this source and id: the
// spec makes an id unique only within its source, so two sources may
// reuse one id, and the log's deduplication must tell them apart. A hash
// keeps the key short and within the characters an Idempotency-Key may
// use whatever the source's URI holds; "ce_" marks where it came from.
func Key(source, id string) string {
	// Length-prefixed, so no two pairs hash the same bytes.
	var stack [512]byte
	b := strconv.AppendInt(stack[:0], int64(len(source)), 10)
	b = append(append(append(b, ':'), source...), id...)
	sum := sha256.Sum256(b)
	var out [3 + 32]byte
	copy(out[:], "ce_")
	keyEncoding.Encode(out[3:], sum[:20])
	return string(out[:])
}

var keyEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)
