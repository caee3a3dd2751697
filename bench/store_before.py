#!/usr/bin/env python3
"""The first store and today's in one run: the same profiles written to
both over gRPC WriteRaw, the same questions asked of both over HTTP.

The first store (gzip pprof blobs in SQLite; every blob of a range decoded
for every request) is the collector at --before (9ded372, the last commit
with it), run from a copy of that commit's ``daemon/`` (``git archive``);
today's is this tree's. Both are real ``ember collector`` processes, one
after the other, on the same machine, so their ratios hold however fast
the machine is at the time.

The hour is the one the issue measured the first store on: 2,880 profiles
(4 hosts x 2 processes, 360 ten-second intervals) of --samples samples
each (100: the first store then takes tens of seconds an answer), drawn
by a Zipf-like popularity from 200,000 distinct stacks grown as prefix
trees over 20,000 functions (bench/fleet_hour.py's shape). Asked:
the whole hour's flame graph (SVG: the route both have), one host's (a
quarter of the series), the top 100 functions, and of today's alone the
pruned trees the UI asks for (a route the first store did not have); the
first answer and the median of the next --repeat. Then each collector's
peak RSS and the store on disk.

    .venv/bin/python bench/store_before.py [--scale 1] [--samples 100]
        [--repeat 2] [--before 9ded372]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np

from common import EMBER, ROOT, fetch, free_port, render, status_kb, wait_healthy
from ember.agent.labels import ProcessLabels, series_labels
from ember.encode.writeraw import make_series
from ember.model import Frame, FrameKind, Mapping, Profile, Sample, cpu_type
from ember.proto import profilestore_pb2 as ps
from ember.proto.profilestore_pb2_grpc import ProfileStoreServiceStub

HOSTS, PROCESSES, INTERVALS = 4, 2, 360
PERIOD_NS = 10_101_010   # 99 Hz
#: (question, route, parameters, whether the first store has the route)
QUESTIONS = [
    ("whole hour: flame graph", "/api/v1/flamegraph", {}, True),
    ("one host: flame graph", "/api/v1/flamegraph", {"match": "host=host-1"}, True),
    ("top 100 functions", "/api/v1/top", {"limit": "100"}, True),
    ("whole hour: pruned tree (today's only)", "/api/v1/tree", {}, False),
    ("one host: pruned tree (today's only)", "/api/v1/tree", {"match": "host=host-1"}, False),
]


def stacks_of(n: int, functions: int, rng: np.random.Generator) -> list[tuple[Frame, ...]]:
    """``n`` distinct stacks as prefix trees over ``functions`` names, as
    bench/fleet_hour.py grows them (a new stack is an older one plus a frame)."""
    exe = Mapping(0x400000, 0x4000000, 0, "/usr/bin/service", "c0ffee")
    frames = [Frame(f"svc::module{i % 97}::function_{i}", FrameKind.USER, exe,
                    0x400000 + 64 * i, file=f"src/module{i % 97}.cc", line=1 + i % 500)
              for i in range(functions)]
    picks = rng.integers(0, functions, size=n)
    parents = rng.random(n)
    out: list[tuple[Frame, ...]] = []
    for i in range(n):
        if i < 64:
            base = tuple(frames[j] for j in rng.integers(0, functions, 8))
        else:
            base = out[int(i - 1 - (parents[i] ** 3) * (i - 1))]
        out.append((*base[-60:], frames[int(picks[i])]))
    return out


def hour(scale: float, samples: int, end_ns: int, seed: int = 1) -> list[ps.WriteRawRequest]:
    """One WriteRaw request per interval: a profile per (host, process)."""
    rng = np.random.default_rng(seed)
    n = int(200_000 * scale)
    stacks = stacks_of(n, max(1000, int(20_000 * scale)), rng)
    weights = 1.0 / np.arange(1, n + 1) ** 0.6
    weights /= weights.sum()
    order = rng.permutation(n)
    draw = random.Random(seed)
    intervals = max(6, int(INTERVALS * scale))
    reqs = []
    for k in range(intervals):
        at = end_ns - (intervals - k) * 10**10
        series = []
        for h in range(HOSTS):
            for p in range(PROCESSES):
                chosen = order[rng.choice(n, size=samples, p=weights)]
                counts = rng.integers(1, 20, size=samples)
                drawn = tuple(Sample(stacks[int(c)], (int(v), int(v) * PERIOD_NS), 1000 + p,
                                       1000 + p + (t := draw.randint(0, 3)), f"worker-{t}")
                                for c, v in zip(chosen, counts, strict=True))
                prof = Profile(cpu_type(99), drawn, at, 10**10)
                labels = series_labels(prof.type, ProcessLabels(pid=1000 + p, comm=f"service-{p}"),
                                       {"host": f"host-{h}"})
                series.append(make_series(replace(prof, labels=labels))[0])
        reqs.append(ps.WriteRawRequest(series=series))
    return reqs


def before_tree(rev: str, into: Path) -> Path:
    """The collector's code at ``rev`` (its ``daemon/``), unpacked into ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "daemon"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "daemon"


def measure(name: str, command: list[str], env: dict[str, str] | None, store: Path,
            reqs: list[ps.WriteRawRequest], repeat: int, old_store: bool) -> dict[str, str]:
    """One collector given the hour, then asked the questions."""
    port, grpc_port = free_port(), free_port()
    proc = subprocess.Popen([*command, "collector", "--storage", str(store),
                             "--http-listen", f"127.0.0.1:{port}",
                             "--grpc-listen", f"127.0.0.1:{grpc_port}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], status_kb(proc.pid, "VmRSS"))
    threading.Thread(target=watch, daemon=True).start()
    out: dict[str, str] = {}
    try:
        wait_healthy(port, proc, f"{name}: the collector")
        stub = ProfileStoreServiceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        began = time.perf_counter()
        for r in reqs:
            stub.WriteRaw(r, timeout=120)
        spent = time.perf_counter() - began
        out["profiles written per second"] = f"{sum(len(r.series) for r in reqs) / spent:.0f}"
        for question, route, params, both in QUESTIONS:
            if old_store and not both:
                continue
            u = f"http://127.0.0.1:{port}{route}?since=2h" + "".join(
                f"&{k}={v}" for k, v in params.items())
            cold = fetch(u, timeout=600)   # (the first store: 1-2 minutes an answer)
            # (the next answers are asked on ranges a second apart: the new
            # store keeps an answer per range, the first keeps none)
            now = time.time_ns()
            rest = [fetch(f"{u}&from={now - 7200 * 10**9}&to={now - i * 10**9}", timeout=600)
                    for i in range(1, repeat + 1)]
            out[f"{question}, first (ms)"] = f"{cold * 1000:.0f}"
            out[f"{question}, a range not asked before (median of {repeat}, ms)"] = \
                f"{statistics.median(rest) * 1000:.0f}"
        out["collector peak RSS (MB)"] = f"{peak[0] / 1024:.0f}"
    finally:
        done.set()
        proc.terminate()
        proc.wait(60)
    files = [p for p in store.parent.iterdir() if p.name.startswith(store.name)]
    out["store on disk (MB)"] = f"{sum(p.stat().st_size for p in files) / 2**20:.0f}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--samples", type=int, default=100, help="samples a profile")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--before", default="9ded372", help="the commit of the first store")
    args = ap.parse_args()
    print("making the hour's profiles", file=sys.stderr)
    reqs = hour(args.scale, args.samples, time.time_ns())
    with tempfile.TemporaryDirectory() as tmp:
        old = before_tree(args.before, Path(tmp) / "before")
        print(f"the first store ({args.before})", file=sys.stderr)
        before = measure("before", [sys.executable, "-c", "import sys; from ember.cli import "
                                    "main; sys.argv[0] = 'ember'; sys.exit(main())"],
                         {"PYTHONPATH": str(old), "PATH": "/usr/bin:/bin"},
                         Path(tmp) / "before.db", reqs, args.repeat, old_store=True)
        print("today's store", file=sys.stderr)
        now = measure("now", EMBER, None, Path(tmp) / "now.duckdb", reqs, args.repeat,
                      old_store=False)
    rows = []
    for key, is_ in now.items():
        was = before.get(key, "-")
        ratio = f"{float(was) / float(is_):.1f}x" if was != "-" and float(is_) else "-"
        rows.append([key, was, is_, ratio])
    print(render(f"The first store ({args.before}) and today's, the same "
                 f"{sum(len(r.series) for r in reqs):,} profiles",
                 ["figure", args.before, "now", "before / now"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
