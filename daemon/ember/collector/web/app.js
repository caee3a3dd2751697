// ember's web UI: plain JavaScript against the collector's API.
//
// With a token on the collector, the API answers 401 to requests without
// "Authorization: Bearer TOKEN". The page then asks for the token (a sign-in
// form), keeps it in sessionStorage (this tab, until it closes or signs out)
// and sends it only in that header, never in a URL: graphs and downloads are
// fetched here and shown or saved from blob: URLs, as an iframe's or a
// link's own request could not carry the header.
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var state = { type: "cpu", since: "1h", from: null, to: null, matchers: [] };
  var lastRange = null; // {start, end} of the last timeline

  // --- the token, and every API request ---
  var TOKEN_KEY = "ember.token";
  var SILENT = "ember: answer dropped"; // an error the sign-in form has dealt with
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
  // to requests made before a sign-in or sign-out.
  function api(path) {
    var t = token.get(), gen = generation;
    var init = t ? { headers: { Authorization: "Bearer " + t } } : {};
    return fetch(path, init).then(function (r) {
      if (gen !== generation) throw new Error(SILENT);
      if (r.status === 401) {
        askToken(t ? "The collector refused that token. Check it and sign in again." : "");
        throw new Error(SILENT);
      }
      return r;
    });
  }
  function json(r) {
    return r.json().then(function (j) {
      if (!r.ok) throw new Error(j.error || r.statusText);
      return j;
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
      refresh();
      return json(r).then(fillLabels);
    }).catch(report);
  }
  // No profile data stays on the page once it needs a token.
  function wipe() {
    ["flame", "diff"].forEach(function (id) { shown[id]++; setBlob($(id), null); });
    $("diff").classList.add("hidden");
    $("top").querySelector("tbody").innerHTML = "";
    $("timeline").innerHTML = "";
    $("label-name").innerHTML = $("label-value").innerHTML = "";
    status("");
  }

  // --- graphs and downloads: fetched with the token, kept as blobs ---
  // The graph iframes are sandboxed (scripts and the search prompt, but not
  // this origin): the SVG's own script cannot read the token.
  var shown = { flame: 0, diff: 0 }; // requests per frame: the latest one is shown
  function showGraph(frame, path) {
    var n = ++shown[frame.id];
    api(path).then(function (r) { return r.blob(); }).then(function (blob) {
      if (n === shown[frame.id]) setBlob(frame, blob);
    }).catch(report);
  }
  function setBlob(frame, blob) {
    var old = frame.src;
    frame.src = blob ? URL.createObjectURL(blob) : "about:blank";
    if (old.indexOf("blob:") === 0) URL.revokeObjectURL(old);
  }
  // The links keep the API URL in href, to read or copy (for curl with the
  // header); a click fetches it with the token and saves what comes back.
  function download(e) {
    e.preventDefault();
    var link = e.currentTarget;
    if (!link.dataset.file) return; // before the first refresh: nothing to save yet
    api(link.getAttribute("href")).then(function (r) {
      return r.ok ? r.blob() : json(r);
    }).then(function (blob) {
      var a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = link.dataset.file;
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(function () { URL.revokeObjectURL(a.href); }, 60000);
    }).catch(report);
  }

  function params(extra) {
    var p = new URLSearchParams();
    p.set("type", state.type);
    if (state.from !== null) { p.set("from", state.from); p.set("to", state.to); }
    else p.set("since", state.since);
    state.matchers.forEach(function (m) { p.append("match", m); });
    Object.keys(extra || {}).forEach(function (k) { p.set(k, extra[k]); });
    return p;
  }
  function frameWidth(el) { return Math.max(300, el.clientWidth - 24); }
  function status(text) { $("status").textContent = text || ""; }
  function fmt(v, unit) {
    if (unit === "ns") return v >= 1e9 ? (v / 1e9).toFixed(2) + " s" : (v / 1e6).toFixed(1) + " ms";
    return String(Math.round(v));
  }

  function fillLabels(j) {
    var sel = $("label-name");
    sel.innerHTML = "";
    j.labels.filter(function (n) { return n !== "__name__"; }).forEach(function (n) {
      var o = document.createElement("option"); o.value = o.textContent = n; sel.appendChild(o);
    });
    var pick = j.labels.indexOf("comm") >= 0 ? "comm" : sel.value;
    sel.value = pick;
    loadValues();
  }
  function loadValues() {
    var name = $("label-name").value;
    if (!name) return;
    api("/api/v1/labels/" + encodeURIComponent(name) + "/values")
      .then(json).then(function (j) {
        var sel = $("label-value");
        sel.innerHTML = "";
        j.values.forEach(function (v) {
          var o = document.createElement("option"); o.value = o.textContent = v; sel.appendChild(o);
        });
      }).catch(quiet);
  }
  function renderFilters() {
    var box = $("filters");
    box.innerHTML = "";
    state.matchers.forEach(function (m, i) {
      var c = document.createElement("span");
      c.className = "chip"; c.textContent = m + " \u00d7"; c.title = "remove";
      c.addEventListener("click", function () { state.matchers.splice(i, 1); refresh(); });
      box.appendChild(c);
    });
  }

  function loadTimeline() {
    var type = state.type === "hotcold" ? "cpu" : state.type;
    var p = params({ type: type, buckets: 120 });
    p.delete("from"); p.delete("to"); p.set("since", state.since);
    api("/api/v1/timeline?" + p).then(json).then(function (j) {
      lastRange = j;
      var svg = $("timeline"), w = 1000, h = 60, n = j.values.length;
      var max = Math.max.apply(null, j.values.concat([1]));
      svg.setAttribute("viewBox", "0 0 " + w + " " + h);
      var out = "";
      j.values.forEach(function (v, i) {
        var bh = (v / max) * (h - 4);
        out += '<rect class="bar" x="' + (i * w / n) + '" y="' + (h - bh) + '" width="' +
          Math.max(1, w / n - 1) + '" height="' + bh + '"><title>' + v + "</title></rect>";
      });
      if (state.from !== null) {
        var x0 = (state.from - j.start) / (j.end - j.start) * w;
        var x1 = (state.to - j.start) / (j.end - j.start) * w;
        out += '<rect class="sel" x="' + x0 + '" y="0" width="' + Math.max(1, x1 - x0) + '" height="' + h + '"/>';
      }
      svg.innerHTML = out;
    }).catch(quiet);
  }

  function loadTop() {
    var type = state.type === "hotcold" ? "cpu" : state.type;
    api("/api/v1/top?" + params({ type: type, limit: 40 })).then(json).then(function (j) {
      var body = $("top").querySelector("tbody");
      body.innerHTML = "";
      j.rows.forEach(function (row) {
        var tr = document.createElement("tr");
        [row.name, fmt(row.self, j.unit), fmt(row.total, j.unit)].forEach(function (t, i) {
          var td = document.createElement("td"); td.textContent = t;
          if (i === 0) td.title = t;
          tr.appendChild(td);
        });
        body.appendChild(tr);
      });
      status("");
    }).catch(function (e) { $("top").querySelector("tbody").innerHTML = ""; report(e); });
  }

  function refresh() {
    renderFilters();
    showGraph($("flame"), "/api/v1/flamegraph?" + params({ width: frameWidth($("flame")) }));
    var dl = state.type === "hotcold" ? "cpu" : state.type;
    $("download-pprof").href = "/api/v1/profile?" + params({ type: dl, format: "pprof" });
    $("download-pprof").dataset.file = "ember-" + dl + ".pb.gz";
    $("download-folded").href = "/api/v1/profile?" + params({ type: dl, format: "folded" });
    $("download-folded").dataset.file = "ember-" + dl + ".folded";
    $("range-text").textContent = state.from === null ? "last " + state.since :
      new Date(state.from / 1e6).toLocaleTimeString() + " \u2013 " +
      new Date(state.to / 1e6).toLocaleTimeString();
    loadTimeline();
    loadTop();
  }

  function compare() {
    var p = new URLSearchParams();
    p.set("type", state.type === "hotcold" ? "cpu" : state.type);
    var now = Date.now() * 1e6;
    var end = state.from !== null ? state.to : now;
    var start = state.from !== null ? state.from : now - lastRangeLength();
    p.set("b_from", start); p.set("b_to", end);
    state.matchers.forEach(function (m) { p.append("b_match", m); });
    if ($("baseline").value === "previous") {
      p.set("a_from", start - (end - start)); p.set("a_to", start);
      state.matchers.forEach(function (m) { p.append("a_match", m); });
    } else {
      p.set("a_from", start); p.set("a_to", end);
      var m = $("baseline-match").value.trim();
      if (m) p.append("a_match", m);
    }
    var f = $("diff");
    f.classList.remove("hidden");
    p.set("width", frameWidth(f));
    showGraph(f, "/api/v1/diff?" + p);
  }
  function lastRangeLength() {
    return lastRange ? lastRange.end - lastRange.start : 3600e9;
  }

  // timeline brushing
  (function () {
    var svg = $("timeline"), downX = null;
    function frac(e) {
      var r = svg.getBoundingClientRect();
      return Math.min(1, Math.max(0, (e.clientX - r.left) / r.width));
    }
    svg.addEventListener("mousedown", function (e) { downX = frac(e); });
    svg.addEventListener("mouseup", function (e) {
      if (downX === null || !lastRange) return;
      var a = Math.min(downX, frac(e)), b = Math.max(downX, frac(e));
      downX = null;
      if (b - a < 0.005) return;
      var span = lastRange.end - lastRange.start;
      state.from = Math.round(lastRange.start + a * span);
      state.to = Math.round(lastRange.start + b * span);
      refresh();
    });
  })();

  $("type").addEventListener("change", function () { state.type = this.value; refresh(); });
  $("since").addEventListener("change", function () {
    state.since = this.value; state.from = state.to = null; refresh();
  });
  $("label-name").addEventListener("change", loadValues);
  $("add-filter").addEventListener("click", function () {
    var m = $("label-name").value + "=" + $("label-value").value;
    if ($("label-name").value && state.matchers.indexOf(m) < 0) state.matchers.push(m);
    refresh();
  });
  $("whole-range").addEventListener("click", function () { state.from = state.to = null; refresh(); });
  $("compare").addEventListener("click", compare);
  $("download-pprof").addEventListener("click", download);
  $("download-folded").addEventListener("click", download);
  $("signin").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", function () { askToken("Signed out."); });
  window.ember = { state: state, refresh: refresh };
  enter();
})();
