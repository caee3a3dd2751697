"""The collector's web UI in a real browser (Debian's chromium driven by
Playwright), against a collector filled by a real agent: without a token,
and with one, where a person signs in and the token never shows in a URL."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
from tests.support.record import share_tolerance

pytestmark = pytest.mark.bpf
FREQUENCY = 199
TOKEN = "ui-t0ken-9f3a7c"  # distinctive: searched for in every URL the page requested


@contextmanager
def _filled(start_workload: Any, tmp_path: Path,
            token_file: str = "") -> Iterator[tuple[Collector, dict[str, int]]]:
    """A collector (with token_file, if given) that a real agent filled for
    a few seconds from two workloads."""
    cpu, off = start_workload("cpu_shares"), start_workload("offcpu_waits")
    port = free_port()
    c = Collector(CollectorConfig(grpc_listen=f"127.0.0.1:{port}", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite"), token_file=token_file))
    c.start()
    cfg = config.override(AgentConfig(), collector=f"127.0.0.1:{port}", interval=1.0,
                          frequency=FREQUENCY, metrics_listen="127.0.0.1:0",
                          spool_dir=str(tmp_path / "spool"), token_file=token_file,
                          targets=Targets(pids=(cpu.pid, off.pid)))
    try:
        with running_agent(cfg):
            time.sleep(4)
            deadline = time.monotonic() + 60  # a loaded machine attaches and ships late
            while not _has_data(c) and time.monotonic() < deadline:
                time.sleep(0.5)
        yield c, {"cpu_shares": cpu.pid, "offcpu_waits": off.pid}
    finally:
        c.close()


def _has_data(c: Collector) -> bool:
    """Whether the collector has what the tests draw: on-CPU profiles of
    cpu_shares and off-CPU profiles of offcpu_waits."""
    return all(c.api.handle("/api/v1/top", {"type": [kind], "match": [f"comm={comm}"]})[0] == 200
               for kind, comm in (("cpu", "cpu_shares"), ("offcpu", "offcpu_waits")))


def _samples(c: Collector, *match: str) -> int:
    """How many on-CPU samples the collector holds (of the matching series):
    its CPU time over the sampling period."""
    code, body, _ = c.api.handle("/api/v1/top", {"type": ["cpu"], "match": list(match)})
    assert code == 200, body
    reply = json.loads(body)
    assert reply["unit"] == "ns", reply["unit"]
    return round(reply["total"] * FREQUENCY / 1e9)


@pytest.fixture
def filled_collector(start_workload, tmp_path: Path) -> Iterator[tuple[Collector, dict[str, int]]]:  # type: ignore[no-untyped-def]
    with _filled(start_workload, tmp_path) as filled:
        yield filled


@pytest.fixture
def token_collector(start_workload, tmp_path: Path) -> Iterator[Collector]:  # type: ignore[no-untyped-def]
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with _filled(start_workload, tmp_path, str(token)) as (c, _):
        yield c


def graph_frame(page: Any, selector: str) -> Any:
    """The document a graph iframe shows: a blob: URL, as the page fetches
    the SVG itself (with the token, when it has one)."""
    handle = page.locator(selector).element_handle()
    frame = handle.content_frame() if handle is not None else None
    assert frame is not None and frame.url.startswith("blob:"), frame
    return frame


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed")
def test_ui_zoom_search_offcpu_and_diff(filled_collector, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    playwright = pytest.importorskip("playwright.sync_api")
    collector, pids = filled_collector
    url = f"http://127.0.0.1:{collector.http_port}/"
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(url)
        wait_frame(page, "work_b")
        # the top-functions table lists the hottest function
        page.locator("#top-rows .row").first.wait_for(timeout=DRAWN_MS)
        assert page.locator("#top-rows .row .name").first.inner_text() == "spin"
        shot = page.screenshot(path=str(tmp_path / "cpu.png"))
        n, warm, _ = colours(shot)
        assert n > 30 and warm > 5000, (n, warm)
        # no token on the collector: no sign-in form, no sign-out button
        assert page.locator("#signin-box").is_hidden()
        assert page.locator("#sign-out").is_hidden()

        # click a frame: the page asks for its subtree, which fills the
        # width; its siblings go. The widest work_b: a process's first
        # samples, before its unwind tables were loaded, were walked by frame
        # pointers and stand apart, narrow.
        click_frame(page, max(named(page, "work_b"), key=lambda f: f["w"]))
        wait_frame(page, "work_b", depth=0)
        assert page.locator("#reset-zoom").is_visible()
        width = frames(page)[0]["w"]
        plot = page.evaluate("document.getElementById('graph').getBoundingClientRect().width")
        assert abs(width - plot) < 1
        assert not named(page, "work_a")
        page.click("#reset-zoom")
        wait_frame(page, "work_a")

        # search by regex: the matched share of the whole profile
        page.fill("#search", "^work_[ab]$")
        page.press("#search", "Enter")
        page.wait_for_function("document.getElementById('matched').dataset.share !== undefined",
                               timeout=DRAWN_MS)
        share = float(page.get_attribute("#matched", "data-share") or -1)
        # truth: work_a 35% + work_b 50% of cpu_shares' samples, which are
        # most of the on-CPU samples shown (offcpu_waits runs a little)
        n, mine = _samples(collector), _samples(collector, "comm=cpu_shares")
        truth = 85 * mine / n
        assert abs(share - truth) <= share_tolerance(truth, n), (share, truth, n)
        page.screenshot(path=str(tmp_path / "search.png"))
        page.fill("#search", "")
        page.press("#search", "Enter")
        # (the search gone before the switch: a graph drawn with it greys
        # every frame it does not match, and a clean-clone run saw 707 blue
        # pixels of the 3,000 asked)
        page.wait_for_function("document.getElementById('matched').dataset.share === undefined",
                               timeout=DRAWN_MS)

        # switch to off-CPU: a blue graph with the waiting functions
        page.select_option("#type", "offcpu")
        # (wait_sleep can be a frame of the CPU graph too: a clean-clone run's
        # screenshot showed that graph under "Loading...", 832 blue pixels)
        wait_frame(page, "wait_sleep")
        page.wait_for_function(
            "document.getElementById('loading').classList.contains('hidden')"
            " && window.ember.state.type === 'offcpu'", timeout=DRAWN_MS)
        assert "Off-CPU" in page.inner_text("#subtitle")
        shot = page.screenshot(path=str(tmp_path / "offcpu.png"))
        _, _, blue = colours(shot)
        assert blue > 3000, blue

        # filter by process, then compare with another process as baseline
        page.select_option("#type", "cpu")
        page.select_option("#label-name", "comm")
        page.wait_for_function(
            "document.querySelectorAll('#label-value option').length >= 2")
        page.select_option("#label-value", "cpu_shares")
        page.click("#add-filter")
        assert "comm=cpu_shares" in page.locator("#filters").inner_text()
        page.select_option("#baseline", "labels")
        page.fill("#baseline-match", "comm=offcpu_waits")
        page.click("#compare")
        diff = page.frame_locator("#diff")
        diff.locator("g.f[data-n='work_a']").first.wait_for(timeout=DRAWN_MS)
        assert "Differential" in (diff.locator("#title").text_content() or "")
        fill = diff.locator("g.f[data-n='work_a'] rect").first.get_attribute("fill")
        assert fill is not None and fill.startswith("rgb(255,")  # grew: red
        page.locator("#diff").scroll_into_view_if_needed()
        shot = page.screenshot(path=str(tmp_path / "diff.png"), full_page=True)
        n, warm, _ = colours(shot)
        assert n > 30 and warm > 3000

        # downloads are real profiles
        href = page.get_attribute("#download-pprof", "href")
        assert href and "format=pprof" in href and "match=comm%3Dcpu_shares" in href
        browser.close()
    for name in ("cpu", "search", "offcpu", "diff"):
        shutil.copy(tmp_path / f"{name}.png", Path("/tmp") / f"ember-ui-{name}.png")
    del pids


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed")
def test_ui_sign_in_with_token(token_collector: Collector, tmp_path: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    from ember.encode.pprof import decode_pprof

    url = f"http://127.0.0.1:{token_collector.http_port}/"
    seen: list[tuple[str, str | None]] = []  # (URL, Authorization) of every request
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.on("request", lambda r: seen.append((r.url, r.headers.get("authorization"))))
        page.goto(url)
        # the page itself loads without the token, then asks for it
        page.locator("#signin-box").wait_for(timeout=DRAWN_MS)
        assert page.get_attribute("#token", "type") == "password"
        assert page.locator("#sign-out").is_hidden()

        # a wrong token: refused with a message, and the form again
        page.fill("#token", "wrong-token")
        page.click("#signin button[type=submit]")
        page.wait_for_function(
            "document.getElementById('signin-message').textContent.includes('refused')")
        assert page.locator("#signin-box").is_visible()
        assert page.evaluate("sessionStorage.length") == 0

        # the right one: a drawn flame graph, the token in sessionStorage only
        page.fill("#token", TOKEN)
        page.press("#token", "Enter")
        wait_frame(page, "work_b")
        assert page.locator("#signin-box").is_hidden()
        assert page.locator("#sign-out").is_visible()
        page.locator("#top-rows .row").first.wait_for(timeout=DRAWN_MS)
        assert page.locator("#top-rows .row .name").first.inner_text() == "spin"
        n, warm, _ = colours(page.screenshot(path=str(tmp_path / "signed-in.png")))
        assert n > 30 and warm > 5000, (n, warm)
        assert page.evaluate("sessionStorage.getItem('ember.token')") == TOKEN
        assert page.evaluate("[localStorage.length, document.cookie]") == [0, ""]

        # a download is fetched with the header and saved from a blob
        with page.expect_download() as info:
            page.click("#download-pprof")
        download = info.value
        assert download.suggested_filename == "ember-cpu.pb.gz"
        assert "spin" in decode_pprof(Path(download.path()).read_bytes()).string_table
        # and so is the differential graph
        page.click("#compare")
        title = page.frame_locator("#diff").locator("#title")
        title.wait_for(timeout=DRAWN_MS)
        assert "Differential" in (title.text_content() or "")
        # a graph's own script runs sandboxed: it cannot read the token
        reach = graph_frame(page, "#diff").evaluate(
            "() => { try { return parent.sessionStorage.getItem('ember.token'); }"
            " catch (e) { return e.name; } }")
        assert reach == "SecurityError", reach

        # a reload in the same tab stays signed in (and shows the same view)
        page.reload()
        wait_frame(page, "work_b")
        page.frame_locator("#diff").locator("#title").wait_for(timeout=DRAWN_MS)
        assert page.locator("#signin-box").is_hidden()
        frame_urls = [f.url for f in page.frames]

        # sign out: the token and the profile data go, the form comes back
        page.click("#sign-out")
        page.locator("#signin-box").wait_for()
        assert page.inner_text("#signin-message") == "Signed out."
        assert page.evaluate("sessionStorage.length") == 0
        assert page.locator("#top-rows .row").count() == 0
        assert frames(page) == []
        assert page.get_attribute("#diff", "data-blob") == ""
        diff_frame = page.locator("#diff").element_handle().content_frame()
        deadline = time.monotonic() + 30
        while diff_frame.url != "about:blank" and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        assert diff_frame.url == "about:blank", diff_frame.url
        assert page.url.startswith(url + "?") and "diff=1" in page.url
        browser.close()

    urls = [u for u, _ in seen] + frame_urls
    assert not [u for u in urls if TOKEN in u or "wrong-token" in u]
    signed = [i for i, (_, auth) in enumerate(seen) if auth == f"Bearer {TOKEN}"]
    later_api = [auth for u, auth in seen[signed[0]:] if "/api/v1/" in u]
    assert len(later_api) >= 10 and set(later_api) == {f"Bearer {TOKEN}"}, later_api
    shutil.copy(tmp_path / "signed-in.png", Path("/tmp/ember-ui-signed-in.png"))
