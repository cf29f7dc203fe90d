package proxy_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/testbed"
)

// TestSSRFGuardRefusesPrivateTargetsAtConnect: with the guard on (the
// default), a delivery to a loopback address is refused when the connection
// is made, both for an IP literal and for a name that resolves to loopback,
// so the receiver never sees a request; the refusal is retried and then
// dead-lettered with last_error "forbidden_target". The same receiver gets
// the event from a sidecar that allows private targets, so the refusal is
// the guard and not the receiver.
func TestSSRFGuardRefusesPrivateTargetsAtConnect(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	u, _ := url.Parse(tb.URL())
	byName := "http://localhost:" + u.Port() + "/name"
	subs := func() []*delivery.Subscription {
		ip, name := sub("ip", tb.URL()+"/ip"), sub("name", byName)
		ip.Retry, name.Retry = fastRetry(2), fastRetry(2)
		return []*delivery.Subscription{ip, name}
	}

	guarded := proxy.New(proxy.Options{Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(),
		Subscriptions: subs(), Logger: quietLogger()})
	if err := guarded.Open(); err != nil {
		t.Fatal(err)
	}
	publish(t, guarded, "t", "e", 3)
	eventually(t, "both lanes dead-letter every event", func() bool {
		return lane(guarded, "ip").DeadLettered == 3 && lane(guarded, "name").DeadLettered == 3
	})
	dls, err := guarded.DeadLetters("", 100)
	if err != nil || len(dls) != 6 {
		t.Fatalf("dead letters: %d %v", len(dls), err)
	}
	for _, d := range dls {
		if d.LastError != "forbidden_target" || d.Attempts != 2 || d.LastStatus != 0 {
			t.Errorf("dead letter %s/%d: last_error %q attempts %d status %d; want forbidden_target after 2 attempts",
				d.Subscription, d.Seq, d.LastError, d.Attempts, d.LastStatus)
		}
	}
	closeServer(t, guarded, 0)
	for path, st := range tb.Stats() {
		if st.Requests != 0 {
			t.Fatalf("the guard let %d requests reach %s", st.Requests, path)
		}
	}

	allowed := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "-", DataDir: t.TempDir(),
		Subscriptions: subs(), Logger: quietLogger()})
	if err := allowed.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, allowed, 0) })
	publish(t, allowed, "t", "e", 3)
	waitFor(t, tb, "deliveries with private targets allowed", func(m map[string]testbed.PathStats) bool {
		return m["/ip"].Unique == 3 && m["/name"].Unique == 3
	})
}

// TestForbiddenTargetErrorNamesHostNotURL: the refusal names the host and
// the way out, never the path or query, which may carry credentials.
func TestForbiddenTargetErrorNamesHostNotURL(t *testing.T) {
	e := &egress.ForbiddenTargetError{Host: "hooks.internal", Reason: "a private address"}
	msg := e.Error()
	for _, want := range []string{"hooks.internal", "a private address", "allow_private_targets"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
}
