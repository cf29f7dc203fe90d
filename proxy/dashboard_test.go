package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/testbed"
)

// getPage is a GET on the admin listener that returns the raw answer.
func getPage(t *testing.T, s *proxy.Server, method, path, token string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, s.AdminURL()+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestDashboardHandler: the page shell and its assets are served without
// the admin token (a browser navigation cannot carry one; the shell holds no
// data), while the data they call and every other path still require it.
func TestDashboardHandler(t *testing.T) {
	tb := startTestbed(t, testbed.ModeOK)
	s := startAdminServer(t, "", "s3cret", sub("a", tb.URL()))

	code, h, body := getPage(t, s, "GET", "/", "")
	if code != http.StatusOK || h.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET / without the token: %d %q, want 200 text/html", code, h.Get("Content-Type"))
	}
	if !strings.Contains(body, `<script src="assets/app.js"`) || !strings.Contains(body, `href="assets/style.css"`) {
		t.Errorf("GET / does not load the script and style sheet:\n%s", body)
	}
	if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "connect-src 'self'") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("GET / Content-Security-Policy %q", csp)
	}
	if code, _, _ := getPage(t, s, "GET", "/", "s3cret"); code != http.StatusOK {
		t.Errorf("GET / with the token: %d", code)
	}

	assets := []struct{ path, ctype, want string }{
		{"/assets/app.js", "text/javascript; charset=utf-8", "v1/subscriptions"},
		{"/assets/style.css", "text/css; charset=utf-8", "tr.saturated"},
	}
	for _, a := range assets {
		code, h, body := getPage(t, s, "GET", a.path, "")
		if code != http.StatusOK || h.Get("Content-Type") != a.ctype || !strings.Contains(body, a.want) {
			t.Errorf("GET %s: %d %q, want 200 %q containing %q", a.path, code, h.Get("Content-Type"), a.ctype, a.want)
		}
	}

	for _, p := range []string{"/assets/nope.js", "/assets/index.html", "/assets/", "/assets/x/app.js", "/assets/..%2Fdashboard.go"} {
		if code, _, _ := getPage(t, s, "GET", p, ""); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, code)
		}
	}

	// Everything else stays behind the token, including what the page
	// calls and other methods on /.
	for _, p := range []struct{ method, path string }{
		{"GET", "/v1/subscriptions"}, {"GET", "/v1/retry-budget"}, {"GET", "/v1/dead-letters?limit=20"},
		{"POST", "/v1/dead-letters/replay"}, {"POST", "/"}, {"GET", "/index.html"}, {"GET", "/dashboard/app.js"},
	} {
		if code, _, _ := getPage(t, s, p.method, p.path, ""); code != http.StatusUnauthorized {
			t.Errorf("%s %s without the token: %d, want 401", p.method, p.path, code)
		}
	}
}

// TestDashboardInChromium loads the page in headless Chromium against a
// live sidecar with one black-hole subscription among healthy ones: the
// black hole's row shows saturation, the healthy rows do not.
func TestDashboardInChromium(t *testing.T) {
	chromium := findChromium(t)
	tb := startTestbed(t, testbed.ModeOK)
	tb.SetMode("/hole", testbed.ModeBlackhole)
	tb.SetMode("/fail", testbed.ModeFail)
	hole := sub("hole", tb.URL()+"/hole")
	hole.MaxConcurrency, hole.Timeout = 4, time.Minute // holds all 4 slots for the whole test
	subs := []*delivery.Subscription{hole}
	healthy := []string{"ok0", "ok1", "ok2"}
	for _, id := range healthy {
		subs = append(subs, sub(id, tb.URL()+"/"+id))
	}
	// A failing tenant, so that the page has dead letters to list.
	fail := sub("fail", tb.URL()+"/fail")
	fail.Retry = fastRetry(2)
	subs = append(subs, fail)

	const token = "dash-s3cret"
	s := proxy.New(proxy.Options{AllowPrivateTargets: true,
		Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", AdminToken: token, DataDir: t.TempDir(),
		Subscriptions: subs, Logger: quietLogger(), CursorInterval: 10 * time.Millisecond,
	})
	if err := s.Open(); err != nil {
		t.Fatalf("open server: %v", err)
	}
	// The black hole never answers: abandon its deliveries at once.
	t.Cleanup(func() { closeServer(t, s, 100*time.Millisecond) })

	publish(t, s, "t", "e", 50)
	eventually(t, "the black hole fills its cap", func() bool { return lane(s, "hole").InFlight == 4 })
	waitFor(t, tb, "every healthy tenant got every event", func(m map[string]testbed.PathStats) bool {
		for _, id := range healthy {
			if m["/"+id].Unique < 50 {
				return false
			}
		}
		return true
	})
	eventually(t, "a dead letter", func() bool {
		dls, err := s.DeadLetters("fail", 1)
		return err == nil && len(dls) > 0
	})

	// The token goes in the fragment, which the browser never sends.
	page := s.AdminURL() + "/#token=" + token
	dom := string(runChromium(t, chromium, "--dump-dom", page))
	rows := laneRows(dom)
	if r, ok := rows["hole"]; !ok || !r.saturated || r.saturation != "1.00" {
		t.Errorf("black-hole row %+v (found %v), want class saturated and data-saturation 1.00", r, ok)
	}
	for _, id := range healthy {
		if r, ok := rows[id]; !ok || r.saturated {
			t.Errorf("healthy row %s: %+v (found %v), want it shown and not saturated", id, r, ok)
		}
	}
	if _, ok := rows["fail"]; !ok {
		t.Error("no row for the failing subscription")
	}
	if !strings.Contains(dom, ">Replay</button>") || !strings.Contains(dom, `data-key="fail/`) {
		t.Error("no dead letter of fail with a Replay button")
	}
	if t.Failed() {
		t.Logf("dumped DOM:\n%s", dom)
	}

	// SLUICE_SCREENSHOT=1 refreshes the screenshot in the docs.
	if os.Getenv("SLUICE_SCREENSHOT") == "1" {
		out, err := filepath.Abs(filepath.Join("..", "docs", "dashboard.png"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		// Keep events flowing so that the rates show something.
		stop, done := make(chan struct{}), make(chan struct{})
		go trickle(s, stop, done)
		runChromium(t, chromium, "--screenshot="+out, "--window-size=1280,800", "--hide-scrollbars", page)
		close(stop)
		<-done
		if fi, err := os.Stat(out); err != nil || fi.Size() == 0 {
			t.Fatalf("screenshot %s: %v", out, err)
		}
		t.Logf("screenshot written to %s", out)
	}
}

// trickle publishes an event every 5 ms until stop is closed, ignoring
// errors (it only decorates the screenshot), then closes done.
func trickle(s *proxy.Server, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		resp, err := httpClient.Post(s.URL()+"/v1/events/t", "application/json", strings.NewReader(`{"n":0}`))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
}

// findChromium returns the Chromium binary; without one the test is
// skipped, unless CI is set (.ci/run installs it there).
func findChromium(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium not found at /usr/bin/chromium or on PATH (Debian package chromium)")
	}
	t.Skip("chromium not found; apt-get install chromium to run the browser test")
	return ""
}

// runChromium runs headless Chromium with args (the last one the URL),
// letting the page run for 5 s of virtual time, and returns its stdout.
func runChromium(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	return runChromiumTo(t, bin, nil, args...)
}

// runChromiumTo is runChromium that also copies Chromium's stderr to
// errs (when not nil).
func runChromiumTo(t *testing.T, bin string, errs *bytes.Buffer, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Not t.TempDir: a Chromium helper process still exiting could make its
	// removal, and so the test, fail.
	profile, err := os.MkdirTemp("", "sluice-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(profile)
	flags := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + profile, "--virtual-time-budget=5000",
	}
	cmd := exec.CommandContext(ctx, bin, append(flags, args...)...)
	cmd.WaitDelay = 5 * time.Second // helpers may hold the pipes open after the browser exits
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if errs != nil {
		errs.Write(stderr.Bytes())
	}
	if err != nil {
		t.Fatalf("chromium %s: %v (context: %v)\n%s", strings.Join(args, " "), err, ctx.Err(), lastBytes(stderr.Bytes(), 4000))
	}
	return stdout.Bytes()
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

type laneRow struct {
	saturated  bool
	saturation string
}

var (
	trTag     = regexp.MustCompile(`<tr\b[^>]*>`)
	attrValue = func(name string) *regexp.Regexp { return regexp.MustCompile(`\s` + name + `="([^"]*)"`) }
	attrSub   = attrValue("data-subscription")
	attrSat   = attrValue("data-saturation")
	attrClass = attrValue("class")
)

// laneRows finds the subscription rows in a dumped DOM, by id.
func laneRows(dom string) map[string]laneRow {
	rows := map[string]laneRow{}
	for _, tag := range trTag.FindAllString(dom, -1) {
		id := attrSub.FindStringSubmatch(tag)
		if id == nil {
			continue
		}
		var r laneRow
		if m := attrSat.FindStringSubmatch(tag); m != nil {
			r.saturation = m[1]
		}
		if m := attrClass.FindStringSubmatch(tag); m != nil {
			r.saturated = strings.Contains(" "+m[1]+" ", " saturated ")
		}
		rows[id[1]] = r
	}
	return rows
}

// TestDashboardChartsAndAttemptsInChromium: for a subscription that
// delivered, the page draws its chart (inline SVG from /series) and lists
// its recent attempts (from /attempts); the subscription is chosen by the
// link's #sub=, and a failing one's card is drawn beside it. Chromium's
// console must report no Content-Security-Policy violation.
func TestDashboardChartsAndAttemptsInChromium(t *testing.T) {
	chromium := findChromium(t)
	tb := startTestbed(t, testbed.ModeOK)
	tb.SetMode("/fail", testbed.ModeFail)
	fail := sub("fail", tb.URL()+"/fail")
	fail.Retry = fastRetry(2)
	const token = "dash-s3cret"
	s := startAdminServer(t, "", token, sub("ok", tb.URL()+"/ok"), fail)
	publish(t, s, "t", "e", 10)
	eventually(t, "every event resolved", func() bool {
		return lane(s, "ok").Delivered == 10 && lane(s, "fail").DeadLettered == 10
	})

	dom, console := runChromiumConsole(t, chromium, "--dump-dom", s.AdminURL()+"/#token="+token+"&sub=ok")
	defer func() {
		if t.Failed() {
			t.Logf("dumped DOM:\n%s\nconsole:\n%s", dom, lastBytes([]byte(console), 4000))
		}
	}()
	for _, id := range []string{"ok", "fail"} {
		c := card(dom, id)
		if c == "" {
			t.Errorf("no chart card for %s", id)
			continue
		}
		if !strings.Contains(c, `<svg class="chart"`) || !strings.Contains(c, `data-drawn="true"`) {
			t.Errorf("%s's card has no drawn chart:\n%s", id, c)
		}
		// Each band is one path; a subscription with attempts has lines.
		if n := len(drawnPath.FindAllString(c, -1)); n < 2 {
			t.Errorf("%s's chart: %d drawn lines, want at least deliveries (or failures) and P99", id, n)
		}
	}
	if c := card(dom, "ok"); !strings.Contains(c, `class="card selected"`) {
		t.Errorf("the card of ok (#sub=ok) is not selected:\n%s", c)
	}
	table := between(dom, `<table id="attempts"`, `</table>`)
	rows := attemptRow.FindAllStringSubmatch(table, -1)
	if len(rows) != 10 {
		t.Errorf("%d attempt rows for ok; want its 10 attempts:\n%s", len(rows), table)
	}
	for _, r := range rows {
		if r[2] != "1" || r[3] != "ack" {
			t.Errorf("ok's attempt row seq %s attempt %s outcome %s; want attempt 1, ack", r[1], r[2], r[3])
		}
	}
	if !strings.Contains(dom, `<span id="attempts-sub" class="sub-name">· ok</span>`) {
		t.Error("the attempts table does not name ok")
	}
	if strings.Contains(console, "Content Security Policy") || strings.Contains(console, "Refused to") {
		t.Errorf("Chromium reports a CSP violation:\n%s", console)
	}
}

var (
	attemptRow = regexp.MustCompile(`<tr\b[^>]*\sdata-attempt="(\d+)/(\d+)"[^>]*\sdata-outcome="([a-z_]+)"`)
	drawnPath  = regexp.MustCompile(`<path class="line" d="M[0-9]`)
)

// card is the chart card of subscription id in a dumped DOM, "" if none.
func card(dom, id string) string {
	i := strings.Index(dom, `data-subscription="`+id+`"><h3>`)
	if i < 0 {
		return ""
	}
	start := strings.LastIndex(dom[:i], "<article")
	return between(dom[start:], "<article", "</article>")
}

// between is s from the first from up to the next to, "" if either is missing.
func between(s, from, to string) string {
	i := strings.Index(s, from)
	if i < 0 {
		return ""
	}
	j := strings.Index(s[i:], to)
	if j < 0 {
		return ""
	}
	return s[i : i+j+len(to)]
}

// runChromiumConsole is runChromium with the page's console logged: it
// returns stdout and what Chromium wrote to stderr.
func runChromiumConsole(t *testing.T, bin string, args ...string) (stdout, console string) {
	t.Helper()
	var errs bytes.Buffer
	out := runChromiumTo(t, bin, &errs, append([]string{"--enable-logging=stderr", "--v=0"}, args...)...)
	return string(out), errs.String()
}

// TestDashboardTenantPortalInChromium: opened with a tenant's token, the
// page is that tenant's portal: a banner naming it, its two subscriptions
// (each with a drawn chart, its attempts, recover and rotate-secret) and
// their dead letters, and nothing of the other tenant's subscription, not
// even its id; the retry budget, the log head, the operator's tools and
// the selected-subscription table are hidden. The operator's token, on
// the same sidecar, shows all three and no banner.
func TestDashboardTenantPortalInChromium(t *testing.T) {
	chromium := findChromium(t)
	tb := startTestbed(t, testbed.ModeOK)
	tb.SetMode("/fail-b", testbed.ModeFail)
	tb.SetMode("/fail-x", testbed.ModeFail)
	a, b, x := sub("acme-a", tb.URL()+"/ok-a"), sub("acme-b", tb.URL()+"/fail-b"), sub("other-x", tb.URL()+"/fail-x")
	a.Tenant, b.Tenant, x.Tenant = "acme", "acme", "other"
	b.Retry, x.Retry = fastRetry(1), fastRetry(1)
	const opToken, acmeToken = "op-s3cret", "acme-s3cret"
	s := proxy.New(proxy.Options{AllowPrivateTargets: true, Listen: "127.0.0.1:0", AdminListen: "127.0.0.1:0", DataDir: t.TempDir(),
		AdminToken: opToken, TenantTokens: []admin.TenantToken{{Token: acmeToken, Tenant: "acme"}},
		// Platform events both tenants receive: type t is shared with each.
		Tenants: []delivery.Tenant{{ID: "acme", SharedTypes: []string{"t"}}, {ID: "other", SharedTypes: []string{"t"}}},
		Logger:  quietLogger(), CursorInterval: 10 * time.Millisecond, Subscriptions: []*delivery.Subscription{a, b, x}})
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, s, time.Second) })
	publish(t, s, "t", "e", 6)
	eventually(t, "every event resolved", func() bool {
		return lane(s, "acme-a").Delivered == 6 && lane(s, "acme-b").DeadLettered == 6 && lane(s, "other-x").DeadLettered == 6
	})

	dom, console := runChromiumConsole(t, chromium, "--dump-dom", s.AdminURL()+"/#token="+acmeToken)
	defer func() {
		if t.Failed() {
			t.Logf("dumped DOM:\n%s\nconsole:\n%s", dom, lastBytes([]byte(console), 4000))
		}
	}()
	if !strings.Contains(dom, `<p id="portal" class="portal-banner">tenant portal: acme</p>`) {
		t.Error("no tenant portal banner naming acme")
	}
	if strings.Contains(dom, "other-x") {
		t.Error("the portal of acme shows something of other's subscription other-x")
	}
	rows := laneRows(dom)
	if _, ok := rows["acme-a"]; !ok || len(rows) != 2 {
		t.Errorf("subscription rows %v; want acme-a and acme-b", rows)
	}
	for _, id := range []string{"acme-a", "acme-b"} {
		c := card(dom, id)
		if !strings.Contains(c, `data-drawn="true"`) || !strings.Contains(c, ">Rotate secret</button>") ||
			!strings.Contains(c, ">Recover dead letters (24 h)</button>") {
			t.Errorf("%s's card lacks its chart or its actions:\n%s", id, c)
		}
		if !fileRotate.MatchString(c) {
			t.Errorf("%s (the config file's) may be rotated from the page; want the button disabled", id)
		}
		want := map[string]string{"acme-a": "ack", "acme-b": "dead_letter"}[id]
		attempts := attemptRow.FindAllStringSubmatch(c, -1)
		if len(attempts) != 6 {
			t.Errorf("%s's card lists %d attempts; want its 6", id, len(attempts))
		}
		for _, r := range attempts {
			if r[3] != want {
				t.Errorf("%s's attempt of seq %s: %s; want %s", id, r[1], r[3], want)
			}
		}
	}
	if n := strings.Count(dom, `data-key="acme-b/`); n != 6 {
		t.Errorf("%d dead letters of acme-b shown; want 6", n)
	}
	for _, tag := range operatorOnly.FindAllString(dom, -1) {
		if !strings.Contains(tag, ` hidden=""`) {
			t.Errorf("operator-only element shown in the portal: %s", tag)
		}
	}
	if n := len(operatorOnly.FindAllString(dom, -1)); n < 4 {
		t.Errorf("%d operator-only elements in the page; want the tools, the budget, the log head and the attempts table", n)
	}
	if strings.Contains(console, "Content Security Policy") || strings.Contains(console, "Refused to") {
		t.Errorf("Chromium reports a CSP violation:\n%s", console)
	}

	// The operator sees every tenant's subscriptions, and no portal.
	op := string(runChromium(t, chromium, "--dump-dom", s.AdminURL()+"/#token="+opToken))
	if rows := laneRows(op); len(rows) != 3 || card(op, "other-x") == "" || !strings.Contains(op, `<p id="portal" class="portal-banner" hidden="">`) {
		t.Errorf("the operator's page: rows %v, card of other-x %t, banner hidden %t", rows, card(op, "other-x") != "",
			strings.Contains(op, `<p id="portal" class="portal-banner" hidden="">`))
	}
}

// fileRotate matches a rotate-secret button disabled for a subscription
// of the config file.
var fileRotate = regexp.MustCompile(`<button\b[^>]*\sdisabled=""[^>]*\stitle="managed by the config file[^"]*">Rotate secret</button>`)

// operatorOnly matches the opening tags of the page's operator-only parts.
var operatorOnly = regexp.MustCompile(`<[a-z]+\b[^>]*\sdata-operator=""[^>]*>`)
