package proxy_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/testbed"
)

// publishAs posts n events of tenant ("" for platform events).
func publishAs(t *testing.T, s *proxy.Server, tenant, typ, prefix string, n int) {
	t.Helper()
	var hdr map[string]string
	if tenant != "" {
		hdr = map[string]string{ingest.HeaderTenant: tenant}
	}
	for i := range n {
		if code, a := postWith(t, s, typ, fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf(`{"n":%d}`, i), hdr); code != http.StatusAccepted {
			t.Fatalf("publish %s-%d: %d %+v", prefix, i, code, a)
		}
	}
}

// TestTenantBacklogBoundsPausedSubscription: a tenant pauses its own
// subscription, which sets no backlog quota of its own; the operator's
// bound for the tenant still applies, counting only the tenant's events,
// while it is paused: the oldest past it are dead-lettered, so the paused
// lane cannot pin the log until the disk guard refuses every producer.
// Another tenant's events and the platform's never count against it.
func TestTenantBacklogBoundsPausedSubscription(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	mine := sub("acme-all", tb.URL()+"/acme", "*")
	mine.Tenant = "acme"
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{mine},
		Tenants: []delivery.Tenant{{ID: "acme", Backlog: delivery.BacklogQuota{MaxEvents: 5}}}})
	if err := s.Pause("acme-all", ""); err != nil {
		t.Fatal(err)
	}
	publishAs(t, s, "acme", "order.created", "acme", 20)
	publishAs(t, s, "globex", "order.created", "globex", 30)
	publishAs(t, s, "", "order.created", "platform", 30)
	eventually(t, "the tenant's bound enforced while paused", func() bool { return lane(s, "acme-all").QuotaDropped >= 15 })
	dls, err := s.DeadLetters("acme-all", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 15 {
		t.Fatalf("%d dead letters, want the 15 oldest of acme's 20", len(dls))
	}
	for i, d := range dls {
		if d.Reason != policy.ReasonBacklogQuota || d.EventID != fmt.Sprintf("acme-%d", i) || d.Tenant != "acme" || d.Owner != "acme" {
			t.Fatalf("dead letter %d = %s %s tenant %q owner %q; want acme-%d, backlog_quota, of acme", i, d.EventID, d.Reason, d.Tenant, d.Owner, i)
		}
	}
	// Nothing more goes: five of acme's wait, and the others' events are
	// not acme's backlog.
	if err := s.Resume("acme-all"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, tb, "acme's five waiting events", accepted(5))
	if st := lane(s, "acme-all"); st.QuotaDropped != 15 {
		t.Fatalf("quota dropped %d after resume, want 15", st.QuotaDropped)
	}
}

// TestTenantBoundTightensOnly: a tenant's own quota and retry age may be
// tighter than the operator's bound, never looser; without either the
// bound is DefaultTenantBacklog. The operator's own subscriptions are not
// bounded.
func TestTenantBoundTightensOnly(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	loose := sub("loose", tb.URL()+"/a", "*")
	loose.Tenant, loose.Backlog, loose.Retry.MaxAge = "acme", delivery.BacklogQuota{MaxEvents: 1 << 40, MaxAge: 1000 * time.Hour}, 1000*time.Hour
	tight := sub("tight", tb.URL()+"/b", "*")
	tight.Tenant, tight.Backlog = "acme", delivery.BacklogQuota{MaxEvents: 3, MaxAge: time.Minute}
	unlisted := sub("unlisted", tb.URL()+"/c", "*")
	unlisted.Tenant, unlisted.Retry.MaxAge = "initech", 1000*time.Hour
	ops := sub("ops", tb.URL()+"/d", "*")
	ops.Retry.MaxAge = 1000 * time.Hour
	startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{loose, tight, unlisted, ops},
		Tenants: []delivery.Tenant{{ID: "acme", Backlog: delivery.BacklogQuota{MaxEvents: 100, MaxAge: time.Hour}}}})
	for _, c := range []struct {
		s      *delivery.Subscription
		want   delivery.BacklogQuota
		maxAge time.Duration
	}{
		{loose, delivery.BacklogQuota{MaxEvents: 100, MaxAge: time.Hour}, time.Hour},
		{tight, delivery.BacklogQuota{MaxEvents: 3, MaxAge: time.Minute}, time.Hour},
		{unlisted, delivery.DefaultTenantBacklog, delivery.DefaultTenantBacklog.MaxAge},
		{ops, delivery.BacklogQuota{}, 1000 * time.Hour},
	} {
		if c.s.Backlog != c.want || c.s.Retry.MaxAge != c.maxAge {
			t.Errorf("%s: backlog %+v, retry max age %v; want %+v, %v", c.s.ID, c.s.Backlog, c.s.Retry.MaxAge, c.want, c.maxAge)
		}
	}
}

// TestTenantDeadLettersBounded: a tenant's subscription at a failing
// endpoint keeps at most its tenant's max_dead_letters, the newest; the
// operator's subscription at the same endpoint keeps every one. So the
// backlog bound, which turns a stalled endpoint's events into dead
// letters, does not just move them where they fill the disk as surely.
func TestTenantDeadLettersBounded(t *testing.T) {
	tb := startTestbed(t, testbed.ModeFail)
	mine := sub("acme-hook", tb.URL()+"/acme", "*")
	mine.Tenant, mine.Retry = "acme", fastRetry(1)
	ops := sub("ops-hook", tb.URL()+"/ops", "*")
	ops.Retry = fastRetry(1)
	reg := prometheus.NewRegistry()
	s := startServerWith(t, proxy.Options{Subscriptions: []*delivery.Subscription{mine, ops}, Registry: reg,
		Tenants: []delivery.Tenant{{ID: "acme", MaxDeadLetters: 5}}})
	publishAs(t, s, "acme", "order.created", "acme", 20)
	eventually(t, "every event dead-lettered", func() bool {
		return lane(s, "acme-hook").DeadLettered == 20 && lane(s, "ops-hook").DeadLettered == 20
	})
	eventually(t, "acme's letters trimmed to its bound", func() bool {
		dls, err := s.DeadLetters("acme-hook", 100)
		return err == nil && len(dls) == 5
	})
	dls, err := s.DeadLetters("acme-hook", 100)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range dls {
		if want := fmt.Sprintf("acme-%d", 15+i); d.EventID != want {
			t.Fatalf("letter %d is %s, want the newest five, %s first", i, d.EventID, "acme-15")
		}
	}
	// The deletions are counted, never silent: the count follows the
	// store's deletion, so it is awaited, and then must be exact.
	eventually(t, "the 15 deletions counted", func() bool {
		return counter(t, reg, "sluice_dead_letters_trimmed_total", "subscription", "acme-hook") >= 15
	})
	if got := counter(t, reg, "sluice_dead_letters_trimmed_total", "subscription", "acme-hook"); got != 15 {
		t.Fatalf("sluice_dead_letters_trimmed_total{subscription=acme-hook} = %v, want 15", got)
	}
	if all, err := s.DeadLetters("ops-hook", 100); err != nil || len(all) != 20 {
		t.Fatalf("the operator's subscription keeps %d letters (%v), want all 20", len(all), err)
	}
}
