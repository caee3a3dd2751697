#!/usr/bin/env python3
"""A range moving on along a fleet-shaped hour: the tree slid from the
last one (collector/window.py) against the same range merged from the rows,
step by step in the same run.

The store is bench/fleet_hour.py's hour (--scale 1: 200,000 stacks, 25M
rows), generated into a temporary directory, or an existing one (--store,
copied first: the collector's store writes). The query API runs in this
process: the first answer of a range five sixths of the hour long (the
index built ahead, as a collector does at start), then --steps moves of 10 s
towards the hour's end, each answered by sliding and, for the baseline, by
an API with nothing to slide from that shares the index.

    .venv/bin/python bench/window_slide.py [--scale 1] [--store PATH] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fleet_hour import extent, hour_at

from common import render
from ember.collector.api import Api
from ember.collector.store import Store

S = 10**9


def timed(api: Api, type_: str, lo: int, hi: int) -> float:
    began = time.perf_counter()
    code, body, _ = api.handle("/api/v1/tree", {"type": [type_], "from": [str(lo)],
                                                "to": [str(hi)]})
    assert code == 200, body[:200]
    return time.perf_counter() - began


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--store", help="an existing generated store (copied)")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store.duckdb"
        hour_at(path, args.scale, args.store)
        store = Store(path)
        type_, first, last = extent(store)
        api = Api(store)
        began = time.perf_counter()
        leaves = api.index.warm()
        warm = time.perf_counter() - began
        length = (last - first) * 5 // 6 // S * S
        lo = first
        cold = timed(api, type_, lo, lo + length)
        slid, merged = [], []
        for _ in range(args.steps):
            lo += 10 * S
            slid.append(timed(api, type_, lo, lo + length))
            fresh = Api(store)
            fresh.index = api.index
            merged.append(timed(fresh, type_, lo, lo + length))
        assert api.windows.slid == args.steps, api.windows.slid
        ratios = [m / s for s, m in zip(slid, merged, strict=True)]
        rows = [["index built ahead", f"{leaves:,} leaves", f"{warm * 1000:.0f}", ""],
                ["first answer", f"{length // S} s range", f"{cold * 1000:.0f}", ""],
                ["slid 10 s, median", "", f"{statistics.median(slid) * 1000:.0f}", ""],
                ["slid 10 s, slowest", "", f"{max(slid) * 1000:.0f}", ""],
                ["merged again, median", "", f"{statistics.median(merged) * 1000:.0f}", ""],
                ["merged / slid, per step", "", "",
                 f"median {statistics.median(ratios):.1f}x (min {min(ratios):.1f}x)"]]
        print(render(f"Sliding a {length // S} s range along {store.count():,} profiles",
                     ["", "", "ms", "ratio"], rows))
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
