package delivery

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/idletick"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/queue"
)

// operational is the operational webhook: sluice's own events
// about its subscriptions, sent to Options.OperationalWebhook.
//
// They ride sluice's own machinery. Each is appended to the log like a
// producer's event and delivered by the lane of OperationalID, so it is
// durable once appended and gets the lane's retries, breaker and rate
// limit, and the shared retry budget, like any delivery. Bodies follow
// Standard Webhooks: {"type", "timestamp", "data": {"subscription", ...}}.
// They name endpoints by subscription id only: never a URL, a secret, a
// header or a payload.
//
// Events, and what triggers them:
//
//   - subscription.paused: a 410 Gone paused a lane (paused_by "endpoint"),
//     or an operator did (paused_by "operator"), with the reason.
//   - subscription.breaker_opened / subscription.breaker_closed: the
//     breaker tripped from closed, or a probe closed it again. A failed
//     probe re-opening it is no news: it was open already.
//   - dead_letter.created: dead letters of every reason but backlog_quota.
//   - backlog_quota.exceeded: events the backlog quota dead-lettered.
//
// Coalescing: dead letters and quota rejections come in thousands a
// second at a black hole, so they are counted per subscription in
// one-minute windows. The first one after a quiet minute is sent at once
// (an alert must not wait for the window), the window then runs for a
// minute from it, and at its end one summary counts what came since; while
// they keep coming, one summary follows per minute. A minute without any
// ends the episode. So a subscription yields at most two events of each
// kind in its first minute and one a minute after that, and the counts of
// an episode's events add up to its dead letters.
//
// The hooks never block a lane. They run under the lane's lock and on the
// delivery path, so they only hand a small notice to a bounded channel, or
// bump a counter in a bounded map of windows, both without waiting; one
// goroutine appends to the log. When the channel or the map is full the
// notice is dropped, counted in sluice_operational_events_dropped_total and
// logged at most once a minute: these are notices about the system, and
// losing one under overload must never stall a delivery. What was appended
// is counted in sluice_operational_events_total{type}.
//
// Nothing is sent about the operational subscription itself: a failing
// operational endpoint must not feed its own lane.
//
// The five types are sluice's alone (operationalType): ingest refuses
// them from producers, and no lane but OperationalID takes them, whether
// or not an operational webhook is configured now. A type's meaning must
// not change with a config key, and events outlive the config that made
// them: a lane behind its head still holds operational events appended
// while the webhook was configured, naming other tenants' subscriptions.
// (The price: events of these types that a producer posted to an older
// version and that still wait are passed over by every lane.)
type operational struct {
	tmpl  Subscription // the webhook as configured; each join gets a copy
	store queue.Store
	log   *slog.Logger
	now   func() time.Time

	notices chan notice   // discrete events, in order
	wake    chan struct{} // a window has something to send at once
	quit    chan struct{}
	wg      sync.WaitGroup

	mu      sync.Mutex
	windows map[windowKey]*window
	lastErr error // the last append that failed, for the drop log

	unlogged atomic.Int64 // drops since the last log line
	dropped  prometheus.Counter
	appended map[string]prometheus.Counter // by type; read-only after new
}

// The operational event types.
const (
	typePaused        = "subscription.paused"
	typeBreakerOpened = "subscription.breaker_opened"
	typeBreakerClosed = "subscription.breaker_closed"
	typeDeadLetter    = "dead_letter.created"
	typeQuota         = "backlog_quota.exceeded"
)

var operationalTypes = []string{typePaused, typeBreakerOpened, typeBreakerClosed, typeDeadLetter, typeQuota}

// OperationalType reports whether typ is one of sluice's own event types.
// It allocates nothing, also for string(b) of a []byte (the compiler
// compares in place).
func OperationalType(typ string) bool {
	switch typ {
	case typePaused, typeBreakerOpened, typeBreakerClosed, typeDeadLetter, typeQuota:
		return true
	}
	return false
}

// hidden reports whether the lane of sub must pass over events of typ:
// operational events are the operational lane's alone. It is the one
// rule; lane.wants applies it to the ring and the ledger, hideOperational
// to pages read from the log. It is not in the lanes' matchers
// (feed.matcherFor): a lane for all types has none, and that nil is its
// fast path everywhere (no type check per event, a backlog counted by
// arithmetic, log pages read unfiltered); one check here costs a length
// compare for most types. The backlog counts of a lane for all types
// ("*") still include the operational events past its cursor (they are
// arithmetic on seqs, which is what keeps them free): an upper bound, off
// by a few coalesced events.
func hidden(sub, typ string) bool { return OperationalType(typ) && sub != OperationalID }

// hideOperational removes, in place, the events of evs that the lane of
// sub must pass over (hidden).
func hideOperational(sub string, evs []*queue.Event) []*queue.Event {
	if sub == OperationalID {
		return evs
	}
	kept := evs[:0]
	for _, ev := range evs {
		if !OperationalType(ev.Type) {
			kept = append(kept, ev)
		}
	}
	clear(evs[len(kept):])
	return kept
}

// Bounds of what waits to be appended.
const (
	// noticeQueue bounds the discrete notices (pauses, breaker changes)
	// waiting for the appender: a burst of breakers tripping at once
	// (a shared upstream going down) fits; past it they are dropped.
	noticeQueue = 256
	// maxWindows bounds the subscriptions with an open coalescing window
	// of each kind together, and so the summaries of one minute.
	maxWindows = 4096
	// coalesceWindow is how long dead letters and quota rejections of one
	// subscription are counted before a summary.
	coalesceWindow = time.Minute
	// opsTick is how often the appender looks for windows that ended.
	opsTick = time.Second
	// appendParallel is how many summaries are appended at once: the
	// log commits concurrent appends in one group, so a minute's
	// summaries of many subscriptions cost a few commits, not one each.
	appendParallel = 16
)

// OperationalID is the subscription id of the operational webhook's lane.
const OperationalID = "sluice.operational"

// newOperational returns the unstarted operational webhook of sub, or nil
// when sub is nil (every method of a nil *operational does nothing).
func newOperational(sub *Subscription, store queue.Store, log *slog.Logger, now func() time.Time, reg prometheus.Registerer) *operational {
	if sub == nil {
		return nil
	}
	o := &operational{
		tmpl: *sub, store: store, log: log, now: now,
		notices: make(chan notice, noticeQueue),
		wake:    make(chan struct{}, 1),
		quit:    make(chan struct{}),
		windows: map[windowKey]*window{},
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_operational_events_dropped_total",
			Help: "Operational events dropped: their queue was full, or the log refused them. Notices, not deliveries: they are dropped rather than stall a lane.",
		}),
		appended: map[string]prometheus.Counter{},
	}
	// The operational lane takes the operational types and nothing else,
	// belongs to no tenant, filters nothing, and is the file's (the API
	// may neither change nor delete it).
	o.tmpl.ID, o.tmpl.Types = OperationalID, operationalTypes
	o.tmpl.ManagedBy, o.tmpl.Tenant, o.tmpl.Filter, o.tmpl.Spec = api.ManagedByFile, "", nil, nil
	o.tmpl.WithDefaults()
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_operational_events_total",
		Help: "Operational events appended to the log for the operational webhook, by type.",
	}, []string{"type"})
	for _, t := range operationalTypes {
		o.appended[t] = events.WithLabelValues(t)
	}
	if reg != nil {
		reg.MustRegister(o.dropped, events)
	}
	return o
}

// with returns subs and the operational webhook's subscription after
// them, so that it joins (at start, and again at every reload, which must
// never remove it) as the file's subscriptions do. The id is reserved
// whether or not the webhook is configured.
func (o *operational) with(subs []*Subscription) ([]*Subscription, error) {
	for _, s := range subs {
		if s.ID == OperationalID {
			return nil, fmt.Errorf("subscription %s: the id is reserved for the operational webhook (admin.operational_webhook)", OperationalID)
		}
	}
	if o == nil {
		return subs, nil
	}
	// A copy each time: a join writes the subscription (its bulkhead)
	// while the lane's deliveries may read the one it had.
	s := o.tmpl
	return append(subs[:len(subs):len(subs)], &s), nil
}

// about reports whether events about subscription sub are sent.
func (o *operational) about(sub string) bool { return o != nil && sub != OperationalID }

// notice is one discrete event for the appender.
type notice struct {
	typ, sub string
	at       time.Time
	reason   string // paused
	by       string // paused: endpoint or operator
	status   int    // breaker_opened: the last attempt's status
	failure  string // breaker_opened: the last attempt's failure word
}

// send hands n to the appender, or drops it when the queue is full.
func (o *operational) send(n notice) {
	select {
	case o.notices <- n:
	default:
		o.drop(nil)
	}
}

func (o *operational) drop(err error) {
	o.dropped.Inc()
	o.unlogged.Add(1)
	if err != nil {
		o.mu.Lock()
		o.lastErr = err
		o.mu.Unlock()
	}
	o.poke() // run ticks again, to log the drop within the minute
}

// Who paused a subscription (the paused_by of subscription.paused).
const (
	pausedByEndpoint = "endpoint"
	pausedByOperator = "operator"
)

// paused notes that sub was paused, by whom and why.
func (o *operational) paused(sub, reason, by string) {
	if o.about(sub) {
		o.send(notice{typ: typePaused, sub: sub, at: o.now(), reason: reason, by: by})
	}
}

// recordBreaker records one attempt's outcome in the lane's breaker and
// tells the operational webhook when that tripped it from closed or
// closed it. The lane watches the transition, not policy, which knows
// nothing of the project. l.mu is held.
func (l *lane) recordBreaker(res result, probe bool) {
	b, o := l.brk(), l.e.ops
	if !o.about(l.id) {
		b.Record(res.Outcome == policy.Retry, res.Timeout(), probe)
		return
	}
	was := b.State()
	b.Record(res.Outcome == policy.Retry, res.Timeout(), probe)
	switch is := b.State(); {
	case was == policy.BreakerClosed && is == policy.BreakerOpen:
		o.send(notice{typ: typeBreakerOpened, sub: l.id, at: o.now(), status: res.Status, failure: res.Failure.String()})
	case was != policy.BreakerClosed && is == policy.BreakerClosed:
		o.send(notice{typ: typeBreakerClosed, sub: l.id, at: o.now()})
	}
}

// windowKey names one coalescing window: a kind of event, a subscription.
type windowKey struct {
	typ string // typeDeadLetter or typeQuota
	sub string
}

// window counts one subscription's dead letters (or quota rejections)
// since the last event about them.
type window struct {
	end     time.Time // when the current minute ends
	sendNow bool      // the first after a quiet minute: sent at once
	count   int64
	first   time.Time
	last    time.Time
	// Dead letters only.
	firstSeq, lastSeq uint64
	reasons           map[string]int64 // by reason, a closed set
	lastStatus        int
	// Quota only: the quota in force.
	quota BacklogQuota
}

// windowLocked returns the open window of k, opening one (to be sent at
// once) if there is none; nil when maxWindows are open. o.mu is held.
func (o *operational) windowLocked(k windowKey, now time.Time) *window {
	if w := o.windows[k]; w != nil {
		return w
	}
	if len(o.windows) >= maxWindows {
		o.dropped.Inc()
		o.unlogged.Add(1)
		return nil
	}
	w := &window{end: now.Add(coalesceWindow), sendNow: true}
	o.windows[k] = w
	o.poke()
	return w
}

// poke wakes the appender's loop without blocking.
func (o *operational) poke() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// idle reports whether the appender has nothing to look at on a tick:
// no window open and no drop to log.
func (o *operational) idle() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.windows) == 0 && o.unlogged.Load() == 0
}

// add counts n more at at. The times are a range, not the order of the
// calls: a lane reads its clock before it takes its lock, so concurrent
// deliveries' letters can come here in the other order.
func (w *window) add(n int64, at time.Time) {
	switch {
	case w.count == 0:
		w.first, w.last = at, at
	case at.Before(w.first):
		w.first = at
	case at.After(w.last):
		w.last = at
	}
	w.count += n
}

// deadLetter counts a durable dead letter of sub. Those of the backlog
// quota are quotaExceeded's.
func (o *operational) deadLetter(sub string, dl *queue.DeadLetter) {
	if !o.about(sub) || dl.Reason == policy.ReasonBacklogQuota {
		return
	}
	o.mu.Lock()
	if w := o.windowLocked(windowKey{typeDeadLetter, sub}, dl.DeadAt); w != nil {
		// The seqs are a range too: a lane with several deliveries in
		// flight dead-letters them as their answers come, not in seq
		// order, and a first_seq past last_seq names no letter at all.
		if w.count == 0 {
			w.firstSeq, w.lastSeq = dl.Seq, dl.Seq
		} else {
			w.firstSeq, w.lastSeq = min(w.firstSeq, dl.Seq), max(w.lastSeq, dl.Seq)
		}
		w.add(1, dl.DeadAt)
		w.lastStatus = dl.LastStatus
		if w.reasons == nil {
			w.reasons = make(map[string]int64, 1)
		}
		w.reasons[dl.Reason]++
	}
	o.mu.Unlock()
}

// quotaExceeded counts n events the backlog quota q of sub dead-lettered
// in one pass.
func (o *operational) quotaExceeded(sub string, n uint64, q BacklogQuota, now time.Time) {
	if n == 0 || !o.about(sub) {
		return
	}
	o.mu.Lock()
	if w := o.windowLocked(windowKey{typeQuota, sub}, now); w != nil {
		w.add(int64(n), now)
		w.quota = q
	}
	o.mu.Unlock()
}

// pending is an operational event ready to be appended.
type pending struct {
	typ  string
	at   time.Time
	data any
}

// due takes what the windows have to send at now: first events, and the
// summaries of windows that ended (all of them if all). A window that
// ended with nothing new is closed. o.mu is not held.
func (o *operational) due(now time.Time, all bool) []pending {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []pending
	for k, w := range o.windows {
		// An end further away than a window lasts predates a step back
		// of the clock: the window ended.
		ended := all || !now.Before(w.end) || w.end.Sub(now) > coalesceWindow
		switch {
		case w.sendNow || ended && w.count > 0:
			out = append(out, w.take(k, now))
			w.sendNow = false
			if ended {
				w.end = now.Add(coalesceWindow)
			}
		case ended:
			delete(o.windows, k)
		}
	}
	if all {
		clear(o.windows)
	}
	return out
}

// take makes the event of what w counted and starts counting afresh.
func (w *window) take(k windowKey, now time.Time) pending {
	p := pending{typ: k.typ, at: now}
	if k.typ == typeQuota {
		p.data = quotaData{Subscription: k.sub, Count: w.count, FirstAt: w.first.UTC(), LastAt: w.last.UTC(),
			MaxEvents: w.quota.MaxEvents, MaxAgeSeconds: w.quota.MaxAge.Seconds()}
	} else {
		p.data = deadLetterData{Subscription: k.sub, Count: w.count, FirstSeq: w.firstSeq, LastSeq: w.lastSeq,
			FirstAt: w.first.UTC(), LastAt: w.last.UTC(), Reasons: w.reasons, LastStatus: w.lastStatus}
	}
	w.count, w.reasons = 0, nil
	return p
}

// The data of each event type.
type (
	pausedData struct {
		Subscription string `json:"subscription"`
		Reason       string `json:"reason"`
		PausedBy     string `json:"paused_by"` // endpoint (a 410 Gone) or operator
	}
	breakerData struct {
		Subscription string `json:"subscription"`
		State        string `json:"state"` // open or closed
		// The attempt that tripped it: its status (0 without an answer)
		// and failure word (timeout, connection_refused, ...).
		LastStatus int    `json:"last_status,omitempty"`
		LastError  string `json:"last_error,omitempty"`
	}
	deadLetterData struct {
		Subscription string `json:"subscription"`
		Count        int64  `json:"count"` // since the last dead_letter.created of the subscription
		// The lowest and highest seq and dead_at of the letters counted.
		FirstSeq   uint64           `json:"first_seq"`
		LastSeq    uint64           `json:"last_seq"`
		FirstAt    time.Time        `json:"first_at"`
		LastAt     time.Time        `json:"last_at"`
		Reasons    map[string]int64 `json:"reasons"`
		LastStatus int              `json:"last_status,omitempty"`
	}
	quotaData struct {
		Subscription  string    `json:"subscription"`
		Count         int64     `json:"count"` // events dead-lettered, since the last event
		FirstAt       time.Time `json:"first_at"`
		LastAt        time.Time `json:"last_at"`
		MaxEvents     int64     `json:"max_events,omitempty"`
		MaxAgeSeconds float64   `json:"max_age_seconds,omitempty"`
	}
)

// envelope is an operational event's body (Standard Webhooks).
type envelope struct {
	Type      string `json:"type"`
	Timestamp string `json:"timestamp"` // RFC 3339, UTC
	Data      any    `json:"data"`
}

func (n notice) pending() pending {
	p := pending{typ: n.typ, at: n.at}
	switch n.typ {
	case typePaused:
		p.data = pausedData{Subscription: n.sub, Reason: n.reason, PausedBy: n.by}
	case typeBreakerOpened:
		p.data = breakerData{Subscription: n.sub, State: policy.BreakerOpen.String(), LastStatus: n.status, LastError: n.failure}
	default:
		p.data = breakerData{Subscription: n.sub, State: policy.BreakerClosed.String()}
	}
	return p
}

// start runs the appender until stop.
func (o *operational) start() {
	if o == nil {
		return
	}
	o.wg.Add(1)
	go o.run()
}

// stop ends the appender after it has appended what was queued and the
// windows' last summaries, each in at most stopBudget. It must run before
// the log closes; what the dispatcher's last cursor flush did not cover
// is delivered after a restart, like any event.
func (o *operational) stop() {
	if o == nil {
		return
	}
	close(o.quit)
	o.wg.Wait()
}

// stopBudget bounds the final appends at shutdown (a log that fails over
// must not hold Close); what is left is dropped and counted.
const stopBudget = 2 * time.Second

func (o *operational) run() {
	defer o.wg.Done()
	t := idletick.New(opsTick)
	defer t.Stop()
	var loggedAt time.Time
	for {
		// Tick only while a window is open or a drop waits to be logged:
		// both poke the loop when they begin, and a quiet sidecar with
		// an operational webhook then sleeps instead of waking each second.
		t.RunIf(!o.idle())
		select {
		case n := <-o.notices:
			o.appendEvent(n.pending())
		case <-o.wake:
			o.appendAll(o.due(o.now(), false))
		case <-t.C:
			o.appendAll(o.due(o.now(), false))
			if time.Since(loggedAt) >= time.Minute {
				if n := o.unlogged.Swap(0); n > 0 {
					args := []any{"count", n}
					o.mu.Lock()
					if o.lastErr != nil {
						args = append(args, "last_err", o.lastErr)
						o.lastErr = nil
					}
					o.mu.Unlock()
					o.log.Warn("operational events dropped (queue full or log refused them); deliveries went on", args...)
					loggedAt = time.Now()
				}
			}
		case <-o.quit:
			o.drain()
			return
		}
	}
}

// drain appends, within stopBudget, what is queued and the windows' last
// summaries; the rest is dropped and counted, and logged here, since the
// loop that logs drops is done.
func (o *operational) drain() {
	deadline := time.Now().Add(stopBudget)
	for queued := true; queued; {
		select {
		case n := <-o.notices:
			if time.Now().Before(deadline) {
				o.appendEvent(n.pending())
			} else {
				o.drop(nil)
			}
		default:
			queued = false
		}
	}
	final := o.due(o.now(), true)
	if time.Now().Before(deadline) {
		o.appendAll(final)
	} else {
		for range final {
			o.drop(nil)
		}
	}
	if n := o.unlogged.Swap(0); n > 0 {
		o.log.Warn("operational events dropped (queue full or log refused them); deliveries went on", "count", n)
	}
}

// appendEvent writes one operational event to the log.
func (o *operational) appendEvent(p pending) {
	body, err := json.Marshal(envelope{Type: p.typ, Timestamp: p.at.UTC().Format(time.RFC3339Nano), Data: p.data})
	if err != nil {
		o.drop(fmt.Errorf("encode %s: %w", p.typ, err)) // plain types: cannot happen
		return
	}
	ev := &queue.Event{ID: ulid.Make().String(), Type: p.typ, ContentType: "application/json", AcceptedAt: p.at, Body: body}
	if _, _, err := o.store.Append(ev); err != nil {
		o.drop(fmt.Errorf("append %s: %w", p.typ, err))
		return
	}
	o.appended[p.typ].Inc()
}

// appendAll appends ps, appendParallel at a time.
func (o *operational) appendAll(ps []pending) {
	if len(ps) == 1 {
		o.appendEvent(ps[0])
		return
	}
	sem := make(chan struct{}, appendParallel)
	var wg sync.WaitGroup
	for _, p := range ps {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.appendEvent(p)
			<-sem
		}()
	}
	wg.Wait()
}
