#!/usr/bin/env python3
"""The web UI on a fleet-shaped hour (bench/fleet_hour.py: 200,000 distinct
stacks, 25 million sample rows at --scale 1), measured in Debian's chromium.

A real ``ember collector`` serves the generated store (or a copy of
--store); once its index is built, the page is opened on the whole hour and
the figures are the browser's own clocks (User Timing marks the page sets
when it has drawn the graph, ``ember:graph``, and around drawing,
``ember:paint``):

- open: from the start of navigation to the graph drawn, the first time
  (the hour merged for this range: each round's range is a second earlier
  than the last's) and again (the tree cached);
- zoom: from a click on a frame to its subtree drawn, and Back;
- search: from Enter in the search field to the graph with its matches;
- paint: the drawing alone, of each of those.

A zoom, Back or a search is drawn at once from what the page has ("view
drawn"), then again from the server's answer ("answer drawn").

    .venv/bin/python bench/ui_render.py [--scale 1] [--store PATH] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from fleet_hour import extent, hour_at

from common import EMBER, free_port, render
from ember.collector.store import Store

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
DRAWN = """n => performance.getEntriesByName('ember:graph').length > n
  && document.getElementById('loading').classList.contains('hidden')"""
LAST = """() => {
  const g = performance.getEntriesByName('ember:graph'),
        p = performance.getEntriesByName('ember:paint');
  return [g.length, g[g.length - 1].startTime, p[p.length - 1].duration,
          window.ember.frames('graph').length];
}"""


def _marks(page: Any) -> tuple[int, float, float, int]:
    n, at, paint, frames = page.evaluate(LAST)
    return int(n), float(at), float(paint), int(frames)


def _act(page: Any, script: str, arg: object = None) -> tuple[float, float, float, int]:
    """Run ``script`` in the page (it returns performance.now() when it acted);
    (ms to the view first drawn: at once from what the page has, else the
    answer; ms to the server's answer drawn; ms of that paint; frames)."""
    n = _marks(page)[0]
    began = float(page.evaluate(script, arg))
    page.wait_for_function(DRAWN, arg=n, timeout=120_000)
    first = float(page.evaluate("n => performance.getEntriesByName('ember:graph')[n].startTime",
                                n))
    _, at, paint, frames = _marks(page)
    return first - began, at - began, paint, frames


CLICK = """d => {
  const fs = window.ember.frames('graph').filter(f => f.d === d);
  fs.sort((a, b) => b.v - a.v);
  const c = document.getElementById('graph'), r = c.getBoundingClientRect(), f = fs[0];
  const t = performance.now();
  c.dispatchEvent(new MouseEvent('click', {bubbles: true, clientX: r.left + f.x + f.w / 2,
                                           clientY: r.top + f.y + f.h / 2}));
  return t;
}"""
BACK = "() => { const t = performance.now(); history.back(); return t; }"
SEARCH = """re => {
  const s = document.getElementById('search');
  s.value = re;
  const t = performance.now();
  s.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));
  return t;
}"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--store", help="an existing generated store (copied)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.duckdb"
        hour_at(path, args.scale, args.store)
        store = Store(path)
        type_, first, last = extent(store)
        store.close()
        port, grpc_port = free_port(), free_port()
        log = Path(tmp) / "collector.log"
        proc = subprocess.Popen([*EMBER, "-v", "collector", "--storage", str(path),
                                 "--http-listen", f"127.0.0.1:{port}",
                                 "--grpc-listen", f"127.0.0.1:{grpc_port}"],
                                stdout=subprocess.DEVNULL, stderr=log.open("w"))
        base = f"http://127.0.0.1:{port}"
        try:
            while True:
                try:
                    urllib.request.urlopen(base + "/healthz", timeout=5).read()
                    break
                except OSError:
                    time.sleep(0.2)
            began = time.monotonic()
            while "query index of" not in log.read_text():  # built at start
                assert proc.poll() is None, log.read_text()
                time.sleep(0.2)
            print(f"index built after {time.monotonic() - began:.1f} s", file=sys.stderr)
            rows = _measure(sync_playwright, f"{base}/?type={type_}", first, last, args.rounds)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(render("The web UI on a 200,000-stack hour (ms, the browser's clock: median"
                 " (slowest) of the rounds)",
                 ["", "view drawn", "answer drawn", "paint", "frames"], rows))
    return 0


def _measure(sync_playwright: Any, url: str, first: int, last: int,
             rounds: int) -> list[list[str]]:
    """Each round opens the page on the hour moved back by a second more (a
    range no answer was cached for, and no earlier one slides to), works in
    it, then opens the same range again (its trees cached)."""
    out: dict[str, list[tuple[float, float, float, int]]] = {}

    def add(name: str, got: tuple[float, float, float, int]) -> None:
        out.setdefault(name, []).append(got)

    def open_page(browser: Any, at: str) -> tuple[Any, tuple[float, float, float, int]]:
        page = browser.new_context(viewport={"width": 1500, "height": 1000}).new_page()
        page.goto(at)
        page.wait_for_function(DRAWN, arg=0, timeout=120_000)
        _, drawn, paint, frames = _marks(page)
        return page, (drawn, drawn, paint, frames)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for i in range(rounds):
                at = f"{url}&from={first - i * 10**9}&to={last - i * 10**9}"
                page, got = open_page(browser, at)
                add("open, the hour merged", got)
                for depth in (2, 3):
                    add("zoom: click to subtree drawn", _act(page, CLICK, depth))
                add("back: to the whole hour drawn", _act(page, BACK))
                add("search: Enter to matches drawn", _act(page, SEARCH, f"function_1{i}"))
                page.context.close()
                page, got = open_page(browser, at)
                add("open again, tree cached", got)
                page.context.close()
        finally:
            browser.close()
    def ms(got: list[tuple[float, float, float, int]], k: int) -> str:
        xs = [x[k] for x in got]
        return f"{statistics.median(xs):.0f} ({max(xs):.0f})"
    return [[name, ms(got, 0), ms(got, 1), f"{statistics.median(x[2] for x in got):.1f}",
             f"{statistics.median(x[3] for x in got):.0f}"] for name, got in out.items()]

if __name__ == "__main__":
    sys.exit(main())
