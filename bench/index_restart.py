#!/usr/bin/env python3
"""A collector's restart on a fleet-shaped hour (bench/fleet_hour.py: 200,000
stacks, 25 million rows at --scale 1): how long until its query index is
ready, built from the rows (the first start) against loaded from the file it
saved beside the store (collector/index_file.py) and completed, in the same
run; and the first whole-hour answer after each.

A real ``ember collector`` process serves the generated store (or a copy of
--store); --rounds restarts alternate the two, the baseline by removing the
saved file first.

    .venv/bin/python bench/index_restart.py [--scale 1] [--store PATH] [--rounds 3]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from fleet_hour import extent, hour_at

from common import EMBER, free_port, render, status_kb
from ember.collector.store import Store


def start(path: Path, tmp: Path, query: str) -> tuple[float, float, int]:
    """(s to the index ready, s to the first whole-hour tree, peak RSS KiB
    until then) of one collector start; stops it (it saves its index)."""
    port, grpc_port = free_port(), free_port()
    log = tmp / "collector.log"
    began = time.monotonic()
    proc = subprocess.Popen([*EMBER, "-v", "collector", "--storage", str(path),
                             "--http-listen", f"127.0.0.1:{port}",
                             "--grpc-listen", f"127.0.0.1:{grpc_port}"],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    peak = 0
    try:
        while "query index of" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            peak = max(peak, status_kb(proc.pid, "VmRSS"))
            time.sleep(0.05)
        ready = time.monotonic() - began
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/tree?{query}",
                               timeout=600).read()
        answered = time.monotonic() - began
        peak = max(peak, status_kb(proc.pid, "VmRSS"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    return ready, answered, peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--store", help="an existing generated store (copied)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        path = tmp / "store.duckdb"
        hour_at(path, args.scale, args.store)
        store = Store(path)
        type_, first, last = extent(store)
        store.close()
        query = f"type={type_}&from={first}&to={last}&max_nodes=5000"
        saved = Path(str(path) + ".index.npz")
        built, loaded = [], []
        for _ in range(args.rounds):
            saved.unlink(missing_ok=True)
            built.append(start(path, tmp, query))
            assert saved.exists(), "the collector saved no index"
            loaded.append(start(path, tmp, query))
        size = saved.stat().st_size
    rows = []
    for what, k in (("index ready", 0), ("first whole-hour tree", 1)):
        b = [x[k] for x in built]
        f = [x[k] for x in loaded]
        ratios = [x / y for x, y in zip(b, f, strict=True)]
        rows.append([what, f"{statistics.median(b):.1f}", f"{statistics.median(f):.1f}",
                     f"{statistics.median(ratios):.1f}x (min {min(ratios):.1f}x)"])
    rows.append(["peak RSS until then, MB", f"{max(x[2] for x in built) / 1024:.0f}",
                 f"{max(x[2] for x in loaded) / 1024:.0f}", ""])
    print(render(f"Collector start, index built vs loaded ({size / 1e6:.0f} MB file), "
                 f"median of {args.rounds}",
                 ["s after start", "built from rows", "loaded", "built / loaded"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
