#!/usr/bin/env python3
"""Where a write's CPU goes, in one process: each stage of storing a
fleet-shaped 1,000-stack profile (as bench/ingest_fleet.py sends them),
in the steady state where every program's locations and stacks are
known, and the commit's cost per profile by the number of writes in one
transaction.

Each stage runs over fresh parses of --profiles profiles (--programs
programs), --rounds times; the table gives the median and the lowest
per-profile time. To compare two commits, run it on each in turn with
PYTHONPATH set to the other's daemon/ (a worktree): this machine's speed
drifts, so only figures of one sitting compare.

    .venv/bin/python bench/ingest_stages.py [--programs 10] [--rounds 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ingest_fleet import BASES_PER_PROGRAM, program_bases, request

from common import render
from ember.collector import decode
from ember.collector.intern import Interner, Rows
from ember.collector.rows import Write, rows_of
from ember.collector.store import Store
from ember.collector.validate import DEFAULT_LIMITS, check_request, decompress, parse
from ember.proto import profile_pb2 as pb

SERIES = [("__name__", "ember_cpu"), ("host", "host-0001")]


def per_profile(stage: Callable[[int], object], n: int, rounds: int) -> list[float]:
    """ms per profile of ``stage(i)`` over i < n, each round."""
    out = []
    for _ in range(rounds):
        began = time.perf_counter()
        for i in range(n):
            stage(i)
        out.append((time.perf_counter() - began) / n * 1e3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", type=int, default=10)
    ap.add_argument("--stacks", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(7)
    print(f"making {args.programs} programs' profiles", file=sys.stderr)
    bases = [b for i in range(args.programs) for b in program_bases(i, args.stacks, rng)]
    n = len(bases)
    gz = [request(b, dict(SERIES), time.time_ns()).series[0].samples[0].raw_profile
          for b in bases]
    raws = [decompress(g, 1 << 30)[0] for g in gz]
    interner = Interner()
    for r in raws:   # every program known: the steady state
        p = parse(r, DEFAULT_LIMITS)[0]
        rows = Rows()
        interner.add(rows, p, SERIES, "t", 0, 1)
        interner.commit(rows)

    def fresh() -> tuple[list[pb.Profile], list[decode.Tables | None]]:
        ps = [parse(r, DEFAULT_LIMITS)[0] for r in raws]
        return ps, [decode.read(p, r) for p, r in zip(ps, raws, strict=True)]

    ps, ts = fresh()
    table = []

    def row(name: str, xs: list[float]) -> None:
        table.append([name, f"{statistics.median(xs):.2f}", f"{min(xs):.2f}"])

    row("decompress", per_profile(lambda i: decompress(gz[i], 1 << 30), n, args.rounds))
    row("parse", per_profile(lambda i: parse(raws[i], DEFAULT_LIMITS), n, args.rounds))
    in_c = getattr(decode, "_pprof", None) is not None   # (not before the C reader)
    row(f"decode.read (the tables in bulk, {'C' if in_c else 'numpy'})",
        per_profile(lambda i: decode.read(ps[i], raws[i]), n, args.rounds))
    if in_c:
        row("decode.in_numpy (the fallback)",
            per_profile(lambda i: decode.in_numpy(ps[i], raws[i]), n, args.rounds))
    reqs = [request(b, dict(SERIES), time.time_ns()) for b in bases]
    row("check_request (all of the above, checked)",
        per_profile(lambda i: check_request(reqs[i], DEFAULT_LIMITS, time.time_ns()), n,
                    args.rounds))
    intern_ms = []
    for _ in range(args.rounds):   # fresh parses: their strings not hashed yet
        ps, ts = fresh()
        intern_ms += per_profile(
            lambda i, ps=ps, ts=ts: interner.add(Rows(), ps[i], SERIES, "t", 0, 1, ts[i]), n, 1)
    row("Interner.add (known locations and stacks)", intern_ms)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "s.duckdb")
        sizes = (1, 3, 10)
        checked = [check_request(request(bases[k % n], dict(SERIES), time.time_ns()),
                                 DEFAULT_LIMITS, time.time_ns())
                   for k in range(n + args.rounds * sum(sizes))]   # each id stored once
        for c in checked[:n]:
            store.write(c)
        at = n
        for size in sizes:
            ms = []
            for _ in range(args.rounds):
                batch = [Write(c, []) for c in checked[at:at + size]]
                at += size
                rows, meta, _ = rows_of(store.interner, batch, set())
                began = time.perf_counter()
                assert store._commit(rows, meta, time.time_ns())
                ms.append((time.perf_counter() - began) / size * 1e3)
            row(f"commit, {size} write{'s' if size > 1 else ''} a transaction", ms)
    print(render(f"One {args.stacks}-stack profile of {args.programs} programs "
                 f"({n // BASES_PER_PROGRAM * BASES_PER_PROGRAM} profiles, "
                 f"{args.rounds} rounds), ms a profile",
                 ["stage", "median", "lowest"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
