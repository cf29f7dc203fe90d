package admin

import (
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// A browser lets any page it shows send requests to the admin listener:
// a form or a fetch with a "simple" Content-Type (text/plain) goes out
// without asking the listener first, and with no token configured it
// needs none. adminGuard refuses what only such a page would send, before
// any handler (or the token check) sees the request.

// adminGuard answers 403 a request from a page of another origin (an
// Origin header that does not name the Host), and, when no operator token
// is configured, a request whose Host is not a loopback or IP address or
// the listener's own host name: a page of a host name that its owner
// re-pointed at 127.0.0.1 (DNS rebinding) is same-origin to the browser,
// so only the Host it sends tells it apart. It answers 415 a write whose
// body is not JSON: a page of another origin cannot send JSON without the
// browser asking first (CORS preflight), which this listener never
// allows. It returns whether the request may go on.
func (s *API) adminGuard(w http.ResponseWriter, r *http.Request, tokenRequired bool) bool {
	if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r.Host) {
		refuseUnread(w, r, http.StatusForbidden, "Origin "+strconv.Quote(o)+" does not match Host "+strconv.Quote(r.Host)+": the admin API answers no other site's pages")
		return false
	}
	if !tokenRequired && !s.localHost(r.Host) {
		refuseUnread(w, r, http.StatusForbidden, "Host "+strconv.Quote(r.Host)+" is not this listener's address: without admin.token the admin API answers only requests for a loopback or IP address or its own host name")
		return false
	}
	if writes(r.Method) && r.ContentLength != 0 { // -1: chunked
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || (mt != "application/json" && mt != "application/merge-patch+json") {
			refuseUnread(w, r, http.StatusUnsupportedMediaType, "Content-Type "+strconv.Quote(r.Header.Get("Content-Type"))+": a request body must be application/json (application/merge-patch+json for PATCH)")
			return false
		}
	}
	return true
}

func writes(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// sameOrigin reports whether origin (an Origin header: scheme://host[:port]
// or "null") names host (a Host header).
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return strings.EqualFold(u.Host, host) ||
		// Browsers leave the default port out of Origin; clients may put
		// it in Host.
		strings.EqualFold(u.Host+":"+map[string]string{"http": "80", "https": "443"}[u.Scheme], host)
}

// localHost reports whether host (a Host header) names this listener
// without a name someone else controls: an IP address (a rebinding page
// has a host name), localhost, or the host name of admin.listen. A unix
// socket cannot be reached by a browser: anything goes.
func (s *API) localHost(host string) bool {
	if strings.HasPrefix(s.opts.AdminListen, "unix://") {
		return true
	}
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.Trim(name, "[]"), ".")
	if net.ParseIP(name) != nil || strings.EqualFold(name, "localhost") || strings.HasSuffix(strings.ToLower(name), ".localhost") {
		return true
	}
	own, _, err := net.SplitHostPort(s.opts.AdminListen)
	return err == nil && own != "" && strings.EqualFold(name, strings.TrimSuffix(own, "."))
}
