// Package queue is what sluice's delivery engine knows of its durable log:
// the Store interface (Log + State), the records it reads and writes, the
// errors it answers, and the defaults every backend shares. It owns no
// storage. Backends implement Store in packages of their own: queue/badger
// (embedded, the default) and, for fleet mode, NATS JetStream; each passes
// queuetest.Run, the contract suite that spells out what Store promises:
//
//   - An event Append acknowledged is durable (with Sync, across power
//     loss) and keeps its sequence number; sequence numbers strictly
//     increase and are never reused, not even after compacting everything.
//   - Append is idempotent on the event id within the dedup window.
//   - A subscription is owed exactly the events appended while it was a
//     member (the membership cut-off): From = head+1 at join, Until = head at leave.
//   - Record writes one delivery outcome at once or not at all; cursors,
//     retry records and dead letters survive a crash once written.
//   - Replay schedules a dead letter once, however many replays race.
//   - Compaction never deletes an event a scheduled retry still needs.
//
// This package imports no backend and no HTTP.
package queue

import "time"

// DefaultDedupWindow is how long an event id is remembered by default: a
// duplicate POST within it is answered with the original event's id.
const DefaultDedupWindow = 24 * time.Hour

// DefaultMinFreeBytes is the free space below which appends are refused
// (ErrDiskFull), for backends that write to a local file system.
//
// Why a floor and not ENOSPC: Badger writes its write-ahead log and value
// log through mmap, and a write to a mapped page the file system cannot
// back is SIGBUS, not an error (measured on a full tmpfs: the process dies
// in memTable.Put). Appends therefore stop while there is room left for
// everything that still writes without an append: the memtables being
// flushed (three of 16 MiB, each also a 16 MiB table), cursors, retry
// records and dead letters.
const DefaultMinFreeBytes = 64 << 20
