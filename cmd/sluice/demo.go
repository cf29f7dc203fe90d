package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
	"github.com/sluicehq/sluice/testbed"
)

// demo is the self-contained tour: a sidecar on a temp dir, local endpoints
// (healthy, flaky, failing, black hole), a producer, live progress and a
// per-subscription summary.
func demo(args []string, stdout io.Writer) error {
	fs := newFlagSet("demo", `A self-contained tour, nothing to set up: a sidecar on a temporary data
dir, local endpoints (healthy, one taking one event type, flaky, failing, a
black hole that never answers), a producer publishing --events events, live
progress and a summary per subscription; it stops when all is delivered or
dead-lettered, or after --max. With --fleet: an embedded 3-server NATS
JetStream cluster and three sluice nodes sharing its log, one of them killed
mid-stream, and a count showing nothing was lost.`, stdout)
	events := fs.Int("events", 300, "events to publish")
	maxWait := fs.Duration("max", 15*time.Second, "stop after this long")
	fleet := fs.Bool("fleet", false, "fleet mode: an embedded 3-node JetStream cluster and three sluice nodes, one killed mid-stream")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs("demo", pos); err != nil {
		return err
	}
	if *fleet {
		if !flagSet(fs, "max") {
			*maxWait = 60 * time.Second
		}
		return demoFleet(*events*3, *maxWait, stdout)
	}
	dir, err := os.MkdirTemp("", "sluice-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	secret, err := signing.GenerateSecret()
	if err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tb := testbed.New(testbed.Options{Secrets: []signing.Secret{secret}, Logger: quiet})
	if err := tb.Open("127.0.0.1:0"); err != nil {
		return err
	}
	defer tb.Close()
	tb.SetMode("/failing", testbed.ModeFail)
	tb.SetMode("/flaky", testbed.ModeFlaky)
	tb.SetMode("/blackhole", testbed.ModeBlackhole)

	fast := policy.RetryPolicy{MaxAttempts: 3, Backoff: policy.Backoff{Base: 50 * time.Millisecond, Cap: 200 * time.Millisecond}}
	sub := func(id string, types ...string) *delivery.Subscription {
		return &delivery.Subscription{ID: id, URL: tb.URL() + "/" + id, Secrets: []signing.Secret{secret}, Types: types,
			Timeout: 2 * time.Second, MaxConcurrency: 8, Retry: fast}
	}
	hole := sub("blackhole")
	hole.Timeout, hole.MaxConcurrency = time.Hour, 4 // never answers: its cap is all it may hold
	flaky := sub("flaky")
	flaky.Retry.MaxAttempts = 20 // every other request to the path fails: an event almost never loses 20 draws
	subs := []*delivery.Subscription{sub("healthy"), sub("geofence-only", "geofence.enter"), flaky, sub("failing"), hole}
	// Breakers and the retry budget at demo scale: the tour lasts seconds,
	// not the minutes of the production defaults.
	for _, s := range subs {
		s.Breaker = policy.BreakerConfig{CoolDown: 200 * time.Millisecond, MaxCoolDown: time.Second, ConsecutiveTimeouts: 2}
	}
	flaky.Breaker.FailureRatio = 0.9 // half of its answers fail, by design: keep delivering
	srv := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: dir, Sync: true, Subscriptions: subs, Logger: quiet,
		RetryBudget: policy.BudgetConfig{MinPerSecond: 500, Window: 2 * time.Second}})
	if err := srv.Open(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "sluice demo: sidecar %s (admin %s), data dir %s\n", srv.URL(), srv.AdminURL(), dir)
	fmt.Fprintf(stdout, "endpoints on %s: healthy, geofence-only (types: geofence.enter), flaky (every other request 500), failing (always 500, 3 attempts, then a dead letter), blackhole (accepts, never answers; cap 4)\n\n", tb.URL())

	// The producer: fire-and-forget POSTs to the local sidecar.
	start := time.Now()
	accepted := make(chan int, 1)
	go func() {
		c := &http.Client{Timeout: 5 * time.Second}
		n := 0
		for i := range *events {
			typ := "geofence.enter"
			if i%3 == 2 {
				typ = "geofence.exit"
			}
			body := fmt.Sprintf(`{"vehicle":"v-%d","zone":"depot-%d","n":%d}`, i%17, i%5, i)
			req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/v1/events/"+typ, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", fmt.Sprintf("demo-%d-%d", start.UnixNano(), i))
			if resp, err := c.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusAccepted {
					n++
				}
			}
			time.Sleep(5 * time.Millisecond) // a steady producer, ~200 events/s
		}
		accepted <- n
	}()

	nAccepted := -1
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(*maxWait)
loop:
	for {
		select {
		case n := <-accepted:
			nAccepted = n
		case <-tick.C:
			fmt.Fprintln(stdout, progressLine(time.Since(start), srv.Lanes()))
			if nAccepted >= 0 && settled(srv.Lanes()) {
				break loop
			}
		case <-deadline:
			break loop
		}
	}
	fmt.Fprintf(stdout, "\npublished %d events, %d accepted (202) in %.1fs\n\n", *events, max(nAccepted, 0), time.Since(start).Seconds())
	writeSummary(stdout, srv.Lanes(), tb.Stats())
	fmt.Fprintln(stdout, "\nThe black hole holds only its cap; its backlog waits on disk and is delivered when the endpoint comes back.")
	fmt.Fprintln(stdout, "The failing endpoint's breaker opened after its first failures: it is probed now and then, not hammered,")
	fmt.Fprintln(stdout, "and its events wait on disk too. The healthy, filtered and flaky subscriptions got every event they are")
	fmt.Fprintln(stdout, "entitled to, unaffected by the other two.")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return srv.Close(ctx)
}

// settled: every lane but the black hole, and any whose breaker has opened,
// has nothing left in flight, on disk or scheduled for retry.
func settled(lanes []api.LaneStatus) bool {
	for _, l := range lanes {
		if l.Subscription == "blackhole" || l.Breaker != "closed" {
			continue // waiting on disk, by design
		}
		if l.InFlight > 0 || l.Backlog > 0 || l.Scheduled > 0 {
			return false
		}
	}
	return true
}

func progressLine(el time.Duration, lanes []api.LaneStatus) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%5.1fs ", el.Seconds())
	for _, l := range lanes {
		fmt.Fprintf(&b, " | %s %d ok", l.Subscription, l.Delivered)
		if l.Retried > 0 {
			fmt.Fprintf(&b, " %d retried", l.Retried)
		}
		if l.DeadLettered > 0 {
			fmt.Fprintf(&b, " %d dead", l.DeadLettered)
		}
		if l.Breaker != "closed" {
			fmt.Fprintf(&b, " [breaker %s]", l.Breaker)
		}
		if l.InFlight == l.Cap {
			fmt.Fprintf(&b, " [%d/%d in flight, %d on disk]", l.InFlight, l.Cap, l.Backlog-uint64(l.InFlight))
		}
	}
	return b.String()
}

func writeSummary(w io.Writer, lanes []api.LaneStatus, stats map[string]testbed.PathStats) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBSCRIPTION\tDELIVERED\tRETRIED\tDEAD-LETTERED\tIN FLIGHT/CAP\tBACKLOG\tBREAKER\tRECEIVER SAW (unique, dup, bad sig)")
	for _, l := range lanes {
		st := stats["/"+l.Subscription]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d/%d\t%d\t%s\t%d, %d, %d\n", l.Subscription, l.Delivered, l.Retried, l.DeadLettered,
			l.InFlight, l.Cap, l.Backlog, l.Breaker, st.Unique, st.Duplicates, st.BadSignatures)
	}
	tw.Flush()
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
