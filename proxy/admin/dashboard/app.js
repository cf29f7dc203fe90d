// sluice dashboard: polls the admin API once a second and renders it.
// No dependencies and no build step. Every value from the API goes into the
// page through textContent (or an SVG attribute it computed), never as
// markup. With a tenant's token it is the tenant portal: only that tenant's
// subscriptions (the API shows it nothing else), each with its charts, its
// recent attempts, recover and rotate-secret; operator-only parts (marked
// data-operator in the page) are hidden.
(function () {
  "use strict";

  var POLL_MS = 1000;
  var SERIES_MS = 5000; // the series move in 10 s steps
  var MAX_CARDS = 24; // charts drawn, besides the selected subscription's
  var PORTAL_ATTEMPTS = 10; // attempts listed per subscription in the portal
  var RECOVER_HOURS = 24;
  var SATURATED = 0.8; // in_flight / cap at which a lane is highlighted
  var TOKEN_KEY = "sluice.adminToken";
  var SVG_NS = "http://www.w3.org/2000/svg";
  // The chart's bands, top to bottom, as GET /v1/subscriptions/{id}/series
  // names them; gaps: a bucket with no exchange has no P99 (0), not a fast one.
  var BANDS = [
    { key: "deliveries", cls: "deliveries", label: "delivered/s", fmt: fmtRate },
    { key: "failures", cls: "failures", label: "failed/s", fmt: fmtRate },
    { key: "p99_ms", cls: "p99", label: "P99 exchange", fmt: fmtMs, gaps: true }
  ];
  var CHART_W = 300, BAND_H = 46, BAND_GAP = 6;

  var $ = function (id) { return document.getElementById(id); };
  var intFmt = new Intl.NumberFormat();
  var token = readToken();
  var who = null; // GET /v1/whoami: {operator: true} or {operator: false, tenant}
  var selected = readSelected();
  var prev = null; // the last poll: {at: ms, lanes: {id: lane}}
  var replays = new Map(); // "sub/seq" -> {text, ok}, what a Replay click answered
  var cards = new Map(); // subscription -> its chart card
  var seriesAt = new Map(); // subscription -> when its series was last asked for (ms)
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

  // readSelected is the subscription named by #sub=... (a link to one
  // subscription's attempts), or "" for the first one.
  function readSelected() {
    return new URLSearchParams(location.hash.slice(1)).get("sub") || "";
  }

  function select(id) {
    selected = id;
    var hash = new URLSearchParams(location.hash.slice(1));
    hash.set("sub", id);
    history.replaceState(null, "", location.pathname + location.search + "#" + hash.toString());
    markSelected();
    var c = cards.get(id);
    if (portal() && c) c.el.scrollIntoView({ block: "nearest" });
    clearTimeout(timer);
    poll();
  }

  function markSelected() {
    cards.forEach(function (c, id) { c.el.classList.toggle("selected", id === selected && who && who.operator); });
    Array.prototype.forEach.call($("subs").tBodies[0].rows, function (tr) {
      tr.classList.toggle("selected", tr.dataset.key === selected && !portal());
    });
    setText($("attempts-sub"), selected ? "· " + selected : "");
  }

  function portal() { return !!who && !who.operator; }

  // loadWho asks whom the token speaks for. A sidecar without
  // GET /v1/whoami (404) only has operators.
  async function loadWho() {
    try {
      who = await api("v1/whoami");
    } catch (e) {
      if (e.unauthorized) throw e;
      who = { operator: true };
    }
    who = who || { operator: true };
    var isPortal = portal();
    document.body.classList.toggle("portal", isPortal);
    document.querySelectorAll("[data-operator]").forEach(function (el) { el.hidden = isPortal; });
    var banner = $("portal");
    banner.hidden = !isPortal;
    setText(banner, isPortal ? "tenant portal: " + (who.tenant || "") : "");
    document.title = isPortal ? "sluice · " + who.tenant : "sluice";
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
    if (!resp.ok) {
      var e2 = new Error(path + " answered " + resp.status + (body && body.error ? ": " + body.error : ""));
      e2.status = resp.status;
      throw e2;
    }
    return body;
  }

  // tryApi is api for the parts of the page that may fail alone (one
  // chart, one attempts table): null instead of an error, but a refused
  // token still stops the poll.
  async function tryApi(path, init) {
    try {
      return await api(path, init);
    } catch (e) {
      if (e.unauthorized) throw e;
      return null;
    }
  }

  function subPath(id, what) { return "v1/subscriptions/" + encodeURIComponent(id) + "/" + what; }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(poll, POLL_MS);
  }

  async function poll() {
    try {
      if (!document.hidden || !prev) {
        if (!who) await loadWho();
        var p = portal();
        var all = await Promise.all([
          api("v1/subscriptions"),
          p ? null : api("v1/retry-budget"),
          p ? tryApi("v1/dead-letters?limit=20") : api("v1/dead-letters?limit=20")
        ]);
        render(all[0], all[1], all[2]);
        await renderActivity((all[0] && all[0].subscriptions) || []);
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

    if (budget) renderBudget(budget);
    var letters = (dls && dls.dead_letters) || [];
    if (portal()) {
      // The API shows a tenant only its own; the page holds to that too.
      letters = letters.filter(function (d) { return lanesByID[d.subscription]; });
    }
    renderDeadLetters(letters, !!(dls && dls.next));
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
    c.pick = pickButton(l.subscription);
    c.id.appendChild(c.pick);
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

    setText(c.pick, l.subscription);
    tr.classList.toggle("selected", l.subscription === selected && !portal());
    // Fleet mode: the node delivering the lane (any node serves this page).
    tr.dataset.owner = l.owner || "";
    c.id.title = l.owner ? "delivered by " + l.owner : "";
    setText(c.state, l.state);
    c.state.className = "state-" + l.state;
    c.state.title = l.paused_by || "";
    if (l.held_until && l.state === "active") {
      // The endpoint said it takes no more until then (RateLimit,
      // X-RateLimit-*): the lane waits rather than collect 429s.
      setText(c.state, "held");
      c.state.className = "state-held";
      c.state.title = "held by the endpoint's announced limit (" + (l.held_by || "") + ") until " +
        new Date(l.held_until).toLocaleTimeString();
    }
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
    var action = cell(tr, "td", "replay");
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

  // renderActivity draws the charts and the attempt tables: the series of
  // the first MAX_CARDS subscriptions and the selected one (every
  // SERIES_MS; a new card at once), and the attempts of the selected one
  // (in the portal, of each).
  async function renderActivity(lanes) {
    var ids = lanes.map(function (l) { return l.subscription; });
    var byID = {};
    lanes.forEach(function (l) { byID[l.subscription] = l; });
    if (!byID[selected]) selected = ids[0] || "";
    var shown = ids.slice(0, MAX_CARDS);
    if (selected && shown.indexOf(selected) < 0) shown.push(selected);
    $("charts-more").hidden = ids.length <= MAX_CARDS;
    syncCards(shown, byID);
    markSelected();

    var now = Date.now();
    var jobs = [];
    shown.forEach(function (id) {
      if (now - (seriesAt.get(id) || 0) < SERIES_MS) return;
      seriesAt.set(id, now);
      jobs.push(tryApi(subPath(id, "series")).then(function (s) {
        var c = cards.get(id);
        if (s && c) drawChart(c, s);
      }));
    });
    if (portal()) {
      shown.forEach(function (id) {
        jobs.push(tryApi(subPath(id, "attempts")).then(function (a) {
          var c = cards.get(id);
          if (a && c && c.attempts) renderAttempts(c.attempts, c.attemptsEmpty, a.attempts.slice(0, PORTAL_ATTEMPTS));
        }));
      });
    } else if (selected) {
      var sel = selected;
      jobs.push(tryApi(subPath(sel, "attempts")).then(function (a) {
        if (sel !== selected) return;
        renderAttempts($("attempts").tBodies[0], $("attempts-empty"), (a && a.attempts) || []);
        var owner = $("attempts-owner");
        owner.hidden = !(a && a.owner);
        setText(owner, a && a.owner ? "Delivered by " + a.owner + "; these are the attempts this node made." : "");
      }));
    }
    await Promise.all(jobs);
  }

  function syncCards(ids, byID) {
    var box = $("charts");
    var seen = new Set(ids);
    cards.forEach(function (c, id) {
      if (!seen.has(id)) {
        c.el.remove();
        cards.delete(id);
        seriesAt.delete(id);
      }
    });
    ids.forEach(function (id, i) {
      var c = cards.get(id);
      if (!c) {
        c = newCard(id);
        cards.set(id, c);
      }
      var l = byID[id];
      if (c.rotate) {
        // The config file's subscriptions change in the file, not here.
        var byFile = !!l && l.managed_by === "file";
        c.rotate.disabled = byFile;
        c.rotate.title = byFile ? "managed by the config file: its secret changes there" : "";
      }
      setText(c.state, l ? l.state : "");
      c.state.className = "card-state" + (l ? " state-" + l.state : "");
      if (box.children[i] !== c.el) box.insertBefore(c.el, box.children[i] || null);
    });
  }

  function pickButton(id) {
    var b = document.createElement("button");
    b.type = "button";
    b.className = "pick";
    b.textContent = id;
    b.setAttribute("aria-label", "Show the attempts of " + id);
    b.addEventListener("click", function () { select(id); });
    return b;
  }

  function svgEl(name, attrs) {
    var el = document.createElementNS(SVG_NS, name);
    Object.keys(attrs || {}).forEach(function (k) { el.setAttribute(k, String(attrs[k])); });
    return el;
  }

  // newCard makes one subscription's card: a three-band chart, and in the
  // portal its actions and its recent attempts.
  function newCard(id) {
    var c = { id: id, bands: [] };
    c.el = document.createElement("article");
    c.el.className = "card";
    c.el.dataset.subscription = id;
    var h = document.createElement("h3");
    h.appendChild(portal() ? document.createTextNode(id) : pickButton(id));
    c.state = document.createElement("span");
    c.state.className = "card-state";
    h.appendChild(c.state);
    c.el.appendChild(h);

    var height = BANDS.length * (BAND_H + BAND_GAP) - BAND_GAP;
    c.svg = svgEl("svg", { "class": "chart", viewBox: "0 0 " + CHART_W + " " + height, role: "img",
      "aria-label": id + ": no data yet", "data-subscription": id });
    BANDS.forEach(function (b, i) {
      var g = svgEl("g", { "class": "band band-" + b.cls, transform: "translate(0," + i * (BAND_H + BAND_GAP) + ")" });
      g.appendChild(svgEl("rect", { "class": "frame", x: 0, y: 0, width: CHART_W, height: BAND_H, rx: 3 }));
      var line = svgEl("path", { "class": "line", d: "" });
      var label = svgEl("text", { "class": "label", x: 6, y: 13 });
      label.textContent = b.label;
      var value = svgEl("text", { "class": "value", x: CHART_W - 6, y: 13, "text-anchor": "end" });
      g.appendChild(line);
      g.appendChild(label);
      g.appendChild(value);
      c.svg.appendChild(g);
      c.bands.push({ line: line, value: value });
    });
    c.el.appendChild(c.svg);
    var axis = document.createElement("p");
    axis.className = "axis";
    ["15 min ago", "now"].forEach(function (t) {
      var s = document.createElement("span");
      s.textContent = t;
      axis.appendChild(s);
    });
    c.el.appendChild(axis);

    if (portal()) {
      var actions = document.createElement("div");
      actions.className = "actions";
      c.rotate = actionButton("Rotate secret", "Rotate the signing secret of " + id);
      c.recover = actionButton("Recover dead letters (" + RECOVER_HOURS + " h)", "Replay the dead letters of " + id + " from the last " + RECOVER_HOURS + " hours");
      c.result = document.createElement("span");
      c.result.className = "result";
      c.result.setAttribute("aria-live", "polite");
      c.rotate.addEventListener("click", function () { rotate(c); });
      c.recover.addEventListener("click", function () { recover(c); });
      actions.appendChild(c.rotate);
      actions.appendChild(c.recover);
      actions.appendChild(c.result);
      c.el.appendChild(actions);

      var h4 = document.createElement("h4");
      h4.textContent = "Recent attempts";
      c.el.appendChild(h4);
      var wrap = document.createElement("div");
      wrap.className = "scroll";
      var table = document.createElement("table");
      table.className = "attempts";
      table.appendChild($("attempts").tHead.cloneNode(true));
      c.attempts = document.createElement("tbody");
      table.appendChild(c.attempts);
      wrap.appendChild(table);
      c.el.appendChild(wrap);
      c.attemptsEmpty = document.createElement("p");
      c.attemptsEmpty.className = "hint";
      c.attemptsEmpty.textContent = "No attempts yet.";
      c.attemptsEmpty.hidden = true;
      c.el.appendChild(c.attemptsEmpty);
    }
    return c;
  }

  function actionButton(text, label) {
    var b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    b.setAttribute("aria-label", label);
    return b;
  }

  // drawChart draws each band's values, scaled to the band's maximum.
  function drawChart(c, s) {
    var summary = [];
    BANDS.forEach(function (b, i) {
      var v = s[b.key] || [];
      var max = 0;
      v.forEach(function (x) { if (x > max) max = x; });
      var top = 18, bottom = BAND_H - 3, step = CHART_W / Math.max(v.length - 1, 1);
      var d = "", pen = false;
      v.forEach(function (x, j) {
        if (b.gaps && !(x > 0)) { pen = false; return; }
        var y = bottom - (max > 0 ? x / max * (bottom - top) : 0);
        // A point that starts a line gets a short stroke of its own, so a
        // bucket between gaps still shows.
        d += (pen ? "L" : "M") + (j * step).toFixed(1) + "," + y.toFixed(1) + (pen ? "" : "h1.5");
        pen = true;
      });
      c.bands[i].line.setAttribute("d", d);
      var last = v.length ? v[v.length - 1] : 0;
      setText(c.bands[i].value, "now " + b.fmt(last) + " · max " + b.fmt(max));
      summary.push(b.label + " now " + b.fmt(last) + ", max " + b.fmt(max));
    });
    c.svg.setAttribute("aria-label", c.id + ", last 15 minutes: " + summary.join("; "));
    c.svg.dataset.start = s.start || "";
    c.svg.dataset.drawn = "true";
  }

  function renderAttempts(tbody, empty, list) {
    empty.hidden = list.length > 0;
    syncRows(tbody, list, function (a) { return a.seq + "/" + a.attempt + "/" + a.at; }, newAttemptRow, updateAttemptRow);
  }

  function newAttemptRow() {
    var tr = document.createElement("tr");
    var c = tr._cells = {};
    c.when = cell(tr, "td");
    c.seq = cell(tr, "td", "n");
    c.event = cell(tr, "td");
    c.attempt = cell(tr, "td", "n");
    c.status = cell(tr, "td", "n");
    c.duration = cell(tr, "td", "n");
    c.outcome = document.createElement("span");
    cell(tr, "td").appendChild(c.outcome);
    c.error = cell(tr, "td");
    c.response = cell(tr, "td", "response");
    return tr;
  }

  function updateAttemptRow(tr, a) {
    var c = tr._cells;
    tr.dataset.attempt = a.seq + "/" + a.attempt;
    tr.dataset.outcome = a.outcome || "";
    setText(c.when, a.at ? ago(Date.parse(a.at)) : "");
    c.when.title = a.at || "";
    setText(c.seq, String(a.seq));
    setText(c.event, a.event_id || "");
    setText(c.attempt, String(a.attempt));
    setText(c.status, a.status ? String(a.status) : "no answer");
    setText(c.duration, fmtMs(a.duration_ms));
    setText(c.outcome, (a.outcome || "").replace("_", " "));
    c.outcome.className = "badge outcome-" + (/^(ack|retry|timeout|dead_letter)$/.test(a.outcome) ? a.outcome : "other");
    setText(c.error, a.error || "");
    var r = a.response || "";
    setText(c.response, r.length > 60 ? r.slice(0, 60) + "…" : r);
    c.response.title = r;
  }

  // recover replays the subscription's dead letters of the last
  // RECOVER_HOURS (each at most once; the server skips the rest).
  async function recover(c) {
    c.recover.disabled = true;
    showCardResult(c, "recovering…", true);
    try {
      var since = new Date(Date.now() - RECOVER_HOURS * 3600 * 1000).toISOString();
      var r = await api(subPath(c.id, "recover"), {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ since: since })
      });
      r = r || {};
      showCardResult(c, r.matched ? "replayed " + intFmt.format(r.replayed || 0) + " of " + intFmt.format(r.matched) +
        " dead letters" + (r.skipped ? " (" + intFmt.format(r.skipped) + " skipped: already replayed or retrying)" : "") :
        "no dead letters in the last " + RECOVER_HOURS + " h", true);
    } catch (e) {
      showCardResult(c, e.unauthorized ? "failed: the token was refused" : "failed: " + e.message, false);
    } finally {
      c.recover.disabled = false;
    }
  }

  // rotate makes a new signing secret, after a second click to confirm;
  // the old ones keep signing beside it for the server's grace period.
  async function rotate(c) {
    if (!c.confirming) {
      c.confirming = setTimeout(function () { resetRotate(c); }, 5000);
      setText(c.rotate, "Confirm: rotate secret");
      c.rotate.classList.add("confirm");
      return;
    }
    resetRotate(c);
    c.rotate.disabled = true;
    showCardResult(c, "rotating…", true);
    try {
      var r = await api(subPath(c.id, "rotate-secret"), {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: "{}"
      });
      showCardResult(c, "secret rotated", true);
      showSecret(c.id, r || {});
    } catch (e) {
      showCardResult(c, e.unauthorized ? "failed: the token was refused" : "failed: " + e.message, false);
    } finally {
      c.rotate.disabled = false; // a file's subscription never gets here
    }
  }

  function resetRotate(c) {
    clearTimeout(c.confirming);
    c.confirming = 0;
    setText(c.rotate, "Rotate secret");
    c.rotate.classList.remove("confirm");
  }

  function showCardResult(c, text, ok) {
    setText(c.result, text);
    c.result.className = "result " + (ok ? "ok" : "bad");
  }

  // showSecret shows a new secret once; closing the dialog forgets it.
  function showSecret(id, r) {
    setText($("secret-sub"), id);
    $("secret-value").value = r.secret || "";
    setText($("secret-grace"), r.old_secrets_until ?
      "The old secrets keep signing beside it until " + new Date(r.old_secrets_until).toLocaleString() + "." :
      "The old secrets no longer sign.");
    setText($("secret-copied"), "");
    var dlg = $("secret-dialog");
    if (typeof dlg.showModal === "function") dlg.showModal(); else dlg.setAttribute("open", "");
    $("secret-value").select();
  }

  $("secret-copy").addEventListener("click", function () {
    var input = $("secret-value");
    input.select();
    var done = function () { setText($("secret-copied"), "copied"); };
    var manual = function () { setText($("secret-copied"), "selected: press Ctrl+C (⌘C) to copy"); };
    if (navigator.clipboard && navigator.clipboard.writeText) navigator.clipboard.writeText(input.value).then(done, manual);
    else manual();
  });
  $("secret-close").addEventListener("click", function () { $("secret-dialog").close(); });
  $("secret-dialog").addEventListener("close", function () { $("secret-value").value = ""; });

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

  function fmtMs(v) {
    if (typeof v !== "number" || !(v > 0)) return v === 0 ? "0" : "–";
    if (v < 1) return v.toFixed(2) + " ms";
    if (v < 10) return v.toFixed(1) + " ms";
    if (v < 1000) return Math.round(v) + " ms";
    return (v / 1000).toFixed(v < 10000 ? 2 : 1) + " s";
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
    // Another token may speak for someone else: ask again, draw anew.
    who = null;
    cards.forEach(function (c) { c.el.remove(); });
    cards.clear();
    seriesAt.clear();
    clearTimeout(timer);
    poll();
  });

  poll();
})();
