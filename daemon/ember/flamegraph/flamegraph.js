(function () {
  var svg = document.documentElement.tagName === "svg" ? document.documentElement
            : document.querySelector("svg");
  var d = svg.dataset, total = +d.total, plotW = +d.plotW, padX = +d.padX;
  var fh = +d.frameH, padTop = +d.padTop, depth = +d.depth, inverted = d.inverted === "true";
  var frames = Array.prototype.slice.call(svg.querySelectorAll("g.f"));
  var details = svg.querySelector("#details");
  var reset = svg.querySelector("#reset"), search = svg.querySelector("#search");
  var matchedText = svg.querySelector("#matched");
  var charW = 0.59 * 12, zoomO = 0, zoomV = total, zoomD = 0, current = null;

  function name(g) { return g.dataset.n; }
  function y(dep) { return inverted ? padTop + dep * fh : padTop + (depth - dep) * fh; }
  function label(text, w) {
    var fits = Math.floor((w - 6) / charW);
    if (fits < 3) return "";
    return text.length <= fits ? text : text.slice(0, fits - 2) + "..";
  }
  function layout() {
    frames.forEach(function (g) {
      var o = +g.dataset.o, v = +g.dataset.v, dep = +g.dataset.d;
      var r = g.querySelector("rect"), t = g.querySelector("text");
      if (!t) {
        t = document.createElementNS("http://www.w3.org/2000/svg", "text");
        g.appendChild(t);
      }
      var inside = o + v > zoomO && o < zoomO + zoomV;
      var ancestor = dep < zoomD && o <= zoomO && o + v >= zoomO + zoomV;
      if (!inside || (dep < zoomD && !ancestor) || (v / zoomV) * plotW < 0.1) {
        g.classList.add("hide"); return;
      }
      g.classList.remove("hide");
      g.classList.toggle("faded", ancestor && zoomD > 0);
      var x0 = Math.max(o, zoomO), x1 = Math.min(o + v, zoomO + zoomV);
      var x = padX + (x0 - zoomO) / zoomV * plotW, w = (x1 - x0) / zoomV * plotW;
      r.setAttribute("x", x.toFixed(2)); r.setAttribute("width", w.toFixed(2));
      r.setAttribute("y", y(dep)); t.setAttribute("x", (x + 3).toFixed(2));
      t.setAttribute("y", y(dep) + fh / 2);
      t.textContent = label(name(g), w);
    });
  }
  function zoom(g) {
    current = g; zoomO = +g.dataset.o; zoomV = +g.dataset.v; zoomD = +g.dataset.d;
    reset.classList.remove("hidden"); layout();
  }
  function unzoom() {
    current = null; zoomO = 0; zoomV = total; zoomD = 0; reset.classList.add("hidden"); layout();
  }
  function doSearch(re) {
    var regex;
    try { regex = new RegExp(re); } catch (e) { matchedText.textContent = "bad regex"; return; }
    var spans = [];
    frames.forEach(function (g) {
      var r = g.querySelector("rect");
      if (r.dataset.fill === undefined) r.dataset.fill = r.getAttribute("fill");
      if (re && regex.test(name(g))) {
        r.setAttribute("fill", "rgb(230,0,230)");
        spans.push([+g.dataset.o, +g.dataset.o + +g.dataset.v]);
      } else r.setAttribute("fill", r.dataset.fill);
    });
    // matched share without counting nested matches twice
    spans.sort(function (a, b) { return a[0] - b[0] || b[1] - a[1]; });
    var sum = 0, end = -1;
    spans.forEach(function (s) {
      if (s[0] >= end) { sum += s[1] - s[0]; end = s[1]; }
      else if (s[1] > end) { sum += s[1] - end; end = s[1]; }
    });
    matchedText.textContent = re ? "Matched: " + (100 * sum / total).toFixed(2) + "%" : "";
    svg.dataset.matched = re ? (100 * sum / total).toFixed(2) : "";
  }
  frames.forEach(function (g) {
    g.addEventListener("mouseover", function () {
      details.textContent = g.querySelector("title").textContent;
    });
    g.addEventListener("mouseout", function () { details.textContent = " "; });
    g.addEventListener("click", function (e) { zoom(g); e.stopPropagation(); });
  });
  reset.addEventListener("click", unzoom);
  search.addEventListener("click", function () {
    var re = prompt("Search (regular expression):", "");
    if (re !== null) doSearch(re);
  });
  window.addEventListener("keydown", function (e) {
    if ((e.ctrlKey || e.metaKey) && e.key === "f") {
      e.preventDefault();
      var re = prompt("Search (regular expression):", "");
      if (re !== null) doSearch(re);
    } else if (e.key === "Escape") { unzoom(); doSearch(""); }
  });
  svg.emberZoom = zoom; svg.emberReset = unzoom; svg.emberSearch = doSearch;
  layout();
})();
