"""Large arrays kept for the next query, rather than mapped afresh.

A query of one host's hour makes a dozen arrays of 4-16 MB: the rows
DuckDB hands over, the sums per leaf, the tree's totals. The collector
maps each allocation of 4 MB or more on its own (server.few_heaps: what
holds its RSS under 500 MB with 8 clients), so each array was a fresh
mapping, every page of it faulted in again: 2,300-8,500 page faults per
one-host answer in the collector, and the answers with the most were the
slowest. glibc's own reuse (a 32 MB mapping threshold) took peak RSS to
532 MB.

``use()`` makes this allocator (_arena.c) numpy's for the calling thread's
arrays (numpy keeps its allocator in a context variable: each thread sets
its own; the query API sets it for the thread each request runs on).
Arrays below 4 MB come from malloc, as before; from 4 MB each is a
mapping of its own, and when freed it is kept, up to ``LIMIT`` bytes in
all (the oldest unmapped to make room: what a query frees fits the next
better than what another kind of query left), for a later array it fits
with at most a quarter to spare. What it keeps is memory no array uses:
bounded here rather than in a ``BoundedCache`` (it holds no objects), and
shown with the caches' bytes in the collector's metrics
(``collector_arrays``). Marked for huge pages, the fresh mappings cost
more than the faults they saved (one host's answer took 70 ms for 40,
in-process), so they are not. Where the install did not build it,
numpy's own allocator stays.
"""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple

_arena: ModuleType | None
try:   # (built by the install where it can be)
    from . import _arena
except ImportError:   # pragma: no cover  (an install without a compiler)
    _arena = None

#: The most freed bytes kept: every array of 4 MB and more one host's
#: answer makes (the rows DuckDB hands over, 15 MB; their sums per leaf;
#: the tree's totals), about 30 MB in 5 blocks. Counted per stage with a
#: probe of the handler: at 12 or 24 MB one host's answer still took 6,600-
#: 7,800 page faults (the rows' arrays were mapped afresh each time), at 32
#: MB none, and it took 42-47 ms in-process against 57-59. In turns in
#: bench/store_engine.py --scale 1 (12 MB, 40, 40, 12): one host 64, 45,
#: 59, 75 ms; the whole hour 76, 40, 29, 35; peak RSS 435, 458, 442, 410
#: MB (the second pair in a slower hour of the machine).
LIMIT = 40 << 20
BUILT = _arena is not None
if _arena is not None:
    _arena.set_limit(LIMIT)


class Stats(NamedTuple):
    kept_bytes: int      # freed, kept for a later array
    kept_blocks: int
    mapped_bytes: int    # arrays' and kept blocks' mappings
    reuses: int          # arrays given a kept block
    mappings: int        # mappings made


def use() -> bool:
    """This allocator for the calling thread's new arrays (those it has
    keep the allocator that made them); False if it was already, or is
    not built."""
    return bool(_arena.install()) if _arena is not None else False


def stats() -> Stats:
    if _arena is None:
        return Stats(0, 0, 0, 0, 0)
    return Stats(*_arena.stats())


def set_limit(n: int) -> None:
    """At most ``n`` freed bytes kept (those past it unmapped now)."""
    if _arena is not None:
        _arena.set_limit(n)
