// sluice dashboard: polls the admin API once a second and renders it.
// No dependencies and no build step. Every value from the API goes into the
// page through textContent, never as markup.
(function () {
  "use strict";

  var POLL_MS = 1000;
  var SATURATED = 0.8; // in_flight / cap at which a lane is highlighted
  var TOKEN_KEY = "sluice.adminToken";

  var $ = function (id) { return document.getElementById(id); };
  var intFmt = new Intl.NumberFormat();
  var token = readToken();
  var prev = null; // the last poll: {at: ms, lanes: {id: lane}}
  var replays = new Map(); // "sub/seq" -> {text, ok}, what a Replay click answered
  var timer = 0;

  // readToken takes the admin token from the URL fragment (#token=..., never
  // sent to the server, so never logged) or the query (?token=...), keeps it
  // in localStorage, and removes it from the address bar and history.
  // Without either it uses the stored one.
  function readToken() {
    var hash = new URLSearchParams(location.hash.slice(1));
    var query = new URLSearchParams(location.search);
    var t = hash.get("token") || query.get("token");
    if (!t) {
      try { return localStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
    }
    try { localStorage.setItem(TOKEN_KEY, t); } catch (e) { /* private mode: keep it in memory */ }
    hash.delete("token");
    query.delete("token");
    var q = query.toString(), h = hash.toString();
    history.replaceState(null, "", location.pathname + (q ? "?" + q : "") + (h ? "#" + h : ""));
    return t;
  }

  // api calls the admin API on this origin; paths are relative so the page
  // also works behind a path prefix.
  async function api(path, init) {
    init = init || {};
    var headers = new Headers(init.headers || {});
    if (token) headers.set("Authorization", "Bearer " + token);
    init.headers = headers;
    init.cache = "no-store";
    var resp = await fetch(path, init);
    var text = await resp.text();
    var body = null;
    try { body = text ? JSON.parse(text) : null; } catch (e) { /* not JSON */ }
    if (resp.status === 401) {
      var err = new Error("unauthorized");
      err.unauthorized = true;
      throw err;
    }
    if (!resp.ok) throw new Error(path + " answered " + resp.status + (body && body.error ? ": " + body.error : ""));
    return body;
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(poll, POLL_MS);
  }

  async function poll() {
    try {
      if (!document.hidden || !prev) {
        var all = await Promise.all([api("v1/subscriptions"), api("v1/retry-budget"), api("v1/dead-letters?limit=20")]);
        render(all[0], all[1], all[2]);
        $("token-form").hidden = true;
        status("live, updated every second", false);
      }
    } catch (e) {
      if (e.unauthorized) {
        $("token-form").hidden = false;
        status(token ? "the admin token was refused" : "the admin API needs a token", true);
      } else {
        status("cannot reach the sidecar (" + e.message + "); showing the last data", true);
      }
    } finally {
      schedule();
    }
  }

  function status(text, error) {
    var el = $("conn");
    setText(el, text); // role=status: announced only when it changes
    el.className = error ? "error" : "";
    document.querySelector("main").classList.toggle("stale", error && prev !== null);
  }

  function render(subs, budget, dls) {
    var now = performance.now();
    var lanes = (subs && subs.subscriptions) || [];
    var dt = prev ? (now - prev.at) / 1000 : 0;
    var totals = { inFlight: 0, backlog: 0, delivered: null, retried: null, dead: null };

    syncRows($("subs").tBodies[0], lanes, function (l) { return l.subscription; }, newLaneRow, function (tr, l) {
      var r = {
        delivered: rate(l, "delivered", dt),
        retried: rate(l, "retried", dt),
        dead: rate(l, "dead_lettered", dt)
      };
      totals.inFlight += l.in_flight;
      totals.backlog += l.backlog;
      ["delivered", "retried", "dead"].forEach(function (k) {
        if (r[k] !== null) totals[k] = (totals[k] || 0) + r[k];
      });
      updateLaneRow(tr, l, r);
    });

    var lanesByID = {};
    lanes.forEach(function (l) { lanesByID[l.subscription] = l; });
    prev = { at: now, lanes: lanesByID };

    setText($("t-subs"), intFmt.format(lanes.length));
    setText($("t-inflight"), intFmt.format(totals.inFlight));
    setText($("t-backlog"), intFmt.format(totals.backlog));
    setText($("t-delivered"), fmtRate(totals.delivered));
    setText($("t-retried"), fmtRate(totals.retried));
    setText($("t-dead"), fmtRate(totals.dead));
    setText($("t-head"), subs && subs.head !== undefined ? intFmt.format(subs.head) : "–");

    renderBudget(budget || {});
    renderDeadLetters((dls && dls.dead_letters) || [], !!(dls && dls.next));
    setText($("updated"), "· " + new Date().toLocaleTimeString());
  }

  // rate is the change of a counter per second since the last poll; null on
  // the first poll, for a new lane, or when the counter went down (restart).
  function rate(l, field, dt) {
    var p = prev && prev.lanes[l.subscription];
    if (!p || dt <= 0) return null;
    var d = l[field] - p[field];
    return d < 0 ? null : d / dt;
  }

  function renderBudget(b) {
    var avail = typeof b.available === "number" ? Math.min(Math.max(b.available, 0), 1) : 0;
    var pct = Math.round(avail * 100);
    var bar = $("budget-bar");
    bar.firstElementChild.style.width = pct + "%";
    bar.classList.toggle("empty", avail < 0.1);
    bar.setAttribute("aria-valuenow", String(pct));
    bar.setAttribute("aria-valuetext", pct + "% available");
    setText($("budget-pct"), pct + "%");
    setText($("budget-detail"), intFmt.format(b.retries || 0) + " of " + intFmt.format(b.allowed || 0) +
      " retries used, " + intFmt.format(b.successes || 0) + " successes in the window");
  }

  function newLaneRow(l) {
    var tr = document.createElement("tr");
    var c = tr._cells = {};
    c.id = cell(tr, "th", "id");
    c.id.scope = "row";
    c.state = cell(tr, "td");
    c.breaker = document.createElement("span");
    cell(tr, "td").appendChild(c.breaker);
    var inflight = cell(tr, "td", "inflight");
    c.bar = document.createElement("span");
    c.bar.className = "bar";
    c.bar.setAttribute("role", "meter");
    c.bar.setAttribute("aria-valuemin", "0");
    c.bar.setAttribute("aria-label", "in flight for " + l.subscription);
    c.bar.appendChild(document.createElement("span"));
    c.count = document.createElement("span");
    c.count.className = "count";
    inflight.appendChild(c.bar);
    inflight.appendChild(c.count);
    ["backlog", "oldest", "delivered", "retried", "dead", "deferred", "short"].forEach(function (k) {
      c[k] = cell(tr, "td", "n");
    });
    return tr;
  }

  function updateLaneRow(tr, l, r) {
    var c = tr._cells;
    var ratio = l.cap > 0 ? l.in_flight / l.cap : 0;
    tr.dataset.subscription = l.subscription;
    tr.dataset.saturation = ratio.toFixed(2);
    tr.classList.toggle("saturated", ratio >= SATURATED);

    setText(c.id, l.subscription);
    // Fleet mode: the node delivering the lane (any node serves this page).
    tr.dataset.owner = l.owner || "";
    c.id.title = l.owner ? "delivered by " + l.owner : "";
    setText(c.state, l.state);
    c.state.className = "state-" + l.state;
    c.state.title = l.paused_by || "";
    var breaker = l.breaker || "";
    setText(c.breaker, breaker.replace("_", "-"));
    c.breaker.className = "badge" + (/^(closed|half_open|open)$/.test(breaker) ? " " + breaker : "");

    c.bar.firstElementChild.style.width = Math.min(ratio * 100, 100).toFixed(1) + "%";
    c.bar.setAttribute("aria-valuemax", String(l.cap));
    c.bar.setAttribute("aria-valuenow", String(l.in_flight));
    c.bar.setAttribute("aria-valuetext", l.in_flight + " of " + l.cap);
    setText(c.count, l.in_flight + " / " + l.cap);

    setText(c.backlog, intFmt.format(l.backlog));
    var age = oldestAge(l);
    if (age !== null) {
      setText(c.oldest, fmtAge(age));
      c.oldest.title = "";
    } else {
      // The admin API does not report the oldest event's age: the backlog
      // is the nearest thing it has.
      setText(c.oldest, l.backlog > 0 ? intFmt.format(l.backlog) + " waiting" : "–");
      c.oldest.title = l.backlog > 0 ? "this sidecar does not report ages; events waiting" : "";
    }
    setText(c.delivered, fmtRate(r.delivered));
    setText(c.retried, fmtRate(r.retried));
    setText(c.dead, fmtRate(r.dead));
    setText(c.deferred, intFmt.format(l.retries_deferred || 0));
    setText(c.short, intFmt.format(l.short_circuits || 0));
  }

  // oldestAge is the age in seconds of the lane's oldest unresolved event,
  // or null when the API does not report it.
  function oldestAge(l) {
    if (typeof l.oldest_age_seconds === "number") return l.oldest_age_seconds;
    if (l.oldest_accepted_at) {
      var t = Date.parse(l.oldest_accepted_at);
      if (!isNaN(t)) return Math.max(0, (Date.now() - t) / 1000);
    }
    return null;
  }

  function renderDeadLetters(list, more) {
    $("dls-empty").hidden = list.length > 0;
    $("dls-more").hidden = !more;
    syncRows($("dls").tBodies[0], list, dlKey, newDeadLetterRow, updateDeadLetterRow);
  }

  function dlKey(d) { return d.subscription + "/" + d.seq; }

  function newDeadLetterRow(d) {
    var tr = document.createElement("tr");
    var c = tr._cells = {};
    c.sub = cell(tr, "td", "id");
    c.seq = cell(tr, "td", "n");
    c.event = cell(tr, "td");
    c.type = cell(tr, "td");
    c.reason = cell(tr, "td");
    c.attempts = cell(tr, "td", "n");
    c.status = cell(tr, "td", "n");
    c.dead = cell(tr, "td");
    var action = cell(tr, "td");
    var btn = document.createElement("button");
    btn.type = "button";
    btn.textContent = "Replay";
    btn.setAttribute("aria-label", "Replay " + d.subscription + " sequence " + d.seq);
    c.result = document.createElement("span");
    c.result.className = "result";
    c.result.setAttribute("aria-live", "polite");
    btn.addEventListener("click", function () { replay(d.subscription, d.seq, btn, tr); });
    action.appendChild(btn);
    action.appendChild(c.result);
    return tr;
  }

  function updateDeadLetterRow(tr, d) {
    var c = tr._cells;
    setText(c.sub, d.subscription);
    setText(c.seq, String(d.seq));
    setText(c.event, d.event_id || "");
    setText(c.type, d.type || "");
    setText(c.reason, d.reason || "");
    c.reason.title = d.last_error || "";
    setText(c.attempts, String(d.attempts || 0));
    setText(c.status, d.last_status ? String(d.last_status) : "no answer");
    setText(c.dead, d.dead_at ? ago(Date.parse(d.dead_at)) : "");
    c.dead.title = d.dead_at || "";
    var res = replays.get(dlKey(d));
    if (!res && d.delivered_at) res = { text: "delivered after replay", ok: true };
    else if (!res && d.replayed_at) res = { text: "replayed " + ago(Date.parse(d.replayed_at)), ok: true };
    setText(c.result, res ? res.text : "");
    c.result.className = "result" + (res ? (res.ok ? " ok" : " bad") : "");
  }

  async function replay(sub, seq, btn, tr) {
    var key = sub + "/" + seq;
    btn.disabled = true;
    replays.set(key, { text: "replaying…", ok: true });
    showResult(tr, key);
    try {
      var body = await api("v1/dead-letters/replay", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ subscription: sub, seq: seq })
      });
      var r = body && body.results && body.results[0];
      replays.set(key, r && r.replayed ? { text: "replayed", ok: true } :
        { text: "skipped: " + ((r && r.skipped) || "no answer"), ok: false });
    } catch (e) {
      replays.set(key, { text: e.unauthorized ? "failed: the admin token was refused" : "failed: " + e.message, ok: false });
    } finally {
      btn.disabled = false;
      showResult(tr, key);
    }
  }

  function showResult(tr, key) {
    var res = replays.get(key);
    setText(tr._cells.result, res.text);
    tr._cells.result.className = "result" + (res.ok ? " ok" : " bad");
  }

  // syncRows makes tbody's rows match items, in order, reusing the row of
  // each key so that focus and replay results survive the next poll.
  function syncRows(tbody, items, keyOf, create, update) {
    var existing = new Map();
    Array.prototype.forEach.call(tbody.rows, function (tr) { existing.set(tr.dataset.key, tr); });
    var seen = new Set();
    items.forEach(function (item, i) {
      var k = keyOf(item);
      seen.add(k);
      var tr = existing.get(k);
      if (!tr) {
        tr = create(item);
        tr.dataset.key = k;
      }
      update(tr, item);
      if (tbody.rows[i] !== tr) tbody.insertBefore(tr, tbody.rows[i] || null);
    });
    existing.forEach(function (tr, k) { if (!seen.has(k)) tr.remove(); });
  }

  function cell(tr, tag, cls) {
    var el = document.createElement(tag);
    if (cls) el.className = cls;
    tr.appendChild(el);
    return el;
  }

  function setText(el, s) {
    if (el.textContent !== s) el.textContent = s;
  }

  function fmtRate(v) {
    if (v === null || v === undefined) return "–";
    if (v === 0) return "0";
    return v < 10 ? v.toFixed(1) : intFmt.format(Math.round(v));
  }

  function fmtAge(s) {
    s = Math.floor(s);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + pad(s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + pad(Math.floor(s / 60) % 60) + "m";
    return Math.floor(s / 86400) + "d " + Math.floor(s / 3600) % 24 + "h";
  }

  function pad(n) { return n < 10 ? "0" + n : String(n); }

  function ago(t) {
    return isNaN(t) ? "" : fmtAge(Math.max(0, (Date.now() - t) / 1000)) + " ago";
  }

  $("token-form").addEventListener("submit", function (ev) {
    ev.preventDefault();
    token = $("token-input").value.trim();
    $("token-input").value = "";
    try { localStorage.setItem(TOKEN_KEY, token); } catch (e) { /* keep it in memory */ }
    clearTimeout(timer);
    poll();
  });

  poll();
})();
