"""Sealed blocks' sample rows written again grouped by series.

A write appends its rows after the last, so the rows of one series are
spread over every row group of the hour, and a merge of one host (a few
series, read from the rows: merge.py) makes DuckDB read the columns of
every row group, however few of their rows match. Under the store's 64 MB
of buffers those column blocks do not stay cached: a fleet hour's one
host (1.25M of 25M rows) took 55-60 ms to read.

So once a five-minute block is sealed (rollup.py) its rows of that type are
written again ordered by (series, time), the whole block at once or, past
``CHUNK_ROWS``, a slice of its times at a time: each row group then holds
a narrow run of series, and DuckDB's per-row-group minimum and maximum
skip the rest. The same hour's host: 15-24 ms. Ordered by time within a series,
the time columns keep their runs and compress as before (ordered by leaf
instead, they took 75% more disk).

Nothing a reader sees changes: the rows are the same, with the same
``written`` generation, moved in one transaction of their own (no
generation is spent: caches and windows stay valid). It runs beside
writes, not under the store's lock: a write's rows are new rows, never
these, and a late row a write adds to the block meanwhile is not in the
transaction's snapshot, so it stays where it was. A deletion of the same
rows (retention) makes one of the two fail; the block is tried again
later. One move per ``Clusterer.step``: the caller rests between them
(server.py), because a move takes the CPU and DuckDB's commit and
checkpoint beside the writes (clustered at once, a fleet hour held writes
back for over a minute and refused 536 of them). ``clustered`` lists the
blocks done (marked by the last move), and retention deletes its entries
with the blocks.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import duckdb

from .rollup import BLOCK_NS

TABLES = """
CREATE TABLE IF NOT EXISTS clustered (type UBIGINT, block BIGINT);
"""
_MOVED = "_ember_moved"
_WHERE = "type = ? AND time_ns >= ? AND time_ns < ?"
#: Rows moved in one transaction at most (bar those of one time): a block
#: this size or smaller moves whole, a larger one a slice of its times at a
#: time. Either way a move's rows are whole row groups as written, dropped
#: cheaply at the checkpoint. Moved a range of series at a time instead,
#: each move deleted rows from every row group of the block and each
#: checkpoint rewrote them all: after 13 moves of 2^17 rows the checkpoints
#: took up to a second, each holding the writes' commits.
CHUNK_ROWS = 1 << 21
#: DuckDB's threads and memory while a move runs (the store's own after):
#: one thread leaves the other core to the writes (beside 30 profiles a
#: second, the acknowledgements' p99 went from 390-840 ms to 270-340).
#: DuckDB fills its memory up to the limit (what a move copies and sorts of
#: 2M rows: about 140 MB), so the limit is what a move adds to the
#: collector's RSS, and it must leave the writes' commits room to pin
#: their blocks: under the store's own limit (64 MB then), or 64 MB for
#: the move, a fleet's commits beside it failed to (8 and 28 refused in
#: two runs of bench/ingest_fleet.py --hosts 1000 --decode-workers 2). So
#: the move's sorts and copies get MOVE_SORT_MEMORY of the connection's
#: (past it DuckDB writes them to its temporary files) and the writes the
#: rest of MOVE_MEMORY. With 160 MB and no such bound, a move added 165 MB
#: (498 MB with 8 clients asking); this adds about 100, and a move takes
#: 1.35 s for 1.11.
MOVE_THREADS, MOVE_MEMORY, MOVE_SORT_MEMORY = 1, "96MB", "48MB"


def next_block(cur: duckdb.DuckDBPyConnection) -> tuple[int, int] | None:
    """(type id, start) of the oldest sealed five-minute block whose rows
    are not clustered yet, or None."""
    got = cur.execute(
        "SELECT s.type, s.block FROM seals s WHERE s.span = ? AND NOT EXISTS "
        "(SELECT 1 FROM clustered c WHERE c.type = s.type AND c.block = s.block) "
        "ORDER BY s.block LIMIT 1", (BLOCK_NS,)).fetchall()
    return (int(got[0][0]), int(got[0][1])) if got else None


def chunks(cur: duckdb.DuckDBPyConnection, type_id: int, start: int) -> list[tuple[int, int]]:
    """The block's times cut into ranges [first, last] of at most
    ``CHUNK_ROWS`` rows each (the rows of one time with more are a range
    of their own): slices of the block in the order it was written."""
    counts = cur.execute("SELECT time_ns, COUNT(*) FROM samples WHERE " + _WHERE
                         + " GROUP BY time_ns ORDER BY time_ns",
                         (type_id, start, start + BLOCK_NS)).fetchall()
    out: list[tuple[int, int]] = []
    held = 0
    for t, n in counts:
        if out and held + n <= CHUNK_ROWS:
            out[-1] = (out[-1][0], int(t))
            held += n
        else:
            out.append((int(t), int(t)))
            held = n
    return out


def move(cur: duckdb.DuckDBPyConnection, type_id: int, start: int, times: tuple[int, int],
         last: bool) -> int:
    """Write the block's rows of the type and times [first, last] again,
    ordered by (series, time), in one transaction (on ``cur``, a connection
    of its own), with the block marked clustered when ``last``; returns how
    many rows moved. duckdb.Error when it conflicts with another change."""
    where = "type = ? AND time_ns >= ? AND time_ns <= ?"
    args = (type_id, *times)
    cur.execute("BEGIN TRANSACTION")
    try:
        cur.execute(f"CREATE TEMP TABLE {_MOVED} AS SELECT * FROM samples WHERE {where}", args)
        moved = int(cur.execute(f"SELECT COUNT(*) FROM {_MOVED}").fetchall()[0][0])
        cur.execute(f"DELETE FROM samples WHERE {where}", args)
        cur.execute(f"INSERT INTO samples SELECT * FROM {_MOVED} ORDER BY series, time_ns")
        cur.execute(f"DROP TABLE {_MOVED}")
        if last:
            cur.execute("INSERT INTO clustered VALUES (?, ?)", (type_id, start))
        cur.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):   # (a failed COMMIT ended it already)
            cur.execute("ROLLBACK")
        raise
    return moved


class Clusterer:
    """The block being clustered and its slices of times still to move,
    moved one per ``step``, for a store whose DuckDB runs ``threads`` and
    ``memory_limit`` (set again after each move)."""

    def __init__(self, threads: int, memory_limit: str) -> None:
        self._block: tuple[int, int] | None = None
        self._ranges: list[tuple[int, int]] = []
        self._threads, self._memory_limit = threads, memory_limit

    @contextlib.contextmanager
    def _moving(self, cur: duckdb.DuckDBPyConnection) -> Iterator[None]:
        """Under MOVE_THREADS, MOVE_MEMORY and MOVE_SORT_MEMORY, and
        checkpointed after: the moved rows leave DuckDB's log now, not in a
        write's commit (DuckDB checkpoints when a commit finds its log past
        16 MB)."""
        cur.execute(f"SET threads = {MOVE_THREADS}")
        cur.execute(f"SET memory_limit = '{MOVE_MEMORY}'")
        cur.execute(f"SET operator_memory_limit = '{MOVE_SORT_MEMORY}'")   # (this connection's)
        try:
            yield
            with contextlib.suppress(duckdb.Error):   # (a write under way: DuckDB's turn)
                cur.execute("CHECKPOINT")
        finally:
            cur.execute("RESET operator_memory_limit")
            cur.execute(f"SET threads = {self._threads}")
            cur.execute(f"SET memory_limit = '{self._memory_limit}'")

    def step(self, cur: duckdb.DuckDBPyConnection, reading: threading.Lock) -> int | None:
        """Move the next slice of the oldest sealed block not yet
        clustered, under ``reading`` (the store's large reads wait for it,
        and it for them): the rows moved, or None when no block is left.
        A failure (duckdb.Error) drops the plan: the block is planned again
        from its rows as they are then."""
        try:
            if self._block is None:
                todo = next_block(cur)
                if todo is None:
                    return None
                self._block, self._ranges = todo, chunks(cur, *todo)
            if not self._ranges:   # (retention emptied it meanwhile)
                cur.execute("INSERT INTO clustered VALUES (?, ?)", self._block)
                moved = 0
            else:
                with reading, self._moving(cur):
                    moved = move(cur, *self._block, self._ranges[0],
                                 last=len(self._ranges) == 1)
                del self._ranges[0]
        except BaseException:
            self._block = None
            raise
        if not self._ranges:
            self._block = None
        return moved
