"""The web UI's views in a real browser (Debian's chromium driven by
Playwright), against ONE collector a real agent filled from compiled
workloads (a module-scoped fixture; the agent stops before the checks, so
what the page shows and what the API answers are the same numbers).

Every check compares what the page shows with what the API answers, or with
numbers computed from the folded output: the view state in the URL (a new
page, Back and Forward), the top table (every row, sorted, filtered), label
filters with all four operators, the lost/truncated banner, a type that was
not collected, dark mode, deep stacks, icicle, subtitles, and a late answer
that must not overwrite a newer view."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from ember import config
from ember.collector.server import Collector
from ember.config import AgentConfig, CollectorConfig, Targets
from tests.support.agent import running_agent
from tests.support.browser import (
    BROWSER_ARGS,
    CHROMIUM,
    DRAWN_MS,
    click_frame,
    colours,
    frames,
    named,
    wait_frame,
)
from tests.support.net import free_port

pytestmark = [pytest.mark.bpf,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed")]
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
SINCE = "15m"  # the page's default range
LOST = r"^\[(lost|truncated)"
WORKLOADS = (("cpu_shares",), ("offcpu_waits",), ("nofp_chain", "deep"))
# Many distinct native functions (the interpreter's), for a top table longer
# than its box.
BUSY_PYTHON = """
import decimal, fractions, hashlib, json, random, re, time, zlib
end = time.time() + 600
d = {"a": [1, 2.5, "x" * 50, None, True], "b": {"c": list(range(50))}}
while time.time() < end:
    s = json.dumps(d)
    json.loads(s)
    re.findall(r"[a-z]+[0-9]", s * 3)
    hashlib.sha256(s.encode()).hexdigest()
    zlib.decompress(zlib.compress(s.encode()))
    sorted(random.random() for _ in range(200))
    decimal.Decimal(1) / decimal.Decimal(7)
    fractions.Fraction(3, 7) ** 3
    "-".join(str(i) for i in range(100)).split("-")
    time.sleep(0.002)
"""


@dataclass
class Views:
    collector: Collector
    url: str
    browser: Any
    shots: Path


def _has_data(c: Collector) -> bool:
    def ok(kind: str, comm: str) -> bool:
        code = c.api.handle("/api/v1/top", {"type": [kind], "match": [f"comm={comm}"],
                                            "since": [SINCE]})[0]
        return bool(code == 200)
    return ok("cpu", "cpu_shares") and ok("cpu", "nofp_chain") and ok("offcpu", "offcpu_waits")


@pytest.fixture(scope="module")
def views(fixture_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Views]:
    """A collector a real agent filled for a few seconds (then stopped), and
    a browser: shared by every test of the module."""
    playwright = pytest.importorskip("playwright.sync_api")
    tmp = tmp_path_factory.mktemp("views")
    procs = [subprocess.Popen([str(fixture_bin / name), "600", *args], stdout=subprocess.PIPE,
                              text=True) for name, *args in WORKLOADS]
    port = free_port()
    c = Collector(CollectorConfig(grpc_listen=f"127.0.0.1:{port}", http_listen="127.0.0.1:0",
                                  storage=str(tmp / "db.sqlite")))
    c.start()
    try:
        pids = []
        for p in procs:
            line = p.stdout.readline() if p.stdout else ""
            assert line.startswith("ready "), line
            pids.append(int(line.split()[1]))
        procs.append(subprocess.Popen([sys.executable, "-c", BUSY_PYTHON]))
        pids.append(procs[-1].pid)
        cfg = config.override(AgentConfig(), collector=f"127.0.0.1:{port}", interval=1.0,
                              frequency=199, metrics_listen="127.0.0.1:0",
                              spool_dir=str(tmp / "spool"), targets=Targets(pids=tuple(pids)))
        with running_agent(cfg):
            deadline = time.monotonic() + 90  # a loaded machine attaches and ships late
            while not _has_data(c) and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(4)  # a few more profiles of each
        for p in procs:
            p.kill()
        assert _has_data(c)
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
            yield Views(c, f"http://127.0.0.1:{c.http_port}/", browser, tmp)
            browser.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        c.close()


@pytest.fixture(autouse=True)
def _pages_closed(views: Views) -> Iterator[None]:
    """Each test's pages closed after it, also when it failed before its own
    close: a page left open goes on asking the shared collector, whose
    queries are bounded (a busy machine then answers the next tests 503)."""
    yield
    for ctx in views.browser.contexts:
        ctx.close()


# --- helpers ---

def api(c: Collector, path: str, **params: str | list[str]) -> Any:
    """The API's JSON answer, asked in-process as the page asks over HTTP."""
    q = {k: v if isinstance(v, list) else [v] for k, v in params.items()}
    q.setdefault("since", [SINCE])
    code, body, _ = c.api.handle(path, q)
    assert code == 200, body
    return json.loads(body)


def folded_share(c: Collector, pattern: str, **params: str | list[str]) -> float:
    """The share (percent) of the folded output's value under a frame that
    matches ``pattern``, computed here from the lines."""
    q = {k: v if isinstance(v, list) else [v] for k, v in params.items()}
    q.setdefault("since", [SINCE])
    code, body, _ = c.api.handle("/api/v1/profile", {**q, "format": ["folded"]})
    assert code == 200, body
    rx = re.compile(pattern)
    hit = whole = 0
    for line in body.decode().splitlines():
        stack, _, value = line.rpartition(" ")
        whole += int(value)
        if any(rx.search(f) for f in stack.split(";")):
            hit += int(value)
    return 100 * hit / whole


def seconds(s: float) -> str:
    """app.js's seconds()."""
    if s == 0:
        return "0"
    if abs(s) >= 1:
        return f"{s:.2f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} \u00b5s"


def new_page(v: Views, **context: Any) -> Any:
    """A page in a context of its own, not yet opened (routes go in first)."""
    return v.browser.new_context(viewport={"width": 1500, "height": 1000}, **context).new_page()


def open_page(v: Views, query: str = "", **context: Any) -> Any:
    page = new_page(v, **context)
    page.goto(v.url + query)
    return page


def drawn(page: Any, name: str = "") -> None:
    """Wait until the graph shows (a frame named ``name``) and nothing loads."""
    wait_frame(page, name)
    page.wait_for_function(
        "window.ember.frames('graph').length > 0"
        " && document.getElementById('loading').classList.contains('hidden')",
        timeout=DRAWN_MS)


def names_at(page: Any, depth: int) -> set[str]:
    return {f["n"] for f in frames(page) if f["d"] == depth}


def root_value(page: Any) -> int:
    return int(frames(page)[0]["v"])


def shown_rows(page: Any) -> list[str]:
    return list(page.eval_on_selector_all("#top-rows .row .name", "s => s.map(x => x.textContent)"))


def wait_rows(page: Any, names: list[str]) -> None:
    """Wait until the table's first rows are the first of ``names`` (up to
    ten: two orders can share a first row, and the table drawn in the
    order before must not pass for the new one)."""
    page.wait_for_function(
        "want => { const r = [...document.querySelectorAll('#top-rows .row .name')]"
        ".map(x => x.textContent); const k = Math.min(want.length, 10);"
        " return r.length >= k && want.slice(0, k).every((w, i) => r[i] === w); }",
        arg=names, timeout=DRAWN_MS)


def legend(page: Any, n: int) -> None:
    """Wait until the timeline's legend shows at least n series; a page
    without the chart library (a copy not set up: make web) says so at once
    rather than as a timeout."""
    page.wait_for_function(
        "n => document.querySelectorAll('#series-legend .series').length >= n"
        " || typeof window.uPlot !== 'function'", arg=n, timeout=DRAWN_MS)
    assert page.evaluate("typeof window.uPlot === 'function'"), \
        "the page has no chart library: /vendor/uPlot.iife.min.js is not built here (make web)"


def wait_asked(page: Any, asked: Callable[[], bool], what: str) -> None:
    """Let the page run until a held route was asked (``asked()``)."""
    deadline = time.monotonic() + 30
    while not asked() and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert asked(), f"{what} was never asked for"


def save(v: Views, page: Any, name: str, **kw: Any) -> None:
    """A screenshot for the docs (docs/images/ui-NAME.png), kept with the run's."""
    path = v.shots / f"ui-{name}.png"
    page.screenshot(path=str(path), **kw)
    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, DOCS_IMAGES / path.name)


# --- the tests ---

def test_opens_on_15_minutes_with_the_range_and_type_in_the_url(views: Views) -> None:
    page = open_page(views)
    drawn(page, "work_b")
    assert page.input_value("#since") == "15m"
    assert "type=cpu" in page.url and "since=15m" in page.url
    whole = api(views.collector, "/api/v1/tree", type="cpu", max_nodes="1")
    assert root_value(page) == whole["total"]
    # the subtitle: what on-CPU means, and the total in samples
    sub = page.inner_text("#subtitle")
    assert "On-CPU" in sub and f"Total: {whole['total']} samples" in sub, sub
    save(views, page, "flamegraph", full_page=True)
    page.context.close()


def test_url_restores_the_view_and_back_forward_walk_through_views(views: Views) -> None:
    c = views.collector
    page = open_page(views)
    drawn(page, "work_b")
    page.select_option("#type", "offcpu")
    drawn(page, "wait_sleep")
    page.select_option("#label-name", "comm")
    page.wait_for_function("document.querySelectorAll('#label-value option').length >= 2")
    page.select_option("#label-value", ["offcpu_waits"])
    page.click("#add-filter")
    page.wait_for_function("document.querySelectorAll('#filters .chip').length === 1")
    page.fill("#search", "^wait_")
    page.press("#search", "Enter")
    page.wait_for_function("document.getElementById('matched').dataset.share !== undefined")
    page.select_option("#view", "icicle")
    page.select_option("#theme", "dark")
    url = page.url
    assert matchers_in(url) == ["comm=offcpu_waits"] and "view=icicle" in url
    assert "theme=dark" in url

    # the copied URL, in a new page: the same view
    other = open_page(views, url[len(views.url):])
    drawn(other, "wait_sleep")
    assert other.input_value("#type") == "offcpu"
    assert other.inner_text("#filters") == page.inner_text("#filters")
    assert "comm=offcpu_waits" in other.inner_text("#filters")
    assert other.input_value("#search") == "^wait_"
    assert other.input_value("#view") == "icicle"
    assert other.get_attribute("html", "data-theme") == "dark"
    want = api(c, "/api/v1/tree", type="offcpu", match="comm=offcpu_waits", search="^wait_",
               max_nodes="1")
    share = float(other.get_attribute("#matched", "data-share") or -1)
    assert abs(share - 100 * want["matched"]["share"]) < 0.01
    assert root_value(other) == want["total"]
    other.context.close()

    # Back: each step undoes one choice; Forward redoes it
    page.go_back()
    page.wait_for_function("!document.documentElement.hasAttribute('data-theme')")
    page.go_back()
    page.wait_for_function("document.getElementById('view').value === 'flame'")
    page.go_back()
    page.wait_for_function("document.getElementById('search').value === ''")
    page.go_back()
    page.wait_for_function("document.querySelectorAll('#filters .chip').length === 0")
    assert "match=" not in page.url
    page.go_back()
    page.wait_for_function("document.getElementById('type').value === 'cpu'")
    drawn(page, "work_b")
    assert root_value(page) == api(c, "/api/v1/tree", type="cpu", max_nodes="1")["total"]
    page.go_forward()
    page.wait_for_function("document.getElementById('type').value === 'offcpu'")
    drawn(page, "wait_sleep")
    page.context.close()


def test_zoom_is_in_the_url_and_fetches_the_subtree(views: Views) -> None:
    c = views.collector
    page = open_page(views)
    drawn(page, "work_b")
    click_frame(page, max(named(page, "work_b"), key=lambda f: f["w"]))
    wait_frame(page, "work_b", depth=0)
    drawn(page)
    focus = re.search(r"focus=([^&]+)", page.url)
    assert focus, page.url
    path = page.evaluate("window.ember.state.focus")
    assert path[-1] == "work_b"
    sub = api(c, "/api/v1/tree", type="cpu", focus=";".join(path), max_nodes="5000")
    assert sub["focus"] == path and root_value(page) == sub["tree"]["value"]
    # the zoomed frame fills the width; its children are the subtree's
    width = page.evaluate("document.getElementById('graph').getBoundingClientRect().width")
    root_w = frames(page)[0]["w"]
    assert abs(root_w - width) < 1
    assert {ch["name"] for ch in sub["tree"]["children"]
            if ch["value"] / sub["tree"]["value"] * width >= 0.5} == names_at(page, 1)
    assert page.locator("#reset-zoom").is_visible()
    # a new page with the URL: the same zoom
    other = open_page(views, page.url[len(views.url):])
    wait_frame(other, "work_b", depth=0)
    assert root_value(other) == sub["tree"]["value"]
    other.context.close()
    # Back: the whole graph again
    page.go_back()
    wait_frame(page, "all", depth=0)
    assert "focus=" not in page.url
    page.context.close()


def test_search_share_is_the_whole_profiles(views: Views) -> None:
    c = views.collector
    pattern = "^work_[ab]$"
    page = open_page(views)
    drawn(page, "work_b")
    page.fill("#search", pattern)
    page.press("#search", "Enter")
    page.wait_for_function("document.getElementById('matched').dataset.share !== undefined",
                           timeout=DRAWN_MS)
    share = float(page.get_attribute("#matched", "data-share") or -1)
    want = api(c, "/api/v1/tree", type="cpu", search=pattern, max_nodes="1")["matched"]["share"]
    assert abs(share - 100 * want) < 0.01
    computed = folded_share(c, pattern, type="cpu")
    assert abs(share - computed) < 0.1, (share, computed)
    assert f"{share:.2f}%" in page.inner_text("#matched")
    # matching frames are highlighted, the others not
    hits = [f["n"] for f in frames(page) if f["match"]]
    assert hits and set(hits) <= {"work_a", "work_b"}
    save(views, page, "search", full_page=True)
    page.context.close()


def test_a_late_answer_does_not_overwrite_a_newer_view(views: Views) -> None:
    page = open_page(views)
    drawn(page, "work_b")
    held: list[Any] = []

    def hold(route: Any) -> None:
        held.append(route)  # answered only after the newer view is drawn

    page.route(re.compile(r".*/api/v1/tree\?.*type=offcpu.*max_nodes=5000.*"), hold)
    page.select_option("#type", "offcpu")
    page.wait_for_function("document.getElementById('loading').offsetParent !== null")
    wait_asked(page, lambda: bool(held), "the off-CPU graph")
    page.select_option("#type", "cpu")
    drawn(page, "work_b")
    # now the older answer arrives: the real off-CPU tree
    code, body, _ = views.collector.api.handle(
        "/api/v1/tree", {"type": ["offcpu"], "since": [SINCE], "max_nodes": ["5000"]})
    assert code == 200
    with contextlib.suppress(Exception):  # the page aborted it: dropped all the same
        held[0].fulfill(status=200, body=body, content_type="application/json")
    page.wait_for_timeout(2000)
    assert page.input_value("#type") == "cpu"
    off = json.loads(body)
    cpu = api(views.collector, "/api/v1/tree", type="cpu", max_nodes="1")
    assert off["total"] != cpu["total"]
    assert root_value(page) == cpu["total"]  # samples, not the off-CPU microseconds
    assert named(page, "work_b")
    assert f"Total: {cpu['total']} samples" in page.inner_text("#subtitle")
    page.context.close()


def test_top_table_every_row_sorted_by_self_total_and_name_and_filtered(views: Views) -> None:
    c = views.collector
    by_self = api(c, "/api/v1/top", type="cpu", sort="self", limit="10000")
    by_total = api(c, "/api/v1/top", type="cpu", sort="total", limit="10000")
    n = len(by_self["rows"])
    assert n > 40, n  # more than fit: the table is virtualised
    page = open_page(views)
    drawn(page, "work_b")
    page.wait_for_function(f"document.getElementById('top-count').textContent === '{n}'",
                           timeout=DRAWN_MS)
    shown = shown_rows(page)
    assert 10 <= len(shown) < n  # only the visible rows (and a few more) are in the document
    assert shown == [r["name"] for r in by_self["rows"][:len(shown)]]
    first = page.locator("#top-rows .row").first.locator("span")
    assert first.nth(1).inner_text() == seconds(by_self["rows"][0]["self"] / 1e9)
    assert first.nth(2).inner_text() == seconds(by_self["rows"][0]["total"] / 1e9)
    spacer = page.evaluate("document.getElementById('top-spacer').offsetHeight")
    assert spacer == 20 * n

    # by total: the API's order, to the last row
    page.click("#top .head button[data-sort='total']")
    assert "sort=total" in page.url
    wait_rows(page, [r["name"] for r in by_total["rows"]])
    shown = shown_rows(page)
    assert shown == [r["name"] for r in by_total["rows"][:len(shown)]]
    page.eval_on_selector("#top-scroll", "e => { e.scrollTop = e.scrollHeight; }")
    page.wait_for_function(
        "t => { const r = document.querySelectorAll('#top-rows .row .name');"
        " return r.length > 0 && r[r.length - 1].textContent === t; }",
        arg=by_total["rows"][-1]["name"], timeout=DRAWN_MS)
    assert page.locator("#top-rows .row").count() < n
    bottom = shown_rows(page)
    assert bottom == [r["name"] for r in by_total["rows"][n - len(bottom):]]
    page.eval_on_selector("#top-scroll", "e => { e.scrollTop = 0; }")

    # by name, then reversed
    names = sorted(r["name"] for r in by_self["rows"])
    page.click("#top .head button[data-sort='name']")
    wait_rows(page, names)
    shown = shown_rows(page)
    assert shown == names[:len(shown)]
    page.click("#top .head button[data-sort='name']")
    wait_rows(page, names[::-1])
    assert "sort=name" in page.url and "rev=1" in page.url

    # the search box keeps the rows with the text, in the same order
    page.click("#top .head button[data-sort='total']")
    wait_rows(page, [r["name"] for r in by_total["rows"]])
    page.fill("#top-filter", "spin")
    want = [r["name"] for r in by_total["rows"] if "spin" in r["name"].lower()]
    page.wait_for_function(
        f"document.getElementById('top-count').textContent === '{len(want)} of {n}'",
        timeout=DRAWN_MS)
    assert shown_rows(page) == want[:len(shown_rows(page))]
    page.wait_for_function("location.search.includes('tq=spin')")
    page.fill("#top-filter", "")
    page.wait_for_function(f"document.getElementById('top-count').textContent === '{n}'")
    page.locator("aside").screenshot(path=str(views.shots / "ui-top-table.png"))
    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    shutil.copy(views.shots / "ui-top-table.png", DOCS_IMAGES / "ui-top-table.png")
    page.context.close()


def _add(page: Any, op: str, values: list[str] | None = None, regex: str = "") -> None:
    chips = page.locator("#filters .chip").count()
    page.select_option("#label-name", "comm")
    page.wait_for_function("document.querySelectorAll('#label-value option').length >= 3")
    page.select_option("#label-op", op)
    if values is not None:
        page.select_option("#label-value", values)
    else:
        page.fill("#label-regex", regex)
    page.click("#add-filter")
    page.wait_for_function(f"document.querySelectorAll('#filters .chip').length > {chips}")


def _check(page: Any, c: Collector, matchers: list[str]) -> set[str]:
    """The graph shows the API's total for these matchers; the threads drawn."""
    want = api(c, "/api/v1/tree", type="cpu", match=matchers, max_nodes="1")["total"]
    page.wait_for_function(
        "v => { const g = window.ember.frames('graph')[0];"
        " return g !== undefined && g.v === v"
        " && document.getElementById('loading').classList.contains('hidden'); }",
        arg=want, timeout=DRAWN_MS)
    assert sorted(page.evaluate("window.ember.state.matchers")) == sorted(matchers)
    return names_at(page, 1)


def matchers_in(url: str) -> list[str]:
    return parse_qs(urlsplit(url).query).get("match", [])


def _remove_all(page: Any) -> None:
    while page.locator("#filters .chip").count():
        n = page.locator("#filters .chip").count()
        page.locator("#filters .chip").first.click()
        page.wait_for_function(f"document.querySelectorAll('#filters .chip').length < {n}")


def test_label_filters_with_four_operators_and_several_values(views: Views) -> None:
    c = views.collector
    page = open_page(views)
    drawn(page, "work_b")
    # = with two values: either of them
    _add(page, "=", ["cpu_shares", "nofp_chain"])
    assert page.inner_text("#filters").count("\u00d7") == 2
    threads = _check(page, c, ["comm=cpu_shares", "comm=nofp_chain"])
    assert threads <= {"cpu_shares", "nofp_chain"} and "cpu_shares" in threads
    assert matchers_in(page.url) == ["comm=cpu_shares", "comm=nofp_chain"]
    save(views, page, "filters")
    # a chip removed: the other stays
    page.locator("#filters .chip[data-matcher='comm=nofp_chain']").click()
    threads = _check(page, c, ["comm=cpu_shares"])
    assert "nofp_chain" not in threads
    _remove_all(page)
    # !=
    _add(page, "!=", ["nofp_chain"])
    threads = _check(page, c, ["comm!=nofp_chain"])
    assert "nofp_chain" not in threads and "cpu_shares" in threads
    _remove_all(page)
    # =~ (anchored)
    _add(page, "=~", regex="cpu.*")
    threads = _check(page, c, ["comm=~cpu.*"])
    assert "nofp_chain" not in threads and "cpu_shares" in threads
    assert matchers_in(page.url) == ["comm=~cpu.*"]
    # and !~ with it: every matcher holds
    _add(page, "!~", regex="cpu_s.*")
    assert "=~" in page.inner_text("#filters") and "!~" in page.inner_text("#filters")
    page.wait_for_function("document.getElementById('graph-message').textContent.startsWith('No ')",
                           timeout=DRAWN_MS)
    page.locator("#filters .chip[data-matcher='comm=~cpu.*']").click()
    threads = _check(page, c, ["comm!~cpu_s.*"])
    assert "cpu_shares" not in threads and "nofp_chain" in threads
    page.context.close()


def test_banner_shows_the_lost_and_truncated_share(views: Views) -> None:
    c = views.collector
    want = api(c, "/api/v1/tree", type="cpu", search=LOST, max_nodes="1")["matched"]["share"]
    computed = folded_share(c, LOST, type="cpu")
    assert want > 0  # nofp_chain recurses deeper than a stack walk goes: [truncated]
    page = open_page(views)
    drawn(page, "work_b")
    banner = page.locator("#lost-banner")
    banner.wait_for(timeout=DRAWN_MS)
    share = float(banner.get_attribute("data-share") or -1)
    assert abs(share - 100 * want) < 0.01
    assert abs(share - computed) < 0.1, (share, computed)
    assert f"{share:.2f}%" in banner.inner_text() and "[truncated]" in banner.inner_text()
    # none without the deep workload
    page.select_option("#label-name", "comm")
    page.wait_for_function("document.querySelectorAll('#label-value option').length >= 3")
    page.select_option("#label-op", "!=")
    page.select_option("#label-value", ["nofp_chain"])
    page.click("#add-filter")
    rest = api(c, "/api/v1/tree", type="cpu", search=LOST, match="comm!=nofp_chain",
               max_nodes="1")["matched"]["share"]
    page.wait_for_function(
        "s => Math.abs(+document.getElementById('lost-banner').dataset.share - s) < 1e-6",
        arg=100 * rest, timeout=DRAWN_MS)
    assert banner.is_visible() == (rest > 0)
    page.context.close()


def test_a_type_not_collected_is_a_sentence_naming_the_setting(views: Views) -> None:
    stored = api(views.collector, "/api/v1/types")
    assert stored["aliases"]["wakeup"] not in stored["types"]
    page = open_page(views, "?type=wakeup")
    msg = page.locator("#graph-message")
    page.wait_for_function(
        "document.getElementById('graph-message').textContent.includes('agent.wakeup')",
        timeout=DRAWN_MS)
    text = msg.inner_text()
    assert text.startswith("No wakeup profiles are stored.") and "agent.wakeup is true" in text
    assert "{" not in text and "error" not in text
    assert frames(page) == []
    assert "Wakeup" in page.inner_text("#subtitle")
    page.context.close()


def test_dark_mode_follows_the_system_and_the_toggle_is_in_the_url(views: Views) -> None:
    bg = "getComputedStyle(document.body).backgroundColor"

    def dark(page: Any) -> bool:
        r, g, b = (int(x) for x in re.findall(r"\d+", page.evaluate(bg))[:3])
        return (r + g + b) / 3 < 80

    page = open_page(views, color_scheme="dark")
    drawn(page, "work_b")
    assert page.input_value("#theme") == "" and dark(page)
    shot = page.screenshot(full_page=True)
    n, warm, _ = colours(shot)
    assert n > 30 and warm > 5000, (n, warm)  # the graph keeps its colours
    save(views, page, "dark", full_page=True)
    page.select_option("#theme", "light")
    page.wait_for_function("location.search.includes('theme=light')")
    assert not dark(page)
    page.context.close()
    page = open_page(views, "?theme=dark", color_scheme="light")
    drawn(page, "work_b")
    assert dark(page)
    page.context.close()


def test_a_deep_stack_grows_the_graph_box(views: Views) -> None:
    page = open_page(views)
    drawn(page, "recurse")
    height = page.evaluate("document.getElementById('graph').getBoundingClientRect().height")
    assert height > 520  # [truncated] stacks of 100+ frames
    box = page.locator("#graph-box").bounding_box()
    assert box is not None and box["height"] >= height
    assert page.evaluate("(e => e.scrollHeight <= e.clientHeight + 1)"
                         "(document.getElementById('graph-box'))")
    graph = page.locator("#graph").bounding_box()
    assert graph is not None and graph["y"] >= box["y"] - 1
    assert graph["y"] + graph["height"] <= box["y"] + box["height"] + 1
    assert max(f["y"] + f["h"] for f in frames(page)) <= graph["height"]
    page.context.close()


def test_icicle_puts_the_root_on_top(views: Views) -> None:
    page = open_page(views, "?view=icicle")
    drawn(page, "work_b")
    ys = {d: min(f["y"] for f in frames(page) if f["d"] == d) for d in (0, 1)}
    assert ys[0] == 0 and ys[1] > ys[0]
    save(views, page, "icicle")
    page.select_option("#view", "flame")
    page.wait_for_function("window.ember.frames('graph')[0].y > 0")
    depth = int(page.get_attribute("#graph", "data-depth") or 0)
    assert frames(page)[0]["y"] == depth * 17
    page.context.close()


@pytest.mark.parametrize("kind,words", [("offcpu", "time blocked")])
def test_time_profiles_show_their_unit_and_meaning(views: Views, kind: str, words: str) -> None:
    tree = api(views.collector, "/api/v1/tree", type=kind, max_nodes="1")
    assert tree["unit"] == "microseconds"
    page = open_page(views, f"?type={kind}")
    drawn(page, "wait_sleep")
    sub = page.inner_text("#subtitle")
    assert "Off-CPU" in sub and words in sub, sub
    assert f"Total: {seconds(tree['total'] / 1e6)}" in sub, sub
    page.context.close()


def _frames(page: Any, canvas: str) -> list[tuple[int, str, int]]:
    """(depth, name, value) of the frames drawn in one of the sandwich's graphs."""
    return [(f["d"], f["n"], f["v"]) for f in frames(page, canvas)]


def test_sandwich_shows_the_callers_and_callees_the_api_gives(views: Views) -> None:
    want = api(views.collector, "/api/v1/sandwich", type="cpu", name="work_a", max_nodes="5000")
    top = api(views.collector, "/api/v1/top", type="cpu", limit="10000")
    row = next(r for r in top["rows"] if r["name"] == "work_a")
    assert (want["total"], want["self"]) == (row["total"], row["self"])
    page = open_page(views, "?view=sandwich&fn=work_a")
    wait_frame(page, depth=0, canvas="callees")
    assert page.input_value("#view") == "sandwich"
    callers, callees = _frames(page, "callers"), _frames(page, "callees")
    assert (0, "work_a", want["total"]) in callers and (0, "work_a", want["total"]) in callees
    total = seconds(want["total"] / 1e9)
    assert total in page.inner_text("#callers-head") and total in page.inner_text("#callees-head")
    assert seconds(want["self"] / 1e9) in page.inner_text("#callees-head")
    # the immediate callers (drawn above the function) and callees (below it): the API's
    for drawn_frames, tree in ((callers, want["callers"]), (callees, want["callees"])):
        children = {(1, c["name"], c["value"]) for c in tree["children"]}
        shown_children = {f for f in drawn_frames if f[0] == 1}
        assert shown_children and shown_children <= children
        assert max(children, key=lambda c: c[2]) in shown_children
    ys = [frames(page, s)[0]["y"] for s in ("callers", "callees")]
    assert ys[0] == int(page.get_attribute("#callers", "data-depth") or 0) * 17 and ys[1] == 0
    page.context.close()
    # the table's button opens the sandwich of its row, in the URL
    page = open_page(views, "?tq=work_a")
    wait_rows(page, ["work_a"])
    page.click("#top-rows .row .sw")
    page.wait_for_function("location.search.includes('view=sandwich')"
                           " && location.search.includes('fn=work_a')")
    wait_frame(page, depth=0, canvas="callees")
    assert int(page.get_attribute("#callees-head", "data-total") or -1) == want["total"]
    page.context.close()


def test_compare_side_by_side_shows_each_label_sets_tree(views: Views) -> None:
    c = views.collector
    page = open_page(views, "?match=comm%3Dcpu_shares&baseline=labels"
                            "&baseline_match=comm%3Dnofp_chain&diff=1&cmp=side")
    for k in ("a", "b"):
        page.wait_for_function(f"document.getElementById('side-{k}-head').dataset.total"
                               " !== undefined", timeout=DRAWN_MS)
    # (the controls follow the URL at the first render, once the page has
    # its labels: read them after, not as soon as the page has loaded)
    assert page.input_value("#compare-mode") == "side"
    assert page.locator("#diff").is_hidden()
    for k, comm, mine, other in (("a", "nofp_chain", "recurse", "work_a"),
                                 ("b", "cpu_shares", "work_a", "recurse")):
        head = page.locator(f"#side-{k}-head")
        span = {e: head.get_attribute(f"data-{e}") or "" for e in ("from", "to")}
        want = api(c, "/api/v1/tree", type="cpu", match=f"comm={comm}", max_nodes="5000", **span)
        shown = frames(page, f"side-{k}")
        assert int(head.get_attribute("data-total") or -1) == want["total"]
        assert shown[0]["d"] == 0 and shown[0]["v"] == want["tree"]["value"]
        assert {f["n"] for f in shown if f["d"] == 1} == {
            t["name"] for t in want["tree"]["children"]
            if t["value"] / want["tree"]["value"] * shown[0]["w"] >= 0.5}
        names = {f["n"] for f in shown}
        assert mine in names and other not in names, (k, sorted(names)[:20])
        assert f"total {want['total']} samples" in head.inner_text()  # on-CPU: a count
    # a click on a function marks it in both graphs (a search, in the URL)
    click_frame(page, max(named(page, "work_a", "side-b"), key=lambda f: f["w"]), "side-b")
    page.wait_for_function("location.search.includes('search=')")
    page.wait_for_function("window.ember.frames('side-b').some(f => f.match)", timeout=DRAWN_MS)
    assert {f["n"] for f in frames(page, "side-b") if f["match"]} == {"work_a"}
    # the differential graph from the same choice
    page.select_option("#compare-mode", "diff")
    page.click("#compare")
    page.wait_for_function("!location.search.includes('cmp=side')")
    page.frame_locator("#diff").locator("#title").wait_for(timeout=DRAWN_MS)
    assert page.locator("#side").is_hidden()
    page.context.close()


def test_timeline_series_per_label_value_and_brush(views: Views) -> None:
    c = views.collector
    page = open_page(views, "?by=comm")
    drawn(page, "work_b")
    legend(page, 3)
    assert page.input_value("#series-by") == "comm"
    assert page.locator("#timeline canvas").count() >= 1  # uPlot drew it
    shown = dict(page.eval_on_selector_all(
        "#series-legend .series[data-value]",
        "bs => bs.map(b => [b.dataset.value, +b.dataset.total])"))
    assert {"cpu_shares", "nofp_chain"} <= set(shown)
    # each value's total is its own tree's (the timeline sums the profiles'
    # samples; the tree, the stacks' rows), over the same range
    answer = api(c, "/api/v1/timeline", type="cpu", by="comm", buckets="120")
    span = {"from": str(answer["start"]), "to": str(answer["end"])}
    for value, total in shown.items():
        tree = api(c, "/api/v1/tree", type="cpu", match=f"comm={value}", max_nodes="1", **span)
        assert total == tree["total"], (value, total, tree["total"])
    buttons = page.locator("#series-legend .series").all()
    assert sum(sum(s["values"]) for s in answer["series"]) == sum(
        int(b.get_attribute("data-total") or 0) for b in buttons)
    # a value's button filters on it
    page.locator("#series-legend .series[data-value='cpu_shares']").click()
    page.wait_for_function("window.ember.state.matchers.includes('comm=cpu_shares')")
    _check(page, c, ["comm=cpu_shares"])
    # a drag on the chart picks that part of the range: the graph shows its total
    # (the chart is drawn again when the filtered answer comes, with its one
    # series: the box taken before that draw replaced the chart was None)
    page.wait_for_function(
        "document.getElementById('timeline').dataset.series === '1'"
        " && document.querySelector('#timeline .u-over') !== null", timeout=DRAWN_MS)
    over = page.locator("#timeline .u-over").bounding_box()
    assert over is not None
    page.mouse.move(over["x"] + over["width"] * 0.5, over["y"] + over["height"] / 2)
    page.mouse.down()
    page.mouse.move(over["x"] + over["width"] * 0.99, over["y"] + over["height"] / 2, steps=5)
    page.mouse.up()
    page.wait_for_function("location.search.includes('from=')")
    state = page.evaluate("window.ember.state")
    lo, hi = int(state["from"]), int(state["to"])
    assert answer["start"] < lo < hi <= answer["end"] + 10**9
    want = api(c, "/api/v1/tree", type="cpu", match="comm=cpu_shares", max_nodes="1",
               **{"from": str(lo), "to": str(hi)})["total"]
    page.wait_for_function(
        "v => { const g = window.ember.frames('graph')[0];"
        " return g !== undefined && g.v === v"
        " && document.getElementById('loading').classList.contains('hidden'); }",
        arg=want, timeout=DRAWN_MS)
    # a new page with the URL: the same series and range
    other = open_page(views, page.url[len(views.url):])
    legend(other, 1)
    assert other.input_value("#series-by") == "comm"
    other.context.close()
    page.context.close()


def test_a_render_while_the_timeline_loads_keeps_the_chart_until_its_answer(views: Views) -> None:
    page = open_page(views, "?by=comm")
    drawn(page, "work_b")
    legend(page, 3)
    held: list[Any] = []

    def hold(route: Any) -> None:
        held.append(route)  # let through once the second render is done

    page.route(re.compile(r".*/api/v1/timeline\?.*cpu_shares.*"), hold)
    # every draw sets the chart's series count: record each one from here on
    page.evaluate(
        "window.draws = []; new MutationObserver(rs => rs.forEach(r =>"
        " window.draws.push(r.target.dataset.series))).observe("
        "document.getElementById('timeline'),"
        " {attributes: true, attributeFilter: ['data-series']})")
    page.locator("#series-legend .series[data-value='cpu_shares']").click()
    wait_asked(page, lambda: bool(held), "the filtered timeline")
    # another render while that answer is out (any choice renders every view):
    # the chart waits for its answer rather than drawing the old series again
    page.click("#top .head button[data-sort='name']")
    page.wait_for_function("window.ember.state.sort === 'name'")
    page.wait_for_timeout(500)
    assert page.evaluate("window.draws") == []
    held[0].continue_()
    page.wait_for_function("window.draws.length > 0", timeout=DRAWN_MS)
    assert set(page.evaluate("window.draws")) == {"1"}
    page.context.close()


def test_a_busy_collector_is_asked_again_after_its_retry_after(views: Views) -> None:
    # the collector answers 503 with Retry-After once its query workers and
    # queue are full (httpserve): the page asks again rather than leaving the
    # graph with an error and the timeline empty
    page = new_page(views)
    asked: dict[str, list[float]] = {"tree": [], "timeline": []}

    def busy(route: Any) -> None:
        view = "timeline" if "/timeline?" in route.request.url else "tree"
        asked[view].append(time.monotonic())
        if len(asked[view]) <= 2:
            route.fulfill(status=503, headers={"Retry-After": "1"},
                          content_type="application/json",
                          body=json.dumps({"error": "busy, try again"}))
        else:
            route.continue_()

    page.route(re.compile(r".*/api/v1/tree\?.*max_nodes=5000.*"), busy)
    page.route(re.compile(r".*/api/v1/timeline\?.*"), busy)
    page.goto(views.url + "?by=comm")
    drawn(page, "work_b")
    legend(page, 3)
    assert page.inner_text("#graph-message") == ""
    for view, times in asked.items():
        assert len(times) == 3, (view, times)  # twice busy, then answered
        # Retry-After: 1 s, then twice that (each spread up to half as much again)
        assert times[1] - times[0] >= 0.95 and times[2] - times[1] >= 1.95, (view, times)
    page.context.close()


def test_a_timeline_that_cannot_be_read_says_why_until_one_can(views: Views) -> None:
    page = new_page(views)

    def broken(route: Any) -> None:
        route.fulfill(status=500, content_type="application/json",
                      body=json.dumps({"error": "the store failed to read"}))

    timeline = re.compile(r".*/api/v1/timeline\?.*")
    page.route(timeline, broken)
    page.goto(views.url + "?by=comm")
    drawn(page, "work_b")   # the graph is not held up by it
    page.wait_for_function(
        "document.getElementById('timeline').textContent.includes('the store failed to read')",
        timeout=DRAWN_MS)
    assert page.inner_text("#timeline").startswith("The timeline could not be read")
    assert page.locator("#series-legend .series").count() == 0
    # the next answer that comes draws the chart in its place
    page.unroute(timeline)
    page.select_option("#series-by", "")
    page.wait_for_function("document.querySelector('#timeline canvas') !== null",
                           timeout=DRAWN_MS)
    assert "could not be read" not in page.inner_text("#timeline")
    page.context.close()


def test_a_render_while_the_graph_and_table_load_keeps_them_until_their_answers(
        views: Views) -> None:
    page = open_page(views)
    drawn(page, "work_b")
    page.wait_for_function("document.querySelectorAll('#top-rows .row').length > 0",
                           timeout=DRAWN_MS)
    held: dict[str, Any] = {}

    def hold(route: Any) -> None:  # let through once the renders below are done
        held["top" if "/top?" in route.request.url else "tree"] = route

    page.route(re.compile(r".*/api/v1/tree\?.*type=offcpu.*max_nodes=5000.*"), hold)
    page.route(re.compile(r".*/api/v1/top\?.*type=offcpu.*"), hold)
    # every draw from here on: the graph's User Timing mark, the table's rows
    marks = "performance.getEntriesByName('ember:graph').length"
    page.evaluate(
        "performance.clearMarks('ember:graph'); window.rows = 0;"
        " new MutationObserver(() => window.rows++).observe("
        "document.getElementById('top-rows'), {childList: true})")

    page.select_option("#type", "offcpu")
    wait_asked(page, lambda: "tree" in held, "the off-CPU tree")
    # renders while the answers are out (any choice renders every view): the
    # CPU graph and rows stay as they were, not drawn again under the
    # off-CPU type's name. The table is asked once the graph is answered, or
    # at the next render: the first sort asks it, the second comes while
    # both are out.
    page.click("#top .head button[data-sort='name']")
    page.wait_for_function("window.ember.state.sort === 'name'")
    wait_asked(page, lambda: "top" in held, "the off-CPU table")
    page.click("#top .head button[data-sort='name']")
    page.wait_for_function("window.ember.state.rev === true")
    page.wait_for_timeout(500)
    assert page.evaluate(marks) == 0
    assert page.evaluate("window.rows") == 0
    for route in held.values():
        route.continue_()
    page.wait_for_function(f"{marks} > 0 && window.rows > 0", timeout=DRAWN_MS)
    drawn(page)
    assert "samples" not in page.inner_text("#subtitle")  # off-CPU time, not CPU samples
    page.context.close()
