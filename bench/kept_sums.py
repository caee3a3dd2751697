#!/usr/bin/env python3
"""Merges of sealed blocks whose sums are kept in memory
(collector/blocksums.py) against the same merges read from the roll-ups
each time, in the same run, alternating.

A store of --hours fleet-shaped hours (bench/fleet_hour.py's generator,
the fleet hour's sizes by default) is generated into a temporary
directory, every closed block sealed, and the query API run in this
process (index built ahead, as a collector does at start). Each figure is
a pruned tree of a range not asked before (a new API each time, the index
shared): the whole store (every row inside sealed blocks, as the fleet
hour's bench asks) and the last hour (its edges cut blocks, so their rows
are summed as well). "kept" is the steady state: one merge of the same
blocks was made before; the first of them is shown on its own.

    .venv/bin/python bench/kept_sums.py [--hours 1] [--rows 25000000]
        [--stacks 200000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from fleet_hour import sealed_hours, tree_ms

from common import render
from ember.collector.blocksums import BlockSums

S = 10**9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=int, default=1)
    ap.add_argument("--rows", type=int, default=25_000_000, help="sample rows an hour")
    ap.add_argument("--stacks", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    with sealed_hours(args.hours, args.rows * args.hours, args.stacks) as (
            store, index, gen, lo, hi):
        kept = store.block_sums

        def ms(start: int, end: int, keep: bool) -> float:
            # (not kept: an empty cache each time, so the blocks are read)
            store.block_sums = kept if keep else BlockSums()
            return tree_ms(store, index, start, end)

        rows = []
        for name, start, end in (("the whole store", lo - 3600 * S, hi + 3600 * S),
                                 ("the last hour", hi - 3600 * S, hi)):
            first = ms(start, end + 10 * S, True)
            got: dict[bool, list[float]] = {False: [], True: []}
            for i in range(args.repeats):   # each range new: it ends i s earlier
                got[False].append(ms(start, end - i * S, False))
                got[True].append(ms(start + S, end - i * S, True))
            med = {k: statistics.median(v) for k, v in got.items()}
            rows.append([name, f"{med[False]:.0f} (slowest {max(got[False]):.0f})",
                         f"{first:.0f}", f"{med[True]:.0f} (slowest {max(got[True]):.0f})",
                         f"{med[False] / med[True]:.2f}"])
        store.block_sums = kept
    print(render(f"Pruned tree of a range not asked before, ms (median of {args.repeats}; "
                 f"{gen['rows']:,.0f} rows, {args.hours} h)",
                 ["range", "read each time", "kept: first", "kept", "ratio"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
