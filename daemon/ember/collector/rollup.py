"""Roll-ups: closed five-minute blocks of a type summed per leaf, so a merge
of the whole fleet reads a third of the rows.

A fleet's hour is 25 million sample rows, and summing them per leaf costs
DuckDB about 300 ms on a 2-core machine however they are filtered: the
grouping itself is the cost. A block of five minutes holds 1.9 million of
them but only 620,000 distinct leaves, so once a block is closed (its end
``GRACE_NS`` behind) its rows of each type are summed per leaf into
``rollups`` and the block is marked in ``seals`` with the generation of
that write. A merge over every series of a type then reads, for each block
wholly inside its range, the block's roll-up rows instead of its sample
rows (merge.py): the fleet hour merges in 110-150 ms instead of 260-390.
A merge of some series (one host) reads their rows as before: a roll-up
holds no series.

It stays exact whatever comes after the seal:

- a row written later into a sealed block (an agent's late retry) is also
  added to the block's roll-up, in the same transaction, as rows of its
  own generation (``written``); a tree of generation g reads the roll-up
  rows written by g, as it reads the sample rows written by g, and the
  seal's own rows are of the seal's generation, which a tree older than
  the seal does not use (it reads that block's sample rows instead);
- retention deletes the roll-ups and seals of the blocks it deletes rows
  of (the oldest block partly: it is sealed again from what is left);
- a type stored with two shapes (sample types, period) has its roll-ups
  dropped and is not sealed: its merges read one shape's rows, which a
  roll-up does not tell apart.

The sample rows stay: they answer the merges of some series, the edges of
a range, the slides of windows (window.py) and the profiles read back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import duckdb
import numpy as np
import numpy.typing as npt

from .intern import MAX_VALUES

#: A block's length: sealed blocks inside a range are read from their roll-ups.
BLOCK_NS = 300 * 10**9
#: How long after its end a block is sealed: an agent ships every 10 s, so
#: later rows come only from retries (added to the roll-up as they come).
GRACE_NS = 60 * 10**9
#: At most this many runs of sealed blocks in one merge (the rest: sample rows).
MAX_RUNS = 8

TABLES = f"""
CREATE TABLE IF NOT EXISTS rollups (
    type UBIGINT, block BIGINT, leaf UINTEGER,
    {", ".join(f"v{i} BIGINT" for i in range(MAX_VALUES))},
    written UBIGINT);                  -- the generation whose rows these sum
CREATE TABLE IF NOT EXISTS seals (type UBIGINT, block BIGINT, written UBIGINT);
"""


def block_of(time_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return time_ns // BLOCK_NS * BLOCK_NS


class Seals:
    """The sealed blocks of each type (type id -> block start -> the
    generation of its seal), as the store holds them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sealed: dict[int, dict[int, int]] = {}

    def load(self, db: duckdb.DuckDBPyConnection) -> None:
        sealed: dict[int, dict[int, int]] = {}
        for t, b, w in db.execute("SELECT type, block, written FROM seals").fetchall():
            sealed.setdefault(int(t), {})[int(b)] = int(w)
        with self._lock:
            self._sealed = sealed

    def any(self) -> bool:
        return bool(self._sealed)

    def blocks(self, type_id: int) -> dict[int, int]:
        with self._lock:
            return dict(self._sealed.get(type_id, {}))

    def late(self, cols: dict[str, Any]) -> dict[str, npt.NDArray[np.generic]] | None:
        """The roll-up rows a write adds to sealed blocks: its sample rows
        (``cols``, with their ``written``) in one, summed per (type, block,
        leaf); None when it has none."""
        with self._lock:
            sealed = {t: set(b) for t, b in self._sealed.items() if b}
        if not sealed or not len(cols["leaf"]):
            return None
        types = np.asarray(cols["type"], np.uint64)
        blocks = block_of(np.asarray(cols["time_ns"], np.int64))
        inside = np.zeros(len(types), bool)
        for t, bs in sealed.items():
            of_type = types == np.uint64(t)
            if of_type.any():
                inside[of_type] = np.isin(blocks[of_type], np.fromiter(bs, np.int64, len(bs)))
        if not inside.any():
            return None
        keys = np.stack([types[inside].view(np.int64), blocks[inside],
                         np.asarray(cols["leaf"], np.int64)[inside]], axis=1)
        uniq, which = np.unique(keys, axis=0, return_inverse=True)
        which = which.reshape(-1)
        out: dict[str, npt.NDArray[np.generic]] = {
            "type": uniq[:, 0].view(np.uint64), "block": uniq[:, 1],
            "leaf": uniq[:, 2].astype(np.uint32)}
        for i in range(MAX_VALUES):
            summed = np.zeros(len(uniq), np.int64)
            np.add.at(summed, which, np.asarray(cols[f"v{i}"], np.int64)[inside])
            out[f"v{i}"] = summed
        out["written"] = np.full(len(uniq), int(np.asarray(cols["written"])[0]), np.uint64)
        return out

    def sealed(self, type_id: int, block: int, generation: int) -> None:
        with self._lock:
            self._sealed.setdefault(type_id, {})[block] = generation

    def forget_types(self, type_ids: Iterable[int]) -> None:
        with self._lock:
            for t in type_ids:
                self._sealed.pop(t, None)

    def forget_before(self, before: int) -> None:
        """The seals of the blocks that start before ``before``."""
        with self._lock:
            for bs in self._sealed.values():
                for b in [b for b in bs if b < before]:
                    del bs[b]


def seal(db: duckdb.DuckDBPyConnection, type_id: int, block: int, generation: int,
         values: int = MAX_VALUES) -> None:
    """Sum a block's sample rows of a type into roll-up rows of
    ``generation`` and mark it sealed (in the caller's transaction).
    ``values``: the type's sample types (the other columns are 0)."""
    sums = ", ".join(f"sum(v{i})" if i < values else "0" for i in range(MAX_VALUES))
    # grouped by the leaf alone, DuckDB sums into an array by id (in id
    # order): by (type, leaf) it hashed, and at 40 MB the seal failed. That
    # array is outside DuckDB's memory limit: for a fleet's block, 214 MB
    # more RSS for a moment with four sums, 118 with two
    db.execute(f"INSERT INTO rollups SELECT ?, ?, leaf, {sums}, ? FROM samples "
               "WHERE type = ? AND time_ns >= ? AND time_ns < ? GROUP BY leaf",
               (type_id, block, generation, type_id, block, block + BLOCK_NS))
    db.execute("INSERT INTO seals VALUES (?, ?, ?)", (type_id, block, generation))


def unsealed(db: duckdb.DuckDBPyConnection, type_id: int, now_ns: int,
             sealed: Iterable[int]) -> list[int]:
    """The closed blocks of a type that hold profiles and no seal, oldest first."""
    have = set(sealed)
    closed = (now_ns - GRACE_NS) // BLOCK_NS * BLOCK_NS   # blocks before it end by now - grace
    return [int(b) for (b,) in db.execute(
        "SELECT DISTINCT time_ns // ? * ? AS b FROM profiles WHERE type_id = ? "
        "AND time_ns < ? ORDER BY b", (BLOCK_NS, BLOCK_NS, type_id, closed)).fetchall()
        if int(b) not in have]


def runs(blocks: dict[int, int], start_ns: int, end_ns: int, upto: int | None
         ) -> list[tuple[int, int]]:
    """The runs [first block, end of last) of consecutive sealed blocks
    wholly inside [start_ns, end_ns) whose seal a tree of generation
    ``upto`` may read, longest first, at most ``MAX_RUNS``. A block [b,
    b + BLOCK_NS) is wholly inside when start_ns <= b and b + BLOCK_NS <=
    end_ns: each of its rows starts before the end and ends after the start."""
    usable = sorted(b for b, w in blocks.items()
                    if start_ns <= b and b + BLOCK_NS <= end_ns and (upto is None or w <= upto))
    out: list[tuple[int, int]] = []
    for b in usable:
        if out and out[-1][1] == b:
            out[-1] = (out[-1][0], b + BLOCK_NS)
        else:
            out.append((b, b + BLOCK_NS))
    out.sort(key=lambda r: r[0] - r[1])
    return out[:MAX_RUNS]
