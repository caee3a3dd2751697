// ember's web UI: plain JavaScript against the collector's API.
//
// With a token on the collector, the API answers 401 to requests without
// "Authorization: Bearer TOKEN". The page then asks for the token (a sign-in
// form), keeps it in sessionStorage (this tab, until it closes or signs out)
// and sends it only in that header, never in a URL: graphs and downloads are
// fetched here and shown or saved from blob: URLs, as an iframe's or a
// link's own request could not carry the header.
//
// The whole view (type, range, label matchers, zoomed frame, search, view
// mode and the sandwich's function, theme, table sort and filter, compare
// settings) is the page's query string: a copied URL opens the same view,
// and Back/Forward go through the views a person chose (pushState on each
// choice, popstate draws again).
//
// Each view (graph, table, timeline, banner, diff) is a slot: a new request
// aborts the slot's older one, and an answer is shown only if it is the
// answer to the slot's latest request.
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var TYPES = ["cpu", "offcpu", "hotcold", "runqlat", "wakeup", "offwake"];
  var VIEWS = ["flame", "icicle", "sandwich"];
  var THEMES = ["", "light", "dark"];
  var SORTS = ["self", "total", "name"];
  // A name as the server's SVG shows it (flamegraph/svg.py escape): what XML
  // cannot hold, control characters and U+FFFE/U+FFFF, as U+FFFD.
  function shown(s) { return s.replace(/[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]/g, "\ufffd"); }
  var DEFAULT_SINCE = "15m";
  var TOP_LIMIT = 10000;      // every row the API gives (its limit)
  var MAX_NODES = 5000;       // frames of a tree the graph asks for
  var LOST = "^\\[(lost|truncated)"; // [lost user stack: collision], [truncated], ...
  var FRAME_H = 17, ROW_H = 20;

  // What each type shows, and the agent setting that records it.
  var KINDS = {
    cpu: { name: "on-CPU", setting: "agent.cpu",
      meaning: "Where threads ran on a CPU, sampled at the agent's frequency. Width: CPU samples (time on a CPU)." },
    offcpu: { name: "off-CPU", setting: "agent.offcpu",
      meaning: "Where threads were blocked (sleeping, waiting for I/O, a lock or another thread), " +
        "from switch-out to their wakeup. Width: time blocked." },
    hotcold: { name: "on-CPU and off-CPU", setting: "agent.cpu and agent.offcpu",
      meaning: "On-CPU (warm colours) and off-CPU (blue) time in one graph. Width: time." },
    runqlat: { name: "run-queue latency", setting: "agent.runqlat",
      meaning: "Where runnable threads waited for a CPU (after a wakeup, or preempted). Width: time waiting." },
    wakeup: { name: "wakeup", setting: "agent.wakeup",
      meaning: "The stacks of wakers, weighted by how long the threads they woke had been blocked. " +
        "Width: blocked time that each waker ended." },
    offwake: { name: "off-wake", setting: "agent.offwake",
      meaning: "Blocked stacks joined with the stacks of the threads that woke them. Width: time blocked." }
  };

  function defaults() {
    return { type: "cpu", since: DEFAULT_SINCE, from: null, to: null, matchers: [], focus: [],
             search: "", view: "flame", theme: "", sort: "self", rev: false, tq: "",
             baseline: "previous", baselineMatch: "", diff: false, cmp: "diff", fn: "", by: "" };
  }
  var state = defaults();
  var lastRange = null;   // {start, end, values} of the last timeline
  var timelineError = "";  // why the last timeline could not be read ("": it was)
  var graphData = null;   // the last tree answer drawn
  var topData = null;     // the last top answer
  var swData = null;      // the last sandwich answer drawn

  // --- the view state <-> the URL ---
  function toQuery(s) {
    var p = new URLSearchParams();
    p.set("type", s.type);
    if (s.from !== null) { p.set("from", s.from); p.set("to", s.to); } else p.set("since", s.since);
    s.matchers.forEach(function (m) { p.append("match", m); });
    if (s.focus.length) p.set("focus", s.focus.join(";"));
    if (s.search) p.set("search", s.search);
    if (s.view !== "flame") p.set("view", s.view);
    if (s.fn) p.set("fn", s.fn);
    if (s.by) p.set("by", s.by);
    if (s.theme) p.set("theme", s.theme);
    if (s.sort !== "self") p.set("sort", s.sort);
    if (s.rev) p.set("rev", "1");
    if (s.tq) p.set("tq", s.tq);
    if (s.baseline !== "previous") p.set("baseline", s.baseline);
    if (s.baselineMatch) p.set("baseline_match", s.baselineMatch);
    if (s.diff) p.set("diff", "1");
    if (s.cmp !== "diff") p.set("cmp", s.cmp);
    return p.toString();
  }
  function fromQuery(search) {
    var p = new URLSearchParams(search), s = defaults();
    var pick = function (v, allowed, d) { return allowed.indexOf(v) >= 0 ? v : d; };
    s.type = pick(p.get("type"), TYPES, s.type);
    var since = p.get("since");
    if (since && /^[0-9]+(s|m|h|d)$/.test(since)) s.since = since;
    var from = p.get("from"), to = p.get("to");
    if (from && to && /^[0-9]{1,19}$/.test(from) && /^[0-9]{1,19}$/.test(to)) { s.from = from; s.to = to; }
    s.matchers = p.getAll("match").filter(function (m) { return m; });
    var focus = p.get("focus");
    s.focus = focus ? focus.split(";") : [];
    s.search = p.get("search") || "";
    s.view = pick(p.get("view"), VIEWS, s.view);
    s.fn = p.get("fn") || "";
    s.by = /^[A-Za-z_][A-Za-z0-9_.-]{0,63}$/.test(p.get("by") || "") ? p.get("by") : "";
    s.theme = pick(p.get("theme") || "", THEMES, s.theme);
    s.sort = pick(p.get("sort"), SORTS, s.sort);
    s.rev = p.get("rev") === "1";
    s.tq = p.get("tq") || "";
    s.baseline = pick(p.get("baseline"), ["previous", "labels"], s.baseline);
    s.baselineMatch = p.get("baseline_match") || "";
    s.diff = p.get("diff") === "1";
    s.cmp = pick(p.get("cmp"), ["diff", "side"], s.cmp);
    return s;
  }
  // A person's choice: a new history entry (or, while typing, the same one).
  function go(change, replace) {
    var next = {};
    Object.keys(state).forEach(function (k) { next[k] = state[k]; });
    Object.keys(change).forEach(function (k) { next[k] = change[k]; });
    state = next;
    var url = location.pathname + "?" + toQuery(state);
    if (replace) history.replaceState(null, "", url);
    else history.pushState(null, "", url);
    render();
  }
  window.addEventListener("popstate", function () {
    state = fromQuery(location.search);
    if (!signingIn()) render(true);
  });

  // --- the token, and every API request ---
  var TOKEN_KEY = "ember.token";
  var SILENT = "ember: answer dropped"; // an error the sign-in form has dealt with, or an old answer
  var generation = 0; // bumped at sign-in and sign-out: older answers are dropped
  var memory = ""; // the token when the browser refuses sessionStorage
  var token = {
    get: function () {
      try { return sessionStorage.getItem(TOKEN_KEY) || memory; } catch (e) { return memory; }
    },
    set: function (t) {
      memory = t;
      try { sessionStorage.setItem(TOKEN_KEY, t); } catch (e) { /* kept in memory */ }
    },
    clear: function () {
      memory = "";
      try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* nothing stored */ }
    }
  };

  // A GET of the API, with the token when there is one. A 401 shows the
  // sign-in form; the promise then fails with SILENT, as it does for answers
  // to requests made before a sign-in or sign-out, and for aborted requests.
  // A 503 (the collector has as many queries as it serves and queues) is
  // asked again after its Retry-After, longer each time and spread, so the
  // pages waiting do not come back together: the view waits rather than
  // stays empty. The last answer of BUSY_TRIES is the view's, 503 or not.
  var BUSY_TRIES = 8, BUSY_MAX_S = 8;
  function api(path, signal, tried) {
    var t = token.get(), gen = generation, n = tried || 0;
    var init = { signal: signal };
    if (t) init.headers = { Authorization: "Bearer " + t };
    return fetch(path, init).then(function (r) {
      if (gen !== generation) throw new Error(SILENT);
      if (r.status === 401) {
        askToken(t ? "The collector refused that token. Check it and sign in again." : "");
        throw new Error(SILENT);
      }
      if (r.status === 503 && n + 1 < BUSY_TRIES) {
        var after = Math.max(1, Number(r.headers.get("Retry-After")) || 1);
        var wait = Math.max(after, Math.min(BUSY_MAX_S, after * Math.pow(2, n)));
        return pause(1000 * wait * (1 + Math.random() / 2), signal).then(function () {
          if (gen !== generation) throw new Error(SILENT); // signed in or out meanwhile
          return api(path, signal, n + 1);
        });
      }
      return r;
    }, function (e) {
      if (e && e.name === "AbortError") throw new Error(SILENT);
      throw e;
    });
  }
  // Resolves after ms, or fails with SILENT when signal aborts first.
  function pause(ms, signal) {
    return new Promise(function (resolve, reject) {
      if (signal && signal.aborted) { reject(new Error(SILENT)); return; }
      var timer = setTimeout(resolve, ms);
      if (signal) signal.addEventListener("abort", function () {
        clearTimeout(timer); reject(new Error(SILENT));
      }, { once: true });
    });
  }
  function json(r) {
    return r.json().then(function (j) {
      if (!r.ok) {
        var e = new Error(j.error || r.statusText);
        e.status = r.status;
        throw e;
      }
      return j;
    });
  }
  function blob(r) {
    if (r.ok) return r.blob();
    return json(r);
  }

  // The slots: per view, the latest request and what it was for.
  var slots = {};
  function slot(name) {
    return slots[name] || (slots[name] = { seq: 0, key: null, ctl: null });
  }
  // Fetch ``path`` for the view ``name`` unless it already shows (or is
  // fetching) ``key``; resolves with the parsed answer only while it is the
  // slot's latest request, rejects with SILENT otherwise. null: nothing to do.
  function fetchSlot(name, key, path, parse) {
    var s = slot(name);
    if (s.key === key) return null;
    if (s.ctl) s.ctl.abort();
    var n = ++s.seq, ctl = new AbortController();
    s.key = key; s.ctl = ctl;
    return api(path, ctl.signal).then(parse).then(function (v) {
      if (n !== s.seq) throw new Error(SILENT);
      s.ctl = null;
      return v;
    }, function (e) {
      if (n !== s.seq) throw new Error(SILENT);
      s.ctl = null;
      s.key = null; // asked again at the next render
      throw e;
    });
  }
  // Whether the view's answer is still out. Until it comes, what the view
  // holds answers an older question: drawn again with the new choices (a
  // zoom's crumbs, a type's name) it would show a view nobody asked for.
  function answerOut(name) { return slots[name] ? slots[name].ctl !== null : false; }
  function dropSlots() {
    Object.keys(slots).forEach(function (k) {
      var s = slots[k];
      if (s.ctl) s.ctl.abort();
      s.seq++; s.key = null; s.ctl = null;
    });
  }

  function signingIn() { return !$("signin-box").classList.contains("hidden"); }
  function report(e) {
    if (e.message === SILENT) return;
    if (signingIn()) $("signin-message").textContent = e.message;
    else status(e.message);
  }
  function quiet(e) { if (e.message !== SILENT) console.error(e); }

  function askToken(message) {
    generation++;
    token.clear();
    wipe();
    $("sign-out").classList.add("hidden");
    $("signin-message").textContent = message;
    $("signin-box").classList.remove("hidden");
    $("token").focus();
  }
  function signIn(e) {
    e.preventDefault();
    var t = $("token").value.trim();
    $("token").value = "";
    if (!/^[\x20-\x7e]+$/.test(t)) {
      $("signin-message").textContent = "A token is printable ASCII text; check what was pasted.";
      return;
    }
    generation++;
    token.set(t);
    $("signin-message").textContent = "Checking\u2026";
    enter();
  }
  // The first request decides: any answer but 401 means the page may work.
  function enter() {
    api("/api/v1/labels").then(function (r) {
      $("signin-box").classList.add("hidden");
      $("sign-out").classList.toggle("hidden", !token.get());
      render();
      return json(r).then(fillLabels);
    }).catch(report);
  }
  // No profile data stays on the page once it needs a token.
  function wipe() {
    dropSlots();
    ["flame", "diff"].forEach(function (id) { setBlob($(id), null); });
    $("diff").classList.add("hidden");
    graphData = topData = lastRange = swData = null;
    timelineError = "";
    unpaint($("graph"));
    sideData = { a: null, b: null }; drawSide();
    ["callers", "callees"].forEach(function (id) { unpaint($(id)); $(id + "-head").textContent = ""; });
    clear($("top-rows")); $("top-spacer").style.height = "0px"; $("top-count").textContent = "";
    if (chart) { chart.destroy(); chart = null; }
    clear($("timeline")); clear($("series-legend"));
    clear($("label-name")); clear($("label-value"));
    $("matched").textContent = ""; $("subtitle").textContent = "";
    $("lost-banner").classList.add("hidden");
    message("");
    loading(false);
    status("");
  }
  function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); }

  // --- graphs and downloads: fetched with the token, kept as blobs ---
  // The graph iframes (hot/cold and diff) are sandboxed (scripts and the
  // search prompt, but not this origin): the SVG's own script cannot read
  // the token.
  // Replaced in place: a frame's navigation must not add an entry to the
  // page's history (Back goes to the previous view, not the previous graph).
  function setBlob(frame, b) {
    var old = frame.dataset.blob || "";
    if (!old && !b) return;
    var next = b ? URL.createObjectURL(b) : "";
    frame.dataset.blob = next;
    try { frame.contentWindow.location.replace(next || "about:blank"); }
    catch (e) { frame.src = next || "about:blank"; }
    if (old) URL.revokeObjectURL(old);
  }
  // The links keep the API URL in href, to read or copy (for curl with the
  // header); a click fetches it with the token and saves what comes back.
  function download(e) {
    e.preventDefault();
    var link = e.currentTarget;
    if (!link.dataset.file) return; // before the first render: nothing to save yet
    api(link.getAttribute("href")).then(blob).then(function (b) {
      var a = document.createElement("a");
      a.href = URL.createObjectURL(b);
      a.download = link.dataset.file;
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(function () { URL.revokeObjectURL(a.href); }, 60000);
    }).catch(report);
  }

  // The query of the data a view shows: type, range and label matchers.
  function params(extra) {
    var p = new URLSearchParams();
    p.set("type", state.type);
    if (state.from !== null) { p.set("from", state.from); p.set("to", state.to); }
    else p.set("since", state.since);
    state.matchers.forEach(function (m) { p.append("match", m); });
    Object.keys(extra || {}).forEach(function (k) { p.set(k, extra[k]); });
    return p;
  }
  function dataType() { return state.type === "hotcold" ? "cpu" : state.type; }
  function status(text) { $("status").textContent = text || ""; }
  function message(text) {
    $("graph-message").textContent = text || "";
    $("graph-message").classList.toggle("hidden", !text);
  }
  function loading(on) { $("loading").classList.toggle("hidden", !on); }
  function seconds(s) {
    var a = Math.abs(s);
    if (a === 0) return "0";
    if (a >= 1) return s.toFixed(2) + " s";
    if (a >= 1e-3) return (s * 1e3).toFixed(1) + " ms";
    return (s * 1e6).toFixed(0) + " \u00b5s";
  }
  // A value in the unit an answer gives: "ns" (top), "microseconds" (a
  // tree of time), anything else counts samples.
  function fmt(v, unit) {
    if (unit === "ns" || unit === "nanoseconds") return seconds(v / 1e9);
    if (unit === "microseconds") return seconds(v / 1e6);
    return Math.round(v) + (v === 1 ? " sample" : " samples");
  }
  function pct(v, whole) { return whole ? (100 * v / whole).toFixed(2) + "%" : "0%"; }

  // --- labels and filters ---
  var labelNames = [];
  function syncBy() { // the series-by choices: every label, and the one in the URL
    var sel = $("series-by"), names = labelNames.slice();
    if (state.by && names.indexOf(state.by) < 0) names.push(state.by);
    if (sel.options.length !== names.length + 1) {
      while (sel.options.length > 1) sel.remove(1);
      names.forEach(function (n) {
        var o = document.createElement("option"); o.value = o.textContent = n; sel.appendChild(o);
      });
    }
    sel.value = state.by;
  }
  function fillLabels(j) {
    var sel = $("label-name");
    clear(sel);
    j.labels.filter(function (n) { return n !== "__name__"; }).forEach(function (n) {
      var o = document.createElement("option"); o.value = o.textContent = n; sel.appendChild(o);
    });
    sel.value = j.labels.indexOf("comm") >= 0 ? "comm" : sel.value;
    labelNames = j.labels.filter(function (n) { return n !== "__name__"; });
    syncBy();
    loadValues();
  }
  // The values of the chosen label. Only the latest request's answer fills
  // the list (the page asks at load, and again when the label changes), and
  // values already picked stay picked when the list is filled again.
  var valuesAsked = 0;
  function loadValues() {
    var name = $("label-name").value;
    if (!name) return;
    var asked = ++valuesAsked;
    api("/api/v1/labels/" + encodeURIComponent(name) + "/values")
      .then(json).then(function (j) {
        if (asked !== valuesAsked || $("label-name").value !== name) return;
        var sel = $("label-value");
        var picked = Array.prototype.map.call(sel.selectedOptions, function (o) { return o.value; });
        clear(sel);
        j.values.forEach(function (v) {
          var o = document.createElement("option"); o.value = o.textContent = v;
          o.selected = picked.indexOf(v) >= 0;
          sel.appendChild(o);
        });
        sel.size = Math.min(4, Math.max(1, j.values.length));
      }).catch(quiet);
  }
  function opChanged() {
    var regex = $("label-op").value.indexOf("~") >= 0;
    $("label-value").classList.toggle("hidden", regex);
    $("label-regex").classList.toggle("hidden", !regex);
  }
  function addFilter() {
    var name = $("label-name").value, op = $("label-op").value;
    if (!name) return;
    var values = op.indexOf("~") >= 0 ? [$("label-regex").value] :
      Array.prototype.map.call($("label-value").selectedOptions, function (o) { return o.value; });
    var add = values.map(function (v) { return name + op + v; }).filter(function (m) {
      return state.matchers.indexOf(m) < 0;
    });
    if (!add.length) return;
    go({ matchers: state.matchers.concat(add), focus: [] });
  }
  function renderFilters() {
    var box = $("filters");
    clear(box);
    state.matchers.forEach(function (m, i) {
      var c = document.createElement("button");
      c.className = "chip"; c.textContent = m + " \u00d7"; c.title = "remove " + m;
      c.dataset.matcher = m;
      c.addEventListener("click", function () {
        go({ matchers: state.matchers.filter(function (_, j) { return j !== i; }), focus: [] });
      });
      box.appendChild(c);
    });
  }

  // --- the timeline: samples over the whole range, one series per value of
  // a label (by=), drawn by uPlot; dragging on it picks a part (a brush) ---
  var SERIES_MAX = 10; // the biggest values; the rest are one "other" series
  var PALETTE = ["#e8710a", "#1a73e8", "#12b5cb", "#e52592", "#9334e6", "#188038",
                 "#f9ab00", "#5f6368", "#a142f4", "#d93025", "#80868b"];
  var chart = null;
  function loadTimeline() {
    var p = params({ type: dataType(), buckets: 120 });
    p.delete("from"); p.delete("to"); p.set("since", state.since);
    if (state.by) p.set("by", state.by);
    var path = "/api/v1/timeline?" + p;
    var f = fetchSlot("timeline", path, path, json);
    if (f) f.then(function (j) { lastRange = j; timelineError = ""; drawTimeline(); })
      .catch(timelineFailed);
    // the same range again: drawn anew (the picked part, the theme), unless its
    // answer is still out; lastRange is then another range's, and the answer draws
    else if (!answerOut("timeline")) drawTimeline();
  }
  // [{value, values, total}]: every value of the label, the biggest first,
  // past SERIES_MAX summed as one "other".
  function seriesOf(j) {
    var total = function (vs) { return vs.reduce(function (a, b) { return a + b; }, 0); };
    if (!j.series) return [{ value: null, values: j.values, total: total(j.values) }];
    var all = j.series.map(function (s) { return { value: s.value, values: s.values, total: total(s.values) }; });
    all.sort(function (a, b) { return b.total - a.total || (a.value < b.value ? -1 : 1); });
    if (all.length <= SERIES_MAX + 1) return all;
    var rest = all.slice(SERIES_MAX), values = rest[0].values.map(function () { return 0; });
    rest.forEach(function (s) { s.values.forEach(function (v, i) { values[i] += v; }); });
    return all.slice(0, SERIES_MAX).concat([{ value: null, other: rest.length, values: values,
                                              total: total(values) }]);
  }
  // A timeline that could not be read says why in its box (once a busy
  // collector's retries are spent, a 500, ...); a range without profiles
  // is left empty, as the graph says so.
  function timelineFailed(e) {
    if (e.message === SILENT) return;
    lastRange = null;
    timelineError = e.status === 404 ? "" : "The timeline could not be read: " + e.message;
    drawTimeline();
    console.error(e);
  }
  function drawTimeline() {
    var box = $("timeline"), j = lastRange;
    if (chart) { chart.destroy(); chart = null; }
    clear(box); clear($("series-legend"));
    if (!j) { box.textContent = timelineError; return; }
    if (typeof window.uPlot !== "function") {
      box.textContent = "The timeline's chart library is not built here (make web).";
      return;
    }
    var list = seriesOf(j), n = j.values.length, xs = [];
    for (var i = 0; i < n; i++) xs.push((j.start + (i + 0.5) * j.bucket_ns) / 1e9);
    var fg = getComputedStyle(document.body).color;
    var one = list.length === 1 && list[0].value === null && !list[0].other;
    var bars = window.uPlot.paths.bars({ size: [0.9, 40] });
    chart = new window.uPlot({
      width: Math.max(300, box.clientWidth), height: state.by ? 140 : 90,
      legend: { show: false },
      scales: { x: { time: true, range: [j.start / 1e9, j.end / 1e9] } },
      axes: [{ stroke: fg, grid: { show: false } },
             { stroke: fg, size: 56, grid: { stroke: "rgba(128,128,128,0.2)" } }],
      series: [{}].concat(list.map(function (s, k) {
        var c = PALETTE[Math.min(k, PALETTE.length - 1)];
        return one ? { label: "samples", stroke: c, fill: c, paths: bars, points: { show: false } }
          : { label: label(s), stroke: c, width: 1.5, points: { show: false } };
      })),
      cursor: { drag: { x: true, y: false, setScale: false } },
      hooks: { setSelect: [function (u) {
        if (u.select.width < 3) return;
        var a = u.posToVal(u.select.left, "x"), b = u.posToVal(u.select.left + u.select.width, "x");
        go({ from: String(Math.round(a * 1e9)), to: String(Math.round(b * 1e9)) });
      }] }
    }, [xs].concat(list.map(function (s) { // (empty slices: no bar, not a flat one)
      return one ? s.values.map(function (v) { return v || null; }) : s.values;
    })), box);
    box.dataset.series = String(list.length);
    if (state.from !== null) { // the picked part, shown on the whole range
      var x0 = chart.valToPos(Number(state.from) / 1e9, "x"), x1 = chart.valToPos(Number(state.to) / 1e9, "x");
      chart.setSelect({ left: x0, width: Math.max(1, x1 - x0), top: 0, height: chart.over.clientHeight }, false);
    }
    if (!one) legend(list);
  }
  function label(s) {
    return s.other ? "other (" + s.other + " values)" : s.value === "" ? "(no " + state.by + ")" : s.value;
  }
  // Each series' value, total and share; a click filters on that value.
  function legend(list) {
    var box = $("series-legend"), all = list.reduce(function (a, s) { return a + s.total; }, 0);
    list.forEach(function (s, k) {
      var b = document.createElement("button");
      b.className = "series";
      b.dataset.total = String(s.total);
      if (s.value !== null) b.dataset.value = s.value;
      var sw = document.createElement("span");
      sw.className = "swatch"; sw.style.background = PALETTE[Math.min(k, PALETTE.length - 1)];
      b.appendChild(sw);
      b.appendChild(document.createTextNode(shown(label(s)) + " " + pct(s.total, all)));
      b.title = s.value === null ? "" : "show only " + state.by + "=" + s.value;
      b.disabled = s.value === null;
      b.addEventListener("click", function () {
        go({ matchers: state.matchers.concat([state.by + "=" + s.value]), focus: [] });
      });
      box.appendChild(b);
    });
  }

  // --- the flame graph (and icicle), drawn here from the tree ---
  function hash(name) { // FNV-1a: a stable colour per name
    var h = 2166136261;
    for (var i = 0; i < name.length; i++) {
      h ^= name.charCodeAt(i);
      h = Math.imul(h, 16777619) >>> 0;
    }
    return h / 4294967296;
  }
  function colour(name, depth) {
    var h = hash(name);
    if (depth === 0 || name.charAt(0) === "[") {
      var g = Math.round(170 + 40 * h);
      return "rgb(" + g + "," + g + "," + g + ")";
    }
    var t = state.type, c;
    if (t === "offcpu" || t === "offwake") c = [80 + 60 * h, 120 + 60 * h, 200 + 55 * h];
    else if (t === "runqlat") c = [150 + 50 * h, 100 + 40 * h, 205 + 50 * h];
    else if (t === "wakeup") c = [60 + 50 * h, 175 + 50 * h, 90 + 40 * h];
    else c = [205 + 50 * h, 230 * h, 55 * h];
    return "rgb(" + c.map(Math.round).join(",") + ")";
  }
  var graphAsked = null; // the flame graph's request of the last render, while it runs
  function loadGraph() {
    graphAsked = null;
    var sandwich = state.view === "sandwich";
    $("sandwich").classList.toggle("hidden", !sandwich);
    if (sandwich) { loadSandwich(); return; }
    swData = null;
    var hotcold = state.type === "hotcold";
    $("graph").classList.toggle("hidden", hotcold);
    $("flame").classList.toggle("hidden", !hotcold);
    $("search").disabled = hotcold;
    var f;
    if (hotcold) { // one graph of two types: the server draws it (its own zoom and search)
      var width = Math.max(300, $("graph-box").clientWidth - 4);
      var svgPath = "/api/v1/flamegraph?" + params({ width: width });
      f = fetchSlot("graph", svgPath, svgPath, blob);
      if (!f) return;
      graphAsked = f;
      loading(true);
      f.then(function (b) {
        loading(false); message(""); graphData = null;
        $("matched").textContent = "";
        setBlob($("flame"), b);
      }).catch(graphFailed);
      return;
    }
    var p = params({ max_nodes: MAX_NODES });
    if (state.focus.length) p.set("focus", state.focus.join(";"));
    if (state.search) p.set("search", state.search);
    var path = "/api/v1/tree?" + p;
    f = fetchSlot("graph", path, path, json);
    // the same question: drawn anew (the view mode may have changed), unless
    // its answer is out and the graph holds another's (early() may have drawn
    // this one's from what the page had)
    if (!f) { if (!answerOut("graph") || asked(graphData)) drawGraph(); return; }
    graphAsked = f;
    loading(true);
    early(path);
    f.then(function (j) {
      loading(false); message(""); status("");
      setBlob($("flame"), null);
      j.query = params().toString(); j.focus = state.focus.join(";");
      graphData = j;
      recent.put(path, j);
      drawGraph();
    }).catch(graphFailed);
  }
  // While the server answers, the view is drawn at once from what the page
  // has: the last answer to the same question (Back, Forward), the zoomed
  // frame's subtree of the tree shown, or the tree shown with the new
  // search's matches coloured. The answer replaces it (a zoom's narrow
  // frames, the matched share over the whole profile).
  var recent = { paths: [], answers: [],
    get: function (path) { var i = this.paths.indexOf(path); return i >= 0 ? this.answers[i] : null; },
    put: function (path, j) {
      var i = this.paths.indexOf(path);
      if (i >= 0) { this.paths.splice(i, 1); this.answers.splice(i, 1); }
      this.paths.push(path); this.answers.push(j);
      if (this.paths.length > 8) { this.paths.shift(); this.answers.shift(); }
    } };
  function asked(j) { // the graph's data answers the current question
    return !!j && j.query === params().toString() && j.focus === state.focus.join(";");
  }
  function early(path) {
    var j = recent.get(path), was = graphData;
    if (!j && was && was.query === params().toString()) {
      var focus = state.focus.join(";"), node = null;
      if (focus === was.focus) node = was.tree;
      else if (was.focus === "" || focus.indexOf(was.focus + ";") === 0) {
        node = was.tree; // the new focus below the one shown: walk down to it
        var rest = (was.focus === "" ? focus : focus.slice(was.focus.length + 1)).split(";");
        for (var k = 0; node && k < rest.length; k++) {
          node = node.children.filter(function (c) { return c.name === rest[k]; })[0] || null;
        }
      }
      if (node) j = { tree: node, total: was.total, unit: was.unit, profiles: was.profiles,
                      query: was.query, focus: focus };
    }
    if (!j || state.type === "hotcold") return;
    graphData = j;
    drawGraph();
  }
  function graphFailed(e) {
    if (e.message === SILENT) return;
    loading(false);
    graphData = swData = null;
    drawGraph();
    setBlob($("flame"), null);
    if (e.status === 404) notCollected(e.message);
    else { message(e.message); report(e); }
  }
  // No profiles matched: say why in a sentence (never raw JSON).
  function notCollected(why) {
    var kind = KINDS[state.type], type = state.type;
    if (/^no frame named/.test(why)) { message("The function is not in this range: " + why + "."); return; }
    if (/^no frame/.test(why)) { message("The zoomed frame is not in this range: " + why + "."); return; }
    message("No " + kind.name + " profiles match this range and these filters.");
    var asked = ++notCollected.seq;
    api("/api/v1/types").then(json).then(function (j) {
      if (asked !== notCollected.seq || state.type !== type) return;
      var need = type === "hotcold" ? ["cpu", "offcpu"] : [type];
      var stored = need.every(function (t) { return j.types.indexOf(j.aliases[t] || t) >= 0; });
      if (stored) {
        message("No " + kind.name + " profiles are stored for this range" +
          (state.matchers.length ? " and these filters" : "") +
          ". Try a longer range" + (state.matchers.length ? " or fewer filters." : "."));
      } else {
        message("No " + kind.name + " profiles are stored. The agent records them when its setting " +
          kind.setting + " is true (`ember config-reference` lists every setting).");
      }
    }).catch(quiet);
  }
  notCollected.seq = 0;

  var drawn = []; // per frame index: {node, parent, depth}
  function drawGraph() {
    var canvas = $("graph");
    unpaint(canvas);
    drawn = [];
    $("crumbs").textContent = "";
    $("reset-zoom").classList.toggle("hidden", !state.focus.length || state.view === "sandwich");
    if (state.view === "sandwich") {
      drawSandwich();
      return;
    }
    renderCrumbs();
    var j = graphData;
    var totalText = $("subtitle-total");
    if (totalText) totalText.textContent = "";
    if (!j || state.type === "hotcold") {
      $("matched").textContent = "";
      return;
    }
    var width = Math.max(300, $("graph-box").clientWidth - 2);
    var root = j.tree;
    var rootName = state.focus.length ? state.focus[state.focus.length - 1] : "";
    var painting = performance.now();
    drawn = paint(canvas, root, width, state.view === "icicle", rootName, describe);
    // User Timing marks (the devtools' Performance panel, bench/ui_render.py)
    performance.measure("ember:paint", { start: painting });
    performance.mark("ember:graph");
    var total = typeof j.total === "number" ? j.total : root.value;
    if (totalText) totalText.textContent = "Total: " + fmt(total, j.unit) +
      (state.focus.length ? "; zoomed frame: " + fmt(root.value, j.unit) + " (" + pct(root.value, total) + ")" : "") +
      " from " + j.profiles + " profile" + (j.profiles === 1 ? "" : "s") + ".";
    var m = $("matched");
    if (j.matched) {
      m.textContent = "Matched: " + (100 * j.matched.share).toFixed(2) + "% of " +
        (state.focus.length ? "the zoomed frame" : "all") + " (" + fmt(j.matched.value, j.unit) + ")";
      m.dataset.share = String(100 * j.matched.share);
    } else { m.textContent = ""; delete m.dataset.share; }
  }
  // One tree as frames on a canvas, the root at the bottom (a flame graph) or
  // at the top (``icicle``); ``rootName`` names the root when not "". A
  // canvas, not an element per frame: thousands of frames draw in a few
  // milliseconds (bench/ui_render.py). Returns the frames drawn, by index,
  // also kept on the canvas (``frames``) for the pointer and the tests.
  function paint(canvas, root, width, icicle, rootName, describeFn) {
    var scale = root.value ? width / root.value : 0;
    var maxDepth = 0, items = [];
    var rx = null;
    if (state.search) { try { rx = new RegExp(state.search); } catch (e) { rx = null; } }
    (function walk(node, x, depth, parent) {
      var w = node.value * scale;
      if (depth > 0 && w < 0.5) return;
      var i = items.length;
      var name = depth === 0 && rootName ? rootName : node.name;
      items.push({ node: node, x: x, w: w, depth: depth, parent: parent,
                   name: shown(name), // searched as stored, drawn as the server's SVG draws it
                   match: rx !== null && (depth > 0 || rootName !== "") && rx.test(name) });
      if (depth > maxDepth) maxDepth = depth;
      var cx = x;
      node.children.forEach(function (c) { walk(c, cx, depth + 1, i); cx += c.value * scale; });
    })(root, 0, 0, -1);
    var height = (maxDepth + 1) * FRAME_H + 2;
    var ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio); canvas.height = Math.round(height * ratio);
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
    canvas.dataset.depth = maxDepth;
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.font = "12px Verdana, sans-serif";
    ctx.textBaseline = "alphabetic";
    var rows = [];
    items.forEach(function (it, i) {
      it.y = icicle ? it.depth * FRAME_H : (maxDepth - it.depth) * FRAME_H;
      (rows[it.depth] = rows[it.depth] || []).push(i); // left to right: the walk's order
      ctx.fillStyle = it.match ? "rgb(230,0,230)" : colour(it.name, it.depth);
      ctx.fillRect(it.x, it.y, Math.max(0.5, it.w - 0.5), FRAME_H - 1);
      var fits = Math.floor((it.w - 6) / 7);
      if (fits >= 3) {
        ctx.fillStyle = "#000";
        ctx.fillText(it.name.length <= fits ? it.name : it.name.slice(0, fits - 2) + "..",
                     it.x + 3, it.y + FRAME_H - 5);
      }
    });
    canvas.frames = items; canvas.rows = rows; canvas.icicle = icicle;
    canvas.describe = describeFn;
    return items;
  }
  // The frame under the pointer: its row from y, then a binary search by x.
  function frameAt(canvas, e) {
    var items = canvas.frames, rows = canvas.rows;
    if (!items || !items.length) return -1;
    var r = canvas.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
    var top = Math.floor(y / FRAME_H), maxDepth = rows.length - 1;
    var depth = canvas.icicle ? top : maxDepth - top;
    var row = rows[depth];
    if (!row) return -1;
    var lo = 0, hi = row.length - 1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1, it = items[row[mid]];
      if (x < it.x) hi = mid - 1;
      else if (x >= it.x + Math.max(0.5, it.w)) lo = mid + 1;
      else return row[mid];
    }
    return -1;
  }
  // Hover and click on a graph: ``pick(i, item)`` on a click.
  function pointer(canvas, pick) {
    canvas.addEventListener("mousemove", function (e) {
      var i = frameAt(canvas, e), it = i >= 0 ? canvas.frames[i] : null;
      canvas.style.cursor = it ? "pointer" : "default";
      var text = it ? canvas.describe(it.node, it.name) : "";
      canvas.title = text;
      $("details").textContent = text || "\u00a0";
    });
    canvas.addEventListener("mouseleave", function () { $("details").textContent = "\u00a0"; });
    canvas.addEventListener("click", function (e) {
      var i = frameAt(canvas, e);
      if (i >= 0) pick(i, canvas.frames[i]);
    });
  }
  function unpaint(canvas) {
    canvas.width = canvas.height = 0;
    canvas.style.width = canvas.style.height = "0px";
    canvas.frames = []; canvas.rows = [];
  }

  // --- the sandwich: one function's callers (above, the function at their
  // bottom) and callees (below, the function at their top) ---
  function loadSandwich() {
    $("graph").classList.add("hidden");
    $("flame").classList.add("hidden");
    $("search").disabled = false;
    setBlob($("flame"), null);
    if (!state.fn) {
      var s = slot("graph");
      s.key = null;
      if (s.ctl) { s.ctl.abort(); s.seq++; s.ctl = null; }
      swData = null; graphData = null;
      drawGraph();
      message("Choose a function: the \u21c5 button of a row in the top functions table " +
        "shows its callers and callees.");
      return;
    }
    var p = params({ type: dataType(), name: state.fn, max_nodes: MAX_NODES });
    var path = "/api/v1/sandwich?" + p;
    var f = fetchSlot("graph", path, path, json);
    if (!f) { if (!answerOut("graph")) drawGraph(); return; }
    loading(true);
    f.then(function (j) {
      loading(false); message(""); status("");
      graphData = null; swData = j;
      drawGraph();
    }).catch(graphFailed);
  }
  function swDescribe(node, name) {
    var j = swData;
    return name + " \u2014 " + fmt(node.value, j.unit) + ", " + pct(node.value, j.all) +
      (node.self ? " (self " + fmt(node.self, j.unit) + ")" : "");
  }
  function drawSandwich() {
    var j = swData;
    var totalText = $("subtitle-total");
    if (totalText) totalText.textContent = "";
    $("matched").textContent = "";
    ["callers", "callees"].forEach(function (id) {
      unpaint($(id));
      $(id + "-head").textContent = "";
      $(id + "-head").classList.toggle("hidden", !j);
    });
    if (!j) return;
    var width = Math.max(300, $("graph-box").clientWidth - 2);
    var name = shown(j.name);
    $("callers-head").textContent = "Callers of " + name + " \u2014 total " + fmt(j.total, j.unit) +
      " (" + pct(j.total, j.all) + ")";
    $("callees-head").textContent = "Callees of " + name + " \u2014 total " + fmt(j.total, j.unit) +
      ", self " + fmt(j.self, j.unit);
    $("callers-head").dataset.total = String(j.callers.value);
    $("callees-head").dataset.total = String(j.callees.value);
    $("callees-head").dataset.self = String(j.self);
    paint($("callers"), j.callers, width, false, "", swDescribe);
    paint($("callees"), j.callees, width, true, "", swDescribe);
    if (totalText) totalText.textContent = "Function " + name + ": " + fmt(j.total, j.unit) + " of " +
      fmt(j.all, j.unit) + " (" + pct(j.total, j.all) + "), self " + fmt(j.self, j.unit) +
      ", from " + j.profiles + " profile" + (j.profiles === 1 ? "" : "s") + ".";
  }
  ["callers", "callees"].forEach(function (id) {
    pointer($(id), function (i, it) { // another function: its sandwich
      // (a caller with self value is a thread name: the callers end there)
      if (it.depth > 0 && (id === "callees" || !it.node.self)) go({ fn: it.node.name });
    });
  });
  function describe(node, name) {
    var j = graphData, total = j.total || j.tree.value;
    return name + " \u2014 " + fmt(node.value, j.unit) + ", " + pct(node.value, total) +
      (node.self ? " (self " + fmt(node.self, j.unit) + ")" : "");
  }
  function pathOf(i) { // names from the drawn root down to frame i
    var out = [];
    while (i > 0) { out.push(drawn[i].node.name); i = drawn[i].parent; }
    return out.reverse();
  }
  function renderCrumbs() {
    var box = $("crumbs");
    if (!state.focus.length) return;
    var parts = ["all"].concat(state.focus);
    parts.forEach(function (name, i) {
      if (i) box.appendChild(document.createTextNode(" \u203a "));
      var b = document.createElement("button");
      b.className = "crumb"; b.textContent = name;
      b.addEventListener("click", function () { go({ focus: state.focus.slice(0, i) }); });
      box.appendChild(b);
    });
  }
  ["side-a", "side-b"].forEach(function (id) { // a click: that function, marked in both
    pointer($(id), function (i, it) {
      if (it.depth > 1) go({ search: "^" + escapeRegex(it.node.name) + "$" });
    });
  });
  pointer($("graph"), function (i) {
    if (i > 0) go({ focus: state.focus.concat(pathOf(i)) }); // (the root: already the view)
  });

  // --- the lost or truncated share ---
  function loadBanner() {
    var p = params({ type: dataType(), search: LOST, max_nodes: 1 });
    var path = "/api/v1/tree?" + p;
    var f = fetchSlot("banner", path, path, json);
    if (!f) return;
    f.then(function (j) {
      var b = $("lost-banner"), share = j.matched ? j.matched.share : 0;
      b.classList.toggle("hidden", !(share > 0));
      b.dataset.share = String(100 * share);
      b.textContent = (100 * share).toFixed(2) + "% of this " + KINDS[dataType()].name +
        " profile comes from stacks that were lost or cut short: frames named [lost \u2026 stack: \u2026]" +
        " (the stack could not be read, e.g. a collision in the kernel's stack map) or [truncated]" +
        " (deeper than the walk's limit). Their callers are unknown.";
    }).catch(function (e) {
      if (e.message !== SILENT) $("lost-banner").classList.add("hidden");
    });
  }

  // --- the top table: every row, only the visible ones in the document ---
  function loadTop() {
    var sort = state.sort === "name" ? "self" : state.sort;
    var path = "/api/v1/top?" + params({ type: dataType(), sort: sort, limit: TOP_LIMIT });
    var f = fetchSlot("top", path, path, json);
    if (!f) { if (!answerOut("top")) drawTop(); return; }
    f.then(function (j) { topData = j; drawTop(); }).catch(function (e) {
      if (e.message === SILENT) return;
      topData = null; drawTop();
    });
  }
  var topRows = [];
  function drawTop() {
    Array.prototype.forEach.call(document.querySelectorAll("#top .head button"), function (b) {
      var on = b.dataset.sort === state.sort;
      var arrow = on ? ((b.dataset.sort === "name") !== state.rev ? " \u25b2" : " \u25bc") : "";
      b.textContent = { name: "function", self: "self", total: "total" }[b.dataset.sort] + arrow;
      b.classList.toggle("on", on);
    });
    if (!topData) { topRows = []; $("top-count").textContent = ""; drawRows(true); return; }
    var q = state.tq.toLowerCase();
    var rows = q ? topData.rows.filter(function (r) { return r.name.toLowerCase().indexOf(q) >= 0; })
      : topData.rows.slice();
    if (state.sort === "name") {
      rows.sort(function (a, b) { return a.name < b.name ? -1 : a.name > b.name ? 1 : 0; });
    }
    if (state.rev) rows.reverse();
    topRows = rows;
    $("top-count").textContent = q ? rows.length + " of " + topData.rows.length : String(rows.length);
    $("top-spacer").style.height = rows.length * ROW_H + "px";
    drawRows(true);
  }
  var rowsShown = null;
  function drawRows(force) {
    var box = $("top-scroll"), body = $("top-rows");
    var first = Math.max(0, Math.floor(box.scrollTop / ROW_H) - 5);
    var last = Math.min(topRows.length, first + Math.ceil(box.clientHeight / ROW_H) + 10);
    var key = first + ":" + last;
    if (!force && key === rowsShown) return;
    rowsShown = key;
    clear(body);
    body.style.top = first * ROW_H + "px";
    var unit = topData ? topData.unit : "", total = topData ? topData.total : 0;
    for (var i = first; i < last; i++) {
      var row = topRows[i], div = document.createElement("div");
      div.className = "row";
      div.setAttribute("role", "row");
      div.dataset.index = i;
      var sw = document.createElement("button");
      sw.className = "sw"; sw.textContent = "\u21c5";
      sw.title = "callers and callees of " + shown(row.name);
      div.appendChild(sw);
      [shown(row.name), fmt(row.self, unit), fmt(row.total, unit)].forEach(function (t, k) {
        var s = document.createElement("span");
        s.className = k ? "num" : "name";
        s.textContent = t;
        s.title = k ? pct(k === 1 ? row.self : row.total, total) : shown(row.name);
        div.appendChild(s);
      });
      body.appendChild(div);
    }
  }
  function escapeRegex(s) { return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"); }

  // --- compare: the baseline (A) against this view (B), as one differential
  // graph drawn by the server, or as two flame graphs side by side ---
  function compared() { // {a, b}: each a range and its matchers
    var now = Date.now() * 1e6;
    var end = state.from !== null ? Number(state.to) : now;
    var start = state.from !== null ? Number(state.from) : now - sinceNs();
    var b = { from: Math.round(start), to: Math.round(end), match: state.matchers };
    var a = state.baseline === "previous" ?
      { from: Math.round(start - (end - start)), to: Math.round(start), match: state.matchers } :
      { from: b.from, to: b.to, match: state.baselineMatch ? [state.baselineMatch] : [] };
    return { a: a, b: b };
  }
  function loadDiff() {
    var f = $("diff"), side = state.cmp === "side";
    f.classList.toggle("hidden", !state.diff || side);
    $("side").classList.toggle("hidden", !state.diff || !side);
    $("hide-diff").classList.toggle("hidden", !state.diff);
    $("compare-hint").textContent = side ?
      "Each graph's widths are shares of its own total; the headings give both totals." :
      "Red: grew compared with the baseline; blue: shrank.";
    if (!state.diff || side) { slot("diff").key = null; setBlob(f, null); }
    if (!state.diff || !side) {
      ["a", "b"].forEach(function (k) { slot("side-" + k).key = null; sideData[k] = null; });
      drawSide();
    }
    if (!state.diff) return;
    var key = JSON.stringify([params().toString(), state.baseline, state.baselineMatch]);
    var c = compared();
    if (side) { loadSide(key, c); return; }
    var p = new URLSearchParams();
    p.set("type", dataType());
    ["a", "b"].forEach(function (k) {
      p.set(k + "_from", c[k].from); p.set(k + "_to", c[k].to);
      c[k].match.forEach(function (m) { p.append(k + "_match", m); });
    });
    p.set("width", Math.max(300, f.clientWidth - 24 || 1200));
    var req = fetchSlot("diff", key, "/api/v1/diff?" + p, blob);
    if (req) req.then(function (b) { setBlob(f, b); }).catch(report);
  }
  var sideData = { a: null, b: null };
  function loadSide(key, c) {
    drawSide(); // what it has, with this view's search marked
    ["a", "b"].forEach(function (k) {
      var p = new URLSearchParams();
      p.set("type", dataType());
      p.set("from", c[k].from); p.set("to", c[k].to);
      c[k].match.forEach(function (m) { p.append("match", m); });
      p.set("max_nodes", MAX_NODES);
      var req = fetchSlot("side-" + k, key, "/api/v1/tree?" + p, json);
      if (!req) return;
      req.then(function (j) {
        j.range = c[k];
        sideData[k] = j; drawSide();
      }).catch(function (e) {
        if (e.message === SILENT) return;
        sideData[k] = { error: e.status === 404 ? "nothing stored for this range and labels" : e.message,
                        range: c[k] };
        drawSide();
      });
    });
  }
  function drawSide() {
    var width = Math.max(200, Math.floor(($("side").clientWidth - 16) / 2));
    ["a", "b"].forEach(function (k) {
      var j = sideData[k], canvas = $("side-" + k), head = $("side-" + k + "-head");
      unpaint(canvas);
      head.textContent = "";
      delete head.dataset.total;
      if (!j) return;
      var what = (k === "a" ? "Baseline: " : "This view: ") +
        new Date(j.range.from / 1e6).toLocaleTimeString() + " \u2013 " +
        new Date(j.range.to / 1e6).toLocaleTimeString() +
        (j.range.match.length ? ", " + j.range.match.join(", ") : "");
      if (j.error) { head.textContent = what + " \u2014 " + j.error; return; }
      head.textContent = what + " \u2014 total " + fmt(j.total, j.unit);
      head.dataset.total = String(j.total);
      head.dataset.from = String(j.range.from); head.dataset.to = String(j.range.to);
      paint(canvas, j.tree, width, state.view === "icicle", "", function (node, name) {
        return name + " \u2014 " + fmt(node.value, j.unit) + ", " + pct(node.value, j.total) +
          (node.self ? " (self " + fmt(node.self, j.unit) + ")" : "");
      });
    });
  }
  function sinceNs() {
    var m = /^([0-9]+)(s|m|h|d)$/.exec(state.since);
    return m ? Number(m[1]) * { s: 1, m: 60, h: 3600, d: 86400 }[m[2]] * 1e9 : 3600e9;
  }

  // --- one view from the state ---
  function applyTheme() {
    if (state.theme) document.documentElement.setAttribute("data-theme", state.theme);
    else document.documentElement.removeAttribute("data-theme");
  }
  // ``all``: the fields a person may be typing in too (Back, Forward).
  function syncControls(all) {
    var typing = function (id) { return !all && document.activeElement === $(id); };
    $("type").value = state.type;
    var since = $("since");
    if (!Array.prototype.some.call(since.options, function (o) { return o.value === state.since; })) {
      var o = document.createElement("option"); o.value = o.textContent = state.since; since.appendChild(o);
    }
    since.value = state.since;
    $("view").value = state.view;
    $("theme").value = state.theme;
    if (!typing("search")) $("search").value = state.search;
    if (!typing("top-filter")) $("top-filter").value = state.tq;
    $("baseline").value = state.baseline;
    $("compare-mode").value = state.cmp;
    syncBy();
    if (!typing("baseline-match")) $("baseline-match").value = state.baselineMatch;
    var kind = KINDS[state.type];
    var sub = $("subtitle");
    clear(sub);
    var b = document.createElement("b"); b.textContent = kind.name.charAt(0).toUpperCase() + kind.name.slice(1) + ": ";
    sub.appendChild(b);
    sub.appendChild(document.createTextNode(kind.meaning + " "));
    var tot = document.createElement("span"); tot.id = "subtitle-total"; sub.appendChild(tot);
  }
  function render(all) {
    applyTheme();
    syncControls(all === true);
    renderFilters();
    var dl = dataType();
    $("download-pprof").href = "/api/v1/profile?" + params({ type: dl, format: "pprof" });
    $("download-pprof").dataset.file = "ember-" + dl + ".pb.gz";
    $("download-folded").href = "/api/v1/profile?" + params({ type: dl, format: "folded" });
    $("download-folded").dataset.file = "ember-" + dl + ".folded";
    $("range-text").textContent = state.from === null ? "last " + state.since :
      new Date(Number(state.from) / 1e6).toLocaleTimeString() + " \u2013 " +
      new Date(Number(state.to) / 1e6).toLocaleTimeString();
    loadGraph();
    loadBanner();
    // the table after the graph: both come from one merge of the range, and
    // the table's own work (and its 10,000 rows of JSON) would otherwise
    // delay the graph, which is what a person looks at first
    if (graphAsked) graphAsked.then(loadTop, loadTop); else loadTop();
    loadTimeline();
    loadDiff();
  }

  $("type").addEventListener("change", function () { go({ type: this.value, focus: [] }); });
  $("since").addEventListener("change", function () {
    go({ since: this.value, from: null, to: null });
  });
  $("view").addEventListener("change", function () {
    // the sandwich of the searched function, when a table row chose one
    var fn = state.fn, m = /^\^(.*)\$$/.exec(state.search);
    var searched = m ? m[1].replace(/\\(.)/g, "$1") : "";
    if (this.value === "sandwich" && !fn && searched &&
        "^" + escapeRegex(searched) + "$" === state.search) fn = searched;
    go({ view: this.value, fn: fn });
  });
  $("theme").addEventListener("change", function () { go({ theme: this.value }); });
  $("label-name").addEventListener("change", loadValues);
  $("label-op").addEventListener("change", opChanged);
  $("add-filter").addEventListener("click", addFilter);
  $("label-regex").addEventListener("keydown", function (e) { if (e.key === "Enter") addFilter(); });
  $("whole-range").addEventListener("click", function () { go({ from: null, to: null }); });
  $("series-by").addEventListener("change", function () { go({ by: this.value }); });
  $("reset-zoom").addEventListener("click", function () { go({ focus: [] }); });
  $("search").addEventListener("keydown", function (e) {
    if (e.key === "Enter") go({ search: this.value.trim() });
    else if (e.key === "Escape") { this.value = ""; go({ search: "" }); }
  });
  $("search").addEventListener("search", function () { // the field's own clear button
    if (!this.value && state.search) go({ search: "" });
  });
  var typing = null;
  $("top-filter").addEventListener("input", function () {
    var v = this.value;
    clearTimeout(typing);
    // the first keystroke of a filter is a new history entry, the rest amend it
    var replace = state.tq !== "";
    typing = setTimeout(function () { go({ tq: v }, replace && v !== ""); }, 150);
  });
  Array.prototype.forEach.call(document.querySelectorAll("#top .head button"), function (b) {
    b.addEventListener("click", function () {
      var s = b.dataset.sort;
      go(s === state.sort ? { rev: !state.rev } : { sort: s, rev: false });
    });
  });
  $("top-scroll").addEventListener("scroll", function () { drawRows(false); });
  $("top-rows").addEventListener("click", function (e) {
    var row = e.target.closest(".row");
    if (row && topRows[+row.dataset.index]) {
      var name = topRows[+row.dataset.index].name;
      // the row's button, or any row in the sandwich view: that function's sandwich
      if (e.target.closest(".sw") || state.view === "sandwich") go({ view: "sandwich", fn: name });
      else go({ search: "^" + escapeRegex(name) + "$" });
    }
  });
  $("compare").addEventListener("click", function () {
    slot("diff").key = null; // asked again, even for the same view: "now" moved on
    slot("side-a").key = slot("side-b").key = null;
    go({ diff: true, baseline: $("baseline").value, baselineMatch: $("baseline-match").value.trim(),
         cmp: $("compare-mode").value });
  });
  $("hide-diff").addEventListener("click", function () { go({ diff: false }); });
  $("reload").addEventListener("click", function () { dropSlots(); render(); });
  $("download-pprof").addEventListener("click", download);
  $("download-folded").addEventListener("click", download);
  $("signin").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", function () { askToken("Signed out."); });
  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () { drawGraph(); drawRows(true); drawSide(); drawTimeline(); }, 100);
  });

  // What the tests read: the frames of a graph as drawn (page coordinates
  // within the canvas), since a canvas has no elements to query.
  function framesOf(id) {
    return ($(id).frames || []).map(function (it, i) {
      return { i: i, n: it.name, d: it.depth, v: it.node.value, x: it.x, y: it.y, w: it.w,
               h: FRAME_H - 1, match: it.match };
    });
  }
  window.ember = { get state() { return state; }, go: go, render: render, frames: framesOf };
  state = fromQuery(location.search);
  history.replaceState(null, "", location.pathname + "?" + toQuery(state));
  applyTheme();
  enter();
})();
