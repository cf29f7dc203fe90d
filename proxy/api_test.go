package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/testbed"
)

// jsonShape describes a JSON document by its keys and the kinds of its
// values, not the values themselves (times, ids and counts vary): objects
// as {key:shape,...} with the keys sorted, arrays as [shape|shape...] with
// each distinct element shape once, sorted.
// Two answers with the same shape carry the same keys, and omit the same
// ones.
func jsonShape(v any) string {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + ":" + jsonShape(v[k])
		}
		return "{" + strings.Join(parts, ",") + "}"
	case []any:
		var shapes []string
		for _, e := range v {
			if sh := jsonShape(e); !slices.Contains(shapes, sh) {
				shapes = append(shapes, sh)
			}
		}
		slices.Sort(shapes)
		return "[" + strings.Join(shapes, "|") + "]"
	case string:
		return "s"
	case float64:
		return "n"
	case bool:
		return "b"
	case nil:
		return "null"
	}
	return fmt.Sprintf("?%T", v)
}

// rawAdmin sends one admin request and returns the status and the body as
// the server wrote it, which must be JSON.
func rawAdmin(t *testing.T, s *proxy.Server, method, path, body, token string) (int, []byte) {
	t.Helper()
	code, b, ct := adminRequest(t, s, method, path, body, token)
	if ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, path, ct)
	}
	return code, b
}

// adminRequest sends one admin request, with the bearer token when not
// empty, and returns the status, the body and its Content-Type.
func adminRequest(t *testing.T, s *proxy.Server, method, path, body, token string) (int, []byte, string) {
	t.Helper()
	req, _ := http.NewRequest(method, s.AdminURL()+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode, b, resp.Header.Get("Content-Type")
}

// laneShape is one entry of GET /v1/subscriptions; paused_by only while
// paused.
const laneShape = "attempts:n,backlog:n,backlog_quota_rejected:n,breaker:s,cap:n,cursor:n,dead_lettered:n,delivered:n,endpoint_held:n,in_flight:n,last_status:n,managed_by:s,oldest_age_seconds:n,rate_limited:n,retried:n,retries_deferred:n,retries_scheduled:n,short_circuits:n,state:s,subscription:s"

// deadLetterShape is a dead letter in a list (no body, never replayed).
const deadLetterShape = "accepted_at:s,attempts:n,body_bytes:n,dead_at:s,event_id:s,last_error:s,last_status:n,reason:s,replays:n,response:s,seq:n,subscription:s,type:s"

// TestAdminAnswersKeepTheirJSON pins the JSON of every admin API answer:
// its keys, which of them are left out when empty, and the indentation
// (operators and scripts read these; the dashboard reads them by name).
// The wire types in api.go must encode exactly this.
func TestAdminAnswersKeepTheirJSON(t *testing.T) {
	var accept atomic.Bool
	rejecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !accept.Load() {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, "no such tenant")
		}
	}))
	t.Cleanup(rejecting.Close)
	tb := startTestbed(t, testbed.ModeOK)
	const token = "pin-token"
	s := startAdminServer(t, "", token, sub("ok", tb.URL()+"/ok"), sub("dead", rejecting.URL))
	publish(t, s, "t", "e", 2)
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/events/bin", strings.NewReader("\xff\xfe"))
	req.Header.Set("Idempotency-Key", "b-0")
	req.Header.Set("Content-Type", "application/octet-stream")
	if code, a := do(t, req); code != http.StatusAccepted {
		t.Fatalf("publish binary: %d %+v", code, a)
	}
	waitFor(t, tb, "deliveries to ok", uniqueAt("/ok", 3))
	eventually(t, "dead letters", func() bool { return lane(s, "dead").DeadLettered == 3 })
	// e-0 is replayed and delivered: replayed_at and delivered_at appear.
	accept.Store(true)
	replay := `{"subscription":"dead","seq":1}`
	if code, b := rawAdmin(t, s, "POST", "/v1/dead-letters/replay", replay, token); code != 200 {
		t.Fatalf("replay: %d %s", code, b)
	}
	eventually(t, "replay acknowledged", func() bool {
		_, b := rawAdmin(t, s, "GET", "/v1/dead-letters/dead/1", "", token)
		return strings.Contains(string(b), `"delivered_at"`)
	})

	dl := deadLetterShape
	replayed := "accepted_at:s,attempts:n,body_bytes:n,dead_at:s,delivered_at:s,event_id:s,last_error:s,last_status:n,reason:s,replayed_at:s,replays:n,response:s,seq:n,subscription:s,type:s"
	cases := []struct {
		name, method, path, body, token string
		status                          int
		shape                           string
		exact                           string // the whole body, when it does not vary
	}{
		{name: "healthz", method: "GET", path: "/healthz", status: 200, exact: "{\n  \"status\": \"ok\"\n}\n"},
		{name: "readyz", method: "GET", path: "/readyz", token: token, status: 200, exact: "{\n  \"status\": \"ready\"\n}\n"},
		{name: "no token", method: "GET", path: "/v1/subscriptions", status: 401, exact: "{\n  \"error\": \"missing or wrong admin token\"\n}\n"},
		{name: "unknown path", method: "GET", path: "/v2/nothing", token: token, status: 404, exact: "{\n  \"error\": \"not found: GET /v2/nothing\"\n}\n"},
		{name: "subscriptions", method: "GET", path: "/v1/subscriptions", token: token, status: 200,
			shape: "{head:n,subscriptions:[{" + laneShape + "}]}"},
		{name: "retry budget", method: "GET", path: "/v1/retry-budget", token: token, status: 200,
			shape: "{allowed:n,available:n,retries:n,successes:n}"},
		{name: "event", method: "GET", path: "/v1/events/e-1", token: token, status: 200,
			shape: "{accepted_at:s,deliveries:[{at:s,attempt:n,last_status:n,reason:s,state:s,subscription:s}|{state:s,subscription:s}],id:s,seq:n,type:s}"},
		{name: "unknown event", method: "GET", path: "/v1/events/nope", token: token, status: 404,
			exact: "{\n  \"error\": \"event \\\"nope\\\" (ids are kept for dedup_window): not found\"\n}\n"},
		{name: "dead letters", method: "GET", path: "/v1/dead-letters?subscription=dead&limit=1", token: token, status: 200,
			shape: "{dead_letters:[{" + replayed + "}],next:s}"},
		{name: "dead letters, second page", method: "GET", path: "/v1/dead-letters?subscription=dead&cursor=dead/1&limit=1", token: token, status: 200,
			shape: "{dead_letters:[{" + dl + "}],next:s}"},
		{name: "no dead letters", method: "GET", path: "/v1/dead-letters?subscription=ok", token: token, status: 200,
			exact: "{\n  \"dead_letters\": [],\n  \"next\": \"\"\n}\n"},
		{name: "dead letter with a text body", method: "GET", path: "/v1/dead-letters/dead/2", token: token, status: 200,
			shape: "{" + strings.Replace(dl, "attempts:n,body_bytes:n,", "attempts:n,body:s,body_bytes:n,content_type:s,", 1) + "}"},
		{name: "dead letter with a binary body", method: "GET", path: "/v1/dead-letters/dead/3", token: token, status: 200,
			shape: "{" + strings.Replace(dl, "attempts:n,body_bytes:n,", "attempts:n,body_base64:s,body_bytes:n,content_type:s,", 1) + "}"},
		{name: "unknown dead letter", method: "GET", path: "/v1/dead-letters/dead/99", token: token, status: 404,
			exact: "{\n  \"error\": \"dead letter dead/99: not found\"\n}\n"},
		{name: "bad seq", method: "GET", path: "/v1/dead-letters/dead/x", token: token, status: 400,
			exact: "{\n  \"error\": \"seq: not a sequence number: \\\"x\\\"\"\n}\n"},
		{name: "replay", method: "POST", path: "/v1/dead-letters/replay", body: `{"items":[{"subscription":"dead","seq":2},{"subscription":"dead","seq":1}]}`, token: token, status: 200,
			shape: "{replayed:n,results:[{event_id:s,replayed:b,seq:n,skipped:s,subscription:s}|{event_id:s,replayed:b,seq:n,subscription:s}]}"},
		{name: "replay, skipped", method: "POST", path: "/v1/dead-letters/replay", body: replay, token: token, status: 200,
			shape: "{replayed:n,results:[{event_id:s,replayed:b,seq:n,skipped:s,subscription:s}]}"},
		{name: "replay, bad body", method: "POST", path: "/v1/dead-letters/replay", body: `{}`, token: token, status: 400,
			exact: "{\n  \"error\": \"nothing to replay: give subscription and seq, items, or filter\"\n}\n"},
		{name: "pause", method: "POST", path: "/v1/subscriptions/ok/pause", body: `{"reason":"pin"}`, token: token, status: 200,
			exact: "{\n  \"state\": \"paused\",\n  \"subscription\": \"ok\"\n}\n"},
		{name: "subscriptions, one paused", method: "GET", path: "/v1/subscriptions", token: token, status: 200,
			shape: "{head:n,subscriptions:[{" + strings.Replace(laneShape, "oldest_age_seconds:n,", "oldest_age_seconds:n,paused_by:s,", 1) + "}|{" + laneShape + "}]}"},
		{name: "resume", method: "POST", path: "/v1/subscriptions/ok/resume", token: token, status: 200,
			exact: "{\n  \"state\": \"active\",\n  \"subscription\": \"ok\"\n}\n"},
		{name: "pause of nobody", method: "POST", path: "/v1/subscriptions/nobody/pause", token: token, status: 404,
			exact: "{\n  \"error\": \"subscription \\\"nobody\\\": not found\"\n}\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, b := rawAdmin(t, s, c.method, c.path, c.body, c.token)
			if code != c.status {
				t.Fatalf("status %d, want %d: %s", code, c.status, b)
			}
			if c.exact != "" {
				if !sameJSON(string(b), c.exact) {
					t.Fatalf("answer\n%s\nwant\n%s", b, c.exact)
				}
				return
			}
			var v any
			if err := json.Unmarshal(b, &v); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, b)
			}
			if got := jsonShape(v); got != c.shape {
				t.Fatalf("shape\n%s\nwant\n%s\nanswer:\n%s", got, c.shape, b)
			}
			if !strings.HasPrefix(string(b), "{\n  \"") || !strings.HasSuffix(string(b), "\n}\n") {
				t.Fatalf("not indented by two spaces:\n%s", b)
			}
		})
	}
}

// sameJSON compares two bodies as JSON values (key order aside), and their
// layout: both indented the same way.
func sameJSON(got, want string) bool {
	var a, b any
	if json.Unmarshal([]byte(got), &a) != nil || json.Unmarshal([]byte(want), &b) != nil {
		return false
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb) && strings.Count(got, "\n") == strings.Count(want, "\n") &&
		strings.HasPrefix(got, "{\n  \"") == strings.HasPrefix(want, "{\n  \"")
}
