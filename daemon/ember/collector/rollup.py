"""Roll-ups: closed blocks of a type summed per leaf, at three lengths,
so a merge of the whole fleet reads a few roll-up rows per leaf instead of
every sample row.

A fleet's hour is 25 million sample rows, and summing them per leaf costs
DuckDB about 300 ms on a 2-core machine however they are filtered: the
grouping itself is the cost. A block of five minutes holds 1.9 million of
them but only 620,000 distinct leaves, so once a block is closed (its end
``GRACE_NS`` behind) its rows of each type are summed per leaf into
``rollups`` and the block is marked in ``seals`` with the generation of
that write. Leaves repeat from block to block: half an hour of the fleet
holds 800,000 of them, not six times 620,000. So the roll-ups of six
sealed five-minute blocks are summed again into one of 30 minutes, and
six of those into one of three hours (``SPANS_NS``: each length a multiple
of the one before, every block aligned to its length). A merge over every
series of a type reads, for the range's inside, the longest sealed blocks
that fit and shorter ones at its edges (``runs``), and the sample rows
for the rest (merge.py). A merge of some series (one host) reads their
rows as before: a roll-up holds no series.

It stays exact whatever comes after a seal:

- a row written later into a sealed block (an agent's late retry) is also
  added to the roll-up of every sealed block holding it, in the same
  transaction, as rows of its own generation (``written``); a tree of
  generation g reads the roll-up rows written by g, as it reads the sample
  rows written by g, and a seal's own rows are of the seal's generation,
  which a tree older than the seal does not use (it reads shorter blocks,
  or that block's sample rows, instead);
- a longer block is sealed only once every shorter block in it that holds
  profiles is: its sums are theirs, late rows included;
- retention deletes the roll-ups and seals of every block that starts
  before its cutoff (the five-minute block it cuts is sealed again from
  what is left; a longer one only once no profile before it is left, as
  its shorter blocks answer for it meanwhile);
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

_S = 10**9
#: The blocks' lengths, shortest first: a block of the first sums sample
#: rows, of each other the sealed blocks of the one before inside it.
SPANS_NS = (300 * _S, 1800 * _S, 10800 * _S)
BLOCK_NS = SPANS_NS[0]
#: How long after its end a block is sealed: an agent ships every 10 s, so
#: later rows come only from retries (added to the roll-ups as they come).
GRACE_NS = 60 * _S
#: At most this many runs of sealed blocks in one merge (the rest: sample rows).
MAX_RUNS = 12

TABLES = f"""
CREATE TABLE IF NOT EXISTS rollups (
    type UBIGINT, block BIGINT, leaf UINTEGER,
    {", ".join(f"v{i} BIGINT" for i in range(MAX_VALUES))},
    written UBIGINT,                   -- the generation whose rows these sum
    span BIGINT DEFAULT {BLOCK_NS});   -- the block's length (ns)
CREATE TABLE IF NOT EXISTS seals (type UBIGINT, block BIGINT, written UBIGINT,
                                  span BIGINT DEFAULT {BLOCK_NS});
"""

#: A sealed block: (span, start).
Block = tuple[int, int]
_INT64 = (-(1 << 63), (1 << 63) - 1)


def upgrade(db: duckdb.DuckDBPyConnection) -> None:
    """A store of schema 5: its tables made where missing, and those made
    before blocks had lengths given one (five minutes: what they hold)."""
    db.execute(TABLES)
    for table in ("rollups", "seals"):
        if not db.execute("SELECT COUNT(*) FROM information_schema.columns WHERE "
                          "table_name = ? AND column_name = 'span'", (table,)).fetchall()[0][0]:
            db.execute(f"ALTER TABLE {table} ADD COLUMN span BIGINT DEFAULT {BLOCK_NS}")


def capped_sum(column: str) -> str:
    """SQL: the sum of a BIGINT column, saturated to BIGINT (never an error)."""
    return f"least(greatest(sum({column}), {_INT64[0]}), {_INT64[1]})::BIGINT"


class Seals:
    """The sealed blocks of each type (type id -> (span, start) -> the
    generation of its seal), as the store holds them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sealed: dict[int, dict[Block, int]] = {}

    def load(self, db: duckdb.DuckDBPyConnection) -> None:
        sealed: dict[int, dict[Block, int]] = {}
        for t, b, w, span in db.execute("SELECT type, block, written, span FROM seals"
                                        ).fetchall():
            sealed.setdefault(int(t), {})[(int(span), int(b))] = int(w)
        with self._lock:
            self._sealed = sealed

    def any(self) -> bool:
        return bool(self._sealed)

    def blocks(self, type_id: int) -> dict[Block, int]:
        with self._lock:
            return dict(self._sealed.get(type_id, {}))

    def late(self, cols: dict[str, Any], dropped: Iterable[int] = ()
             ) -> dict[str, npt.NDArray[np.generic]] | None:
        """The roll-up rows a write adds to sealed blocks: its sample rows
        (``cols``, with their ``written``) in one, summed per (type, span,
        block, leaf), saturated as the merges sum; None when it has none.
        ``dropped``: types whose roll-ups the same write deletes."""
        skip = set(dropped)
        with self._lock:
            sealed = {t: set(b) for t, b in self._sealed.items() if b and t not in skip}
        if not sealed or not len(cols["leaf"]):
            return None
        types = np.asarray(cols["type"], np.uint64)
        time_ns = np.asarray(cols["time_ns"], np.int64)
        leaf = np.asarray(cols["leaf"], np.int64)
        keys = []
        for span in SPANS_NS:
            blocks = time_ns // span * span
            inside = np.zeros(len(types), bool)
            for t, bs in sealed.items():
                starts = [b for s, b in bs if s == span]
                of_type = types == np.uint64(t)
                if starts and of_type.any():
                    inside[of_type] = np.isin(blocks[of_type], np.array(starts, np.int64))
            at = np.flatnonzero(inside)
            if len(at):
                keys.append((at, np.stack([types[at].view(np.int64), np.full(len(at), span),
                                           blocks[at], leaf[at]], axis=1)))
        if not keys:
            return None
        rows = np.concatenate([at for at, _ in keys])
        uniq, which = np.unique(np.concatenate([k for _, k in keys]), axis=0,
                                return_inverse=True)
        which = which.reshape(-1)
        out: dict[str, npt.NDArray[np.generic]] = {
            "type": uniq[:, 0].view(np.uint64), "span": uniq[:, 1], "block": uniq[:, 2],
            "leaf": uniq[:, 3].astype(np.uint32)}
        for i in range(MAX_VALUES):
            values = np.asarray(cols[f"v{i}"], np.int64)[rows]
            if len(values) and int(np.abs(values).max()) * len(values) >= _INT64[1]:
                # (a sum that may leave int64: in Python's integers, saturated)
                exact = [0] * len(uniq)
                for k, v in zip(which.tolist(), values.tolist(), strict=True):
                    exact[k] += v
                out[f"v{i}"] = np.array([min(max(v, _INT64[0]), _INT64[1]) for v in exact],
                                        np.int64)
                continue
            summed = np.zeros(len(uniq), np.int64)
            np.add.at(summed, which, values)
            out[f"v{i}"] = summed
        out["written"] = np.full(len(uniq), int(np.asarray(cols["written"])[0]), np.uint64)
        return out

    def sealed(self, type_id: int, block: Block, generation: int) -> None:
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
                for b in [b for b in bs if b[1] < before]:
                    del bs[b]


def seal(db: duckdb.DuckDBPyConnection, type_id: int, block: Block, generation: int,
         values: int = MAX_VALUES) -> None:
    """Sum a block into roll-up rows of ``generation`` and mark it sealed
    (in the caller's transaction): a five-minute block from its sample rows
    of a type, a longer one from the roll-ups of the shorter blocks in it.
    ``values``: the type's sample types (the other columns are 0)."""
    span, start = block
    sums = ", ".join(capped_sum(f"v{i}") if i < values else "0" for i in range(MAX_VALUES))
    names = ", ".join(["type", "block", "leaf", *(f"v{i}" for i in range(MAX_VALUES)),
                       "written", "span"])
    # grouped by the leaf alone, DuckDB sums into an array by id (in id
    # order): by (type, leaf) it hashed, and at 40 MB the seal failed. That
    # array is outside DuckDB's memory limit: for a fleet's block, 214 MB
    # more RSS for a moment with four sums, 118 with two
    if span == SPANS_NS[0]:
        source, args = "samples WHERE type = ? AND time_ns >= ? AND time_ns < ?", [
            type_id, start, start + span]
    else:
        source = "rollups WHERE type = ? AND span = ? AND block >= ? AND block < ?"
        args = [type_id, SPANS_NS[SPANS_NS.index(span) - 1], start, start + span]
    db.execute(f"INSERT INTO rollups ({names}) SELECT ?, ?, leaf, {sums}, ?, ? "
               f"FROM {source} GROUP BY leaf", [type_id, start, generation, span, *args])
    db.execute("INSERT INTO seals (type, block, written, span) VALUES (?, ?, ?, ?)",
               (type_id, start, generation, span))


def unsealed(db: duckdb.DuckDBPyConnection, type_id: int, now_ns: int,
             sealed: Iterable[Block]) -> list[Block]:
    """The closed blocks of a type that hold profiles and no seal, shortest
    first, then oldest; a longer block only once each shorter one in it
    that holds profiles is sealed, and only from its start on: one that
    starts before the oldest profile is left to its shorter blocks (as
    retention moves on every minute, it would be sealed again each time)."""
    have = set(sealed)
    closed = [(now_ns - GRACE_NS) // span * span for span in SPANS_NS]  # blocks before end
    holding = [int(b) for (b,) in db.execute(
        "SELECT DISTINCT time_ns // ? * ? AS b FROM profiles WHERE type_id = ? "
        "AND time_ns < ? ORDER BY b", (BLOCK_NS, BLOCK_NS, type_id, closed[0])).fetchall()]
    out = [(BLOCK_NS, b) for b in holding if (BLOCK_NS, b) not in have]
    if not holding:
        return out
    oldest = int(db.execute("SELECT min(time_ns) FROM profiles WHERE type_id = ?",
                            (type_id,)).fetchall()[0][0])
    for k in range(1, len(SPANS_NS)):
        span, shorter = SPANS_NS[k], SPANS_NS[k - 1]
        inside: dict[int, set[int]] = {}
        for b in holding:
            if oldest <= b // span * span and b < closed[k]:
                inside.setdefault(b // span * span, set()).add(b // shorter * shorter)
        out += [(span, b) for b, parts in sorted(inside.items())
                if (span, b) not in have and all((shorter, p) in have for p in parts)]
    return out


def runs(blocks: dict[Block, int], start_ns: int, end_ns: int, upto: int | None
         ) -> list[tuple[int, int, int]]:
    """What a merge of [start_ns, end_ns) reads from roll-ups, as runs
    (span, first block, end of last) of consecutive sealed blocks of one
    length wholly inside the range whose seal a tree of generation ``upto``
    may read: the longest blocks first, shorter ones in what they leave;
    at most ``MAX_RUNS`` runs, those covering the most time (the rest is
    read from the sample rows). A block [b, b + span) is wholly inside when
    start_ns <= b and b + span <= end_ns: each of its rows starts before the
    end and ends at or after the start."""
    out: list[tuple[int, int, int]] = []
    for span in reversed(SPANS_NS):
        usable = sorted(b for (s, b), w in blocks.items()
                        if s == span and start_ns <= b and b + span <= end_ns
                        and (upto is None or w <= upto)
                        and not any(lo <= b < hi for _, lo, hi in out))
        mine: list[tuple[int, int, int]] = []
        for b in usable:
            if mine and mine[-1][2] == b:
                mine[-1] = (span, mine[-1][1], b + span)
            else:
                mine.append((span, b, b + span))
        out += mine
    out.sort(key=lambda r: r[1] - r[2])
    return out[:MAX_RUNS]
