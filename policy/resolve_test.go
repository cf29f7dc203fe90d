package policy_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

func TestResolve(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := policy.RetryPolicy{MaxAttempts: 3, MaxAge: time.Hour, Backoff: policy.Backoff{Base: time.Second, Cap: time.Minute}}
	cases := []struct {
		name    string
		x       policy.Exchange
		attempt int
		now     time.Time
		want    policy.Resolution
	}{
		{"ack", policy.Exchange{Outcome: policy.Ack, Status: 200}, 1, t0, policy.Resolution{Outcome: policy.Ack}},
		{"retry-after honoured", policy.Exchange{Outcome: policy.Retry, Status: 503, RetryAfter: 7 * time.Second}, 1, t0,
			policy.Resolution{Outcome: policy.Retry, Due: t0.Add(7 * time.Second)}},
		{"retry-after capped", policy.Exchange{Outcome: policy.Retry, Status: 429, RetryAfter: time.Hour}, 1, t0,
			policy.Resolution{Outcome: policy.Retry, Due: t0.Add(time.Minute)}},
		{"attempts spent", policy.Exchange{Outcome: policy.Retry, Failure: policy.FailTimeout}, 3, t0,
			policy.Resolution{Outcome: policy.DeadLetter, Reason: policy.ReasonMaxAttempts}},
		{"too old", policy.Exchange{Outcome: policy.Retry, Status: 500, RetryAfter: 30 * time.Second}, 1, t0.Add(time.Hour),
			policy.Resolution{Outcome: policy.DeadLetter, Reason: policy.ReasonMaxAge}},
		{"rejected", policy.Exchange{Outcome: policy.DeadLetter, Status: 400}, 1, t0,
			policy.Resolution{Outcome: policy.DeadLetter, Reason: policy.ReasonRejected}},
		{"gone pauses", policy.Exchange{Outcome: policy.DeadLetter, Status: 410}, 2, t0,
			policy.Resolution{Outcome: policy.DeadLetter, Reason: policy.ReasonGone, Pause: policy.PauseGone}},
		// classify: {"410": ack} makes a 410 an ACK: no pause.
		{"gone classified ack", policy.Exchange{Outcome: policy.Ack, Status: 410}, 1, t0, policy.Resolution{Outcome: policy.Ack}},
		{"gone classified retry", policy.Exchange{Outcome: policy.Retry, Status: 410, RetryAfter: time.Second}, 1, t0,
			policy.Resolution{Outcome: policy.Retry, Due: t0.Add(time.Second)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := policy.Resolve(c.x, p, c.attempt, t0, c.now); got != c.want {
				t.Fatalf("Resolve = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestFailureWords(t *testing.T) {
	want := map[policy.Failure]string{policy.NoFailure: "", policy.FailTimeout: "timeout", policy.FailNoFreeConns: "no_free_connections",
		policy.FailForbiddenTarget: "forbidden_target", policy.FailDNS: "dns", policy.FailConnRefused: "connection_refused",
		policy.FailConnReset: "connection_reset", policy.FailTLS: "tls", policy.FailConnect: "connect", policy.FailTransport: "transport",
		policy.FailTLSUnknownAuthority: "tls_unknown_authority", policy.FailTLSHostname: "tls_hostname", policy.FailTLSExpired: "tls_expired",
		policy.FailTLSClientCert: "tls_client_cert", policy.FailProxy: "proxy", policy.FailProxyAuth: "proxy_auth", policy.FailAuthToken: "oauth2_token"}
	for f, w := range want {
		if f.String() != w {
			t.Errorf("%d.String() = %q, want %q", f, f.String(), w)
		}
	}
	if s := policy.Failure(200).String(); s != "Failure(200)" {
		t.Errorf("out of range: %q", s)
	}
	x := policy.Exchange{Failure: policy.FailTimeout}
	if !x.Timeout() || x.Answered() {
		t.Errorf("timeout exchange: Timeout %v Answered %v", x.Timeout(), x.Answered())
	}
	if !(policy.Exchange{Status: 404}).Answered() || (policy.Exchange{Status: 503}).Answered() {
		t.Error("Answered: 404 counts, 503 does not")
	}
}
