package main

import (
	"fmt"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/testbed"
)

// filterEvents are events of several types and bodies, and whether each
// passes depots' body filter and geo's type pattern.
var filterEvents = []struct {
	typ, body   string
	depots, geo bool
}{
	{"geofence.enter", `{"data": {"depot": "A", "speed": 90}}`, true, true},
	{"geofence.exit", `{"data": {"depot": "C", "speed": 90}}`, false, true},
	{"order.created", `{"data": {"depot": "B", "kind": "alarm.fire"}}`, true, false},
	{"order.created", `{"data": {"depot": "B", "speed": 10}}`, false, false},
	{"geofence.enter.late", `{"data": {"depot": "A", "speed": 99}}`, true, false},
	{"geofence", `{"data": {"depot": "A", "speed": 81}}`, true, false},
	{"order.created", `not json at all`, false, false},
	{"order.created", `{"data": {"speed": 95}}`, false, false},
	{"geofence.enter", `{"data": {"depot": "Z", "kind": "alarm"}}`, false, true},
}

// depotsFilter is the documentation's example filter: depot A or B, and a
// speed over 80 or an alarm.
var depotsFilter = map[string]any{
	"data.depot": map[string]any{"$in": []string{"A", "B"}},
	"$or":        []any{map[string]any{"data.speed": map[string]any{"$gt": 80}}, map[string]any{"data.kind": map[string]any{"$startsWith": "alarm"}}},
}

// TestFiltersEndToEnd: a subscription with a body filter and one with a
// type pattern ("geofence.*") get exactly the events that match, among
// events of several types and bodies (one not JSON); the ones filtered
// out count as resolved (each lane's cursor reaches the head, its backlog
// 0) and the ledger says "filtered" for them, while geo is not entitled
// to other types at all. Then both are paused, more events come, the
// sidecar restarts, and once resumed the lanes, now behind, apply the
// same filter and pattern to the events they read back from the log.
func TestFiltersEndToEnd(t *testing.T) {
	log := newDeliveryLog()
	tb := startDeliveryTestbed(t, log)
	s := openAPISidecar(t, proxy.Options{AdminToken: apiOpToken})
	s.mustCall(t, "", "POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "depots", "url": tb.URL() + "/depots", "filter": depotsFilter}), 201, nil)
	s.mustCall(t, "", "POST", "/v1/subscriptions", jsonOf(map[string]any{"id": "geo", "url": tb.URL() + "/geo", "types": []string{"geofence.*"}}), 201, nil)

	var depots, geo []string // what each is owed, over both batches
	batch := func(prefix string) (ids []string) {
		for i, ev := range filterEvents {
			id := fmt.Sprintf("%s-%d", prefix, i)
			s.post(t, ev.typ, id, ev.body)
			ids = append(ids, id)
			if ev.depots {
				depots = append(depots, id)
			}
			if ev.geo {
				geo = append(geo, id)
			}
		}
		return ids
	}
	settled := func(what string, ids []string) {
		t.Helper()
		waitFor(t, tb, what, func(m map[string]testbed.PathStats) bool {
			return m["/depots"].Unique >= int64(len(depots)) && m["/geo"].Unique >= int64(len(geo))
		})
		// Filtered out is resolved: both lanes reach the head, nothing owed.
		eventually(t, what+": the lanes at the head", func() bool {
			var list api.SubscriptionList
			s.mustCall(t, "", "GET", "/v1/subscriptions", "", 200, &list)
			for _, l := range list.Subscriptions {
				if l.Cursor != list.Head || l.Backlog != 0 || l.InFlight != 0 {
					return false
				}
			}
			return len(list.Subscriptions) == 2
		})
		for path, want := range map[string][]string{"/depots": depots, "/geo": geo} {
			got := tb.IDs(path)
			slices.Sort(got)
			want = slices.Sorted(slices.Values(want))
			if !slices.Equal(got, want) {
				t.Errorf("%s: %s received %v, want exactly %v", what, path, got, want)
			}
		}
		// The ledger: delivered, filtered, or (geo, other types) not owed.
		for i, id := range ids {
			var st api.EventStatus
			s.mustCall(t, "", "GET", "/v1/events/"+id, "", 200, &st)
			states := map[string]string{}
			for _, d := range st.Deliveries {
				states[d.Subscription] = d.State
			}
			ev := filterEvents[i]
			want := map[string]string{"depots": "filtered"}
			if ev.depots {
				want["depots"] = "delivered"
			}
			if ev.geo {
				want["geo"] = "delivered"
			}
			if fmt.Sprint(states) != fmt.Sprint(want) {
				t.Errorf("%s: the ledger of %s (%s %s) says %v, want %v", what, id, ev.typ, ev.body, states, want)
			}
		}
		if st := tb.Stats(); st["/depots"].Duplicates+st["/geo"].Duplicates != 0 {
			t.Errorf("%s: duplicates %+v", what, st)
		}
	}
	settled("live events", batch("live"))

	// Behind across a restart: paused, the next batch waits in the log.
	for _, id := range []string{"depots", "geo"} {
		s.mustCall(t, "", "POST", "/v1/subscriptions/"+id+"/pause", "", 200, nil)
	}
	first := len(depots) + len(geo)
	owed := batch("logged")
	s.reopen(t)
	for _, id := range []string{"depots", "geo"} {
		if l := s.laneOf(t, id); l.State != "paused" {
			t.Fatalf("%s after the restart: %s, want still paused", id, l.State)
		}
	}
	if n := len(tb.IDs("/depots")) + len(tb.IDs("/geo")); n != first {
		t.Fatalf("paused lanes delivered: %d deliveries in all, want the first batch's %d", n, first)
	}
	for _, id := range []string{"depots", "geo"} {
		s.mustCall(t, "", "POST", "/v1/subscriptions/"+id+"/resume", "", 200, nil)
	}
	settled("events read back from the log", owed)
}
