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

from fleet_hour import sealed_hours, tree_ms

from common import render
from ember.collector import merge, rollup

S = 10**9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=int, default=6)
    ap.add_argument("--rows", type=int, default=30_000_000)
    ap.add_argument("--stacks", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with sealed_hours(args.hours, args.rows, args.stacks) as (store, index, gen, lo, hi):
        spans = sorted({s for s, _ in store.seals.blocks(store.type_id(store.types()[0]) or 0)})
        real = rollup.runs

        def five(blocks: dict[rollup.Block, int], *a: int | None) -> list[tuple[int, int, int]]:
            return real({k: w for k, w in blocks.items() if k[0] == rollup.BLOCK_NS},
                        *a)  # type: ignore[arg-type]

        rows = []
        try:
            for name, start in (("last hour", hi - 3600 * S), (f"all {args.hours} hours", lo - S)):
                got: dict[str, list[float]] = {"five": [], "all": []}
                for i in range(args.repeats):   # each range new: it ends i s earlier
                    end = hi - i * S
                    merge.runs = five  # type: ignore[assignment]
                    got["five"].append(tree_ms(store, index, start, end))
                    merge.runs = real
                    got["all"].append(tree_ms(store, index, start + 1, end))
                med = {k: statistics.median(v) for k, v in got.items()}
                rows.append([name, f"{med['five']:.0f} (slowest {max(got['five']):.0f})",
                             f"{med['all']:.0f} (slowest {max(got['all']):.0f})",
                             f"{med['five'] / med['all']:.2f}"])
        finally:
            merge.runs = real
    print(render(f"Pruned tree of a range not asked before, ms (median of {args.repeats}; "
                 f"{gen['rows']:,.0f} rows, {args.hours} h)",
                 ["range", "five-minute roll-ups", "every length", "ratio"], rows))
    print(render("Sealing", ["figure", "value"],
                 [["blocks sealed (all lengths)", f"{gen['sealed']:.0f}"],
                  ["lengths (s)", ", ".join(str(s // S) for s in spans)],
                  ["sealing them all (s)", f"{gen['seal_s']:.1f}"]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
