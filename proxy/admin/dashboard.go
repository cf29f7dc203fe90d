package admin

import (
	"embed"
	"net/http"
	"path"
	"strings"
)

// dashboardFS holds the live dashboard: one page, its script and its style
// sheet, compiled in so the page needs nothing but the admin listener (no
// CDN, no fonts, no build step).
//
//go:embed dashboard/*
var dashboardFS embed.FS

// dashboardTypes are the content types of the embedded files, fixed here
// rather than taken from the host's MIME tables, which vary.
var dashboardTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
}

// dashboardCSP lets the page load only its own assets and call only its
// own origin: it shows dead-letter fields that producers wrote.
const dashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// dashboardRoutes registers the dashboard on the admin mux: GET / serves
// the page, GET /assets/{name} its script and style sheet. The page polls
// GET /v1/subscriptions, /v1/retry-budget and /v1/dead-letters once a second
// and replays through POST /v1/dead-letters/replay.
func (s *API) dashboardRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		serveDashboardFile(w, r, "index.html")
	})
	mux.HandleFunc("GET /assets/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if name == "index.html" {
			name = "" // the page lives at /, once
		}
		serveDashboardFile(w, r, name)
	})
}

// dashboardPublic reports whether r asks for the dashboard's static shell,
// which requireToken serves without the admin token. A browser cannot
// attach a bearer header to a navigation, so the page could not load at all
// if it asked for one; it holds no data, and its script sends the token
// (from the URL fragment, ?token= or localStorage) to the data endpoints,
// which stay protected. Only GET (and HEAD) of exactly "/" and
// "/assets/...": any other request still needs the token, even one that
// would answer 404.
func dashboardPublic(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	return r.URL.Path == "/" || strings.HasPrefix(r.URL.Path, "/assets/")
}

func serveDashboardFile(w http.ResponseWriter, r *http.Request, name string) {
	ctype, known := dashboardTypes[path.Ext(name)]
	var b []byte
	var err error
	if known && !strings.Contains(name, "/") {
		b, err = dashboardFS.ReadFile("dashboard/" + name)
	}
	if !known || err != nil {
		writeError(w, http.StatusNotFound, "not found: "+r.Method+" "+r.URL.Path)
		return
	}
	h := w.Header()
	h.Set("Content-Type", ctype)
	// Revalidate every time: the assets are tiny and must match the binary
	// after an upgrade.
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	// The query may carry the admin token; keep it out of Referer headers.
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", dashboardCSP)
	w.Write(b)
}
