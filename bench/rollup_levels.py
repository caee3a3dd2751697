#!/usr/bin/env python3
"""Long ranges over every series: the merge read from roll-ups of every
length (five minutes, 30 minutes, three hours: collector/rollup.py)
against five-minute roll-ups alone, in the same run, alternating.

A store of --hours fleet-shaped hours (bench/fleet_hour.py's generator:
20 hosts x 10 processes, 10-second intervals, --rows sample rows over
--stacks stacks) is generated into a temporary directory, every closed
block sealed, and the query API run in this process (index built ahead,
as a collector does at start). Each figure is a pruned tree of a range not
asked before (a new API each time, the index shared), for the last hour
and for the whole store.

    .venv/bin/python bench/rollup_levels.py [--hours 6] [--rows 30000000]
        [--stacks 50000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fleet_hour import Shape, extent, generate

from common import render
from ember.collector import merge, rollup
from ember.collector.api import Api
from ember.collector.store import Store

S = 10**9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=int, default=6)
    ap.add_argument("--rows", type=int, default=30_000_000)
    ap.add_argument("--stacks", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    shape = Shape(stacks=args.stacks, functions=max(1000, args.stacks // 10),
                  intervals=360 * args.hours, rows=args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store.duckdb")
        try:
            print(f"generating {shape}", file=sys.stderr)
            gen = generate(store, shape)
            typ, lo, hi = extent(store)
            began, sealed = time.monotonic(), 0
            while store.seal(hi + 4 * 3600 * S):   # every block closed
                sealed += 1
            seal_s = time.monotonic() - began
            spans = sorted({s for s, _ in store.seals.blocks(store.type_id(typ) or 0)})
            base = Api(store)
            base.index.warm()
            real = rollup.runs

            def five(blocks: dict[rollup.Block, int], *a: int | None
                     ) -> list[tuple[int, int, int]]:
                return real({k: w for k, w in blocks.items() if k[0] == rollup.BLOCK_NS},
                            *a)  # type: ignore[arg-type]

            def tree_ms(start: int, end: int, runs: Callable[..., object]) -> float:
                merge.runs = runs  # type: ignore[assignment]
                api = Api(store)
                api.index = base.index
                t = time.perf_counter()
                code, _, _ = api.handle("/api/v1/tree", {"from": [str(start)],
                                                         "to": [str(end)]})
                assert code == 200, code
                return (time.perf_counter() - t) * 1000

            rows = []
            for name, start in (("last hour", hi - 3600 * S),
                                (f"all {args.hours} hours", lo - S)):
                got: dict[str, list[float]] = {"five": [], "all": []}
                for i in range(args.repeats):   # each range new: it ends i s earlier
                    end = hi - i * S
                    got["five"].append(tree_ms(start, end, five))
                    got["all"].append(tree_ms(start + 1, end, real))
                med = {k: statistics.median(v) for k, v in got.items()}
                rows.append([name, f"{med['five']:.0f} (slowest {max(got['five']):.0f})",
                             f"{med['all']:.0f} (slowest {max(got['all']):.0f})",
                             f"{med['five'] / med['all']:.2f}"])
            merge.runs = real
        finally:
            store.close()
    print(render(f"Pruned tree of a range not asked before, ms (median of {args.repeats}; "
                 f"{gen['rows']:,.0f} rows, {args.hours} h)",
                 ["range", "five-minute roll-ups", "every length", "ratio"], rows))
    print(render("Sealing", ["figure", "value"],
                 [["blocks sealed (all lengths)", f"{sealed}"],
                  ["lengths (s)", ", ".join(str(s // S) for s in spans)],
                  ["sealing them all (s)", f"{seal_s:.1f}"]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
