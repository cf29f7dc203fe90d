package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/proxy/api"
)

// TestCLITokens: tokens issue prints a token once with its id and
// expiry, tokens list shows ids (never a token) for one tenant or all,
// tokens revoke makes the token stop working at once, and the errors a
// person meets name what to fix.
func TestCLITokens(t *testing.T) {
	s := startAPISidecar(t, "http://127.0.0.1:1/filed")
	c := []string{"--config", s.config}
	cmd := func(args ...string) []string { return append(append([]string{"tokens"}, args...), c...) }

	out := mustRun(t, cmd("issue", "acme")...)
	contains(t, out, onceNote, "expires: never")
	m := regexp.MustCompile(`(?m)^token ([0-9a-f]{12}) of tenant acme: (sltk_\S+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("issue printed no id and token:\n%s", out)
	}
	id, tok := m[1], m[2]
	out = mustRun(t, cmd("issue", "acme", "--expires-in", "720h")...)
	contains(t, out, onceNote)
	if !regexp.MustCompile(`(?m)^  expires: .*\(in 7(20h0m|19h59m)\)$`).MatchString(out) {
		t.Fatalf("issue --expires-in 720h printed no expiry 720h away:\n%s", out)
	}
	var globex api.TokenAnswer
	// The output holds stderr's note on the token too: the JSON follows it.
	out = mustRun(t, cmd("issue", "globex", "--json")...)
	contains(t, out, onceNote)
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &globex); err != nil || globex.Tenant != "globex" || globex.ID == "" {
		t.Fatalf("issue --json: %+v %v", globex, err)
	}

	out = mustRun(t, cmd("list", "acme")...)
	for _, re := range []string{`TENANT +ID +SOURCE +CREATED +EXPIRES`, `(?m)^acme +` + id + ` +issued +.* +never$`, `(?m)^acme +[0-9a-f]{12} +issued +.*\(in 7(20h0m|19h59m)\)$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("list acme lacks %s:\n%s", re, out)
		}
	}
	if strings.Contains(out, "globex") || strings.Contains(out, "sltk_") {
		t.Fatalf("list acme shows another tenant's or a token:\n%s", out)
	}
	var all api.TokenList
	if err := json.Unmarshal([]byte(mustRun(t, cmd("list", "--json")...)), &all); err != nil || len(all.Tokens) != 3 {
		t.Fatalf("list --json: %+v %v", all, err)
	}

	mustRun(t, append([]string{"subscriptions", "list", "--token", tok}, c...)...)
	out = mustRun(t, cmd("revoke", "acme", id)...)
	contains(t, out, "revoked token "+id+" of tenant acme")
	out = mustFail(t, append([]string{"subscriptions", "list", "--token", tok}, c...)...)
	contains(t, out, "401")

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{cmd("revoke", "acme", id), []string{"404 Not Found", id}},
		{cmd("revoke", "acme", globex.ID), []string{"404 Not Found"}},
		{cmd("revoke", "acme", "nope"), []string{"400 Bad Request", "id"}},
		{cmd("issue", "acme", "--expires-in", "10000h"), []string{"400 Bad Request", "expires_in"}},
		{cmd("issue", "acme", "--expires-in", "-1h"), []string{"--expires-in"}},
		{cmd("issue", "Not-A-Tenant"), []string{"400 Bad Request", "tenant"}},
		{cmd("revoke", "acme"), []string{"want TENANT ID"}},
		{cmd("list", "acme", "globex"), []string{"at most TENANT"}},
		{cmd("frobnicate"), []string{`unknown subcommand "frobnicate"`}},
		{cmd("list", "--token", globex.Token), []string{"404 Not Found"}}, // a tenant sees no tokens
	} {
		out := mustFail(t, tc.args...)
		contains(t, out, tc.want...)
	}
}
