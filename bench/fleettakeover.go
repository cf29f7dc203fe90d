package main

// fleet-takeover: SIGKILL a lane owner and time the takeover of its lanes.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ---------------------------------------------------------------- takeover

// takeoverTrial is one SIGKILL of a lane owner under a steady stream.
type takeoverTrial struct {
	LeaseTTL     string            `json:"lease_ttl"`
	Victim       string            `json:"victim"`
	VictimLanes  []string          `json:"victim_lanes"`
	Lanes        []takeoverLane    `json:"lanes"`
	Rate         float64           `json:"rate_events_per_s"`
	Subs         int               `json:"subscriptions"`
	KillAt       float64           `json:"kill_at_s"` // into the load
	Accepted     int64             `json:"accepted"`
	Unique       int64             `json:"unique_deliveries"`
	Owed         int64             `json:"owed_deliveries"`
	Duplicates   int64             `json:"duplicates"`
	Lost         int64             `json:"lost"`
	DrainSeconds float64           `json:"drain_seconds"`
	OthersRate   float64           `json:"other_lanes_deliveries_per_s_during"` // lanes of the survivors, kill → last takeover
	OthersBefore float64           `json:"other_lanes_deliveries_per_s_before"`
	Owners       map[string]string `json:"owners_before"`
	OwnersAfter  map[string]string `json:"owners_after,omitempty"`
	Error        string            `json:"error,omitempty"`
}

// takeoverLane is one lane of the killed node.
type takeoverLane struct {
	Subscription string  `json:"subscription"`
	NewOwner     string  `json:"new_owner"`
	TakeoverS    float64 `json:"sigkill_to_first_delivery_s"` // -1: none seen
	GapS         float64 `json:"receiver_gap_s"`              // last delivery by the victim → first by the new owner
}

const (
	takeoverSubs = 6   // so that the victim owns some and the survivors the rest
	takeoverRate = 200 // events/s, each to every subscription
)

// scenarioFleetTakeover: three nodes, six subscriptions whose deliveries
// carry X-Node, a steady open loop to the two nodes that survive; the owner
// of s0 is SIGKILLed and the receiver times, for each lane it owned, the
// first delivery by another node. Once per lease_ttl: 3 s (the demo's)
// and, without -quick, the default of 10 s.
func (h *harness) scenarioFleetTakeover(ctx context.Context, name string) error {
	ttls := []time.Duration{3 * time.Second, 10 * time.Second}
	if h.opts.quick {
		ttls = ttls[:1]
	}
	var trials []*takeoverTrial
	var firstErr error
	for _, ttl := range ttls {
		if ctx.Err() != nil {
			break
		}
		tr, err := h.takeoverTrial(ctx, name, ttl)
		if err != nil {
			tr.Error = err.Error()
			if firstErr == nil {
				firstErr = fmt.Errorf("lease_ttl %s: %w", ttl, err)
			}
		}
		trials = append(trials, tr)
		h.takeoverRows(name, tr, ttl)
	}
	h.rep.Details[name] = map[string]any{"rate_events_per_s": takeoverRate, "subscriptions": takeoverSubs, "trials": trials}
	return firstErr
}

func (h *harness) takeoverTrial(ctx context.Context, name string, ttl time.Duration) (*takeoverTrial, error) {
	tr := &takeoverTrial{LeaseTTL: ttl.String(), Rate: takeoverRate, Subs: takeoverSubs}
	f, err := h.startFleet(ctx, fmt.Sprintf("%s.ttl-%s", name, yamlDur(ttl)), fleetNodes,
		[]subGroup{{takeoverSubs, benchType}}, fleetOpts{LeaseTTL: ttl, NodeHeader: true})
	if err != nil {
		return tr, err
	}
	defer f.stop()
	tr.Owners = f.owners
	tr.Victim = f.owners["s0"]
	var victim *sidecar
	var survivors []string
	for _, sc := range f.nodes {
		if sc.spec.Fleet.NodeID == tr.Victim {
			victim = sc
		} else {
			survivors = append(survivors, sc.ingest)
		}
	}
	if victim == nil {
		return tr, fmt.Errorf("owner %q of s0 is not a node", tr.Victim)
	}
	for i := range takeoverSubs {
		if s := "s" + strconv.Itoa(i); f.owners[s] == tr.Victim {
			tr.VictimLanes = append(tr.VictimLanes, s)
		}
	}
	nw := newNodeWatch()
	track := newIDTracker(time.Time{})
	h.recv.nodes.Store(nw)
	h.recv.track.Store(track)
	defer func() {
		h.recv.nodes.CompareAndSwap(nw, nil)
		h.recv.track.CompareAndSwap(track, nil)
	}()

	pre := 3 * time.Second
	if h.opts.quick {
		pre = 2 * time.Second
	}
	wait := ttl + 20*time.Second // for the new owners, after the kill
	stop := make(chan struct{})
	start := time.Now()
	spec := loadSpec{Addrs: survivors, Paths: []string{eventsPath}, Status: 202, Keys: true, KeyID: h.runID + "-" + h.nextID("k"),
		Conc: openWorkers, Rate: takeoverRate, Body: 512, Start: start, Dur: pre + wait + 2*time.Second, Grace: openGrace, Stop: stop}
	done := make(chan loadResult, 1)
	go func() { done <- runLoad(ctx, spec) }()

	sleepUntil(ctx, start.Add(pre))
	before := h.recv.snapshotPaths(takeoverSubs)
	killAt := time.Now()
	nw.setMark(killAt)
	victim.kill()
	tr.KillAt = killAt.Sub(start).Seconds()
	h.logf("  SIGKILL %s (owner of %s), lease_ttl %s", tr.Victim, strings.Join(tr.VictimLanes, ","), ttl)

	// Wait until every lane of the victim was delivered by another node.
	taken := func() bool {
		for _, s := range tr.VictimLanes {
			i, _ := strconv.Atoi(strings.TrimPrefix(s, "s"))
			ok := false
			for node, seen := range nw.get(i) {
				if node != tr.Victim && seen.AfterMark > 0 {
					ok = true
				}
			}
			if !ok {
				return false
			}
		}
		return true
	}
	waitFor(ctx, wait, taken)
	tookAll := time.Now()
	after := h.recv.snapshotPaths(takeoverSubs)
	// A second more of load, then stop it.
	sleepUntil(ctx, time.Now().Add(time.Second))
	close(stop)
	res := <-done
	tr.Accepted = res.OK

	// The lanes of the killed node.
	var others, othersN int64
	for i := range takeoverSubs {
		s := "s" + strconv.Itoa(i)
		if !slices.Contains(tr.VictimLanes, s) {
			others += after[i] - before[i]
			othersN++
			continue
		}
		seen := nw.get(i)
		l := takeoverLane{Subscription: s, TakeoverS: -1, GapS: -1}
		for node, x := range seen {
			if node == tr.Victim || x.AfterMark == 0 {
				continue
			}
			if t := x.FirstAfterMark.Sub(killAt).Seconds(); l.TakeoverS < 0 || t < l.TakeoverS {
				l.TakeoverS, l.NewOwner = t, node
				if v, ok := seen[tr.Victim]; ok {
					l.GapS = x.FirstAfterMark.Sub(v.LastBeforeMark).Seconds()
				}
			}
		}
		tr.Lanes = append(tr.Lanes, l)
	}
	if d := tookAll.Sub(killAt).Seconds(); d > 0 && othersN > 0 {
		tr.OthersRate = float64(others) / d
	}
	tr.OthersBefore = takeoverRate * float64(othersN)

	// Everything accepted must reach every subscription.
	tr.Owed = tr.Accepted * takeoverSubs
	ds := time.Now()
	waitFor(ctx, h.drainTimeout(), func() bool { return track.stats().Unique >= tr.Owed })
	tr.DrainSeconds = time.Since(ds).Seconds()
	st := track.stats()
	tr.Unique, tr.Duplicates = st.Unique, st.Duplicates
	tr.Lost = max(0, tr.Owed-st.Unique)
	if m, err := ownersOf(f.nodes[slices.IndexFunc(f.nodes, func(sc *sidecar) bool { return sc != victim })]); err == nil {
		tr.OwnersAfter = m
	}
	if !taken() {
		return tr, fmt.Errorf("lanes of %s not delivered by another node within %s of the SIGKILL", tr.Victim, wait)
	}
	return tr, nil
}

func (h *harness) takeoverRows(name string, tr *takeoverTrial, ttl time.Duration) {
	r := h.rep
	at := fmt.Sprintf(", lease_ttl %s", yamlDur(ttl))
	worst, gap := -1.0, -1.0
	var parts []string
	for _, l := range tr.Lanes {
		worst = max(worst, l.TakeoverS)
		gap = max(gap, l.GapS)
		parts = append(parts, fmt.Sprintf("%s→%s %.2f s", l.Subscription, l.NewOwner, l.TakeoverS))
	}
	row := r.add(name, "SIGKILL → first delivery by the new owner (slowest lane)"+at, worst, "s").
		want(onValue, "<=", ttl.Seconds()+2).
		note(fmt.Sprintf("%s owned %d of %d lanes: %s; bound = lease_ttl + 2 s (the crash soak's)",
			tr.Victim, len(tr.VictimLanes), tr.Subs, strings.Join(parts, ", ")))
	if tr.Error != "" || worst < 0 {
		row.fail(tr.Error)
	}
	r.add(name, "receiver gap on the moved lanes (last by old owner → first by new)"+at, gap, "s")
	r.add(name, "other lanes' deliveries/s while the lanes moved"+at, tr.OthersRate, "/s").vsValue("offered", tr.OthersBefore).
		note("the survivors' lanes, SIGKILL → last lane taken over")
	lost := r.add(name, "lost deliveries"+at, float64(tr.Lost), "").want(onValue, "<=", 0).
		note(fmt.Sprintf("%d events accepted × %d subscriptions = %d owed, %d unique delivered (drained %.1f s after the load)",
			tr.Accepted, tr.Subs, tr.Owed, tr.Unique, tr.DrainSeconds))
	if tr.Owed == 0 {
		lost.fail("no events accepted")
	}
	r.add(name, "duplicates"+at, float64(tr.Duplicates), "").note("deliveries in flight on the killed node, sent again: at-least-once")
}
