"""The sums of runs of sealed blocks, kept in memory once a merge has
read them.

A merge of every series of a type reads the roll-ups of the sealed blocks
inside its range (rollup.runs). For the fleet hour that is 2.4 million
roll-up rows, and DuckDB groups them into 800,000 leaves in 100-130 ms on
every request: a range that moves by a second is a new question to every
cache keyed by range. Sealed blocks change only when late rows reach them,
so a merge keeps the sums per leaf of the blocks it read (``Part``), and
the next merge of the same blocks (the same hour a second later, or a
page's other views) only adds the rows around them.

A part holds the blocks' roll-up rows written by generation ``at`` (the
merge's ``upto``). A merge of generation ``upto`` may use it when no late
rows reached its blocks between the two (``touched``, told by the store
before it commits them; a generation earlier than this process never
matters: every merge asks for one at least as new as the store's opening).
It is keyed by each block's seal as well: a block sealed again (after
retention cut it, or its type took a second shape) makes another part.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..cache import BoundedCache
from . import scatter


@dataclass(frozen=True)
class Part:
    """Sealed blocks' sums of some value columns: ``leaf`` distinct, a sum
    per leaf for each column (never negative, capped at 2^63 - 1), of the
    roll-up rows written by generation ``at`` (None: by any, as a merge of
    no one generation reads them; such a part is not kept)."""

    leaf: npt.NDArray[np.uint32]
    sums: tuple[npt.NDArray[np.int64], ...]
    at: int | None

    def __post_init__(self) -> None:
        arrays: list[npt.NDArray[np.generic]] = [self.leaf, *self.sums]
        for a in arrays:   # (kept, and handed to merges: never changed)
            a.flags.writeable = False

    @property
    def nbytes(self) -> int:
        return int(self.leaf.nbytes + sum(s.nbytes for s in self.sums))


#: A run of sealed blocks as a part names them: (span, start, its seal's generation) each.
Blocks = tuple[tuple[int, int, int], ...]


class BlockSums:
    """The parts merges made, by (type, blocks, columns), the least
    recently used dropped past ``max_bytes`` (the fleet hour's part of one
    column is about 10 MB); the memory governor sees them as the cache
    ``collector_block_sums``."""

    def __init__(self, max_bytes: int = 32 << 20):
        self._parts: BoundedCache[tuple[object, ...], Part] = BoundedCache(
            "collector_block_sums", max_bytes=max_bytes, weigh=lambda p: p.nbytes, lru=True)
        self._lock = threading.Lock()
        # (type, span, start) -> the generations of late rows that reached it
        self._late: dict[tuple[int, int, int], list[int]] = {}

    def touched(self, types: npt.NDArray[np.generic], spans: npt.NDArray[np.generic],
                starts: npt.NDArray[np.generic], generation: int) -> None:
        """Late rows of ``generation`` reach these sealed blocks."""
        with self._lock:
            for t, span, start in set(zip(types.tolist(), spans.tolist(), starts.tolist(),
                                          strict=True)):
                self._late.setdefault((t, span, start), []).append(generation)

    def get(self, type_id: int, blocks: Blocks, columns: Sequence[str],
            upto: int | None) -> Part | None:
        """The part of these blocks for a merge of generation ``upto``, if
        one is kept that holds what that merge would read."""
        if upto is None:   # (a merge of no one generation reads its blocks)
            return None
        part = self._parts.get((type_id, blocks, tuple(columns)))
        if part is None or part.at is None:
            return None
        lo, hi = sorted((part.at, upto))
        with self._lock:
            for span, start, _ in blocks:
                if any(lo < g <= hi for g in self._late.get((type_id, span, start), ())):
                    return None
        return part

    def put(self, type_id: int, blocks: Blocks, columns: Sequence[str], part: Part) -> None:
        if part.at is not None:
            self._parts.put((type_id, blocks, tuple(columns)), part)

    def forget_before(self, before: int) -> None:
        """Retention deleted the blocks that start before ``before``: the
        parts holding one will not be asked for again (their seals are gone)."""
        with self._lock:
            self._late = {k: g for k, g in self._late.items() if k[2] >= before}
        for key, _ in self._parts.items():
            blocks: Blocks = key[1]  # type: ignore[assignment]
            if any(start < before for _, start, _ in blocks):
                self._parts.pop(key)


def add_up(parts: Sequence[Part], columns: int) -> tuple[npt.NDArray[np.uint32],
                                                          list[npt.NDArray[np.int64]]]:
    """The parts summed per leaf: the leaves of any (ascending) and each
    column's sums, saturated at 2^63 - 1 as the store's own sums are."""
    return scatter.sum_per_index([(p.leaf, p.sums) for p in parts], columns)
