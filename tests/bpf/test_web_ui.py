"""The collector's web UI in a real browser (Debian's chromium driven by
Playwright), against a collector filled by a real agent."""

from __future__ import annotations

import io
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ember import config
from ember.collector.server import Collector
from ember.config import AgentConfig, CollectorConfig, Targets
from tests.support.agent import running_agent
from tests.support.net import free_port

pytestmark = pytest.mark.bpf
CHROMIUM = "/usr/bin/chromium"



@pytest.fixture
def filled_collector(start_workload, tmp_path: Path) -> Iterator[tuple[Collector, dict[str, int]]]:  # type: ignore[no-untyped-def]
    cpu, off = start_workload("cpu_shares"), start_workload("offcpu_waits")
    port = free_port()
    c = Collector(CollectorConfig(grpc_listen=f"127.0.0.1:{port}", http_listen="127.0.0.1:0",
                                  storage=str(tmp_path / "db.sqlite")))
    c.start()
    cfg = config.override(AgentConfig(), collector=f"127.0.0.1:{port}", interval=1.0,
                          frequency=199, metrics_listen="127.0.0.1:0",
                          spool_dir=str(tmp_path / "spool"),
                          targets=Targets(pids=(cpu.pid, off.pid)))
    with running_agent(cfg):
        time.sleep(4)
    yield c, {"cpu_shares": cpu.pid, "offcpu_waits": off.pid}
    c.close()


def colours(png: bytes) -> tuple[int, int, int]:
    """(distinct colours, warm pixels, blue pixels) of a screenshot."""
    from PIL import Image

    raw = Image.open(io.BytesIO(png)).convert("RGB").tobytes()
    pixels = [tuple(raw[i:i + 3]) for i in range(0, len(raw), 3)]
    warm = sum(1 for r, g, b in pixels if r > 190 and b < 120 and r - b > 100)
    blue = sum(1 for r, g, b in pixels if b > 190 and b - r > 60)
    return len(set(pixels)), warm, blue


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed")
def test_ui_zoom_search_offcpu_and_diff(filled_collector, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    playwright = pytest.importorskip("playwright.sync_api")
    collector, pids = filled_collector
    url = f"http://127.0.0.1:{collector.http_port}/"
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-quic"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(url)
        flame = page.frame_locator("#flame")
        flame.locator("g.f[data-n='work_b']").first.wait_for(timeout=20_000)
        # the top-functions table lists the hottest function
        page.locator("#top tbody tr").first.wait_for()
        assert page.locator("#top tbody tr td").first.inner_text() == "spin"
        shot = page.screenshot(path=str(tmp_path / "cpu.png"))
        n, warm, _ = colours(shot)
        assert n > 30 and warm > 5000, (n, warm)

        # click a frame: it fills the width, its siblings go
        frame = page.frame(url=lambda u: "/api/v1/flamegraph" in u)
        assert frame is not None
        frame.locator("g.f[data-n='work_b'] rect").first.click()
        assert "hidden" not in (frame.locator("#reset").get_attribute("class") or "")
        width = float(frame.locator("g.f[data-n='work_b'] rect").first.get_attribute("width") or 0)
        plot = float(frame.locator("svg").get_attribute("data-plot-w") or 0)
        assert abs(width - plot) < 1
        assert "hide" in (frame.locator("g.f[data-n='work_a']").first.get_attribute("class") or "")
        frame.locator("#reset").click()
        assert "hide" not in (frame.locator("g.f[data-n='work_a']").first.get_attribute("class")
                              or "")

        # search by regex (Ctrl-F opens the prompt): matched share shown
        page.once("dialog", lambda d: d.accept("^work_[ab]$"))
        frame.locator("svg").press("Control+f")
        matched = frame.locator("#matched")
        matched.wait_for()
        text = matched.text_content() or ""
        share = float(text.split(":")[1].strip().rstrip("%"))
        assert 70 <= share <= 90, text  # work_a 35% + work_b 50% of the process
        page.screenshot(path=str(tmp_path / "search.png"))

        # switch to off-CPU: a blue graph with the waiting functions
        page.select_option("#type", "offcpu")
        off = page.frame_locator("#flame")
        off.locator("g.f[data-n='wait_sleep']").first.wait_for(timeout=20_000)
        assert "Off-CPU" in (off.locator("#title").text_content() or "")
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
        diff.locator("g.f[data-n='work_a']").first.wait_for(timeout=20_000)
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
