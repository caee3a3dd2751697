// ember's web UI: plain JavaScript against the collector's API.
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var state = { type: "cpu", since: "1h", from: null, to: null, matchers: [] };
  var lastRange = null; // {start, end} of the last timeline

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

  function loadLabels() {
    fetch("/api/v1/labels").then(function (r) { return r.json(); }).then(function (j) {
      var sel = $("label-name");
      sel.innerHTML = "";
      j.labels.filter(function (n) { return n !== "__name__"; }).forEach(function (n) {
        var o = document.createElement("option"); o.value = o.textContent = n; sel.appendChild(o);
      });
      var pick = j.labels.indexOf("comm") >= 0 ? "comm" : sel.value;
      sel.value = pick;
      loadValues();
    });
  }
  function loadValues() {
    var name = $("label-name").value;
    if (!name) return;
    fetch("/api/v1/labels/" + encodeURIComponent(name) + "/values")
      .then(function (r) { return r.json(); }).then(function (j) {
        var sel = $("label-value");
        sel.innerHTML = "";
        j.values.forEach(function (v) {
          var o = document.createElement("option"); o.value = o.textContent = v; sel.appendChild(o);
        });
      });
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
    fetch("/api/v1/timeline?" + p).then(function (r) { return r.json(); }).then(function (j) {
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
    });
  }

  function loadTop() {
    var type = state.type === "hotcold" ? "cpu" : state.type;
    fetch("/api/v1/top?" + params({ type: type, limit: 40 })).then(function (r) {
      if (!r.ok) return r.json().then(function (j) { throw new Error(j.error); });
      return r.json();
    }).then(function (j) {
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
    }).catch(function (e) { status(e.message); $("top").querySelector("tbody").innerHTML = ""; });
  }

  function refresh() {
    renderFilters();
    $("flame").src = "/api/v1/flamegraph?" + params({ width: frameWidth($("flame")) });
    var dl = state.type === "hotcold" ? "cpu" : state.type;
    $("download-pprof").href = "/api/v1/profile?" + params({ type: dl, format: "pprof" });
    $("download-folded").href = "/api/v1/profile?" + params({ type: dl, format: "folded" });
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
    f.src = "/api/v1/diff?" + p;
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
  window.ember = { state: state, refresh: refresh };
  loadLabels();
  refresh();
})();
