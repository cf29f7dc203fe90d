package delivery

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/queue"
)

// A lane is everything one subscription consumes: its place in the log, its
// in-flight window (never more than the cap), and its retry schedule. A lane
// is not a goroutine: it is pumped when something changes (a commit, a
// completion, a due retry), so an idle lane costs only its struct and
// 50,000 of them fit in memory.
//
// Cursor rule: every entitled event at or below cursor is resolved (acked,
// scheduled for retry, or dead-lettered, durably written). The cursor is
// the lowest unresolved seq - 1; it moves only forward.
type lane struct {
	e  *engine
	id string

	mu       sync.Mutex
	sub      *Subscription
	match    queue.Match
	fromSeq  uint64 // first entitled seq (membership cutoff)
	until    uint64 // last entitled seq when left
	next     uint64 // next seq to look at
	buf      []*queue.Event
	window   []slot // fresh deliveries in flight, in seq order
	retrying map[uint64]struct{}
	// ahead: seqs above the cursor this process started from that already
	// have a retry record (see queue.RetrySummary.Ahead); nil almost always.
	ahead map[uint64]struct{}
	// unrecorded holds attempts whose outcome could not be written yet;
	// nil almost always.
	unrecorded []unrecorded
	inFlight   int
	cursor     uint64
	nextDue    time.Time // earliest known scheduled retry; zero when none is known
	// timerAt is the unix nanos of the lane's live timer entry (0: none);
	// guarded by the timer heap's mu, not by l.mu.
	timerAt int64
	// memo is what the lane remembers to keep periodic reads small; nil
	// until a quota check or a scrape needs it (most idle lanes never do).
	memo *laneMemo
	// activity is the lane's last attempts and its charts' series
	// (attempts.go); nil until its first attempt.
	activity *activity
	pausedBy string // why deliveries are paused at run time (410 Gone, an operator)
	// The flags sit together so that they pack into one word with leaving:
	// apart, their padding cost 24 bytes, and with 50,000 lanes the struct
	// must stay in the 384-byte size class (docs/benchmarks.md, lanes-50k).
	left    bool        // removed from the config: drains up to until, then retires
	dirty   bool        // in the dirty set: the cursor moved since the last flush
	hungry  bool        // parked in the feed until a commit wakes it
	retired bool        // drained and forgotten
	foreign bool        // fleet mode: another node owns the lane (or none yet); it sends nothing
	leaving atomic.Bool // mirrors left, for lock-free scans
	// releasing is set by Release before it waits for mu, and cleared by
	// takeOver: a lane that holds mu through a slow store write (unrecorded
	// outcomes, retried while the shared log fails over) must not start
	// deliveries once that write returns, after its lease was lost.
	releasing atomic.Bool

	// Per-subscription policies, owned by the lane (used under mu).
	breaker *policy.Breaker // nil until first used: see brk
	limiter *rate.Limiter   // nil: unlimited
	auto    *policy.AutoCap // nil: static MaxConcurrency

	metrics   atomic.Pointer[laneMetrics] // series handles, made on first use
	horizon   atomic.Int64                // a time.Duration; see farAhead
	saved     atomic.Uint64               // the cursor last written to the log
	scheduled atomic.Int64                // retry records in the log

	delivered, retried, deadLettered, attempts atomic.Uint64
	deferred, shortCircuits, rateLimited       atomic.Uint64
	quotaRejections                            atomic.Uint64 // dead letters with reason backlog_quota
	lastStatus                                 atomic.Int64
}

type slot struct {
	seq  uint64
	done bool
}

// job is one delivery attempt.
type job struct {
	lane    *lane
	sub     *Subscription
	ev      *queue.Event
	retry   *queue.Retry // the record this attempt came from; nil for a first attempt
	attempt int          // 1 for the first try
	first   time.Time    // when attempt 1 started
	started time.Time    // when this attempt started
	probe   bool         // the breaker's half-open probe
}

func newLane(e *engine, m queue.Membership, sub *Subscription) *lane {
	l := &lane{
		e: e, id: m.Subscription, sub: sub, match: e.feed.matcherFor(sub),
		fromSeq: m.From, left: m.Left, until: m.Until, next: m.Cursor + 1, cursor: m.Cursor,
	}
	l.saved.Store(m.Cursor)
	l.leaving.Store(m.Left)
	l.pausedBy = m.Paused
	l.foreign = e.fleet != nil // until the lease is gained
	l.setPolicies(sub)
	return l
}

// setPolicies (re)creates the lane's breaker, rate limiter and auto cap for
// sub, keeping each one whose settings did not change (a reload must not
// close an open breaker).
func (l *lane) setPolicies(sub *Subscription) {
	old := l.sub
	now := l.e.now
	if l.breaker != nil && old.Breaker != sub.Breaker {
		l.breaker = nil // made again, with the new settings, when next used
	}
	if l.limiter == nil || old.Rate != sub.Rate {
		l.limiter = nil
		if sub.Rate.PerSecond > 0 {
			l.limiter = rate.NewLimiter(rate.Limit(sub.Rate.PerSecond), max(sub.Rate.Burst, 1))
		}
	}
	switch {
	case sub.Auto == nil:
		l.auto = nil
	case l.auto == nil || old.Auto == nil || *old.Auto != *sub.Auto:
		l.auto = policy.NewAutoCap(*sub.Auto, now)
	}
	l.horizon.Store(int64(horizon(sub)))
	// Written only when it differs, before the lane hands sub to a job: a
	// Subscription handed over again by Reload is being read by the
	// lane's jobs meanwhile (as WithDefaults).
	if b := l.e.bulkheadOf(sub.Tenant); sub.bulkhead != b {
		sub.bulkhead = b
	}
	if old != nil && old.Tenant != sub.Tenant {
		// The attempt log names the events of the tenant it was kept
		// for; the new tenant starts with none, so it sees nothing of the
		// old tenant's events.
		l.activity = nil
	}
	// A tenant's subscription waits no longer and no deeper than its
	// tenant's bound allows, retries included: what it set can only be
	// tighter (tenantBound). Written like the bulkhead, only when it
	// differs.
	if bound := l.e.tenantBound(sub.Tenant); bound != (BacklogQuota{}) {
		if q := sub.Backlog.bounded(bound); q != sub.Backlog {
			sub.Backlog = q
		}
		if sub.Retry.MaxAge <= 0 || sub.Retry.MaxAge > bound.MaxAge {
			sub.Retry.MaxAge = bound.MaxAge
		}
	}
	// Its route and token too; written only when it changes, like the
	// bulkhead (a Subscription handed over again is being read).
	if b := l.e.routes.Attach(egress.Settings{ID: sub.ID, URL: sub.URL, Egress: sub.Egress, TLS: sub.TLS, Auth: sub.Auth}, sub.binding); b != sub.binding {
		sub.binding = b
	}
	if sub.SecretExpiry != nil {
		l.e.rotating.Store(true)
	}
	if sub.Backlog.MaxEvents > 0 || sub.Backlog.MaxAge > 0 {
		l.e.quotas.Store(true)
	}
	l.sub = sub
}

func (l *lane) paused() bool { return l.sub.Paused || l.pausedBy != "" }
