#!/usr/bin/env python3
"""What a store holds under churn: processes that come and go behind a
retention window, in one process, on a store file of its own.

Each round is a minute of simulated time: --processes processes, each a
new pid in a new pod (so new threads and a new series), write one profile
of --threads threads; retention then keeps the last --keep rounds, as the
collector's retention runs it. Every --every rounds the table shows the
threads and series in the tables and in memory, the process's RSS, and
the longest retention pass so far. With retention forgetting what no row
names (collector/garbage.py) they stay at about --keep rounds' worth; to
compare, run it again with PYTHONPATH set to another commit's daemon/.

    .venv/bin/python bench/churn.py [--rounds 300] [--processes 20] [--keep 10]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from common import render, status_kb
from ember.agent.labels import ProcessLabels, series_labels
from ember.collector.store import Store
from ember.collector.validate import DEFAULT_LIMITS, check_request
from ember.encode.writeraw import make_series
from ember.model import Frame, FrameKind, Mapping, Profile, Sample, cpu_type
from ember.proto import profilestore_pb2 as ps

S = 10**9
T0 = 1_700_000_000 * S
EXE = Mapping(0x400000, 0x500000, 0, "/usr/bin/app", "feedface")
FRAMES = [Frame(f"fn{i}", FrameKind.USER, EXE, 0x400000 + 16 * i) for i in range(60)]


def profile(rng: random.Random, pid: int, threads: int, at_ns: int) -> Profile:
    samples = []
    for _ in range(200):
        stack = (FRAMES[0], *rng.sample(FRAMES[1:], rng.randint(1, 10)))
        tid = pid + rng.randrange(threads)
        samples.append(Sample(stack, (1, 10_000_000), pid, tid, f"worker-{tid - pid}"))
    return Profile(cpu_type(100), tuple(samples), start_ns=at_ns, duration_ns=10 * S)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--processes", type=int, default=20)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--keep", type=int, default=10, help="rounds retention keeps")
    ap.add_argument("--every", type=int, default=50)
    args = ap.parse_args()
    rng = random.Random(1)
    rows = []
    longest = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "churn.duckdb")
        pid = 1000
        for r in range(1, args.rounds + 1):
            at = T0 + r * 60 * S
            series = []
            for _ in range(args.processes):
                pid += 1000
                prof = profile(rng, pid, args.threads, at)
                labels = series_labels(prof.type, ProcessLabels(pid=pid, comm="app"),
                                       {"host": "h0", "pod": f"app-{pid}"})
                series.append(make_series(Profile(prof.type, prof.samples, at, 10 * S,
                                                  labels))[0])
            store.write(check_request(ps.WriteRawRequest(series=series), DEFAULT_LIMITS,
                                      at + 11 * S))
            began = time.perf_counter()
            cutoff = at - args.keep * 60 * S
            store.enforce_retention((time.time_ns() - cutoff) / 1e9, 1 << 40)
            longest = max(longest, time.perf_counter() - began)
            if r % args.every == 0:
                tables = [store._db.execute(f"SELECT COUNT(*) FROM {t}").fetchall()[0][0]
                          for t in ("threads", "series")]
                rows.append([str(r), str(r * args.processes), str(tables[0]),
                             str(len(store.interner.threads)), str(tables[1]),
                             str(store.series_count()),
                             f"{status_kb(os.getpid(), 'VmRSS') / 1024:.0f}",
                             f"{longest * 1000:.0f}"])
        store.close()
    print(render(f"Churn: {args.processes} new processes a minute ({args.threads} threads "
                 f"each), retention keeping {args.keep} minutes",
                 ["rounds", "processes seen", "threads table", "threads in memory",
                  "series table", "series in memory", "RSS MB", "longest retention ms"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
